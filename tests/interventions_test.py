"""Gaussian augmentation and the sensitivity regulariser (docs/papers/sensitivity.md §3) in the one
trainer."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from tests.train_test import smoke_train
from xsens.errors import ConfigError
from xsens.models import get_model
from xsens.train import interventions, losses, objectives, trainer


@pytest.mark.slow
def test_window_masks_are_one_q_by_q_window_inside_the_image():
  masks = np.asarray(interventions.window_masks(jax.random.key(0), 2000, 8, 8, 3, False))
  assert masks.shape == (2000, 8, 8, 1)
  assert np.all(masks.sum(axis=(1, 2, 3)) == 9)
  rows = np.argmax(masks[..., 0].any(axis=2), axis=1)
  cols = np.argmax(masks[..., 0].any(axis=1), axis=1)
  # Every corner in {0..H-q} is drawn, the last one included (the official code misses it).
  assert set(rows) == set(range(6)) and set(cols) == set(range(6))


def test_grid_aligned_windows_sit_on_the_patch_grid():
  masks = np.asarray(interventions.window_masks(jax.random.key(1), 500, 8, 8, 4, True))
  rows = np.argmax(masks[..., 0].any(axis=2), axis=1)
  cols = np.argmax(masks[..., 0].any(axis=1), axis=1)
  assert set(rows) == {0, 4} and set(cols) == {0, 4}


@pytest.mark.slow
def test_patch_noise_changes_only_the_window():
  x = jnp.zeros((4, 8, 8, 3))
  noisy = np.asarray(interventions.patch_noise(x, jax.random.key(2), sigma=1.0, patch_size=2))
  changed = (noisy != 0).any(axis=3)
  assert np.all(changed.sum(axis=(1, 2)) == 4)


def test_gaussian_augment_probability_and_scale():
  x = jnp.zeros((4000, 2, 2, 1))
  assert np.all(np.asarray(interventions.gaussian_augment(
      x, jax.random.key(0), std=0.5, prob=0.0)) == 0)
  y = np.asarray(interventions.gaussian_augment(x, jax.random.key(0), std=0.5, prob=0.25))
  hit = (y != 0).any(axis=(1, 2, 3))
  assert abs(hit.mean() - 0.25) < 0.03
  assert abs(y[hit].std() - 0.5) < 0.02


def test_penalty_is_zero_for_a_constant_model():
  const = lambda x: jnp.ones((x.shape[0], 10))
  x = jax.random.normal(jax.random.key(0), (8, 8, 8, 1))
  noisy = interventions.patch_noise(x, jax.random.key(1), sigma=3.0, patch_size=4)
  assert float(interventions.sensitivity_penalty(const(x), const(noisy))) == 0.0


def _one_step(objective, augment=None):
  model = get_model("mlp", 10, (8, 8, 1), hidden_dims=(16,))
  tx = optax.sgd(0.1)
  state = trainer.init_state(model, tx, (8, 8, 1), jax.random.key(0))
  batch = {"image": jax.random.normal(jax.random.key(1), (16, 8, 8, 1)),
           "label": jnp.arange(16) % 10}
  config = ml_collections.ConfigDict({"loss": "cross_entropy", "objective": objective,
                                      "augment": augment})
  step = jax.jit(trainer.make_train_step(
      model, tx, objectives.terms_from_config(config, (8, 8, 1), losses.cross_entropy),
      objectives.transforms_from_config(config)))
  return step(state, batch, jax.random.key(2))


def _reg(weight=0.5):
  """(1 − p)·CE + p·MSE(f(x̃), f(x)) as objective terms."""
  return ml_collections.ConfigDict({
      "ce": {"kind": "cross_entropy", "weight": 1.0 - weight},
      "penalty": {"kind": "sensitivity", "weight": weight, "sigma": 1.0, "patch_size": 4,
                  "grid_aligned": False}})


@pytest.mark.slow
def test_regularised_loss_equals_cross_entropy_at_p_zero():
  plain_state, plain = _one_step(None)
  reg_state, reg = _one_step(_reg(weight=0.0))
  assert float(reg["loss"]) == pytest.approx(float(plain["loss"]), rel=1e-6)
  assert float(reg["penalty"]) > 0
  for a, b in zip(jax.tree.leaves(plain_state["params"]), jax.tree.leaves(reg_state["params"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_regularised_loss_weights_task_and_penalty():
  _, m = _one_step(_reg(weight=0.3))
  assert float(m["loss"]) == pytest.approx(0.7 * float(m["ce"]) + 0.3 * float(m["penalty"]),
                                           rel=1e-5)


@pytest.mark.parametrize("field,value,match", [
    ("objective.penalty.kind", "l2", "unknown term kind 'l2'"),
    ("objective.penalty.weight", -1.5, "must be a finite number >= 0"),
    ("objective.penalty.patch_size", 40, "40 must be an int in \\[1, 28\\]"),
    ("augment.gaussian_std", -1.0, "must be >= 0"),
])
def test_bad_intervention_settings_are_refused(tmp_path, field, value, match):
  config = smoke_train("mlp", **{"objective": _reg(), field: value})
  with pytest.raises(ConfigError, match=f"config.{field}: {match}"):
    trainer.train_and_evaluate(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


@pytest.mark.slow
def test_trainer_runs_with_regulariser_and_augmentation(tmp_path):
  config = smoke_train("vit", **{"objective": _reg(), "augment.gaussian_std": 0.1})
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.summary["steps"] == 4
  from xsens.train.metrics import read_metrics  # pylint: disable=g-import-not-at-top
  assert any("train/penalty" in r for r in read_metrics(str(tmp_path)))


@pytest.mark.slow
def test_fine_tune_from_a_vit_jax_checkpoint(tmp_path, monkeypatch):
  """`pretrained.path` loads a vit_jax .npz (posemb resized, head re-initialised)."""
  from tests import pretrained_test  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(pretrained_test, "C", 1)  # mnist5k is grey.
  ck = pretrained_test.fake_vit_checkpoint(grid=2)
  path = str(tmp_path / "vit.npz")
  np.savez(path, **ck)
  config = smoke_train("vit", total_steps=1, **{
      "pretrained.path": path, "optimizer.name": "sgd", "optimizer.learning_rate": 1e-9,
      "model.patch_size": 4, "model.width": 8, "model.depth": 2, "model.num_heads": 2,
      "model.mlp_dim": 16})
  result = trainer.train_and_evaluate(config, str(tmp_path / "wd"))
  params = result.variables["params"]
  np.testing.assert_allclose(np.asarray(params["embedding"]["kernel"]),
                             ck["embedding/kernel"], atol=1e-6)
  assert params["head"]["kernel"].shape == (8, 10)


def test_missing_pretrained_checkpoint_is_refused(tmp_path):
  config = smoke_train("vit", **{"pretrained.path": str(tmp_path / "nope.npz")})
  with pytest.raises(ConfigError, match="config.pretrained.path: no checkpoint at"):
    trainer.train_and_evaluate(config, str(tmp_path / "wd"))
  config = smoke_train("cnn", **{"pretrained.path": str(tmp_path / "nope.npz")})
  with pytest.raises(ConfigError, match="load into models vit, bit_resnet, convnext, roberta, not 'cnn'"):
    trainer.train_and_evaluate(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()
