"""Evaluators (`xsens.train.evaluators`): padded batches, masked sums, config, trainer use."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests.train_test import smoke_train
from xsens.data import batching
from xsens.errors import ConfigError
from xsens.train import evaluators, losses, sharding, trainer
from xsens.train.metrics import read_metrics


def _data(n=10):
  x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
  return x, (np.arange(n) % 2).astype(np.int32)


def test_batches_pad_the_last_batch_with_mask_zero():
  x, y = _data(10)
  out = list(evaluators.batches(x, y, 4, sharding.data_mesh(), limit=9))
  assert [b["image"].shape[0] for b in out] == [4, 4, 4]
  np.testing.assert_array_equal(np.asarray(out[-1]["mask"]), [1, 0, 0, 0])
  np.testing.assert_array_equal(np.asarray(out[-1]["image"])[1:], np.repeat(x[8:9], 3, 0))


def test_batches_follow_the_shared_padded_index_batches():
  x, y = _data(11)
  out = list(evaluators.batches(x, y, 4, sharding.data_mesh()))
  ref = list(batching.padded_index_batches(11, 4))
  assert len(out) == len(ref) == 3
  for b, (idx, mask) in zip(out, ref):
    np.testing.assert_array_equal(np.asarray(b["image"]), x[idx])
    np.testing.assert_array_equal(np.asarray(b["label"]), y[idx])
    np.testing.assert_array_equal(np.asarray(b["mask"]), mask)
  assert list(evaluators.batches(x, y, 4, sharding.data_mesh(), limit=0)) == []

def _linear_apply(variables, inputs):
  return inputs @ variables["w"]


def test_classification_evaluator_matches_a_direct_computation():
  x, y = _data(10)
  w = jnp.asarray(np.random.RandomState(0).normal(size=(3, 2)), jnp.float32)
  (ev,) = evaluators.build({"t": {"kind": "classification", "split": "test"}},
                           apply_fn=_linear_apply, loss_fn=losses.cross_entropy,
                           default_every=5)
  out = ev.run({"w": w}, x, y, 4, sharding.data_mesh(), step=5)
  logits = x @ np.asarray(w)
  assert out["eval/t_accuracy"] == pytest.approx(np.mean(logits.argmax(-1) == y))
  want = float(losses.cross_entropy(jnp.asarray(logits), jnp.asarray(y)).mean())
  assert out["eval/t_loss"] == pytest.approx(want, rel=1e-6)
  assert ev.due(5, False) and ev.due(3, True) and not ev.due(3, False)


def test_measure_evaluator_weights_batch_means_by_real_examples():
  """A masked-mean measure over 10 examples in padded batches of 4 = the plain mean."""
  def first_feature(apply_fn, variables, inputs, *, labels=None, key=None, mask=None,
                    scale=1.0):
    del apply_fn, variables, labels, key
    v = inputs[:, 0] * scale
    return {"mean_x0": jnp.sum(v * mask) / jnp.sum(mask), "per_example": v}
  x, y = _data(10)
  (ev,) = evaluators.build(
      {"m": {"kind": "measure", "measure": "first_feature", "options": {"scale": 2.0}}},
      apply_fn=_linear_apply, loss_fn=losses.cross_entropy, default_every=0,
      measures={"first_feature": first_feature})
  out = ev.run({"w": jnp.zeros((3, 2))}, x, y, 4, sharding.data_mesh(), step=0)
  assert out == {"eval/m_mean_x0": pytest.approx(2.0 * x[:, 0].mean())}


@pytest.mark.parametrize("block,field,match", [
    ({"kind": "nope"}, "evals.e.kind", "unknown evaluator 'nope'"),
    ({"kind": "classification", "split": "val"}, "evals.e.split", "must be 'train' or"),
    ({"kind": "classification", "every": -1}, "evals.e.every", "must be an int >= 0"),
    ({"kind": "classification", "measure": "x"}, "evals.e.measure", "unknown field"),
    ({"kind": "measure", "measure": "no_such_measure"}, "evals.e.measure",
     "unknown measure 'no_such_measure'"),
])
def test_bad_evaluators_are_refused(block, field, match):
  with pytest.raises(ConfigError, match=f"config.{field}: {match}"):
    evaluators.build({"e": block}, apply_fn=_linear_apply, loss_fn=losses.cross_entropy,
                     default_every=1, measures={})


@pytest.mark.slow
def test_trainer_runs_configured_evaluators_on_their_own_schedules(tmp_path):
  config = smoke_train("mlp", total_steps=6, eval_every=2)
  config.evals = ml_collections.ConfigDict({
      "test": {"kind": "classification", "split": "test", "every": 3},
      "train": {"kind": "classification", "split": "train", "limit": 64}})
  trainer.train_and_evaluate(config, str(tmp_path))
  records = read_metrics(str(tmp_path))
  assert [r["step"] for r in records if "eval/test_accuracy" in r] == [3, 6]
  assert [r["step"] for r in records if "eval/train_accuracy" in r] == [2, 4, 6]


def test_target_accuracy_needs_a_train_classification_evaluator(tmp_path):
  config = smoke_train("mlp", target_train_accuracy=0.5)
  config.evals = ml_collections.ConfigDict({"test": {"kind": "classification"}})
  with pytest.raises(ConfigError, match="config.target_train_accuracy: needs a "):
    trainer.train_and_evaluate(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


@pytest.mark.slow
def test_trainer_logs_a_measure_evaluator_from_xsens_measures(tmp_path):
  """The README's example: token sensitivity of the test split every k steps."""
  config = smoke_train("vit", total_steps=4, eval_every=2)
  config.evals = ml_collections.ConfigDict({
      "test": {"kind": "classification", "split": "test"},
      "sens": {"kind": "measure", "measure": "token_sensitivity", "split": "test",
               "limit": 40, "every": 4,
               "options": {"sigma": 1.0, "patch_size": 7, "num_draws": 1}}})
  trainer.train_and_evaluate(config, str(tmp_path))
  records = [r for r in read_metrics(str(tmp_path)) if "eval/sens_mean" in r]
  assert [r["step"] for r in records] == [4]
  assert 0.0 <= records[0]["eval/sens_mean"] <= 1.0
