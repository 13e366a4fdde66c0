"""Co-distillation (xsens/train/codistill.py): zero coupling = two independent runs; exact
resume through the one loop."""

import jax
import numpy as np
import pytest

from mlcollections_configs import common
from tests.train_test import smoke_train
from xsens.errors import ConfigError
from xsens.train import workdir as workdir_lib
from xsens.train import codistill, trainer
from xsens.train.metrics import read_metrics


def _leaves(result):
  return [np.asarray(x) for x in jax.tree.leaves(result.variables["params"])]


def _config(beta, **overrides):
  # Gaussian augmentation on: both peers must see the independent runs' augmented batches.
  config = smoke_train("mlp", init_seed=3, order_seed=5, augment_seed=7,
                       **{"augment.gaussian_std": 0.3, "augment.gaussian_prob": 0.5},
                       **overrides)
  config.codistill = common.codistill_config(beta=beta, peer_seed_offset=10)
  return config


@pytest.fixture(scope="module")
def zero(tmp_path_factory):
  root = tmp_path_factory.mktemp("codistill")
  co = codistill.train_and_evaluate(_config(0.0), str(root / "co"))
  plain_a = trainer.train_and_evaluate(
      smoke_train("mlp", init_seed=3, order_seed=5, augment_seed=7,
                  **{"augment.gaussian_std": 0.3, "augment.gaussian_prob": 0.5}),
      str(root / "a"))
  plain_b = trainer.train_and_evaluate(
      smoke_train("mlp", init_seed=13, order_seed=5, augment_seed=7,
                  **{"augment.gaussian_std": 0.3, "augment.gaussian_prob": 0.5}),
      str(root / "b"))
  return root, co, plain_a, plain_b


@pytest.mark.slow
def test_zero_coupling_equals_two_independent_runs(zero):
  root, co, plain_a, plain_b = zero
  for got, want in ((co.a, plain_a), (co.b, plain_b)):
    for x, y in zip(_leaves(got), _leaves(want)):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert got.summary["test_accuracy"] == pytest.approx(want.summary["test_accuracy"])
  assert workdir_lib.Workdir(str(root / "co")).latest_step() == 4
  assert any("train/churn" in r for r in read_metrics(str(root / "co")))
  # The two peers start from different initialisations.
  assert any(np.abs(x - y).max() > 0 for x, y in zip(_leaves(co.a), _leaves(co.b)))


@pytest.mark.slow
def test_coupling_pulls_the_peers_together(tmp_path, zero):
  co = codistill.train_and_evaluate(_config(5.0), str(tmp_path / "co"))
  assert co.summary["beta"] == 5.0
  _, free, _, _ = zero
  x = co.a.test.images[:200]
  disagree = lambda r: np.mean(np.argmax(r.a.predict_fn()(x), -1)
                               != np.argmax(r.b.predict_fn()(x), -1))
  kl = lambda r: [rec["train/a/kl"] for rec in read_metrics(r) if "train/a/kl" in rec][-1]
  assert kl(str(tmp_path / "co")) < kl(str(free_dir(zero)))
  assert disagree(co) <= disagree(free)
  # Rerunning a finished run trains no more and gives the same result.
  again = codistill.train_and_evaluate(_config(5.0), str(tmp_path / "co"))
  for a, b in zip(_leaves(again.a), _leaves(co.a)):
    np.testing.assert_array_equal(a, b)


def free_dir(zero):
  return zero[0] / "co"


@pytest.mark.slow
def test_resume_after_interruption_is_bit_equal(tmp_path):
  """Interrupted after step 3 (a checkpoint), resumed: the same params, metrics and summary
  as one uninterrupted run."""
  config = _config(0.5, total_steps=6, eval_every=3)
  config.codistill.burn_in_steps = 2
  cut, straight = str(tmp_path / "cut"), str(tmp_path / "straight")
  # The study's path: a prepared directory (not a Workdir) passed to run_experiment.
  workdir_lib.Workdir(cut).prepare(config)
  exp = trainer.build_experiment(config)
  part = codistill.run_experiment(exp, codistill.validate_codistill_config(config), cut,
                                  max_chunks=3)
  assert part.summary["steps"] == 3 and part.summary["stop_reason"] is None
  assert workdir_lib.Workdir(cut).latest_step() == 3
  resumed = codistill.train_and_evaluate(config, cut)
  reference = codistill.train_and_evaluate(config, straight)
  assert resumed.summary["steps"] == reference.summary["steps"] == 6
  assert resumed.summary["stop_reason"] == "max_steps"
  for peer in ("a", "b"):
    got, want = getattr(resumed, peer), getattr(reference, peer)
    for x, y in zip(jax.tree.leaves(got.variables), jax.tree.leaves(want.variables)):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    for key in ("train_accuracy", "train_loss", "test_accuracy", "test_loss"):
      assert got.summary[key] == want.summary[key]
  strip = lambda recs: [{k: v for k, v in r.items()
                         if k != "train/steps_per_sec" and not k.startswith("time/")}
                        for r in recs]
  # The interrupted run flushed its train means at step 3, so the resumed window is 3..4;
  # every other record (evaluations at 3 and 6, train means at 2 and 6) is the straight
  # run's, exactly once.
  got, want = strip(read_metrics(cut)), strip(read_metrics(straight))
  assert [r["step"] for r in want if "train/loss" in r] == [2, 4, 6]
  assert [r["step"] for r in got if "train/loss" in r] == [2, 3, 4, 6]
  same = lambda recs: [r for r in recs if r["step"] not in (3, 4) or "train/loss" not in r]
  assert same(got) == same(want)
  assert [r["step"] for r in got if "eval/a_test_accuracy" in r] == [3, 6]


@pytest.mark.parametrize("change,field", [
    ({"beta": -1.0}, "codistill.beta"),
    ({"peer_seed_offset": 0}, "codistill.peer_seed_offset"),
    ({"burn_in_steps": -2}, "codistill.burn_in_steps"),
])
def test_bad_codistill_config_is_refused_before_writing(tmp_path, change, field):
  config = _config(0.5)
  config.codistill.update(change)
  with pytest.raises(ConfigError, match=f"config.{field}"):
    codistill.train_and_evaluate(config, str(tmp_path / "wd"))
  config = _config(0.5, objective={"ce": {"kind": "cross_entropy"}})
  with pytest.raises(ConfigError, match="config.objective: co-distillation"):
    codistill.train_and_evaluate(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()
