"""Fourier–Walsh analysis of functions on the Boolean cube {±1}^n (exact, jittable).

For f: {±1}^n -> R, f(x) = sum_S fhat(S) chi_S(x) with chi_S(x) = prod_{i in S} x_i and
fhat(S) = E_x f(x) chi_S(x), x uniform (O'Donnell, "Analysis of Boolean Functions",
2014, ch. 1). Used by the sensitivity paper's theory ("Larger eigenvalues for
lower-order monomials indicate that simpler features are learned faster … Proposition
2.1 also implies a weak form of low sensitivity bias", Vasudeva et al., ICLR 2025,
arXiv 2403.06925, authors' rebuttal).

Indexing (`all_inputs`, the points `xsens.measures.sensitivity.boolean_sensitivity`
enumerates for the exact average sensitivity): input number
idx in [0, 2^n) has bit b_i = (idx >> (n - 1 - i)) & 1 for coordinate i (coordinate 0 is
the most significant bit) and x_i = 1 - 2 b_i. A subset S is indexed by the integer
with the same bit layout, so chi_S(x_idx) = (-1)^popcount(idx & S) and the coefficient
vector is the Sylvester–Hadamard transform of the value vector divided by 2^n.

  coeffs = fourier_coefficients(values)        # values [..., 2^n] in input order
  w = degree_spectrum(coeffs)                  # W^k = sum_{|S|=k} fhat(S)^2, [..., n + 1]
  fourier_average_sensitivity(coeffs)          # sum_S |S| fhat(S)^2
  fourier_spectrum(apply_fn, variables, n)     # coeffs of a model, one call on all_inputs(n)

Every function is pure; n is static (read from the last axis), sizes up to
`MAX_BITS` = 20 (2^20 values).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from xsens import boolean_cube

Array = jax.Array
# The cube's points and monomials, shared with xsens.data.sparse_tokens.
MAX_BITS = boolean_cube.MAX_BITS
all_inputs = boolean_cube.all_inputs
monomial_values = boolean_cube.monomial_values
subset_index = boolean_cube.subset_index


def _num_bits(size: int) -> int:
  n = int(size).bit_length() - 1
  if size < 1 or 2**n != size:
    raise ValueError(f"the last axis must have length 2^n, got {size}.")
  if n > MAX_BITS:
    raise ValueError(f"n={n} > {MAX_BITS} bits is too large for exact enumeration.")
  return n


def random_inputs(key: Array, num_samples: int, n: int, dtype=jnp.float32) -> Array:
  """num_samples uniform points of {±1}^n: [num_samples, n] (Rademacher draws of key)."""
  if not isinstance(n, int) or isinstance(n, bool) or n < 1:
    raise ValueError(f"n must be a positive int, got {n!r}.")
  return jax.random.rademacher(key, (num_samples, n), dtype=dtype)


def walsh_hadamard(values: Array) -> Array:
  """Unnormalised fast Walsh–Hadamard transform over the last axis (length 2^n).

  out[S] = sum_idx values[idx] (-1)^popcount(idx & S): n butterfly passes, O(n 2^n),
  written as reshapes so it traces to n small fused ops (any leading batch axes).
  """
  values = jnp.asarray(values)
  size = values.shape[-1]
  n = _num_bits(size)
  lead = values.shape[:-1]
  x = values.reshape(*lead, *([2] * n))
  for axis in range(n):
    a = len(lead) + axis
    x0 = jax.lax.index_in_dim(x, 0, a, keepdims=True)
    x1 = jax.lax.index_in_dim(x, 1, a, keepdims=True)
    x = jnp.concatenate([x0 + x1, x0 - x1], axis=a)
  return x.reshape(*lead, size)


def fourier_coefficients(values: Array) -> Array:
  """fhat [..., 2^n] from the values [..., 2^n] of f on `all_inputs(n)` (in that order)."""
  values = jnp.asarray(values)
  if not jnp.issubdtype(values.dtype, jnp.floating):
    values = values.astype(jnp.float32)
  return walsh_hadamard(values) / values.shape[-1]


def fourier_spectrum(apply_fn: Callable[[Any, Array], Array], variables: Any, n: int, *,
                     dtype=jnp.float32) -> Array:
  """fhat [2^n] of apply_fn(variables, .): inputs [2^n, n] -> values [2^n] (or [2^n, K]).

  One call on all 2^n points (`all_inputs`), in the measures' calling convention
  (`variables` may be None for a plain function); a multi-output model ([2^n, K], e.g.
  logits) gives [K, 2^n].
  """
  values = jnp.asarray(apply_fn(variables, all_inputs(n, dtype)))
  if values.ndim > 1:
    values = jnp.moveaxis(values, 0, -1)
  return fourier_coefficients(values)


def subset_sizes(n: int) -> np.ndarray:
  """|S| for every subset index S in [0, 2^n): int32 [2^n] (numpy, static)."""
  idx = np.arange(2**n, dtype=np.int64)
  return sum((idx >> j) & 1 for j in range(n)).astype(np.int32) if n else np.zeros(1, np.int32)


def degree_spectrum(coeffs: Array) -> Array:
  """W^k = sum_{|S|=k} fhat(S)^2 for k = 0..n: [..., 2^n] -> [..., n + 1].

  Sums to E[f^2] (Parseval); W^k / sum_k W^k is the spectral sample's degree law.
  """
  coeffs = jnp.asarray(coeffs)
  n = _num_bits(coeffs.shape[-1])
  onehot = jax.nn.one_hot(jnp.asarray(subset_sizes(n)), n + 1, dtype=coeffs.dtype)
  return jnp.square(coeffs) @ onehot


def fourier_average_sensitivity(coeffs: Array, *, normalize: bool = False) -> Array:
  """sum_S |S| fhat(S)^2 over the last axis ([..., 2^n] -> [...]).

  For f: {±1}^n -> {±1} this is the average sensitivity as(f) = E_x #{i: f(x) != f(x^i)}
  (O'Donnell 2014, Thm 2.38), the quantity `boolean_sensitivity` counts directly. For a
  real-valued f it is the total influence sum_i E[(D_i f)^2], D_i f(x) = (f(x^{i->1}) -
  f(x^{i->-1})) / 2. `normalize` divides by n (whether the paper does is not known).
  """
  coeffs = jnp.asarray(coeffs)
  n = _num_bits(coeffs.shape[-1])
  sizes = jnp.asarray(subset_sizes(n), coeffs.dtype)
  total = jnp.square(coeffs) @ sizes
  return total / n if normalize else total

