"""The measures run the same with and without `jax.jit`, and a jitted measure traces once
per shape: `chex.assert_max_traces` (big_vision's `utils_test.py` check for recompiles)
around the measure, then new variables, inputs and keys of the same shapes.

Parametrised over measures with `jax.jit` by hand rather than `chex.variants`
(STYLE.md, "Avoid" 8)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens import measures

B, H, W, C, K = 6, 4, 4, 1, 3   # batch, image 4x4x1 (four 2x2 patches), classes


def _apply(variables, inputs):
  """A linear classifier [B, H, W, C] -> logits [B, K] with flax's variable layout."""
  dense = variables["params"]["dense"]
  return inputs.reshape(inputs.shape[0], -1) @ dense["kernel"] + dense["bias"]


def _data(seed: int):
  keys = jax.random.split(jax.random.key(seed), 4)
  variables = {"params": {"dense": {"kernel": jax.random.normal(keys[0], (H * W * C, K)),
                                    "bias": 0.1 * jax.random.normal(keys[1], (K,))}}}
  x = jax.random.uniform(keys[2], (B, H, W, C))
  return variables, x, jnp.argmax(_apply(variables, x), -1), keys[3]


MASK = jnp.asarray([1, 1, 1, 1, 1, 0], jnp.float32)   # The last example is padding.

# Measure -> its keyword arguments beyond labels, key and mask (built per call: the peer's
# variables and the priors are arrays).
MEASURES = {
    "token_sensitivity": lambda: dict(sigma=0.5, num_draws=3, patch_size=2),
    "global_sensitivity": lambda: dict(sigma=0.5, num_draws=3, patch_size=2),
    "scattered_pixel_sensitivity": lambda: dict(sigma=0.5, num_draws=3, num_pixels=4),
    "smooth_token_sensitivity": lambda: dict(sigma=0.5, num_draws=3, patch_size=2),
    "accuracy": dict,
    "fgsm": lambda: dict(epsilon=0.1),
    "pgd": lambda: dict(epsilon=0.1, num_steps=3, step_size=0.05),
    "corruption_accuracy": lambda: dict(name="gaussian_noise", severity=3),
    "weight_noise_accuracy": lambda: dict(relative_scale=0.5, num_draws=2),
    "sharpness": lambda: dict(sigma=0.05, num_draws=2),
    "subgroup_accuracy": lambda: dict(num_classes=K),
    "label_shift_accuracy": lambda: dict(priors=jnp.asarray([0.5, 0.3, 0.2])),
    "prediction_churn": lambda: dict(peer_variables=_data(9)[0]),
}


def _call(fn, variables, x, labels, key, name):
  return fn(_apply, variables, x, labels=labels, key=key, mask=MASK, **MEASURES[name]())


@pytest.mark.parametrize("name", sorted(MEASURES))
def test_with_and_without_jit_the_same_result(name):
  fn = getattr(measures, name)
  variables, x, labels, key = _data(0)
  eager = _call(fn, variables, x, labels, key, name)
  jitted = _call(measures.jit(fn), variables, x, labels, key, name)
  assert jax.tree.structure(eager) == jax.tree.structure(jitted)
  for e, j in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
    np.testing.assert_allclose(np.asarray(j), np.asarray(e), rtol=1e-5, atol=1e-6,
                               err_msg=name)


@pytest.mark.parametrize("name", sorted(MEASURES))
def test_a_jitted_measure_traces_once_for_new_arrays_of_the_same_shapes(name):
  fn = getattr(measures, name)
  once = measures.jit(chex.assert_max_traces(fn, n=1))
  for seed in (0, 1):  # New variables, inputs, labels and key: no second trace.
    jax.block_until_ready(_call(once, *_data(seed), name))
