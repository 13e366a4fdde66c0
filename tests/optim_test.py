"""Tests of xsens/train/optim.py: every optimizer and schedule against values computed by hand.

Parameters p0 = [1, -2] take three steps on the fixed gradients G below; the expected
parameters are worked out in the comments (or, for Adam's square roots, by the textbook
recurrence written out in NumPy float64).
"""

import json
import math
import os

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from mlcollections_configs import common
from xsens.errors import ConfigError
from tests.train_test import smoke_train
from xsens.train import optim, trainer
from xsens.train import workdir as workdir_lib

P0 = np.array([1.0, -2.0])
G = [np.array([0.5, -1.0]), np.array([0.25, 0.5]), np.array([-1.0, 0.0])]


def opt_config(**overrides) -> ml_collections.ConfigDict:
  """An sgd `config.optimizer` block (`common.optimizer_config`), then `overrides`."""
  cfg = common.optimizer_config("sgd", 0.1)
  for key, value in overrides.items():
    cfg[key] = value
  return cfg


def run(cfg, grads, total_steps: int = 10, p0=P0) -> list[np.ndarray]:
  """Parameters after each step of `make_optimizer(cfg)` on `grads`."""
  tx = optim.make_optimizer(cfg, total_steps)
  params = jnp.asarray(p0, jnp.float32)
  state = tx.init(params)
  out = []
  for g in grads:
    updates, state = tx.update(jnp.asarray(g, jnp.float32), state, params)
    params = optax.apply_updates(params, updates)
    out.append(np.asarray(params, np.float64))
  return out


def assert_steps(got, expected, rtol=1e-6, atol=1e-6):
  assert len(got) == len(expected)
  for t, (a, b) in enumerate(zip(got, expected), 1):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"step {t}")


def adam_reference(grads, lr, b1=0.9, b2=0.999, eps=1e-8, l2=0.0, decoupled=0.0,
                   p0=P0) -> list[np.ndarray]:
  """Adam (Kingma & Ba 2015, Alg. 1) with coupled L2 (g += l2 p) or AdamW's decoupled decay
  (p -= lr decoupled p, Loshchilov & Hutter 2019), in float64."""
  p, m, v, out = p0.astype(np.float64), 0.0, 0.0, []
  for t, g in enumerate(grads, 1):
    g = g + l2 * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    step = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    p = p - lr * (step + decoupled * p)
    out.append(p)
  return out


# ------------------------------------------------------------------------------- optimizers


def test_sgd():
  # p -= 0.1 g: [1, -2] -> [0.95, -1.9] -> [0.925, -1.95] -> [1.025, -1.95].
  assert_steps(run(opt_config(), G), [[0.95, -1.9], [0.925, -1.95], [1.025, -1.95]])


def test_sgd_weight_decay_is_coupled_l2():
  # g' = g + 0.1 p. Step 1: g' = [0.6, -1.2], p = [0.94, -1.88].
  # Step 2: g' = [0.25 + 0.094, 0.5 - 0.188] = [0.344, 0.312], p = [0.9056, -1.9112].
  got = run(opt_config(weight_decay=0.1), G[:2])
  assert_steps(got, [[0.94, -1.88], [0.9056, -1.9112]])


def test_momentum():
  # m = g + 0.9 m, p -= 0.1 m (PyTorch SGD, dampening 0).
  # m1 = [0.5, -1]              p1 = [0.95, -1.9]
  # m2 = [0.25 + 0.45, 0.5 - 0.9] = [0.7, -0.4]     p2 = [0.88, -1.86]
  # m3 = [-1 + 0.63, 0 - 0.36] = [-0.37, -0.36]     p3 = [0.917, -1.824]
  got = run(opt_config(name="momentum"), G)
  assert_steps(got, [[0.95, -1.9], [0.88, -1.86], [0.917, -1.824]])
  # The momentum field is read: mu = 0.5 gives m2 = [0.5, 0], p2 = [0.9, -1.9].
  assert_steps(run(opt_config(name="momentum", momentum=0.5), G[:2]),
               [[0.95, -1.9], [0.9, -1.9]])


def test_nesterov_momentum():
  # m = g + 0.9 m, p -= 0.1 (g + 0.9 m).
  # Step 1: m1 = [0.5, -1], g + 0.9 m1 = [0.95, -1.9]: p1 = [0.905, -1.81].
  # Step 2: m2 = [0.7, -0.4], g + 0.9 m2 = [0.88, 0.14]: p2 = [0.817, -1.824].
  got = run(opt_config(name="momentum", nesterov=True), G[:2])
  assert_steps(got, [[0.905, -1.81], [0.817, -1.824]])


def test_adam():
  got = run(opt_config(name="adam"), G)
  # Step 1: m_hat = g, v_hat = g^2, so p moves by lr * sign(g): [0.9, -1.9].
  np.testing.assert_allclose(got[0], [0.9, -1.9], atol=1e-6)
  assert_steps(got, adam_reference(G, 0.1), rtol=1e-5)


def test_adam_betas_are_read():
  # b1 = 0.5, b2 = 0.9, two steps:
  # m1 = [0.25, -0.5], v1 = [0.025, 0.1]; p1 = [0.9, -1.9].
  # m2 = 0.5 m1 + 0.5 g2 = [0.25, 0], v2 = 0.9 v1 + 0.1 g2^2 = [0.02875, 0.115].
  # m_hat = m2 / 0.75 = [1/3, 0], v_hat = v2 / 0.19; the second coordinate stays put and the
  # first moves by 0.1 (1/3) / sqrt(0.02875 / 0.19).
  got = run(opt_config(name="adam", b1=0.5, b2=0.9), G[:2])
  step = 0.1 * (1 / 3) / math.sqrt(0.02875 / 0.19)
  assert step == pytest.approx(0.0856913, abs=1e-7)
  assert_steps(got, [[0.9, -1.9], [0.9 - step, -1.9]], rtol=1e-5)


def test_adam_weight_decay_is_coupled_l2():
  got = run(opt_config(name="adam", weight_decay=0.1), G)
  # Step 1: g' = g + 0.1 p0 = [0.6, -1.2]: again lr * sign, [0.9, -1.9].
  np.testing.assert_allclose(got[0], [0.9, -1.9], atol=1e-6)
  assert_steps(got, adam_reference(G, 0.1, l2=0.1), rtol=1e-5)
  assert not np.allclose(got[2], adam_reference(G, 0.1)[2], rtol=1e-4)


def test_adamw_weight_decay_is_decoupled():
  got = run(opt_config(name="adamw", weight_decay=0.1), G)
  # Step 1: p -= 0.1 (sign(g) + 0.1 p0) = 0.1 [1.1, -1.2]: [0.89, -1.88].
  np.testing.assert_allclose(got[0], [0.89, -1.88], atol=1e-6)
  assert_steps(got, adam_reference(G, 0.1, decoupled=0.1), rtol=1e-5)


def test_grad_clip_norm_clips_before_weight_decay():
  # |[3, 4]| = 5 -> clipped to norm 0.5: [0.3, 0.4]; lr 1: p = [0.7, -2.4].
  big = [np.array([3.0, 4.0])]
  assert_steps(run(opt_config(learning_rate=1.0, grad_clip_norm=0.5), big), [[0.7, -2.4]])
  # A gradient inside the ball is untouched: [0.3, 0] -> p = [0.7, -2].
  small = [np.array([0.3, 0.0])]
  assert_steps(run(opt_config(learning_rate=1.0, grad_clip_norm=0.5), small), [[0.7, -2.0]])
  # With L2 0.1 the decay is added after clipping: [0.3, 0.4] + 0.1 [1, -2] = [0.4, 0.2].
  got = run(opt_config(learning_rate=1.0, grad_clip_norm=0.5, weight_decay=0.1), big)
  assert_steps(got, [[0.6, -2.2]])


def test_schedule_drives_the_step_size():
  # linear, lr 0.1, 2 warm-up steps of 4: step sizes 0, 0.05, 0.1, 0.05 at counts 0..3.
  cfg = opt_config(schedule="linear", warmup_steps=2)
  got = run(cfg, [np.ones(2)] * 4, total_steps=4)
  assert_steps(got, [P0, P0 - 0.05, P0 - 0.15, P0 - 0.2])


# -------------------------------------------------------------------------------- schedules


def schedule_values(steps, total_steps=10, **overrides):
  fn = optim.make_schedule(opt_config(**overrides), total_steps)
  return [float(fn(s)) for s in steps]


def test_constant_schedule_with_and_without_warmup():
  assert schedule_values([0, 3, 9]) == pytest.approx([0.1, 0.1, 0.1])
  # Warm-up 4: lr s / 4 for s < 4, then 0.1.
  assert schedule_values([0, 1, 2, 3, 4, 9], warmup_steps=4) == pytest.approx(
      [0.0, 0.025, 0.05, 0.075, 0.1, 0.1])


def test_cosine_schedule_after_warmup():
  # Warm-up 2 of 10 steps, then 0.1 * (1 + cos(pi (s - 2) / 8)) / 2, 0 from step 10 on.
  steps = [0, 1, 2, 4, 6, 8, 10, 12]
  expected = [0.0, 0.05, 0.1, 0.05 * (1 + math.cos(math.pi / 4)), 0.05,
              0.05 * (1 + math.cos(3 * math.pi / 4)), 0.0, 0.0]
  assert expected[3] == pytest.approx(0.0853553, abs=1e-7)
  assert schedule_values(steps, schedule="cosine", warmup_steps=2) == pytest.approx(
      expected, abs=1e-7)
  # No warm-up: starts at the peak and decays over all 10 steps.
  assert schedule_values([0, 5, 10], schedule="cosine") == pytest.approx([0.1, 0.05, 0.0],
                                                                        abs=1e-7)


def test_linear_schedule():
  # Warm-up 2, then 0.1 -> 0 over 8 steps.
  assert schedule_values([1, 2, 4, 6, 10, 11], schedule="linear", warmup_steps=2) == (
      pytest.approx([0.05, 0.1, 0.075, 0.05, 0.0, 0.0], abs=1e-7))


def test_step_schedule_is_pytorch_steplr():
  # lr * gamma^floor(s / step_every), gamma 0.5 every 3 steps.
  assert schedule_values([0, 2, 3, 5, 6, 9], schedule="step", step_every=3) == pytest.approx(
      [0.1, 0.1, 0.05, 0.05, 0.025, 0.0125])
  # gamma from the config; the decay clock starts after the warm-up.
  assert schedule_values([1, 2, 4, 5], schedule="step", step_every=3, step_gamma=0.1,
                         warmup_steps=2) == pytest.approx([0.05, 0.1, 0.1, 0.01])


def test_warmup_spanning_every_step():
  # warmup == total_steps: the decay phase has length max(0, 1) = 1 and is reached at the end.
  assert schedule_values([0, 1, 2, 3], total_steps=2, schedule="cosine",
                         warmup_steps=2) == pytest.approx([0.0, 0.05, 0.1, 0.0], abs=1e-7)


@pytest.mark.parametrize("overrides, field", [
    ({"name": "lion"}, "optimizer.name"),
    ({"learning_rate": 0.0}, "optimizer.learning_rate"),
    ({"schedule": "exp"}, "optimizer.schedule"),
    ({"weight_decay": -1.0}, "optimizer.weight_decay"),
    ({"warmup_steps": 11}, "optimizer.warmup_steps"),
    ({"schedule": "step", "step_every": 0}, "optimizer.step_every"),
    ({"grad_clip_norm": 0.0}, "optimizer.grad_clip_norm"),
    ({"b1": 1.0}, "optimizer.b1"),
    ({"b2": -0.1}, "optimizer.b2"),
    ({"eps": 0.0}, "optimizer.eps"),
    ({"momentum": -0.5}, "optimizer.momentum"),
])
def test_bad_fields_name_the_field(overrides, field):
  with pytest.raises(ConfigError) as e:
    optim.make_optimizer(opt_config(**overrides), 10)
  assert e.value.field == field


def test_a_block_missing_a_field_names_it_and_the_constructor():
  cfg = opt_config()
  del cfg["eps"]
  with pytest.raises(ConfigError, match="optimizer_config") as e:
    optim.make_optimizer(cfg, 10)
  assert e.value.field == "optimizer.eps"


def test_the_block_constructor_lists_every_field_and_refuses_unknown_ones():
  cfg = common.optimizer_config("adamw", 3e-4, b2=0.95)
  assert (cfg.name, cfg.learning_rate, cfg.b2, cfg.eps, cfg.decay_steps) == (
      "adamw", 3e-4, 0.95, 1e-8, None)
  cfg.decay_steps = 100   # Optional fields take their type.
  with pytest.raises(ValueError, match="unknown optimizer field 'beta1'"):
    common.optimizer_config("adam", 1e-3, beta1=0.9)


def test_adam_hyperparameters_reach_optax():
  """b1, b2 and eps of the block give optax.adam's updates exactly."""
  cfg = opt_config(name="adam", learning_rate=0.1, b1=0.5, b2=0.9, eps=1e-3)
  grads = [np.array([0.3, -1.0]), np.array([0.2, 0.5])]
  tx = optax.adam(0.1, b1=0.5, b2=0.9, eps=1e-3)
  p, state, want = jnp.asarray(P0), tx.init(jnp.asarray(P0)), []
  for g in grads:
    u, state = tx.update(jnp.asarray(g), state, p)
    p = optax.apply_updates(p, u)
    want.append(np.asarray(p))
  np.testing.assert_allclose(run(cfg, grads), want, rtol=1e-6)


def test_a_run_saved_without_the_adam_fields_resumes_at_their_defaults(tmp_path):
  """A run whose config.json predates b1/b2/eps/nesterov in the block resumes under a
  config holding their defaults; another b1 is refused."""
  config = smoke_train("mlp")
  old = workdir_lib.config_fingerprint(config)
  for field in ("b1", "b2", "eps", "nesterov"):
    del old["optimizer"][field]
  os.makedirs(tmp_path / workdir_lib.CHECKPOINT_DIR / "4")
  with open(tmp_path / workdir_lib.CONFIG_FILE, "w") as f:
    json.dump(old, f)
  trainer.make_workdir(str(tmp_path), config).check(config)  # No error.
  config.optimizer.b1 = 0.5
  with pytest.raises(ConfigError, match="optimizer.b1"):
    trainer.make_workdir(str(tmp_path), config).check(config)
