"""Cao et al.'s two-layer CNN with polynomial ReLU (NeurIPS 2022, arXiv 2202.06526), pure functions.

  f(W, X) = F_{+1}(W_{+1}, X) − F_{−1}(W_{−1}, X),
  F_j(W_j, X) = (1/m) Σ_{r=1..m} Σ_{p=1..M} σ(⟨w_{j,r}, x_p⟩),   σ(z) = max(0, z)^q

(spec §8; q > 2 in the paper, q = 1 is Kou et al.'s ReLU case). The second layer is fixed
at ±1/m, so the trained pytree is just {"w": [2, m, d]} (row 0 = class +1 filters); the
frozen part is None. w_{j,r}^(0) ~ N(0, σ_0² I).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
