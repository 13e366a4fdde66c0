"""Distillation in the one trainer (xsens/train/distill.py), the min-entropy regulariser,
per-run seeds, and their bad-input errors."""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from mlcollections_configs import common
from tests.train_test import smoke_train
from xsens.data.long_tail import long_tail_fractions
from xsens.errors import ConfigError
from xsens.models import get_model
from xsens.train import workdir as workdir_lib
from xsens.train import distill, interventions, losses, objectives, trainer

NUM_TRAIN = 256  # smoke_train's data.num_train


def _params(result):
  return [np.asarray(x) for x in jax.tree.leaves(result.variables["params"])]


def _distill_train(**fields):
  config = smoke_train("mlp")
  config.distill = common.distill_config(**fields)
  return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """A CE student, a teacher, and students distilled from it (4 smoke steps each)."""
  root = tmp_path_factory.mktemp("distill")
  out = {"root": root}
  out["ce"] = trainer.train_and_evaluate(smoke_train("mlp"), str(root / "ce"))
  logits = np.random.default_rng(0).normal(size=(NUM_TRAIN, 10)).astype(np.float32) * 3
  np.save(root / "random_logits.npy", logits)
  out["alpha0"] = trainer.train_and_evaluate(
      _distill_train(alpha=0.0, teacher_logits=str(root / "random_logits.npy")),
      str(root / "alpha0"))
  teacher_cfg = smoke_train("cnn")
  out["teacher"] = trainer.train_and_evaluate(teacher_cfg, str(root / "teacher"))
  for mode in distill.TEACHER_MODES:
    out[mode] = trainer.train_and_evaluate(
        _distill_train(alpha=0.7, temperature=2.0, teacher_workdir=str(root / "teacher"),
                       teacher_mode=mode), str(root / mode))
  return out


@pytest.mark.slow
def test_kd_with_alpha_zero_equals_cross_entropy_training(runs):
  for a, b in zip(_params(runs["ce"]), _params(runs["alpha0"])):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_distillation_changes_the_student(runs):
  diff = max(np.abs(a - b).max() for a, b in zip(_params(runs["ce"]),
                                                 _params(runs["precomputed"])))
  assert diff > 1e-4


@pytest.mark.slow
def test_in_step_teacher_equals_precomputed_teacher_logits(runs):
  # No augmentation: the teacher sees the same images either way.
  for a, b in zip(_params(runs["precomputed"]), _params(runs["in_step"])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_teacher_variables_round_trip_from_its_checkpoint(runs):
  teacher = runs["teacher"]
  model = distill.build_teacher(str(runs["root"] / "teacher"), 10,
                                teacher.train.image_shape, smoke_train("cnn").data)
  variables = distill.load_teacher_variables(str(runs["root"] / "teacher"), model,
                                             teacher.train.image_shape)
  x = teacher.test.images[:8]
  np.testing.assert_allclose(distill.predict_logits(model, variables, x, batch_size=3),
                             np.asarray(teacher.predict_fn()(x)), rtol=1e-5, atol=1e-5)
  # A model that does not fit the checkpoint (3 classes) is refused, naming the field.
  with pytest.raises(ConfigError, match=r"teacher_workdir: .*does not match"):
    distill.build_teacher(str(runs["root"] / "teacher"), 3, teacher.train.image_shape,
                          smoke_train("cnn").data)


def test_kd_gradient_is_tau_times_probability_difference():
  s = jax.random.normal(jax.random.key(0), (5, 7)) * 3
  t = jax.random.normal(jax.random.key(1), (5, 7)) * 3
  for tau in (1.0, 4.0, 10.0):
    grad = jax.grad(lambda z: distill.kd_term(z, t, tau).sum())(s)
    expected = tau * (jax.nn.softmax(s / tau) - jax.nn.softmax(t / tau))
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-6)


def test_tau_squared_keeps_the_gradient_scale():
  """Hinton et al. §2: for large τ the gradient tends to (z_s − z_t)/K (centred logits), so
  its size does not depend on τ; without τ² it would shrink like 1/τ²."""
  k = 10
  s = jax.random.normal(jax.random.key(2), (64, k))
  t = jax.random.normal(jax.random.key(3), (64, k))
  norm = lambda tau, scale: float(jnp.linalg.norm(jax.grad(
      lambda z: scale * distill.kd_term(z, t, tau).sum())(s)))
  limit = (s - s.mean(-1, keepdims=True) - t + t.mean(-1, keepdims=True)) / k
  assert norm(20.0, 1.0) == pytest.approx(float(jnp.linalg.norm(limit)), rel=0.02)
  assert norm(40.0, 1.0) == pytest.approx(norm(20.0, 1.0), rel=0.02)
  assert norm(40.0, 1.0 / 40.0 ** 2) == pytest.approx(norm(40.0, 1.0) / 1600, rel=1e-4)


def test_kd_term_is_zero_for_equal_logits_and_gives_no_teacher_gradient():
  z = jax.random.normal(jax.random.key(4), (3, 5))
  np.testing.assert_allclose(distill.kd_term(z, z, 3.0), 0.0, atol=1e-6)
  g = jax.grad(lambda t: distill.kd_term(z + 1.0, t, 2.0).sum())(z * 2)
  assert float(jnp.abs(g).max()) == 0.0


def test_per_class_alpha_and_margin_in_the_loss():
  logits = jnp.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.5]])
  teacher = jnp.array([[0.0, 3.0, 0.0], [1.0, 1.0, 1.0]])
  labels = jnp.array([0, 1])
  ce = losses.cross_entropy
  spec = distill.DistillSpec(alpha=0.5, temperature=2.0, class_alpha=(0.0, 1.0, 0.3))
  out = distill.distill_loss(logits, teacher, labels, ce, spec)
  kd = distill.kd_term(logits, teacher, 2.0)
  np.testing.assert_allclose(out, [ce(logits, labels)[0], kd[1]], rtol=1e-6)
  # Margin: CE of f − m_y·e_y; a positive margin lowers the true logit: larger loss.
  spec_m = distill.DistillSpec(alpha=0.0, temperature=1.0, margin=(1.0, 0.0, 0.0))
  shifted = logits.at[0, 0].add(-1.0)
  np.testing.assert_allclose(distill.distill_loss(logits, teacher, labels, ce, spec_m),
                             ce(shifted, labels), rtol=1e-6)
  assert float(ce(shifted, labels)[0]) > float(ce(logits, labels)[0])


@pytest.mark.slow
def test_min_entropy_regulariser_adds_lambda_times_entropy():
  model = get_model("mlp", 10, (8, 8, 1), hidden_dims=(16,))
  tx = optax.sgd(0.1)
  state = trainer.init_state(model, tx, (8, 8, 1), jax.random.key(0))
  batch = {"image": jax.random.normal(jax.random.key(1), (16, 8, 8, 1)),
           "label": jnp.arange(16) % 10}
  reg = ml_collections.ConfigDict({"ce": {"kind": "cross_entropy"},
                                   "penalty": {"kind": "min_entropy", "weight": 0.3}})
  def step(objective):
    config = ml_collections.ConfigDict({"loss": "cross_entropy", "objective": objective})
    terms = objectives.terms_from_config(config, (8, 8, 1), losses.cross_entropy)
    return jax.jit(trainer.make_train_step(model, tx, terms))(state, batch, jax.random.key(2))
  _, plain = step(None)
  _, out = step(reg)
  logits = model.apply({"params": state["params"]}, batch["image"])
  p = jax.nn.softmax(logits)
  entropy = float(-(p * jnp.log(p)).sum(-1).mean())
  assert float(out["penalty"]) == pytest.approx(entropy, rel=1e-5)
  assert float(out["loss"]) == pytest.approx(float(plain["loss"]) + 0.3 * entropy, rel=1e-5)
  assert float(interventions.entropy_penalty(jnp.array([[0.0, 0.0]]))) == pytest.approx(
      np.log(2.0))


def test_seed_fields_default_to_seed_and_change_only_their_source():
  config = smoke_train("mlp", seed=5)
  assert trainer.run_seeds(config) == {"init_seed": 5, "order_seed": 5, "augment_seed": 5}
  config.order_seed = 2
  assert trainer.run_seeds(config) == {"init_seed": 5, "order_seed": 2, "augment_seed": 5}


@pytest.mark.slow
def test_seed_sources_change_the_run_and_seed_fields_equal_to_seed_do_not(tmp_path):
  base = trainer.train_and_evaluate(smoke_train("mlp", total_steps=2), str(tmp_path / "a"))
  same = trainer.train_and_evaluate(
      smoke_train("mlp", total_steps=2, init_seed=0, order_seed=0, augment_seed=0),
      str(tmp_path / "b"))
  order = trainer.train_and_evaluate(smoke_train("mlp", total_steps=2, order_seed=1),
                                     str(tmp_path / "c"))
  for a, b in zip(_params(base), _params(same)):
    np.testing.assert_array_equal(a, b)
  assert any(np.abs(a - b).max() > 0 for a, b in zip(_params(base), _params(order)))


def test_long_tail_fractions():
  f = long_tail_fractions(10, 100.0)
  assert f["0"] == 1.0 and f["9"] == pytest.approx(0.01)
  assert f["3"] == pytest.approx(100 ** (-1 / 3))
  assert long_tail_fractions(3, 4.0, order=[2, 0, 1]) == {"2": 1.0, "0": 0.5, "1": 0.25}
  with pytest.raises(ValueError):
    long_tail_fractions(10, 0.5)


def _bad(root, **fields):
  """A distill config whose `fields` override a valid precomputed-logits block."""
  logits = root / "ok_logits.npy"
  if not logits.exists():
    np.save(logits, np.zeros((NUM_TRAIN, 10), np.float32))
  base = {"alpha": 0.5, "teacher_logits": str(logits)}
  base.update(fields)
  return _distill_train(**base)


@pytest.mark.parametrize("fields,field", [
    ({"alpha": 1.5}, "distill.alpha"),
    ({"temperature": 0.0}, "distill.temperature"),
    ({"teacher_mode": "online"}, "distill.teacher_mode"),
    ({"per_class_alpha": [0.5] * 9}, "distill.per_class_alpha"),
    ({"per_class_alpha": [2.0] * 10}, "distill.per_class_alpha"),
    ({"margin": [float("nan")] * 10}, "distill.margin"),
    ({"teacher_logits": "/nonexistent/logits.npy"}, "distill.teacher_logits"),
    ({"teacher_logits": None}, "distill.teacher_workdir"),
    ({"teacher_logits": None, "teacher_workdir": "/nonexistent/run"},
     "distill.teacher_workdir"),
    ({"teacher_logits": None, "teacher_mode": "in_step"}, "distill.teacher_workdir"),
    ({"teacher_workdir": "/tmp"}, "distill.teacher_logits"),
])
def test_bad_distill_config_is_refused_before_writing(tmp_path, fields, field):
  config = _bad(tmp_path, **fields)
  with pytest.raises(ConfigError, match=f"config.{field}"):
    trainer.train_and_evaluate(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


@pytest.mark.slow
def test_bad_teacher_runs_are_refused(tmp_path, runs):
  wrong_shape = tmp_path / "wrong.npy"
  np.save(wrong_shape, np.zeros((NUM_TRAIN, 3), np.float32))
  with pytest.raises(ConfigError, match=r"config.distill.teacher_logits: .*need float"):
    trainer.build_experiment(_bad(tmp_path, teacher_logits=str(wrong_shape)))
  # A teacher trained on inputs scaled differently.
  config = _distill_train(teacher_workdir=str(runs["root"] / "teacher"))
  config.data.normalize = "zero_one"
  with pytest.raises(ConfigError, match=r"teacher_workdir: .*data.normalize"):
    trainer.build_experiment(config)
  # A teacher trained on other labels: logit k would not mean the student's class k.
  config = _distill_train(teacher_workdir=str(runs["root"] / "teacher"))
  config.data.classes = tuple(range(9, -1, -1))  # Same shapes, labels reversed.
  with pytest.raises(ConfigError, match=r"teacher_workdir: .*data.classes"):
    trainer.build_experiment(config)
  # A teacher with another number of classes.
  config = _distill_train(teacher_workdir=str(runs["root"] / "teacher"))
  config.data.classes = (0, 1, 2)
  with pytest.raises(ConfigError, match=r"teacher_workdir: .*data.classes"):
    trainer.build_experiment(config)
  config = _distill_train(teacher_workdir=str(runs["root"] / "teacher"))
  config.distill.bogus = 1
  with pytest.raises(ConfigError, match=r"config.distill.bogus: unknown field"):
    trainer.build_experiment(config)


@pytest.mark.parametrize("overrides,field", [
    ({"init_seed": -1}, "init_seed"),
    ({"augment_seed": -3}, "augment_seed"),
    ({"objective": {"penalty": {"kind": "min_entropy", "weight": -0.1}}},
     "objective.penalty.weight"),
    ({"regularizer": {"name": "min_entropy"}}, "regularizer: replaced by objective terms"),
])
def test_bad_seed_and_objective_fields(tmp_path, overrides, field):
  with pytest.raises(ConfigError, match=f"config.{field}"):
    trainer.train_and_evaluate(smoke_train("mlp", **overrides), str(tmp_path / "wd"))
  assert not os.path.exists(tmp_path / "wd")


def test_workdir_of_a_config_without_seed_fields_still_resumes(tmp_path):
  """A run written before init/order/augment_seed existed (its config.json lacks them)
  resumes under today's config, whose seed fields are None."""
  config = smoke_train("mlp")
  old = workdir_lib.config_fingerprint(config)
  for field in trainer.SEED_FIELDS:
    del old[field]
  os.makedirs(tmp_path / workdir_lib.CHECKPOINT_DIR / "4")
  with open(tmp_path / workdir_lib.CONFIG_FILE, "w") as f:
    json.dump(old, f)
  workdir_lib.Workdir(str(tmp_path)).check(config)  # No error.
  config.init_seed = 1
  with pytest.raises(ConfigError, match="differing fields: init_seed"):
    workdir_lib.Workdir(str(tmp_path)).check(config)
