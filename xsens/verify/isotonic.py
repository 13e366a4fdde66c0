"""Isotonic regression as a second stagewise problem for the nonconvex solver.

min_z ½‖z − y‖²  s.t.  z_1 ≤ z_2 ≤ … ≤ z_n  is stagewise (arXiv 2010.14322, App. A) with
μ_i = z_{i-1} (convex) and η_i = U (concave), z_1 ∈ [L, U], where L = min y, U = max y
(the solution lies in [L, U]). The reformulation

  z_1 = L + θ_1 (U − L),  z_i = z_{i-1} + θ_i (U − z_{i-1}),  θ ∈ [0, 1]^n

is solved by `xsens.verify.nonconvex.solve`. The dual bound is read off the gradient
g = z − y: with the constraints D z ≥ 0 (D the first differences) the Lagrangian dual is
g(λ) = −½‖Dᵀλ‖² − λᵀ D y for λ ≥ 0, and stationarity z − y = Dᵀλ gives
λ_i = max(0, −Σ_{j<i} g_j). `pava` is the exact pool-adjacent-violators reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xsens.verify import nonconvex

Array = jax.Array


def z_of_theta(theta: Array, lo: Array, hi: Array) -> Array:
  """The monotone sequence z [n] of θ [n] (module doc)."""
  z1 = lo + theta[0] * (hi - lo)

  def step(prev, th):
    z = prev + th * (hi - prev)
    return z, z

  _, rest = jax.lax.scan(step, z1, theta[1:])
  return jnp.concatenate([z1[None], rest])


def dual_bound(z: Array, y: Array) -> Array:
  """g(λ) with λ read off the gradient z − y (module doc)."""
  lam = jnp.maximum(0.0, -jnp.cumsum(z - y)[:-1])        # λ for z_{i+1} − z_i ≥ 0
  dt_lam = jnp.concatenate([-lam[:1], lam[:-1] - lam[1:], lam[-1:]])  # Dᵀλ
  return -0.5 * jnp.sum(dt_lam ** 2) - jnp.sum(lam * jnp.diff(y))


def objective(y: Array, theta: Array) -> tuple[Array, Array, Array]:
  """(½‖z(θ) − y‖², ∂/∂θ, dual bound) for `nonconvex.solve`."""
  lo, hi = jnp.min(y), jnp.max(y)
  def value(th):
    z = z_of_theta(th, lo, hi)
    return 0.5 * jnp.sum((z - y) ** 2), z
  (v, z), g = jax.value_and_grad(value, has_aux=True)(theta)
  return v, g, dual_bound(z, y)


def fit(y: Array, *, method: str = "fista", max_iters: int = 2000, tol: float = 1e-10,
        **solver_options) -> dict:
  """Isotonic regression of y [n] by the nonconvex reformulation.

  Returns `solve`'s dict plus "z" [n], the fitted non-decreasing sequence.
  """
  y = jnp.asarray(y)
  theta0 = jnp.full_like(y, 0.5)
  out = nonconvex.solve(lambda th: objective(y, th), theta0, method=method,
                        max_iters=max_iters, tol=tol, **solver_options)
  out["z"] = z_of_theta(out["theta"], jnp.min(y), jnp.max(y))
  return out


def pava(y) -> np.ndarray:
  """Pool adjacent violators: the exact least-squares non-decreasing fit (float64)."""
  values, weights = [], []
  for v in np.asarray(y, np.float64):
    values.append(v)
    weights.append(1.0)
    while len(values) > 1 and values[-2] > values[-1]:
      w = weights[-2] + weights[-1]
      values[-2] = (values[-2] * weights[-2] + values[-1] * weights[-1]) / w
      weights[-2] = w
      values.pop()
      weights.pop()
  return np.repeat(values, np.asarray(weights, int))
