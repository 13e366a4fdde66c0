"""Points and monomials of the Boolean cube {±1}^n in one index order (pure, jittable).

Shared by `xsens.data.sparse_tokens` (which encodes every cube point as tokens) and
`xsens.measures.boolean` (which re-exports these names and computes Fourier spectra in the
same order), so that neither package imports the other.

Indexing: input number idx in [0, 2^n) has bit b_i = (idx >> (n - 1 - i)) & 1 for
coordinate i (coordinate 0 is the most significant bit) and x_i = 1 - 2 b_i. A subset S
of coordinates is indexed by the integer with the same bit layout.
"""

from __future__ import annotations

from typing import Iterable

import jax
import jax.numpy as jnp

Array = jax.Array
MAX_BITS = 20


def all_inputs(n: int, dtype=jnp.float32) -> Array:
  """Every point of {±1}^n in index order: [2^n, n], row idx has x_i = 1 - 2 bit_i(idx)."""
  if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_BITS:
    raise ValueError(f"n must be an int in [1, {MAX_BITS}], got {n!r}.")
  idx = jnp.arange(2**n, dtype=jnp.int32)
  shifts = jnp.arange(n - 1, -1, -1, dtype=jnp.int32)
  bits = (idx[:, None] >> shifts[None, :]) & 1
  return (1 - 2 * bits).astype(dtype)


def subset_index(n: int, coords: Iterable[int]) -> int:
  """The index of the subset S = coords (0-based coordinates) in the coefficient vector."""
  out = 0
  for i in coords:
    if not 0 <= int(i) < n:
      raise ValueError(f"coordinate {i} is outside [0, {n}).")
    out |= 1 << (n - 1 - int(i))
  return out


def monomial_values(n: int, coords: Iterable[int], dtype=jnp.float32) -> Array:
  """chi_S on all_inputs(n): [2^n] of ±1 (S = coords; the empty set gives ones)."""
  x = all_inputs(n, dtype)
  out = jnp.ones((2**n,), dtype)
  for i in coords:
    out = out * x[:, int(i)]
  return out
