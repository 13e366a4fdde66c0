"""Cao et al.'s two-layer CNN with polynomial ReLU (NeurIPS 2022, arXiv 2202.06526), pure functions.

  f(W, X) = F_{+1}(W_{+1}, X) − F_{−1}(W_{−1}, X),
  F_j(W_j, X) = (1/m) Σ_{r=1..m} Σ_{p=1..M} σ(⟨w_{j,r}, x_p⟩),   σ(z) = max(0, z)^q

(docs/papers/benign_overfitting.md §8; q > 2 in the paper, q = 1 is Kou et al.'s ReLU case). The
second layer is fixed at ±1/m, so the trained pytree is just {"w": [2, m, d]} (row 0 = class +1
filters); the frozen part is None. w_{j,r}^(0) ~ N(0, σ_0² I).

`TwoLayerCNN` is the same model as a flax.linen module (params {"w": [2, m, d]}), the
registry's "two_layer_cnn"; the sweeps use the pure functions, which vmap without ceremony.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from xsens.errors import ConfigError
from xsens.models import _checks
from xsens.models import precision


def init(key, d: int, m: int, *, sigma_0: float = 0.01):
  """Returns (params {"w": [2, m, d]}, None)."""
  return {"w": sigma_0 * jax.random.normal(key, (2, m, d), jnp.float32)}, None


def poly_relu(z, q: float):
  """max(0, z)^q."""
  return jnp.maximum(z, 0.0) ** q


def apply(params, frozen, x, *, q: float = 3.0):
  """f for x [..., M, d] -> [...]."""
  del frozen
  w = params["w"]
  z = jnp.einsum("...pd,jrd->...jrp", x, w)  # [..., 2, m, M]
  f = poly_relu(z, q).sum(axis=-1).mean(axis=-1)  # [..., 2]
  return f[..., 0] - f[..., 1]


class TwoLayerCNN(nn.Module):
  """f(W, X) of the module docstring: x [B, M, d] -> f [B] (one score; the label is its sign).

  Params {"w": [2, m, d]} ~ N(0, sigma_0²), as `init`; `apply` computes the output in the
  compute dtype `dtype` ("float32" | "bfloat16", `xsens.models.precision`; params and f
  float32).
  """
  m: int = 10
  q: float = 3.0
  sigma_0: float = 0.01
  dtype: str = "float32"

  def check_input(self, input_shape) -> None:
    """Raises ConfigError for settings impossible on inputs of per-example shape (M, d)."""
    _checks.tokens(input_shape)
    _checks.positive_int("m", self.m)
    _checks.positive_float("q", self.q)
    if self.q < 1:
      raise ConfigError("model.q", f"must be >= 1; got {self.q!r}")
    _checks.positive_float("sigma_0", self.sigma_0)
    _checks.dtype(self.dtype)

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train  # No dropout, no batch statistics.
    w = self.param("w", lambda k, s: self.sigma_0 * jax.random.normal(k, s, jnp.float32),
                   (2, self.m, x.shape[-1]))
    dt = precision.compute_dtype(self.dtype)
    out = apply({"w": precision.cast(w, dt)}, None, precision.cast(x, dt), q=self.q)
    return out.astype(jnp.float32)
