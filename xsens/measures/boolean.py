"""Fourier–Walsh analysis of functions on the Boolean cube {±1}^n (exact, jittable).

For f: {±1}^n -> R, f(x) = sum_S fhat(S) chi_S(x) with chi_S(x) = prod_{i in S} x_i and
fhat(S) = E_x f(x) chi_S(x), x uniform (O'Donnell, "Analysis of Boolean Functions",
2014, ch. 1). Used by the sensitivity paper's theory ("Larger eigenvalues for
lower-order monomials indicate that simpler features are learned faster … Proposition
2.1 also implies a weak form of low sensitivity bias", Vasudeva et al., ICLR 2025,
arXiv 2403.06925, authors' rebuttal).

Indexing (`all_inputs`, the points `boolean_sensitivity` enumerates for the exact average
sensitivity): input number idx in [0, 2^n) has bit b_i = (idx >> (n - 1 - i)) & 1 for
coordinate i (coordinate 0 is the most significant bit) and x_i = 1 - 2 b_i. A subset S is
indexed by the integer with the same bit layout, so chi_S(x_idx) = (-1)^popcount(idx & S)
and the coefficient vector is the Sylvester–Hadamard transform of the value vector divided
by 2^n.

>>> import jax.numpy as jnp
>>> from xsens.measures import boolean
>>> majority = lambda variables, x: jnp.sign(x.sum(-1))   # {±1}^3 -> {±1}
>>> values = majority(None, boolean.all_inputs(3))        # [2^n] in input order
>>> coeffs = boolean.fourier_coefficients(values)
>>> boolean.degree_spectrum(coeffs).tolist()             # W^k = sum_{|S|=k} fhat(S)^2
[0.0, 0.75, 0.0, 0.25]
>>> float(boolean.fourier_average_sensitivity(coeffs))   # sum_S |S| fhat(S)^2
1.5
>>> bool((boolean.fourier_spectrum(majority, None, 3) == coeffs).all())  # One call.
True
>>> float(boolean.boolean_sensitivity(majority, None, boolean.all_inputs(3))["mean"])
1.5

Every function is pure; n is static (read from the last axis), sizes up to
`MAX_BITS` = 20 (2^20 values).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

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


def _differs(a: Array, b: Array) -> Array:
  """a != b per leading index, any over trailing label axes."""
  ne = a != b
  return jnp.any(ne, axis=tuple(range(1, ne.ndim))) if ne.ndim > 1 else ne


def _boolean_labels(out: Array) -> Array:
  """Function values [M] as they are; logits [M, K] -> argmax [M]."""
  return jnp.argmax(out, axis=-1) if out.ndim == 2 else out


def boolean_sensitivity(
    apply_fn: Callable[[Any, Array], Array],
    variables: Any,
    inputs: Array,
    *,
    labels: Optional[Array] = None,
    key: Optional[Array] = None,
    mask: Optional[Array] = None,
    normalize: bool = False,
) -> dict[str, Array]:
  """Average sensitivity as(f) = E_x sum_i 1[f(x) != f(x^{+i})] at given points.

  as(f) = sum_i Inf_i(f) = sum_S |S| fhat(S)^2 (O'Donnell, "Analysis of
  Boolean Functions", 2014, §2.3). s(f, x) = #{i: f(x) != f(x^{+i})} is
  counted at each row x of inputs (one call of apply_fn on the B * (n + 1)
  points x and x^{+i}); `mean` averages it over the rows. The exact as(f) is
  the mean over `xsens.measures.boolean.all_inputs(n)` (n <= 20); a
  Monte-Carlo estimate the mean over `boolean.random_inputs(key, M, n)`.

  Args:
    apply_fn: (variables, x [M, n] of ±1) -> function values [M] (compared
      exactly, e.g. ±1 labels) or logits [M, K] (compared by argmax).
    variables: passed to apply_fn (any pytree, e.g. None for a plain f).
    inputs: [B, n] points of {±1}^n (any float dtype).
    labels: [B] reference values f(x); default apply_fn's value on inputs.
    key: unused (the points are the caller's); accepted so every measure
      takes the same arguments.
    mask: [B] example mask (bool or weights).
    normalize: divide per_example, mean and stderr by n (the mean influence,
      in [0, 1]); whether the paper normalises is not known.

  Returns:
    dict: per_example [B] s(f, x) (or s / n); mean; stderr (std of
    per_example over valid rows / sqrt(N), ddof 1, as for a uniform sample;
    when inputs enumerate the cube the mean is exact and this is only their
    spread); influence [n] (the weighted share of rows where flipping bit i
    changes f: Pr_x[f(x) != f(x^{+i})] at uniform points, never normalised);
    count (int32 number of valid rows).
  """
  del key
  if inputs.ndim != 2:
    raise ValueError(
        f"inputs must be points [B, n] of {{±1}}^n, got shape "
        f"{tuple(inputs.shape)}.")
  b, n = inputs.shape
  flip = 1 - 2 * jnp.eye(n, dtype=inputs.dtype)                  # [n, n]
  x_flip = (inputs[:, None, :] * flip[None]).reshape(b * n, n)
  if labels is None:
    out = _boolean_labels(apply_fn(variables,
                                   jnp.concatenate([inputs, x_flip], 0)))
    fx, f_flip = out[:b], out[b:]
  else:
    fx, f_flip = jnp.asarray(labels), _boolean_labels(apply_fn(variables,
                                                               x_flip))
  f_flip = f_flip.reshape(b, n, *f_flip.shape[1:])
  diff = jax.vmap(_differs, in_axes=(None, 1), out_axes=1)(fx, f_flip)
  s = diff.sum(-1, dtype=jnp.float32)                            # [B]
  if mask is None:
    mean = s.mean()
    influence = diff.mean(0, dtype=jnp.float32)
    stderr = jnp.std(s, ddof=1 if b > 1 else 0) / math.sqrt(b)
    count = jnp.asarray(b, jnp.int32)
  else:
    w = jnp.asarray(mask).astype(jnp.float32)
    total = jnp.maximum(w.sum(), jnp.finfo(jnp.float32).tiny)
    mean = jnp.sum(w * s) / total
    influence = jnp.sum(w[:, None] * diff, 0) / total
    valid = w > 0
    wn = w / total
    n_f = valid.sum().astype(jnp.float32)
    stderr = jnp.sqrt(n_f / jnp.maximum(n_f - 1.0, 1.0) * jnp.sum(
        jnp.where(valid, wn**2 * (s - mean)**2, 0.0)))
    count = valid.sum(dtype=jnp.int32)
  scale = 1.0 / n if normalize else 1.0
  return dict(per_example=s * scale, mean=mean * scale, stderr=stderr * scale,
              influence=influence, count=count)
