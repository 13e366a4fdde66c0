"""Tests for xsens/measures/similarity.py."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.measures import similarity as sim
from xsens.models import get_model

jax.config.update("jax_disable_most_optimizations", True)


def _normal(seed, shape):
  return jax.random.normal(jax.random.key(seed), shape)


def _orthogonal(seed, d):
  q, _ = jnp.linalg.qr(_normal(seed, (d, d)))
  return q


def _related(seed, n, d=8, noise=1.0):
  """x [n, d] and y = x A + noise [n, d + 4]: CKA strictly inside (0, 1)."""
  x = _normal(seed, (n, d)) * jnp.linspace(0.5, 2.0, d)
  y = x @ _normal(seed + 1, (d, d + 4)) + noise * _normal(seed + 2,
                                                          (n, d + 4))
  return x, y


# ----------------------------------------------------------------------------
# Full linear CKA.
# ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("n", [50, 6])   # Feature form and Gram form.
def test_cka_identity_and_invariances(n):
  x, y = _related(0, n)
  np.testing.assert_allclose(sim.linear_cka(x, x), 1.0, rtol=1e-5)
  c = sim.linear_cka(x, y)
  assert 0.0 < float(c) < 1.0
  q = _orthogonal(5, y.shape[1])
  np.testing.assert_allclose(sim.linear_cka(x @ _orthogonal(6, 8), y), c,
                             rtol=1e-4)
  np.testing.assert_allclose(sim.linear_cka(x, y @ q), c, rtol=1e-4)
  np.testing.assert_allclose(sim.linear_cka(3.7 * x, 0.01 * y), c, rtol=1e-4)
  np.testing.assert_allclose(sim.linear_cka(x + 5.0, y), c, rtol=1e-4)
  np.testing.assert_allclose(sim.linear_cka(y, x), c, rtol=1e-5)


def test_cka_feature_and_gram_forms_agree():
  x, y = _related(1, 20)
  xc, yc = x - x.mean(0), y - y.mean(0)
  k, l = xc @ xc.T, yc @ yc.T
  want = jnp.sum(k * l) / (jnp.linalg.norm(k) * jnp.linalg.norm(l))
  np.testing.assert_allclose(sim.linear_cka(x, y), want, rtol=1e-5)
  # Gram form (n <= d) on the same data padded with zero features.
  pad = jnp.concatenate([x, jnp.zeros((20, 30))], axis=1)
  np.testing.assert_allclose(sim.linear_cka(pad, y), want, rtol=1e-4)


def test_cka_independent_features():
  small = sim.linear_cka(_normal(1, (40, 10)), _normal(2, (40, 10)))
  assert float(small) < 0.6
  big = sim.linear_cka(_normal(1, (20000, 10)), _normal(2, (20000, 10)))
  assert float(big) < 0.01    # ~ sqrt(d1 d2) / n.
  assert float(sim.linear_cka(jnp.ones((10, 3)), _normal(0, (10, 3)))) == 0.0


@pytest.mark.slow
def test_cka_matrix():
  x, y = _related(3, 30)
  z = _normal(9, (30, 5))
  m = sim.cka_matrix([x, y, z])
  assert m.shape == (3, 3)
  np.testing.assert_allclose(jnp.diag(m), 1.0, rtol=1e-5)
  np.testing.assert_allclose(m, m.T, rtol=1e-6)
  for i, j in itertools.product(range(3), range(3)):
    np.testing.assert_allclose(m[i, j], sim.linear_cka([x, y, z][i],
                                                       [x, y, z][j]),
                               rtol=1e-4)
  assert sim.cka_matrix([x, y], [z]).shape == (2, 1)


# ----------------------------------------------------------------------------
# Minibatch CKA.
# ----------------------------------------------------------------------------


def _brute_force_hsic(k, l):
  """Unbiased HSIC as a U-statistic over ordered 4-tuples (Song et al. 2012)."""
  k, l = np.asarray(k, np.float64), np.asarray(l, np.float64)
  n = k.shape[0]
  total, count = 0.0, 0
  for i, j, q, r in itertools.permutations(range(n), 4):
    h = 0.0
    for t, u, v, w in itertools.permutations((i, j, q, r)):
      h += k[t, u] * l[t, u] + k[t, u] * l[v, w] - 2 * k[t, u] * l[t, v]
    total += h / 24
    count += 1
  return total / count


def test_unbiased_hsic_matches_u_statistic():
  x, y = _related(4, 6, d=3)
  k, l = x @ x.T, y @ y.T
  np.testing.assert_allclose(sim.unbiased_hsic(k, l), _brute_force_hsic(k, l),
                             rtol=1e-4)


@pytest.mark.slow
def test_minibatch_cka_converges_to_full():
  n, b = 8192, 256
  x, y = _related(7, n)
  full = float(sim.linear_cka(x, y))
  state = sim.hsic_init()
  step = jax.jit(sim.hsic_accumulate)
  errors = []
  for i in range(n // b):
    state = step(state, x[i * b:(i + 1) * b], y[i * b:(i + 1) * b])
    if i + 1 in (2, n // b):
      errors.append(abs(float(sim.cka_from_accumulated(state)) - full))
  assert int(state["count"]) == n // b
  assert errors[-1] < 0.01, (errors, full)
  np.testing.assert_allclose(sim.minibatch_cka(x, y, b),
                             sim.cka_from_accumulated(state), rtol=1e-5)
  # Unbiased: independent features give ~0 even with small batches, where the
  # biased (full-form) CKA of one batch is far from 0.
  u, v = _normal(11, (n, 10)), _normal(12, (n, 10))
  assert abs(float(sim.minibatch_cka(u, v, 32))) < 0.02
  assert float(sim.linear_cka(u[:32], v[:32])) > 0.1


def test_masked_hsic_equals_the_real_rows_alone():
  """Padding rows (mask 0) contribute nothing; < 4 real rows add nothing at all."""
  x, y = _normal(1, (9, 5)), _normal(2, (9, 3))
  mask = jnp.asarray([1, 1, 0, 1, 1, 1, 0, 1, 0], jnp.float32)
  real = np.flatnonzero(np.asarray(mask))
  got = sim.hsic_accumulate(sim.hsic_init(2, 1), [x, y], [y], mask=mask)
  want = sim.hsic_accumulate(sim.hsic_init(2, 1), [x[real], y[real]], [y[real]])
  for k in ("xy", "xx", "yy"):
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
  assert int(got["count"]) == 1
  few = sim.hsic_accumulate(sim.hsic_init(), x, y, mask=jnp.asarray([1.0, 1, 1] + [0] * 6))
  assert int(few["count"]) == 0 and float(few["xy"]) == 0.0 and float(few["xx"]) == 0.0


@pytest.mark.slow
def test_minibatch_cka_matrix():
  x, y = _related(8, 1024)
  z = _normal(3, (1024, 6))
  m = sim.minibatch_cka([x, y, z], [x, y], 128)
  assert m.shape == (3, 2)
  np.testing.assert_allclose(m[0, 0], 1.0, rtol=1e-5)
  np.testing.assert_allclose(m[:2], m[:2].T, rtol=1e-5)
  np.testing.assert_allclose(m[0, 1], sim.minibatch_cka(x, y, 128), rtol=1e-5)
  np.testing.assert_allclose(m[0, 1], sim.linear_cka(x, y), atol=0.03)
  assert abs(float(m[2, 0])) < 0.05
  with pytest.raises(ValueError, match="n >= 4"):
    sim.minibatch_cka(x, y, 3)


# ----------------------------------------------------------------------------
# Layer features and probes.
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_vit():
  model = get_model("vit", num_classes=3, input_shape=(8, 8, 1), patch_size=4,
                    width=16, depth=3, num_heads=2, mlp_dim=16)
  x = _normal(0, (10, 8, 8, 1))
  return model, jax.jit(lambda k: model.init(k, x, train=False))(
      jax.random.key(1)), x


@pytest.mark.slow
def test_layer_features_vit(tiny_vit):
  model, variables, x = tiny_vit
  feats = sim.layer_features(functools.partial(model.apply, train=False), variables, x)
  assert list(feats) == [f"encoderblock_{i}" for i in range(3)]
  assert all(f.shape == (10, 16) for f in feats.values())
  cls = sim.layer_features(functools.partial(model.apply, train=False), variables, x, pooling="cls")
  flat = sim.layer_features(functools.partial(model.apply, train=False), variables, x, pooling="flatten")
  assert flat["encoderblock_0"].shape == (10, 5 * 16)    # CLS + 4 patches.
  tokens = flat["encoderblock_2"].reshape(10, 5, 16)
  np.testing.assert_allclose(cls["encoderblock_2"], tokens[:, 0], rtol=1e-6)
  np.testing.assert_allclose(feats["encoderblock_2"], tokens.mean(1),
                             rtol=1e-5, atol=1e-6)
  m = sim.cka_matrix(list(feats.values()))
  np.testing.assert_allclose(jnp.diag(m), 1.0, rtol=1e-5)
  other = sim.layer_features(functools.partial(model.apply, train=False), variables, x, filter=r"encoder_norm|head")
  assert list(other) == ["encoder_norm", "head"]
  assert other["head"].shape == (10, 3)
  with pytest.raises(ValueError, match="pooling"):
    sim.layer_features(functools.partial(model.apply, train=False), variables, x, pooling="max")


@pytest.mark.slow
def test_layer_features_resnet():
  model = get_model("resnet18", num_classes=3, input_shape=(8, 8, 1),
                    width_multiplier=1 / 16)
  x = _normal(0, (4, 8, 8, 1))
  variables = jax.jit(lambda k: model.init(k, x, train=False))(jax.random.key(0))
  feats = sim.layer_features(functools.partial(model.apply, train=False), variables, x)
  want = [f"stage{s}_block{b}" for s in range(1, 5) for b in (1, 2)]
  assert list(feats) == want
  assert [f.shape[1] for f in feats.values()] == [4, 4, 8, 8, 16, 16, 32, 32]
  with pytest.raises(ValueError, match="cls"):
    sim.layer_features(functools.partial(model.apply, train=False), variables, x, pooling="cls")


@pytest.mark.slow
def test_linear_probe_separable():
  key = jax.random.key(0)
  centers = 6.0 * _normal(1, (4, 20))
  labels = jax.random.randint(key, (200,), 0, 4)
  feats = centers[labels] + _normal(2, (200, 20))
  test_labels = jax.random.randint(jax.random.key(3), (100,), 0, 4)
  test_feats = centers[test_labels] + _normal(4, (100, 20))
  acc = sim.linear_probe_accuracy(feats, labels, test_feats, test_labels)
  assert float(acc) == 1.0
  # Dual (n < d) form and scale invariance give the same probe.
  wide = jnp.concatenate([feats, _normal(5, (200, 300))], axis=1)
  wide_test = jnp.concatenate([test_feats, _normal(6, (100, 300))], axis=1)
  acc_wide = sim.linear_probe_accuracy(wide, labels, wide_test, test_labels)
  assert float(acc_wide) >= 0.95
  w, b = sim.ridge_classifier(feats, labels)
  w2, b2 = sim.ridge_classifier(1e3 * feats, labels)
  np.testing.assert_allclose(1e3 * w2, w, rtol=1e-3, atol=1e-6)
  np.testing.assert_allclose(b2, b, rtol=1e-3, atol=1e-5)
  # Random features cannot predict random labels.
  chance = sim.linear_probe_accuracy(_normal(7, (400, 5)), labels.repeat(2),
                                     _normal(8, (400, 5)),
                                     test_labels.repeat(4), num_classes=4)
  assert float(chance) < 0.45
  per_layer = sim.layerwise_probe_accuracy({"a": feats}, labels,
                                           {"a": test_feats}, test_labels)
  assert float(per_layer["a"]) == 1.0


def test_primal_and_dual_ridge_agree():
  x = _normal(0, (30, 30))
  labels = jnp.arange(30) % 3
  # A zero column makes n < d (dual form) without changing tr(X^T X), so
  # lam = l2 tr / d matches the primal fit with l2 rescaled by d / (d + 1).
  wd, bd = sim.ridge_classifier(jnp.pad(x, ((0, 0), (0, 1))), labels, l2=0.1)
  wp, bp = sim.ridge_classifier(x, labels, l2=0.1 * 30 / 31)
  np.testing.assert_allclose(wd[:30], wp, rtol=1e-3, atol=1e-5)
  np.testing.assert_allclose(bd, bp, rtol=1e-3, atol=1e-5)
  np.testing.assert_allclose(wd[30], 0.0, atol=1e-6)
  assert wp.shape == (30, 3) and bp.shape == (3,)
