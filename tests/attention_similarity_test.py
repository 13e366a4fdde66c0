"""Tests for xsens/measures/attention_similarity.py (Reuse Transformers,
docs/papers/google_papers.md §A.1)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.lab import head_similarity
from xsens.measures import attention_similarity as asim
from xsens.models import get_model

jax.config.update("jax_disable_most_optimizations", True)

MNIST = (28, 28, 1)


def _maps(seed, shape=(3, 6, 6)):
  return jax.nn.softmax(3 * jax.random.normal(jax.random.key(seed), shape), axis=-1)


def test_identical_maps_have_similarity_one():
  a = _maps(0)
  np.testing.assert_allclose(asim.similarity(a, a), 1.0, rtol=1e-6)


def test_symmetric_and_in_unit_interval():
  a, b = _maps(0), _maps(1)
  s = asim.similarity(a, b)
  np.testing.assert_allclose(s, asim.similarity(b, a), rtol=1e-6)
  assert np.all(s >= 0) and np.all(s <= 1)
  # Disjoint supports are the minimum.
  eye = jnp.eye(4)
  np.testing.assert_allclose(asim.similarity(eye, jnp.roll(eye, 1, axis=1)), 0.0)


def test_hand_computed_value():
  a = jnp.array([[1.0, 0.0], [0.5, 0.5]])
  b = jnp.array([[0.5, 0.5], [0.5, 0.5]])
  # Row TVs: ½(0.5 + 0.5) = 0.5 and 0; mean 0.25; sim 0.75.
  np.testing.assert_allclose(asim.similarity(a, b), 0.75, rtol=1e-6)


def test_layer_matrix_and_kth_best():
  # Two layers, two heads, one input: layer 1 head 0 copies layer 0 head 1.
  m00, m01, m11 = _maps(0, (1, 5, 5)), _maps(1, (1, 5, 5)), _maps(2, (1, 5, 5))
  maps = jnp.stack([jnp.stack([m00, m01], 1), jnp.stack([m01, m11], 1)])  # [L,B,H,T,T]
  hs = np.asarray(asim.head_similarity(maps))
  assert hs.shape == (2, 2, 2, 2)
  np.testing.assert_allclose(hs, hs.transpose(2, 3, 0, 1), rtol=1e-6)
  layer = asim.layer_similarity(hs)
  np.testing.assert_allclose(np.diag(layer), 1.0, rtol=1e-6)
  s_11_prev = max(float(asim.similarity(m11, m00)[0]), float(asim.similarity(m11, m01)[0]))
  np.testing.assert_allclose(layer[1, 0], (1.0 + s_11_prev) / 2, rtol=1e-5)
  kth = asim.adjacent_kth_best(hs)
  assert kth.shape == (1, 2, 2)
  np.testing.assert_allclose(kth[0, 0, 0], 1.0, rtol=1e-6)
  assert np.all(np.diff(kth, axis=-1) <= 1e-7)


@pytest.mark.slow
def test_collect_over_dataset_on_random_and_reuse_models():
  images = np.asarray(jax.random.normal(jax.random.key(0), (7, *MNIST)))
  kwargs = dict(patch_size=7, width=16, depth=3, num_heads=2, mlp_dim=32)
  vit = get_model("vit", 10, MNIST, **kwargs)
  variables = vit.init(jax.random.key(1), images[:1])
  apply_fn = functools.partial(vit.apply, train=False)
  hs = head_similarity.collect_head_similarity(apply_fn, variables, images, batch_size=4)
  assert hs.shape == (3, 2, 3, 2)
  assert np.all((hs >= -1e-6) & (hs <= 1 + 1e-6))
  # Batch-wise mean equals the mean over the whole set.
  full = asim.head_similarity(jnp.stack(asim.attention_maps(apply_fn, variables, images)))
  np.testing.assert_allclose(hs, full, rtol=1e-5, atol=1e-6)
  # The per-batch measure: masked mean and count, composable in a caller's jit.
  mask = jnp.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
  out = jax.jit(asim.batch_head_similarity, static_argnums=0)(
      apply_fn, variables, images, mask=mask)
  assert float(out["count"]) == 3.0
  sub = asim.head_similarity(jnp.stack(asim.attention_maps(apply_fn, variables,
                                                           images[np.array([0, 1, 3])])))
  np.testing.assert_allclose(out["head_similarity"], sub, rtol=1e-5, atol=1e-6)

  reuse = get_model("reuse_vit", 10, MNIST, reuse_heads=-1, reuse_layers=1, **kwargs)
  rv = reuse.init(jax.random.key(1), images[:1])
  layer = asim.layer_similarity(head_similarity.collect_head_similarity(
      functools.partial(reuse.apply, train=False), rv, images))
  np.testing.assert_allclose(layer[1, 0], 1.0, rtol=1e-5)   # layer 1 copies layer 0
