"""Precision and memory in the train step: gradient accumulation (`accum_steps`: k
micro-batches make the full-batch step) and a bfloat16 compute dtype (float32 state)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from tests.train_test import smoke_train
from xsens.errors import ConfigError
from xsens.models import get_model
from xsens.train import losses, objectives, trainer

SHAPE = (8, 8, 1)


def _batch(n=16):
  return {"image": jax.random.normal(jax.random.key(1), (n, *SHAPE)),
          "label": jnp.arange(n) % 10}


def _steps(model, terms, accum_steps, tx=None, batch=None, state=None):
  tx = tx or optax.sgd(0.5)
  state = state or trainer.init_state(model, tx, SHAPE, jax.random.key(0))
  step = jax.jit(trainer.make_train_step(model, tx, terms, accum_steps=accum_steps))
  return step(state, batch or _batch(), jax.random.key(2))


@pytest.mark.parametrize("k", [2, 4])
def test_accumulated_step_equals_the_full_batch_step(k):
  """Loss, accuracy, gradient (through the SGD update) and params to float32 rounding, with
  two deterministic terms (their values are batch means too)."""
  model = get_model("mlp", 10, SHAPE, hidden_dims=(16,))
  config = ml_collections.ConfigDict({"loss": "cross_entropy", "objective": {
      "ce": {"kind": "cross_entropy"}, "penalty": {"kind": "min_entropy", "weight": 0.1}}})
  terms = objectives.terms_from_config(config, SHAPE, losses.cross_entropy)
  tx = optax.sgd(1.0)   # new params = params - grads: equal params mean equal grads.
  state = trainer.init_state(model, tx, SHAPE, jax.random.key(0))
  params0 = jax.device_get(state["params"])
  (full, m_full), (acc, m_acc) = (
      _steps(model, terms, n, tx, state=jax.tree.map(jnp.array, state)) for n in (1, k))
  assert set(m_full) == set(m_acc) and "penalty" in m_acc
  for name in m_full:
    np.testing.assert_allclose(float(m_acc[name]), float(m_full[name]), rtol=1e-5, atol=1e-6)
  grads = lambda s: jax.tree.map(lambda p0, p: p0 - np.asarray(p), params0, s["params"])
  for a, b in zip(jax.tree.leaves(grads(acc)), jax.tree.leaves(grads(full))):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  assert int(acc["step"]) == 1


class _BatchNormNet(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.reshape(x.shape[0], -1)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.5)(x)
    return nn.Dense(10)(x)


def test_batch_stats_are_threaded_through_the_micro_batches():
  """Running averages after k micro-batches = k momentum updates with each micro-batch's
  statistics in order (micro-batch j holds examples j, j+k, ...)."""
  model, k = _BatchNormNet(), 4
  batch = _batch()
  state, _ = _steps(model, objectives.terms_from_config(
      ml_collections.ConfigDict({"loss": "cross_entropy"}), SHAPE, losses.cross_entropy),
                    k, batch=batch)
  x = np.asarray(batch["image"]).reshape(16, -1)
  mean = np.zeros(x.shape[1])
  for j in range(k):
    mean = 0.5 * mean + 0.5 * x[j::k].mean(0)
  np.testing.assert_allclose(np.asarray(state["batch_stats"]["BatchNorm_0"]["mean"]), mean,
                             rtol=1e-5, atol=1e-6)


def test_stateful_term_state_is_threaded_through_the_micro_batches():
  seen = objectives.Term(
      "count", "cross_entropy", 1.0,
      lambda apply_fn, params, batch, key, state: (
          losses.cross_entropy(batch["logits"], batch["label"]).mean(),
          {"state": {"seen": state["seen"] + batch["label"].shape[0]}}),
      init_state=lambda: {"seen": jnp.zeros((), jnp.int32)})
  model = get_model("mlp", 10, SHAPE, hidden_dims=(16,))
  tx = optax.sgd(0.5)
  state = trainer.init_state(model, tx, SHAPE, jax.random.key(0), terms=[seen])
  new, _ = _steps(model, [seen], 4, tx, state=state)
  assert int(new["objective"]["count"]["seen"]) == 16


@pytest.mark.parametrize("accum, batch, devices, field", [
    (3, 32, 1, "accum_steps"), (0, 32, 1, "accum_steps"), (4, 24, 16, "batch_size"),
    (4, 48, 8, "accum_steps")])
def test_bad_accum_steps_is_one_line_naming_the_field(accum, batch, devices, field):
  config = smoke_train("mlp", accum_steps=accum, batch_size=batch)
  with pytest.raises(ConfigError) as e:
    trainer.validate_config(config, num_devices=devices)
  assert e.value.field == field and "\n" not in str(e.value)


def test_accum_steps_default_is_one_and_divisible_batches_validate():
  config = smoke_train("mlp")
  assert config.accum_steps == 1 and config.sharding.fsdp is False
  trainer.validate_config(smoke_train("mlp", accum_steps=4, batch_size=32), num_devices=8)


@pytest.mark.slow
def test_trainer_with_accum_steps_matches_one_pass(tmp_path):
  """The config field reaches the step: an MLP (no dropout / BatchNorm), SGD, two steps."""
  overrides = {"total_steps": 2, "eval_every": 0, "checkpoint_every": 0,
               "optimizer.name": "sgd", "optimizer.learning_rate": 0.1,
               "data.test_split": "test[:256]"}
  one = trainer.train_and_evaluate(smoke_train("mlp", **overrides), str(tmp_path / "one"))
  four = trainer.train_and_evaluate(smoke_train("mlp", accum_steps=4, **overrides),
                                    str(tmp_path / "four"))
  for a, b in zip(jax.tree.leaves(one.variables), jax.tree.leaves(four.variables)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  assert abs(one.summary["test_loss"] - four.summary["test_loss"]) < 1e-4


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_state_and_a_finite_float32_loss():
  """A tiny ViT with model.dtype=bfloat16: params, grads and optimizer state stay float32,
  the loss is float32, finite and close to the float32 model's (accumulation with
  bfloat16: `test_trainer_runs_a_bfloat16_vit`)."""
  shape = (28, 28, 1)
  kwargs = {k: v for k, v in smoke_train("vit").model.items() if k != "name"}
  batch = {"image": jax.random.normal(jax.random.key(1), (16, *shape)),
           "label": jnp.arange(16) % 10}
  terms = objectives.terms_from_config(ml_collections.ConfigDict({"loss": "cross_entropy"}),
                                       shape, losses.cross_entropy)
  tx = optax.adam(1e-3)
  out = {}
  for dtype, k in (("float32", 1), ("bfloat16", 1)):
    model = get_model("vit", 10, shape, **dict(kwargs, dtype=dtype))
    state = trainer.init_state(model, tx, shape, jax.random.key(0))
    step = jax.jit(trainer.make_train_step(model, tx, terms, accum_steps=k,
                                           input_dtype=jnp.float32))
    for _ in range(2):
      state, metrics = step(state, batch, jax.random.key(2))
    dtypes = {leaf.dtype for leaf in jax.tree.leaves(state)}
    assert dtypes == {np.dtype("float32"), np.dtype("int32")}, dtypes
    assert metrics["loss"].dtype == jnp.float32 and np.isfinite(float(metrics["loss"]))
    out[dtype, k] = float(metrics["loss"])
  assert abs(out["bfloat16", 1] - out["float32", 1]) < 0.05, out


@pytest.mark.slow
def test_trainer_runs_a_bfloat16_vit(tmp_path):
  result = trainer.train_and_evaluate(
      smoke_train("vit", total_steps=3, eval_every=0, checkpoint_every=0, accum_steps=2,
                  **{"model.dtype": "bfloat16", "data.test_split": "test[:256]"}),
      str(tmp_path))
  assert {leaf.dtype for leaf in jax.tree.leaves(result.variables)} == {np.dtype("float32")}
  assert np.isfinite(result.summary["train_loss"]) and np.isfinite(result.summary["test_loss"])


@pytest.mark.parametrize("field, value", [("accum_steps", 2), ("sharding.fsdp", True),
                                          ("sharding.model_axis_size", 2)])
def test_codistillation_refuses_accumulation_and_sharding(field, value):
  """Co-distillation has its own step (xsens/train/codistill.py): one pass, replicated."""
  from tests.codistill_test import _config
  from xsens.train import codistill
  config = _config(0.5, **{field: value})
  with pytest.raises(ConfigError) as e:
    codistill.validate_codistill_config(config)
  assert e.value.field == field
