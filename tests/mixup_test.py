"""Mixup (`config.mixup.alpha`, xsens/train/losses.py `mixup`): a NumPy reference, soft labels
through the loss and the train step, trainer runs on in-memory and streamed data, one-line
errors. Off (alpha 0, the default) the step is bit-identical to a step without the option."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from tests.input_pipeline_test import _mock, smoke_stream_config
from tests.train_test import smoke_train
from xsens.errors import ConfigError
from xsens.models import get_model
from xsens.train import losses, objectives, trainer

SHAPE = (8, 8, 1)


def _reference_mixup(images, labels, lam, k):
  """NumPy: x_i -> lam x_i + (1 - lam) x_{i-1}, soft and dominant labels."""
  partner = np.roll(labels, 1)
  mixed = lam * images + (1 - lam) * np.roll(images, 1, axis=0)
  soft = lam * np.eye(k)[labels] + (1 - lam) * np.eye(k)[partner]
  return mixed, soft, labels if lam >= 0.5 else partner


@pytest.mark.parametrize("alpha, seed", [(0.2, 0), (0.2, 3), (1.0, 1)])
def test_mixup_matches_a_numpy_reference(alpha, seed):
  rng = np.random.default_rng(seed)
  images = rng.normal(size=(6, 4, 4, 3)).astype(np.float32)
  labels = rng.integers(0, 5, size=6)
  key = jax.random.key(seed)
  mixed, soft, dominant = losses.mixup(key, jnp.asarray(images), jnp.asarray(labels), 5, alpha)
  lam = float(jax.random.beta(key, alpha, alpha))
  ref = _reference_mixup(images, labels, lam, 5)
  np.testing.assert_allclose(np.asarray(mixed), ref[0], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(soft), ref[1], rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(np.asarray(dominant), ref[2])
  np.testing.assert_allclose(np.asarray(soft).sum(1), 1.0, rtol=1e-6)
  assert mixed.dtype == jnp.float32 and soft.shape == (6, 5)


def test_soft_cross_entropy_matches_numpy_and_the_hard_loss():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 3)).astype(np.float32)
  soft = rng.dirichlet(np.ones(3), size=4).astype(np.float32)
  log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
  np.testing.assert_allclose(np.asarray(losses.soft_cross_entropy(logits, soft)),
                             -(soft * log_p).sum(1), rtol=1e-5)
  labels = np.array([0, 2, 1, 1])
  np.testing.assert_allclose(np.asarray(losses.soft_cross_entropy(logits, np.eye(3)[labels])),
                             np.asarray(losses.cross_entropy(logits, labels)), rtol=1e-6)


def _step(alpha, accum_steps=1):
  model = get_model("mlp", 10, SHAPE, hidden_dims=(16,))
  terms = objectives.terms_from_config(ml_collections.ConfigDict({"loss": "cross_entropy"}),
                                       SHAPE, losses.cross_entropy)
  tx = optax.sgd(0.1)
  state = trainer.init_state(model, tx, SHAPE, jax.random.key(0))
  kwargs = {} if alpha is None else {"mixup_alpha": alpha, "num_classes": 10}
  step = jax.jit(trainer.make_train_step(model, tx, terms, accum_steps=accum_steps, **kwargs))
  batch = {"image": jax.random.normal(jax.random.key(1), (16, *SHAPE)),
           "label": jnp.arange(16) % 10}
  return model, state, batch, step(jax.tree.map(jnp.array, state), batch, jax.random.key(2))


def test_train_step_mixes_with_the_step_key_and_is_off_at_alpha_zero():
  model, state, batch, (_, m) = _step(0.4)
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(2), 0), 3)  # Step 0.
  lam = float(jax.random.beta(key, 0.4, 0.4))
  x, soft, dominant = _reference_mixup(np.asarray(batch["image"]), np.asarray(batch["label"]),
                                       lam, 10)
  logits = np.asarray(model.apply({"params": state["params"]}, x, train=True), np.float64)
  log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
  np.testing.assert_allclose(float(m["loss"]), -(soft * log_p).sum(1).mean(), rtol=1e-5)
  np.testing.assert_allclose(float(m["accuracy"]), (logits.argmax(1) == dominant).mean())
  # Deterministic; alpha 0 is the step without the option, bit for bit.
  assert float(_step(0.4)[3][1]["loss"]) == float(m["loss"])
  (s_off, m_off), (s_none, m_none) = _step(0.0)[3], _step(None)[3]
  for a, b in zip(jax.tree.leaves((s_off, m_off)), jax.tree.leaves((s_none, m_none))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert float(m_none["loss"]) != float(m["loss"])
  # Mixed on the whole batch before the micro-batch split: accumulation gives the same loss.
  np.testing.assert_allclose(float(_step(0.4, accum_steps=4)[3][1]["loss"]), float(m["loss"]),
                             rtol=1e-5)


def test_trainer_runs_with_mixup_on_in_memory_data(tmp_path):
  config = smoke_train("mlp", **{"mixup.alpha": 0.2, "total_steps": 2, "eval_every": 0,
                                 "data.test_split": "test[:64]"})
  result = trainer.train_and_evaluate(config, str(tmp_path / "on"))
  assert result.summary["steps"] == 2 and np.isfinite(result.summary["train_loss"])


@pytest.mark.slow
def test_trainer_runs_with_mixup_on_streamed_data(tmp_path):
  config = smoke_stream_config(tmp_path, total_steps=2, eval_every=0, checkpoint_every=0)
  config.mixup.alpha = 0.2
  with _mock():
    result = trainer.train_and_evaluate(config, str(tmp_path / "wd"))
  assert result.summary["steps"] == 2 and np.isfinite(result.summary["train_loss"])


@pytest.mark.parametrize("overrides, field, message", [
    ({"mixup.alpha": -0.1}, "mixup.alpha", "finite number >= 0"),
    ({"mixup.alpha": float("nan")}, "mixup.alpha", "finite number >= 0"),
    ({"mixup.alpha": "big"}, "mixup.alpha", "finite number >= 0"),
    ({"mixup.alpha": 0.2, "loss": "multi_margin"}, "mixup.alpha", "soft labels"),
])
def test_bad_mixup_configs_are_one_line_errors(overrides, field, message):
  config = smoke_train("mlp")
  config.mixup = ml_collections.ConfigDict({"alpha": 0.0})
  for k, v in overrides.items():
    if k == "mixup.alpha":
      config.mixup = ml_collections.ConfigDict({"alpha": v})
    else:
      config[k] = v
  with pytest.raises(ConfigError, match=message) as e:
    trainer.build_experiment(config)
  assert e.value.field == field and "\n" not in str(e.value)


def test_unknown_mixup_field_and_integer_inputs_are_refused():
  config = smoke_train("mlp")
  config.mixup = ml_collections.ConfigDict({"alpha": 0.2, "p": 1})
  with pytest.raises(ConfigError, match="unknown field") as e:
    trainer.validate_config(config)
  assert e.value.field == "mixup.p"
  terms = objectives.terms_from_config(ml_collections.ConfigDict({"loss": "cross_entropy"}),
                                       SHAPE, losses.cross_entropy)
  with pytest.raises(ConfigError, match="float inputs") as e:
    trainer.check_mixup_fits(ml_collections.ConfigDict({"mixup": {"alpha": 0.2}}), terms,
                             np.uint8)
  assert e.value.field == "mixup.alpha"


def test_run_written_before_mixup_resumes_and_a_change_is_refused(tmp_path):
  """A workdir whose config.json predates `mixup` matches a config at alpha 0."""
  import json  # pylint: disable=g-import-not-at-top
  config = smoke_train("mlp")
  old = json.loads(config.to_json_best_effort())
  del old["mixup"]
  wd = trainer.make_workdir(str(tmp_path), config)
  wd.write_json("config.json", old)
  wd.save(1, {"x": jnp.zeros(())})
  wd.close()
  trainer.make_workdir(str(tmp_path), config).check(config)
  changed = smoke_train("mlp", **{"mixup.alpha": 0.2})
  with pytest.raises(ConfigError, match="differing fields: mixup.alpha"):
    trainer.make_workdir(str(tmp_path), changed).check(changed)
