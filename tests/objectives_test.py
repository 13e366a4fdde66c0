"""Objectives as terms (`xsens.train.objectives`): the registry, config form, combinations,
state."""

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


def test_terms_sum_in_name_order_and_a_legacy_regularizer_is_refused():
  """A ConfigDict sorts its keys: the terms (and their keys) follow the names' order."""
  config = ml_collections.ConfigDict({"loss": "cross_entropy", "objective": {
      "task": {"kind": "cross_entropy", "weight": 0.7},
      "penalty": {"kind": "sensitivity", "weight": 0.3}}})
  terms = objectives.terms_from_config(config, SHAPE, losses.cross_entropy)
  assert [(t.name, t.kind, t.weight, t.needs_key) for t in terms] == [
      ("penalty", "sensitivity", 0.3, True), ("task", "cross_entropy", 0.7, False)]
  config = ml_collections.ConfigDict({"loss": "cross_entropy", "regularizer": {
      "name": "min_entropy", "weight": 0.2}})
  with pytest.raises(ConfigError, match="^config.regularizer: replaced by objective terms"):
    objectives.terms_from_config(config, SHAPE, losses.cross_entropy)


@pytest.mark.slow
def test_distillation_plus_sensitivity_regulariser_is_the_weighted_sum():
  """(1 − p)·distill + p·MSE(f(x̃), f(x)), each checked against a direct computation."""
  spec = distill.DistillSpec(alpha=0.6, temperature=2.0)
  p = 0.25
  config = ml_collections.ConfigDict({"loss": "cross_entropy", "objective": {
      "task_loss": {"kind": "distillation", "weight": 1 - p},
      "penalty": {"kind": "sensitivity", "weight": p, "sigma": 0.5, "patch_size": 4,
                  "grid_aligned": True}}})
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


def test_a_term_registered_outside_objectives_trains_through_the_trainer(tmp_path):
  """A new kind is one decorated builder (here in a test): the trainer takes it from the
  registry, validates its options and trains with it; trainer.py is not edited."""
  @objectives.register("toy_logit_l2", ("scale",),
                       validate=lambda o, path, ctx: {"scale": float(o.get("scale", 1.0))})
  def toy(options, ctx):
    del ctx
    def term(apply_fn, params, batch, key, state):
      del apply_fn, params, key, state
      value = options["scale"] * jnp.mean(jnp.square(batch["logits"]))
      return value, {"half": value / 2}
    return term

  try:
    config = smoke_train("mlp", **{"total_steps": 1, "eval_every": 0, "log_every": 1})
    config.objective = ml_collections.ConfigDict({
        "ce": {"kind": "cross_entropy"}, "toy": {"kind": "toy_logit_l2", "weight": 0.1,
                                                 "scale": 2.0}})
    exp = trainer.build_experiment(config)
    assert [(t.name, t.kind) for t in exp.terms] == [("ce", "cross_entropy"),
                                                   ("toy", "toy_logit_l2")]
    result = trainer.run_experiment(exp, trainer.open_workdir(str(tmp_path), config))
    assert result.summary["steps"] == 1
    from xsens.train.metrics import read_metrics  # pylint: disable=g-import-not-at-top
    row = [r for r in read_metrics(str(tmp_path)) if "train/toy" in r][0]
    assert row["train/toy/half"] == pytest.approx(row["train/toy"] / 2)
    assert row["train/loss"] == pytest.approx(row["train/ce"] + 0.1 * row["train/toy"],
                                              rel=1e-5)
  finally:
    del objectives.KINDS["toy_logit_l2"]
