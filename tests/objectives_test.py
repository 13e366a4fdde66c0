"""Objectives as terms (`xsens.train.objectives`): old fields, new form, combinations, state."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from tests.train_test import smoke_train
from xsens.errors import ConfigError
from xsens.models import get_model
from xsens.train import distill, interventions, losses, objectives, trainer

SHAPE = (8, 8, 1)


def _setup():
  model = get_model("mlp", 10, SHAPE, hidden_dims=(16,))
  tx = optax.sgd(0.1)
  state = trainer.init_state(model, tx, SHAPE, jax.random.key(0))
  batch = {"image": jax.random.normal(jax.random.key(1), (16, *SHAPE)),
           "label": jnp.arange(16) % 10,
           "teacher_logits": jax.random.normal(jax.random.key(3), (16, 10))}
  return model, tx, state, batch


def _step(config, distill_spec=None, model_tx_state_batch=None):
  model, tx, state, batch = model_tx_state_batch or _setup()
  terms = objectives.terms_from_config(config, SHAPE, losses.cross_entropy, distill_spec)
  step = jax.jit(trainer.make_train_step(model, tx, terms,
                                         objectives.transforms_from_config(config)))
  return step(state, batch, jax.random.key(2))


@pytest.mark.slow
def test_new_form_equals_the_old_fields_bit_for_bit():
  old = ml_collections.ConfigDict({"loss": "cross_entropy", "regularizer": {
      "name": "sensitivity", "weight": 0.3, "sigma": 1.0, "patch_size": 4,
      "grid_aligned": False}})
  new = ml_collections.ConfigDict({"loss": "cross_entropy", "objective": {
      "task_loss": {"kind": "cross_entropy", "weight": 0.7},
      "penalty": {"kind": "sensitivity", "weight": 0.3, "sigma": 1.0, "patch_size": 4}}})
  (s_old, m_old), (s_new, m_new) = _step(old), _step(new)
  for a, b in zip(jax.tree.leaves(s_old), jax.tree.leaves(s_new)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert {k: float(v) for k, v in m_old.items()} == {k: float(v) for k, v in m_new.items()}


@pytest.mark.slow
def test_distillation_plus_sensitivity_regulariser_is_the_weighted_sum():
  """(1 − p)·distill + p·MSE(f(x̃), f(x)), each checked against a direct computation."""
  spec = distill.DistillSpec(alpha=0.6, temperature=2.0)
  p = 0.25
  config = ml_collections.ConfigDict({"loss": "cross_entropy", "regularizer": {
      "name": "sensitivity", "weight": p, "sigma": 0.5, "patch_size": 4,
      "grid_aligned": True}})
  setup = _setup()
  model, _, state, batch = setup
  _, metrics = _step(config, spec, setup)
  logits = model.apply({"params": state["params"]}, batch["image"])
  want_distill = distill.distill_loss(logits, batch["teacher_logits"], batch["label"],
                                      losses.cross_entropy, spec).mean()
  step_key = jax.random.fold_in(jax.random.key(2), 0)
  noisy = interventions.patch_noise(batch["image"], jax.random.fold_in(step_key, 2),
                                    sigma=0.5, patch_size=4, grid_aligned=True)
  want_pen = jnp.mean(jnp.square(model.apply({"params": state["params"]}, noisy) - logits))
  np.testing.assert_allclose(float(metrics["task_loss"]), float(want_distill), rtol=1e-6)
  np.testing.assert_allclose(float(metrics["penalty"]), float(want_pen), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["loss"]),
                             (1 - p) * float(want_distill) + p * float(want_pen), rtol=1e-6)


def test_a_stateful_term_keeps_its_state_in_the_train_state():
  """A term with state (as label-shift DRO's π will be): carried, updated, returned."""
  def counting_ce(apply_fn, params, batch, key, state):
    del apply_fn, params, key
    ce = losses.cross_entropy(batch["logits"], batch["label"]).mean()
    return ce, {"state": {"seen": state["seen"] + batch["label"].shape[0]}, "seen":
                state["seen"]}
  term = objectives.Term("ce", "custom", 1.0, counting_ce,
                         init_state=lambda: {"seen": jnp.zeros((), jnp.int32)})
  model, tx, _, batch = _setup()
  state = trainer.init_state(model, tx, SHAPE, jax.random.key(0), terms=[term])
  assert int(state["objective"]["ce"]["seen"]) == 0
  step = jax.jit(trainer.make_train_step(model, tx, [term]))
  state, _ = step(state, batch, jax.random.key(2))
  state, _ = step(state, batch, jax.random.key(2))
  assert int(state["objective"]["ce"]["seen"]) == 32


def test_each_stochastic_term_gets_its_own_key():
  keys = objectives.stream_keys(jax.random.key(5), 3)
  assert keys[0] is not None and len({int(jax.random.key_data(k)[-1]) for k in keys}) == 3


@pytest.mark.parametrize("objective,field,match", [
    ({"a": {"kind": "l2"}}, "objective.a.kind", "unknown term kind 'l2'"),
    ({"a": {"kind": "cross_entropy", "weight": -1.0}}, "objective.a.weight", "must be"),
    ({"a": {"kind": "cross_entropy", "sigma": 1.0}}, "objective.a.sigma", "unknown field"),
    ({"a": {"kind": "sensitivity", "patch_size": 40}}, "objective.a.patch_size",
     "40 must be an int in \\[1, 28\\]"),
    ({"a": {"kind": "distillation"}}, "objective.a.kind", "a distillation term needs config.distill"),
])
def test_bad_terms_are_refused_before_anything_is_written(tmp_path, objective, field, match):
  config = smoke_train("mlp")
  config.objective = ml_collections.ConfigDict(objective)
  with pytest.raises(ConfigError, match=f"config.{field}: {match}"):
    trainer.train_and_evaluate(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


@pytest.mark.slow
def test_trainer_trains_a_new_form_objective(tmp_path):
  config = smoke_train("vit")
  config.objective = ml_collections.ConfigDict({
      "ce": {"kind": "cross_entropy"},
      "ent": {"kind": "min_entropy", "weight": 0.1}})
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.summary["steps"] == 4
  from xsens.train.metrics import read_metrics  # pylint: disable=g-import-not-at-top
  assert any("train/ent" in r and "train/ce" in r for r in read_metrics(str(tmp_path)))
