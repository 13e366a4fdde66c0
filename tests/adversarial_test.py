"""Tests for xsens/measures/adversarial.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.measures import adversarial as adv_lib
from xsens.models import get_model

jax.config.update("jax_disable_most_optimizations", True)

SHAPE = (4, 4, 2)   # H, W, C of the toy images.
DIM = 4 * 4 * 2


def _linear_w(seed=0):
  w = np.array(jax.random.normal(jax.random.key(seed), (DIM,)))
  w[np.abs(w) < 0.05] = 0.1   # No zero (or tiny) weights: sign(w) is defined.
  return jnp.asarray(w * 0.1)


W = _linear_w()


def linear_apply(w, x):
  """Binary linear classifier: logits [0, w . x]."""
  z = x.reshape(x.shape[0], -1) @ w
  return jnp.stack([jnp.zeros_like(z), z], axis=-1)


linear_predict = (linear_apply, W)   # (apply_fn, variables).


def _fgsm(model, x, labels, **kw):
  return adv_lib.fgsm(*model, x, labels=labels, **kw)["adv_inputs"]


def _pgd(model, x, labels, key, **kw):
  return adv_lib.pgd(*model, x, labels=labels, key=key, **kw)["adv_inputs"]


def _images(seed, b=5, scale=0.5):
  return jax.random.uniform(jax.random.key(seed), (b, *SHAPE), minval=-scale,
                            maxval=scale)


def _worst_linf(x, eps):
  """The exact L-inf worst case for label 1: x - eps * sign(w)."""
  return x - eps * jnp.sign(W).reshape(SHAPE)


@pytest.fixture(scope="module")
def mlp():
  model = get_model("mlp", num_classes=4, input_shape=SHAPE, hidden_dims=(16,))
  x = _images(1, b=64, scale=1.0)
  variables = jax.jit(lambda k: model.init(k, x, train=False))(
      jax.random.key(2))
  apply_fn = functools.partial(model.apply, train=False)
  labels = jnp.argmax(apply_fn(variables, x), -1)   # Clean accuracy 1 by construction.
  return (apply_fn, variables), x, labels


# ----------------------------------------------------------------------------
# Attacks on a linear model: exact worst cases.
# ----------------------------------------------------------------------------


def test_fgsm_linf_linear_exact():
  x = _images(0)
  labels = jnp.ones(x.shape[0], jnp.int32)
  out = _fgsm(linear_predict, x, labels, epsilon=0.1)
  np.testing.assert_array_equal(out, _worst_linf(x, 0.1))
  # Label 0 flips the direction.
  out0 = _fgsm(linear_predict, x, jnp.zeros_like(labels), epsilon=0.1)
  np.testing.assert_array_equal(out0, _worst_linf(x, -0.1))


def test_fgsm_l2_linear_exact():
  x = _images(0)
  labels = jnp.ones(x.shape[0], jnp.int32)
  out = _fgsm(linear_predict, x, labels, epsilon=0.3, norm="l2")
  want = x - 0.3 * (W / jnp.linalg.norm(W)).reshape(SHAPE)
  np.testing.assert_allclose(out, want, atol=1e-6)


def test_pgd_linf_reaches_worst_case():
  x = _images(3)
  labels = jnp.ones(x.shape[0], jnp.int32)
  out = _pgd(linear_predict, x, labels, jax.random.key(0), epsilon=0.1,
                    num_steps=6, step_size=0.05)
  np.testing.assert_array_equal(out, _worst_linf(x, 0.1))


def test_pgd_l2_reaches_worst_case():
  x = _images(3)
  labels = jnp.ones(x.shape[0], jnp.int32)
  want = x - 0.5 * (W / jnp.linalg.norm(W)).reshape(SHAPE)
  out = _pgd(linear_predict, x, labels, jax.random.key(0), epsilon=0.5,
                    num_steps=1, step_size=0.5, norm="l2", random_start=False)
  np.testing.assert_allclose(out, want, atol=1e-6)
  # From a random start the component orthogonal to w shrinks geometrically.
  out = _pgd(linear_predict, x, labels, jax.random.key(0), epsilon=0.5,
                    num_steps=40, step_size=0.5, norm="l2")
  np.testing.assert_allclose(out, want, atol=1e-4)


def test_pgd_zero_steps_is_random_start_in_ball():
  x = _images(4)
  labels = jnp.ones(x.shape[0], jnp.int32)
  out = _pgd(linear_predict, x, labels, jax.random.key(1), epsilon=0.2,
                    num_steps=0, step_size=0.1)
  d = out - x
  assert float(jnp.abs(d).max()) <= 0.2 + 1e-6
  assert float(jnp.abs(d).max()) > 0.1   # It did move.
  same = _pgd(linear_predict, x, labels, jax.random.key(1),
                     epsilon=0.2, num_steps=0, step_size=0.1,
                     random_start=False)
  np.testing.assert_array_equal(same, x)


# ----------------------------------------------------------------------------
# Constraints and accuracy ordering on a small MLP.
# ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("norm,eps", [("linf", 0.3), ("l2", 1.5)])
def test_constraints_hold(mlp, norm, eps):
  predict_fn, x, labels = mlp
  for attack in ("fgsm", "pgd"):
    if attack == "fgsm":
      out = _fgsm(predict_fn, x, labels, epsilon=eps, norm=norm,
                         clip_min=-1.0, clip_max=1.0)
    else:
      out = _pgd(predict_fn, x, labels, jax.random.key(5), epsilon=eps,
                        num_steps=5, step_size=eps / 2, norm=norm,
                        clip_min=-1.0, clip_max=1.0)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert float(out.min()) >= -1.0 and float(out.max()) <= 1.0
    d = (out - x).reshape(x.shape[0], -1)
    size = jnp.abs(d).max(-1) if norm == "linf" else jnp.linalg.norm(d, axis=-1)
    assert float(size.max()) <= eps * (1 + 1e-5), attack
    # The pixel clip binds for some examples (x spans the whole range).
    assert float(size.max()) > 0.5 * eps


def test_pgd_le_fgsm_le_clean(mlp):
  predict_fn, x, labels = mlp
  eps = 0.15
  f = _fgsm(predict_fn, x, labels, epsilon=eps)
  p = _pgd(predict_fn, x, labels, jax.random.key(0), epsilon=eps,
                  num_steps=10, step_size=eps / 4)
  acc_f = adv_lib.adversarial_accuracy(*predict_fn, x, labels=labels, adv_inputs=f)
  acc_p = adv_lib.adversarial_accuracy(*predict_fn, x, labels=labels, adv_inputs=p)
  assert float(acc_f["clean_acc"]) == 1.0
  assert float(acc_p["adv_acc"]) <= float(acc_f["adv_acc"]) < 1.0
  assert float(acc_p["adv_acc"]) < 0.9
  np.testing.assert_allclose(acc_p["adv_acc"], acc_p["adv_correct"].mean())


def test_pgd_compiles_once_across_epsilons():
  """Callers jit with apply_fn static and the variables traced: one trace for every ε and
  every new set of weights."""
  traces = []

  def apply_fn(w, z):
    traces.append(1)
    return linear_apply(w, z)

  pgd = jax.jit(adv_lib.pgd, static_argnums=0,
                static_argnames=("num_steps", "norm", "random_start"))
  x = _images(6)
  labels = jnp.ones(x.shape[0], jnp.int32)
  for eps in (0.01, 0.02, 0.04):
    pgd(apply_fn, W, x, labels=labels, key=jax.random.key(0), epsilon=eps,
        num_steps=3, step_size=eps / 2)
  n = len(traces)
  out = pgd(apply_fn, 2.0 * W, x, labels=labels, key=jax.random.key(1), epsilon=0.1,
            num_steps=3, step_size=0.1)
  assert len(traces) == n
  np.testing.assert_array_equal(out["adv_inputs"], _worst_linf(x, 0.1))
  fgsm = jax.jit(adv_lib.fgsm, static_argnums=0)
  for eps in (0.1, 0.2):
    fgsm(apply_fn, W, x, labels=labels, epsilon=eps)
  assert len(traces) == n + 1


def test_pgd_needs_key_and_labels():
  x = _images(6)
  labels = jnp.ones(x.shape[0], jnp.int32)
  with pytest.raises(ValueError, match="key"):
    adv_lib.pgd(linear_apply, W, x, labels=labels, epsilon=0.1, num_steps=1,
                step_size=0.1)
  with pytest.raises(ValueError, match="labels"):
    adv_lib.fgsm(linear_apply, W, x, labels=None, epsilon=0.1)
  out = adv_lib.pgd(linear_apply, W, x, labels=labels, epsilon=0.1, num_steps=1,
                    step_size=0.1, random_start=False)
  np.testing.assert_array_equal(out["adv_inputs"], _worst_linf(x, 0.1))


def test_adversarial_accuracy_mask():
  x = _images(7, b=4)
  labels = jnp.array([1, 0, 1, 0])
  out = adv_lib.adversarial_accuracy(linear_apply, W, x, labels=labels, adv_inputs=x,
                                     mask=jnp.array([1, 1, 0, 0]))
  correct = np.asarray(jnp.argmax(linear_apply(W, x), -1) == labels)
  np.testing.assert_allclose(out["clean_acc"], correct[:2].mean())
  np.testing.assert_allclose(out["adv_acc"], correct[:2].mean())
  assert float(out["count"]) == 2.0
  acc = adv_lib.accuracy(linear_apply, W, x, labels=labels, mask=jnp.array([1, 1, 0, 0]))
  np.testing.assert_allclose(acc["accuracy"], correct[:2].mean())
  np.testing.assert_array_equal(acc["correct"], correct)
  assert float(acc["count"]) == 2.0
  assert float(adv_lib.accuracy(linear_apply, W, x, labels=labels)["count"]) == 4.0


@pytest.mark.slow
def test_perturbation_structure_masked_sums():
  d = jax.random.normal(jax.random.key(0), (3, 8, 8, 2))
  mask = jnp.array([1.0, 0.0, 1.0])
  out = jax.jit(adv_lib.perturbation_structure, static_argnames="patch_size")(
      d, patch_size=4, cutoff=0.5, mask=mask)
  np.testing.assert_allclose(out["patch_energy"],
                             adv_lib.patch_energy(d, 4)[jnp.array([0, 2])].sum(0), rtol=1e-6)
  np.testing.assert_allclose(out["low_freq_share"],
                             adv_lib.frequency_share(d, 0.5)[jnp.array([0, 2])].sum(),
                             rtol=1e-6)
  np.testing.assert_allclose(out["patch_alignment"],
                             adv_lib.patch_alignment(d, 4)[jnp.array([0, 2])].sum(),
                             rtol=1e-6)
  assert float(out["count"]) == 2.0


def test_transfer_attack_bookkeeping(mlp):
  predict_fn, x, labels = mlp
  kw = dict(epsilon=0.15, num_steps=5, step_size=0.05)
  key = jax.random.key(3)
  same = adv_lib.transfer_attack(*predict_fn, x, labels=labels, key=key,
                                 target_apply_fn=predict_fn[0],
                                 target_variables=predict_fn[1], **kw)
  white = adv_lib.adversarial_accuracy(
      *predict_fn, x, labels=labels, adv_inputs=_pgd(predict_fn, x, labels, key, **kw))
  np.testing.assert_allclose(same["source_acc"], white["adv_acc"])
  np.testing.assert_allclose(same["target_acc_adv"], white["adv_acc"])
  np.testing.assert_allclose(same["target_acc_clean"], 1.0)
  np.testing.assert_allclose(same["source_acc_clean"], 1.0)

  const = lambda v, z: jnp.tile(v, (z.shape[0], 1))  # Always 3.
  other = adv_lib.transfer_attack(*predict_fn, x, labels=labels, key=key,
                                  target_apply_fn=const, target_variables=jnp.arange(4.0),
                                  **kw)
  np.testing.assert_allclose(other["source_acc"], white["adv_acc"])
  want = float((labels == 3).mean())
  np.testing.assert_allclose(other["target_acc_clean"], want)
  np.testing.assert_allclose(other["target_acc_adv"], want)
  np.testing.assert_array_equal(other["adv_inputs"], same["adv_inputs"])


def test_invalid_arguments():
  x = _images(0)
  labels = jnp.ones(x.shape[0], jnp.int32)
  with pytest.raises(ValueError, match="norm"):
    _fgsm(linear_predict, x, labels, epsilon=0.1, norm="l1")
  with pytest.raises(ValueError, match="patch_size"):
    adv_lib.patch_energy(x, 3)
  with pytest.raises(ValueError, match="patch_size"):
    adv_lib.patch_alignment(x, 1)


# ----------------------------------------------------------------------------
# Perturbation structure.
# ----------------------------------------------------------------------------


def test_patch_energy_sums_to_one_and_localises():
  d = jax.random.normal(jax.random.key(0), (3, 8, 8, 3))
  e = adv_lib.patch_energy(d, 4)
  assert e.shape == (3, 2, 2)
  np.testing.assert_allclose(e.sum((1, 2)), 1.0, rtol=1e-6)
  one = jnp.zeros((1, 8, 8, 3)).at[0, 4:8, 0:4].set(
      jax.random.normal(jax.random.key(1), (4, 4, 3)))
  np.testing.assert_allclose(adv_lib.patch_energy(one, 4)[0],
                             [[0, 0], [1, 0]], atol=1e-7)
  np.testing.assert_array_equal(adv_lib.patch_energy(jnp.zeros((1, 8, 8, 1)), 4),
                                0.0)


def test_patch_alignment():
  p = 4
  key = jax.random.key(0)
  blocky = jnp.repeat(jnp.repeat(
      jax.random.normal(key, (2, 4, 4, 3)), p, axis=1), p, axis=2)
  np.testing.assert_allclose(adv_lib.patch_alignment(blocky, p), 1.0)
  # Constant on blocks shifted by p/2: all changes inside patches.
  shifted = jnp.roll(blocky, (p // 2, p // 2), axis=(1, 2))
  np.testing.assert_allclose(adv_lib.patch_alignment(shifted, p), 0.0)
  noise = jax.random.normal(key, (2, 64, 64, 3))
  np.testing.assert_allclose(adv_lib.patch_alignment(noise, p), 0.5, atol=0.02)
  np.testing.assert_allclose(adv_lib.patch_alignment(3.0 * noise, p),
                             adv_lib.patch_alignment(noise, p), rtol=1e-5)
  ramp = jnp.broadcast_to(jnp.arange(16.0)[None, :, None, None], (1, 16, 16, 1))
  np.testing.assert_allclose(adv_lib.patch_alignment(ramp, p), 0.5, rtol=1e-6)


@pytest.mark.slow
def test_frequency_share_and_spectrum():
  const = jnp.full((1, 8, 8, 3), 0.7)
  i, j = np.mgrid[:8, :8]
  checker = jnp.asarray(((-1.0) ** (i + j))[None, :, :, None])
  np.testing.assert_allclose(adv_lib.frequency_share(const, 0.25), 1.0)
  np.testing.assert_allclose(adv_lib.frequency_share(checker, 1.0), 0.0,
                             atol=1e-6)
  np.testing.assert_allclose(adv_lib.frequency_share(checker, 1.5), 1.0)
  noise = jax.random.normal(jax.random.key(0), (4, 32, 32, 1))
  share = adv_lib.frequency_share(noise, 0.5)
  # White noise: the share is the fraction of FFT bins with r <= 0.5.
  frac = float((adv_lib.radial_frequency(32, 32) <= 0.5).mean())
  np.testing.assert_allclose(share.mean(), frac, atol=0.03)

  centers, spec = adv_lib.radial_power_spectrum(const, num_bins=8)
  assert centers.shape == (8,) and spec.shape == (1, 8)
  assert float(spec[0, 0]) > 0 and float(jnp.abs(spec[0, 1:]).max()) < 1e-6
  _, spec = adv_lib.radial_power_spectrum(checker, num_bins=8)
  assert float(jnp.abs(spec[0, :-1]).max()) < 1e-6 and float(spec[0, -1]) > 0


def test_structure_is_jittable_and_differentiable():
  d = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
  f = jax.jit(lambda z: adv_lib.frequency_share(z, 0.5).sum()
              + adv_lib.patch_alignment(z, 4).sum()
              + adv_lib.patch_energy(z, 4)[:, 0, 0].sum())
  g = jax.grad(f)(d)
  assert bool(jnp.isfinite(g).all())


@pytest.mark.slow
def test_vit_end_to_end():
  """PGD on a tiny ViT in the Normalize(0.5, 0.5) range, then its structure."""
  model = get_model("vit", num_classes=3, input_shape=(8, 8, 1), patch_size=4,
                    width=16, depth=1, num_heads=2, mlp_dim=16)
  x = jax.random.uniform(jax.random.key(0), (6, 8, 8, 1), minval=-1.0,
                         maxval=1.0)
  variables = jax.jit(lambda k: model.init(k, x, train=False))(
      jax.random.key(1))
  predict_fn = (functools.partial(model.apply, train=False), variables)
  labels = jnp.argmax(predict_fn[0](variables, x), -1)
  eps = 8 / 255 * 2   # 8/255 in [0, 1] pixels is 16/255 after Normalize.
  out = _pgd(predict_fn, x, labels, jax.random.key(2), epsilon=eps,
                    num_steps=3, step_size=eps / 4, clip_min=-1.0, clip_max=1.0)
  delta = out - x
  assert float(jnp.abs(delta).max()) <= eps * (1 + 1e-5)
  energy = adv_lib.patch_energy(delta, 4)
  assert energy.shape == (6, 2, 2)
  np.testing.assert_allclose(energy.sum((1, 2)), 1.0, rtol=1e-5)
  align = adv_lib.patch_alignment(delta, 4)
  share = adv_lib.frequency_share(delta, 0.5)
  assert align.shape == share.shape == (6,)
  assert bool(((align >= 0) & (align <= 1) & (share >= 0) & (share <= 1)).all())
