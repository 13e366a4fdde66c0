"""Tests for xsens/measures/smooth_sensitivity.py: gradients, chunking, masks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.sensitivity_test import KEY, mlp_apply, mlp_params, random_tokens, token0_model
from xsens.measures import smooth_sensitivity

jax.config.update("jax_disable_most_optimizations", True)


@pytest.mark.parametrize("norm,on,chunk_size", [
    ("l2", "logits", None), ("l1", "probs", 3), ("sq_l2", "logits", 7)])
@pytest.mark.slow
def test_smooth_gradient_matches_finite_difference(norm, on, chunk_size):
  with jax.enable_x64(True):
    params = jax.tree.map(lambda a: a.astype(jnp.float64),
                          mlp_params(jax.random.key(21), 5, 4))
    tok = random_tokens(22).astype(jnp.float64)

    @jax.jit
    def loss(scale, x):
      v = dict(params, w2=params["w2"] * scale)      # Gradient via variables.
      return smooth_sensitivity.smooth_token_sensitivity(
          mlp_apply, v, x, key=KEY, sigma=0.5, num_draws=3, norm=norm, on=on,
          chunk_size=chunk_size)["mean"]

    value, (g_scale, g_tok) = jax.jit(jax.value_and_grad(loss, (0, 1)))(
        1.3, tok)
    h = 1e-5
    fd = (loss(1.3 + h, tok) - loss(1.3 - h, tok)) / (2 * h)
    assert float(value) > 0
    np.testing.assert_allclose(g_scale, fd, rtol=1e-6, atol=1e-9)
    direction = jax.random.normal(jax.random.key(23), tok.shape, jnp.float64)
    fd_tok = (loss(1.3, tok + h * direction) -
              loss(1.3, tok - h * direction)) / (2 * h)
    np.testing.assert_allclose(jnp.vdot(g_tok, direction), fd_tok, rtol=1e-6,
                               atol=1e-9)


@pytest.mark.slow
def test_smooth_variant_chunking_masking_and_zero():
  tok = random_tokens(24)
  params = mlp_params(jax.random.key(25), 5, 4)

  @jax.jit
  def run(v, x, key):
    sts = lambda f, **kw: smooth_sensitivity.smooth_token_sensitivity(f, v, x, key=key, **kw)
    return (sts(mlp_apply, sigma=1.0, num_draws=4, chunk_size=None),
            sts(mlp_apply, sigma=1.0, num_draws=4, chunk_size=7),
            # One copy per call: the perturbed forward has the clean one's batch
            # size (B * T * R copies in one call may round differently: ~3e-7).
            sts(mlp_apply, sigma=0.0, num_draws=2, chunk_size=1),
            sts(token0_model, sigma=1.0, num_draws=2,
                token_mask=jnp.arange(5) > 0))

  unchunked, chunked, zero, masked = run(params, tok, KEY)
  assert float(unchunked["mean"]) > 0
  np.testing.assert_allclose(unchunked["mean"], chunked["mean"], rtol=1e-5)
  assert float(zero["mean"]) == 0.0 and float(masked["mean"]) == 0.0
  np.testing.assert_array_equal(masked["per_token"][:, 1:], 0.0)
  assert unchunked["per_token"].shape == (3, 5)
  np.testing.assert_allclose(unchunked["per_example"],
                             unchunked["per_token"].mean(-1), rtol=1e-6)
  np.testing.assert_allclose(unchunked["mean"],
                             unchunked["per_example"].mean(), rtol=1e-6)
  padded = jax.jit(lambda v, x, key: smooth_sensitivity.smooth_token_sensitivity(
      mlp_apply, v, x, key=key, sigma=1.0, num_draws=4, chunk_size=None,
      mask=jnp.array([1.0, 1.0, 0.0])))(params, tok, KEY)
  np.testing.assert_allclose(padded["mean"],
                             unchunked["per_example"][:2].mean(), rtol=1e-6)
  with pytest.raises(ValueError, match="norm"):
    smooth_sensitivity.smooth_token_sensitivity(mlp_apply, params, tok, key=KEY, sigma=1.0,
                                                num_draws=2, norm="linf")
