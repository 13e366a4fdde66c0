"""Empirical NTK at initialisation on the Boolean cube and its Walsh (monomial) spectrum.

The object of the sensitivity paper's weak spectral bias (Prop. 2.1 in the ICLR numbering;
Vasudeva et al., ICLR 2025, arXiv 2403.06925): the NTK of a linear-attention transformer on
{±1}^n, compared across degrees of the multilinear monomials chi_S(x) = prod_{i in S} x_i.
The paper's model, embedding and exact statement are not known here (docs/results.md,
"Weak spectral bias (Prop. 2.1)"); this module measures one well-defined instance, exactly
over all 2^n inputs.

**Kernel.** For f_theta: {±1}^n -> R (one scalar output),

  K(x, x') = <df(x)/dtheta, df(x')/dtheta>      (Jacot et al. 2018, arXiv 1806.07572)

over every trainable leaf, K [N, N] for the N inputs. `empirical_ntk` (a measure in the
shared calling convention, returning {"kernel": K}) takes per-example reverse-mode
gradients (vmap of `jax.grad`, i.e. the rows of `jax.jacrev`) and contracts them leaf by
leaf (the "jacobian contraction" of Novak et al. 2022, "Fast finite width neural tangent
kernel", arXiv 2206.08720).

**Walsh spectrum.** On the cube, L^2 of the uniform law has the orthonormal basis
{chi_S}; the kernel's integral operator (T g)(x) = E_x' K(x, x') g(x') has, in that basis,
the matrix

  Khat[S, S'] = <chi_S, T chi_S'> = chi_S^T K chi_S' / 2^{2n}       (`walsh_kernel`)

with K on `all_inputs(n)` (xsens.boolean_cube order; subsets indexed as there). Its
diagonal lambda_S = Khat[S, S] is the eigenvalue of chi_S when Khat is diagonal, which
holds exactly for any kernel K(x, x') = Phi(<x, x'>) (Yang & Salman 2019, "A fine-grained
spectral perspective on neural networks", arXiv 1907.10599) but not in general;
`walsh_degree_spectrum` reports how far from diagonal Khat is. sum_S lambda_S =
tr(K) / 2^n, and ||Khat||_F^2 = sum of the operator's squared eigenvalues (the matrix K has
eigenvalues 2^n times the operator's).

**Models** (plain-pytree parameters, all N(0, 1); NTK parametrisation, i.e. every
matmul divided by the square root of its fan-in, so the kernel has a limit as width ->
infinity). Tokens: coordinate t of x becomes

  e_t = [x_t ; position_scale * onehot_t]  in R^d,  d = n + 1            (`boolean_tokens`)

fixed, not trained: the embedding the repository's Boolean spectral-bias experiment uses
(`xsens.data.sparse_tokens.boolean_tokens`), so token Gram entries are
<e_t(x), e_s(x')> = x_t x'_s + position_scale^2 [t = s] and the only randomness is the
initialisation. Fixed embeddings keep the kernel's infinite-width limit a function of the
input alone.

* `linear_attention_model`: one layer of H heads of head dimension m, no softmax,

    q_{h,t} = W_Q^h^T e_t / sqrt(d),  k_{h,s} = W_K^h^T e_s / sqrt(d),
    v_{h,s} = W_V^h^T e_s / sqrt(d)                               (W^h: [d, m])
    a_{h,ts} = q_{h,t} . k_{h,s} / sqrt(m)
    f(x) = sum_h u_h . mean_t mean_s a_{h,ts} v_{h,s} / sqrt(H m)  (u_h: [m])

  i.e. per head u . mean_t (sum_s (e_t W_Q)(e_s W_K)^T e_s W_V), times the fan-in
  factors and 1/n. This is the linear (softmax-free) self-attention of von Oswald et al.
  2023 (arXiv 2212.07677) and Zhang, Frei & Bartlett 2023 (arXiv 2306.09927), whose 1/n
  over the keys we keep (a sum instead of a mean multiplies K by n^2), with a linear
  readout u. Scores use the standard 1/sqrt(m): they stay O(1) and random as m grows
  (with 1/m, the scores of independent W_Q, W_K tend to 0 by the law of large numbers),
  so one head's NTK stays random at any head dimension, while averaging over H -> infinity
  heads makes it deterministic; this many-heads limit is the one Hron et al. 2020
  ("Infinite attention: NNGP and NTK for deep attention networks", arXiv 2006.10540) take
  under this scaling. Width = H m. Because x_s^2 = 1, f and every gradient coordinate are
  multilinear polynomials of degree <= 2 in x (x_s enters each term twice, through k_s
  and v_s, and x_t once), so lambda_S = 0 exactly for |S| >= 3, for any embedding of
  this form (a token embedding E[x_t] of two vectors is affine in x_t).
* `relu_mlp_model`: the comparison, `depth` hidden ReLU layers of width W on the
  flattened tokens (dimension n d), f = u . h_depth / sqrt(W), h_l = relu(W_l h_{l-1} /
  sqrt(fan_in)); no biases (the constant position coordinates play that part). Its
  infinite-width NTK is a function of <x, x'> alone (the token norms are constant), so in
  expectation its Walsh matrix is exactly diagonal (Yang & Salman 2019).

Every function is pure; the spectrum functions are jittable (n static from the shapes);
`init_ntks` maps over initialisation keys (one kernel at a time in memory per key).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from xsens import boolean_cube
from xsens.measures import boolean

Array = jax.Array
InitFn = Callable[[Array], Any]
ApplyFn = Callable[[Any, Array], Array]


def boolean_tokens(x: Array, position_scale: float = 1.0) -> Array:
  """Tokens e_t = [x_t ; position_scale * onehot_t]: x [..., n] -> [..., n, n + 1]."""
  x = jnp.asarray(x)
  n = x.shape[-1]
  pos = position_scale * jnp.eye(n, dtype=x.dtype)
  pos = jnp.broadcast_to(pos, (*x.shape[:-1], n, n))
  return jnp.concatenate([x[..., None], pos], axis=-1)


def linear_attention_model(n: int, *, heads: int, head_dim: int,
                           position_scale: float = 1.0) -> tuple[InitFn, ApplyFn]:
  """(init_fn(key) -> params, apply_fn(params, x [B, n]) -> f [B]) of the one-layer,
  H-head linear attention in the module docstring; params {"query", "key", "value":
  [H, d, m], "readout": [H, m]}, d = n + 1, m = head_dim, all N(0, 1)."""
  d = n + 1

  def init_fn(key: Array) -> dict[str, Array]:
    kq, kk, kv, ku = jax.random.split(key, 4)
    shape = (heads, d, head_dim)
    return {"query": jax.random.normal(kq, shape), "key": jax.random.normal(kk, shape),
            "value": jax.random.normal(kv, shape),
            "readout": jax.random.normal(ku, (heads, head_dim))}

  def apply_fn(params: dict[str, Array], x: Array) -> Array:
    e = boolean_tokens(jnp.asarray(x, params["query"].dtype), position_scale)
    q = jnp.einsum("btd,hdm->bhtm", e, params["query"]) / math.sqrt(d)
    k = jnp.einsum("btd,hdm->bhtm", e, params["key"]) / math.sqrt(d)
    v = jnp.einsum("btd,hdm->bhtm", e, params["value"]) / math.sqrt(d)
    scores = jnp.einsum("bhtm,bhsm->bhts", q, k) / math.sqrt(head_dim)
    out = jnp.einsum("bhts,bhsm->bhm", scores, v) / (n * n)
    return jnp.einsum("bhm,hm->b", out, params["readout"]) / math.sqrt(heads * head_dim)

  return init_fn, apply_fn


def relu_mlp_model(n: int, *, width: int, depth: int = 1,
                   position_scale: float = 1.0) -> tuple[InitFn, ApplyFn]:
  """(init_fn, apply_fn(params, x [B, n]) -> f [B]) of a ReLU MLP on the flattened tokens
  (n (n + 1) inputs), `depth` hidden layers of `width`, NTK parametrisation, no biases;
  params {"hidden": [[fan_in, width]] * depth, "readout": [width]}."""
  fan_in = n * (n + 1)

  def init_fn(key: Array) -> dict[str, Any]:
    keys = jax.random.split(key, depth + 1)
    sizes = [fan_in] + [width] * depth
    hidden = [jax.random.normal(keys[i], (sizes[i], width)) for i in range(depth)]
    return {"hidden": hidden, "readout": jax.random.normal(keys[-1], (width,))}

  def apply_fn(params: dict[str, Any], x: Array) -> Array:
    h = boolean_tokens(jnp.asarray(x, params["readout"].dtype), position_scale)
    h = h.reshape(*h.shape[:-2], fan_in)
    for w in params["hidden"]:
      h = jax.nn.relu(h @ w / math.sqrt(w.shape[0]))
    return h @ params["readout"] / math.sqrt(width)

  return init_fn, apply_fn


def num_params(params: Any) -> int:
  """Number of scalars in a parameter pytree."""
  return int(sum(np.prod(np.shape(leaf)) for leaf in jax.tree_util.tree_leaves(params)))


def _trainable(variables: Any) -> tuple[Any, Callable[[Any], Any]]:
  if isinstance(variables, dict) and "params" in variables:
    return variables["params"], lambda p: {**variables, "params": p}
  return variables, lambda p: p


def empirical_ntk(apply_fn: ApplyFn, variables: Any, inputs: Array, *,
                  labels: Array | None = None, key: Array | None = None,
                  mask: Array | None = None) -> dict[str, Array]:
  """{"kernel": K [N, N]}, K[a, b] = <df(inputs[a])/dtheta, df(inputs[b])/dtheta>.

  apply_fn(variables, inputs [B, ...]) -> [B] or [B, 1] (one scalar per example). theta is
  `variables["params"]` when `variables` is a dict with that key (a linen tree; other
  collections are held fixed), else the whole pytree. Per-example gradients [N, P] are
  formed leaf by leaf (memory N x the largest leaf), in the parameters' dtype. `mask` [N]
  zeroes the rows and columns of padding examples; `labels` and `key` are unused (the
  kernel needs neither) and accepted for the measures' shared calling convention.
  """
  del labels, key
  params, rebuild = _trainable(variables)
  inputs = jnp.asarray(inputs)

  def one(p, x):
    out = apply_fn(rebuild(p), x[None])
    if out.size != 1:
      raise ValueError(f"apply_fn must give one scalar per example, got shape {out.shape} "
                       "for one input.")
    return out.reshape(())

  grads = jax.vmap(jax.grad(one), in_axes=(None, 0))(params, inputs)
  num = inputs.shape[0]
  kernel = 0.0
  for g in jax.tree_util.tree_leaves(grads):
    g = g.reshape(num, -1)
    kernel = kernel + g @ g.T
  if mask is not None:
    m = jnp.asarray(mask, kernel.dtype)
    kernel = kernel * m[:, None] * m[None, :]
  return {"kernel": kernel}


def init_ntks(init_fn: InitFn, apply_fn: ApplyFn, inputs: Array, keys: Array) -> Array:
  """The empirical NTK at the initialisation of each key: [R, N, N] for keys [R, ...].

  One initialisation at a time (`lax.map`), so memory holds one set of per-example
  gradients. Jittable with init_fn / apply_fn static.
  """
  inputs = jnp.asarray(inputs)
  return jax.lax.map(lambda k: empirical_ntk(apply_fn, init_fn(k), inputs)["kernel"], keys)


def walsh_kernel(kernel: Array) -> Array:
  """Khat [..., 2^n, 2^n], Khat[S, S'] = chi_S^T K chi_S' / 2^{2n}, for K [..., 2^n, 2^n]
  on `all_inputs(n)`: the kernel operator in the orthonormal monomial basis."""
  kernel = jnp.asarray(kernel)
  size = kernel.shape[-1]
  if kernel.shape[-2] != size:
    raise ValueError(f"the kernel must be square, got shape {kernel.shape}.")
  out = boolean.walsh_hadamard(kernel)                     # K H over the last axis
  out = boolean.walsh_hadamard(jnp.swapaxes(out, -1, -2))  # (K H)^T H = H K H
  return jnp.swapaxes(out, -1, -2) / (size * size)


def walsh_diagonal(kernel: Array) -> Array:
  """lambda_S = chi_S^T K chi_S / 2^{2n}: [..., 2^n] for K [..., 2^n, 2^n]."""
  return jnp.diagonal(walsh_kernel(kernel), axis1=-2, axis2=-1)


def degree_masks(n: int) -> np.ndarray:
  """bool [n + 1, 2^n]: row k marks the subsets S with |S| = k (numpy, static)."""
  return boolean.subset_sizes(n)[None, :] == np.arange(n + 1)[:, None]


def walsh_degree_spectrum(kernel: Array) -> dict[str, Array]:
  """The Walsh diagonal of K [2^n, 2^n] and its summary per degree |S| = k = 0..n.

  Returns
    walsh_diagonal [2^n]: lambda_S (subset order of `boolean_cube.subset_index`);
    degree_mean, degree_min, degree_max [n + 1]: over the C(n, k) subsets of size k;
    degree_sum [n + 1]: sum_{|S|=k} lambda_S (the trace of the degree-k block);
    trace []: sum_S lambda_S = tr(K) / 2^n;
    offdiag_mass []: sum_{S != S'} Khat^2 / sum Khat^2 (0 iff Khat is diagonal);
    cross_degree_mass []: the same sum over |S| != |S'| only (0 iff no degree mixes);
    spectrum_captured []: sum_S lambda_S^2 / sum of the operator's squared eigenvalues
      (= 1 - offdiag_mass; 1 iff the monomials are its eigenfunctions).
  Pure and jittable; vmap for a stack of kernels.
  """
  khat = walsh_kernel(kernel)
  size = khat.shape[-1]
  n = size.bit_length() - 1
  lam = jnp.diagonal(khat)
  masks = jnp.asarray(degree_masks(n))
  counts = masks.sum(-1)
  sq = jnp.square(khat)
  total = sq.sum()
  diag_sq = jnp.square(lam).sum()
  sizes = jnp.asarray(boolean.subset_sizes(n))
  cross = jnp.where(sizes[:, None] != sizes[None, :], sq, 0.0).sum()
  return {
      "walsh_diagonal": lam,
      "degree_mean": (masks * lam).sum(-1) / counts,
      "degree_min": jnp.where(masks, lam, jnp.inf).min(-1),
      "degree_max": jnp.where(masks, lam, -jnp.inf).max(-1),
      "degree_sum": (masks * lam).sum(-1),
      "trace": lam.sum(),
      "offdiag_mass": (total - diag_sq) / total,
      "cross_degree_mass": cross / total,
      "spectrum_captured": diag_sq / total,
  }


def monomial_matrix(n: int) -> np.ndarray:
  """chi [2^n, 2^n] float64, chi[idx, S] = chi_S(x_idx) (`all_inputs` and subset order)."""
  idx = np.arange(2**n, dtype=np.int64)
  both = idx[:, None] & idx[None, :]
  parity = sum((both >> j) & 1 for j in range(n)) & 1 if n else np.zeros_like(both)
  return 1.0 - 2.0 * parity


def degree_block_eigenvalues(kernel: Array) -> list[np.ndarray]:
  """Eigenvalues (descending) of each within-degree block Khat[|S|=k, |S'|=k], k = 0..n.

  The operator's eigenvalues on the span of the degree-k monomials when no degree mixes
  (`cross_degree_mass` = 0): a kernel invariant to permuting coordinates but not to
  flipping one coordinate's sign can mix the monomials of one degree, so its degree-k
  block need not be diagonal. Host-side, in float64: a list of n + 1 arrays of C(n, k)
  values.
  """
  kernel = np.asarray(kernel, np.float64)
  size = kernel.shape[-1]
  if kernel.shape != (size, size):
    raise ValueError(f"the kernel must be one square matrix, got shape {kernel.shape}.")
  n = size.bit_length() - 1
  chi = monomial_matrix(n)
  khat = chi.T @ kernel @ chi / float(size * size)
  out = []
  for mask in degree_masks(n):
    block = khat[np.ix_(mask, mask)]
    out.append(np.linalg.eigvalsh((block + block.T) / 2)[::-1])
  return out


def ntk_degree_spectrum(init_fn: InitFn, apply_fn: ApplyFn, n: int, keys: Array,
                        ) -> dict[str, Array]:
  """The NTK at initialisation over all 2^n inputs, per key and averaged, by degree.

  keys [R, ...]: R initialisations. Returns `walsh_degree_spectrum` of every per-key kernel
  (each value with a leading [R] axis, prefix "seed_") and of their mean kernel (no
  prefix), plus "kernel" [2^n, 2^n], the mean NTK. Jittable with init_fn / apply_fn static.
  """
  inputs = boolean_cube.all_inputs(n)
  kernels = init_ntks(init_fn, apply_fn, inputs, keys)
  per_seed = jax.vmap(walsh_degree_spectrum)(kernels)
  mean_kernel = kernels.mean(0)
  out = {"seed_" + k: v for k, v in per_seed.items()}
  out.update(walsh_degree_spectrum(mean_kernel))
  out["kernel"] = mean_kernel
  return out
