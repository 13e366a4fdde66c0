"""Eigen-analysis of attention scores and their reconstruction from partial computation.

Bhojanapalli, Chakrabarti, Jain, Kumar, Lukasik, Veit (2021), "Eigen Analysis of
Self-Attention and its Reconstruction from Partial Computation", arXiv 2106.08823
(docs/papers/google_papers.md §C). The abstract's claims: most variation of the attention scores,
of whole matrices and of single rows, lies in a low-dimensional eigenspace; these eigenspaces
overlap across layers and models; scores on a subset of token pairs suffice to estimate the rest.
The definitions below are our reconstruction (not confirmed from the paper):

- score row: a ∈ R^T, the logits q_i·k_j/√d_h of one query i over the T keys (or the
  softmax probabilities); one sample per (example, head, query) of a layer;
- score matrix: the T×T logits of one (example, head), vectorised (T² entries; pooled
  over the heads of a layer); `matrix_tokens` keeps a strided subset of t tokens (t² dims);
- PCA: eigenvalues λ_1 ≥ … of the covariance; explained variance at k = Σ_{i≤k} λ_i / Σ λ_i;
- subspace overlap of orthonormal U_a, U_b ∈ R^{T×k}: ‖U_aᵀU_b‖_F² / k ∈ [0, 1]
  (1 for the same subspace, k/T in expectation for a uniformly random one);
- partial computation: exact scores on m keys S, c = argmin ‖U_S c − (a_S − μ_S)‖,
  â = μ + U c, exact on S (`xsens.models.eigen_vit.reconstruct_logits`); errors: score MSE
  over all T² entries, and the total-variation distance ½‖softmax(â) − softmax(a)‖₁ per row.

Scores are read from any registered transformer without changing it: flax
`capture_intermediates` records the outputs [B, T, H, d_h] of each attention module's
`query` and `key` projections (ViT `MultiHeadDotProductAttention_0`, ReuseViT and RoBERTa
`attention`), and the logits are q·k/√d_h (ViT "lsa" attention scales differently; a
ReuseViT layer's reused heads have no query and are not seen). `apply_fn` is a flax apply
in eval mode that forwards `capture_intermediates` and `mutable`, e.g.
`TrainResult.apply_fn`. For integer inputs (token ids) keys equal to the pad id 0 are
masked out of the probabilities.

Streaming: `score_moments` returns one batch's moments (count, mean, centred second
moment M2) per layer; `merge_moments` combines two (Chan et al.'s pairwise update), so a
dataset's covariance is accumulated without ever holding N×H×T×T scores.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from xsens import choices
from xsens.models import eigen_vit

SUBSET_RULES = choices.SUBSET_RULES
SCORE_KINDS = ("logits", "centered_logits", "probs")
_QK = ("query", "key")


def _capture_qk(mdl, method_name) -> bool:
  return method_name == "__call__" and mdl.name in _QK


def attention_logits(apply_fn, variables, inputs) -> list[jax.Array]:
  """Per-layer attention logits q·k/√d_h of one batch, in layer order.

  Args:
    apply_fn: flax apply in eval mode forwarding `capture_intermediates` and `mutable`.
    variables: its variables.
    inputs: [B, ...] inputs.

  Returns:
    A list of float32 [B, H, T, T] arrays, one per attention module that has a query.
  """
  _, state = apply_fn(variables, inputs, capture_intermediates=_capture_qk,
                      mutable=["intermediates"])
  found: dict[tuple, dict] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]:
    keys = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
    proj = next((k for k in keys if k in _QK), None)
    if proj is None:
      continue
    parent = tuple(keys[:keys.index(proj)])
    found.setdefault(parent, {})[proj] = leaf
  order = sorted(found, key=lambda p: (tuple(int(n) for k in p for n in re.findall(r"\d+", k)),
                                       p))
  out = []
  for parent in order:
    q, k = found[parent]["query"], found[parent]["key"]
    q = q.astype(jnp.float32) / jnp.sqrt(jnp.float32(q.shape[-1]))
    out.append(jnp.einsum("bqhd,bkhd->bhqk", q, k.astype(jnp.float32)))
  return out


def key_mask(inputs) -> jax.Array | None:
  """[B, T] bool valid keys for token ids (id != 0), None for other inputs."""
  if jnp.issubdtype(inputs.dtype, jnp.integer) and inputs.ndim == 2:
    return inputs != 0
  return None


def probabilities(logits, keys_valid=None):
  """Softmax over keys of [B, H, T, T] logits, padded keys (keys_valid [B, T]) masked."""
  if keys_valid is not None:
    logits = jnp.where(keys_valid[:, None, None], logits, jnp.finfo(logits.dtype).min)
  return jax.nn.softmax(logits, axis=-1)


def centered(logits, keys_valid=None):
  """Logit rows minus their mean over the (valid) keys: the part of [..., B, H, T, T]
  logits the softmax sees (adding a constant to a row leaves its probabilities unchanged).
  Padded keys (keys_valid [B, T]) become 0."""
  if keys_valid is None:
    return logits - logits.mean(-1, keepdims=True)
  w = keys_valid[:, None, None].astype(logits.dtype)
  mean = (logits * w).sum(-1, keepdims=True) / jnp.maximum(w.sum(-1, keepdims=True), 1.0)
  return (logits - mean) * w


# ----------------------------------------------------------------------------- moments


def batch_moments(x, weights=None) -> dict[str, jax.Array]:
  """Moments of samples x [N, ..., D] with weights [N] (None: 1).

  Returns:
    {"count": scalar Σw, "mean": [..., D], "m2": [..., D, D] Σ w (x − mean)(x − mean)ᵀ}.
  """
  x = x.astype(jnp.float32)
  w = jnp.ones(x.shape[:1], jnp.float32) if weights is None else weights.astype(jnp.float32)
  n = w.sum()
  wb = w.reshape((-1,) + (1,) * (x.ndim - 1))
  mean = (wb * x).sum(0) / jnp.maximum(n, 1e-12)
  xc = x - mean
  m2 = jnp.einsum("n...i,n...j->...ij", wb * xc, xc)
  return {"count": n, "mean": mean, "m2": m2}


def merge_moments(a: dict, b: dict) -> dict:
  """Moments of the union of two sample sets (pairwise update; works in NumPy or JAX)."""
  n = a["count"] + b["count"]
  safe = np.maximum(n, 1e-12) if isinstance(n, (float, np.floating, np.ndarray)) else \
      jnp.maximum(n, 1e-12)
  delta = b["mean"] - a["mean"]
  mean = a["mean"] + delta * (b["count"] / safe)
  outer = delta[..., :, None] * delta[..., None, :]
  m2 = a["m2"] + b["m2"] + outer * (a["count"] * b["count"] / safe)
  return {"count": n, "mean": mean, "m2": m2}


def covariance(moments: dict):
  """Population covariance M2 / count, [..., D, D]."""
  return moments["m2"] / np.maximum(moments["count"], 1e-12)


def matrix_token_subset(num_tokens: int, matrix_tokens: int | None) -> np.ndarray:
  """The strided tokens (queries and keys) whose sub-matrix is vectorised."""
  if matrix_tokens is None or matrix_tokens >= num_tokens:
    return np.arange(num_tokens)
  return eigen_vit.strided_keys(num_tokens, matrix_tokens)


def score_moments(apply_fn, variables, inputs, *, labels=None, key=None, mask=None,
                  kind: str = "logits", matrix_tokens: int | None = None
                  ) -> dict[str, dict]:
  """One batch's moments of score rows (per layer and head) and score matrices (per layer).

  Args:
    apply_fn, variables, inputs: see `attention_logits`.
    labels, key: unused (the common convention).
    mask: optional [B] example weights (0 for padding rows).
    kind: "logits", "centered_logits" (each row minus its mean over the keys: the
      softmax-invariant offset removed) or "probs" (softmax over the keys; padded keys
      masked for token ids).
    matrix_tokens: tokens t of the vectorised matrices (None: all T; t² dims).

  Returns:
    {"rows": moments with mean [L, H, T], m2 [L, H, T, T], count (rows of padded queries
     left out for token ids);
     "matrices": moments with mean [L, t²], m2 [L, t², t²], count} (`batch_moments`);
    merge batches with `merge_moments`.
  """
  del labels, key
  scores = jnp.stack(attention_logits(apply_fn, variables, inputs))   # [L, B, H, T, T]
  valid = key_mask(inputs)
  if kind not in SCORE_KINDS:
    raise ValueError(f"kind must be one of {SCORE_KINDS}, got {kind!r}")
  if kind == "probs":
    scores = probabilities(scores, valid)
  elif kind == "centered_logits":
    scores = centered(scores, valid)
  num_layers, b, h, t, _ = scores.shape
  w = jnp.ones((b,), jnp.float32) if mask is None else mask.astype(jnp.float32)
  rows = scores.transpose(1, 3, 0, 2, 4).reshape(b * t, num_layers, h, t)
  # Rows of padded queries (token ids 0) are not samples.
  row_w = jnp.broadcast_to(w[:, None] * (1.0 if valid is None else valid), (b, t)).reshape(-1)
  sub = matrix_token_subset(t, matrix_tokens)
  mats = scores[:, :, :, sub][..., sub].transpose(1, 2, 0, 3, 4)
  mats = mats.reshape(b * h, num_layers, len(sub) ** 2)
  return {"rows": batch_moments(rows, row_w),
          "matrices": batch_moments(mats, jnp.repeat(w, h))}


def pool_heads(row_moments: dict) -> dict:
  """Per-layer moments of score rows pooled over heads: [L, H, ...] -> [L, ...]."""
  out = {k: np.asarray(v)[:, 0] if k != "count" else v for k, v in row_moments.items()}
  out["count"] = row_moments["count"]
  h = np.asarray(row_moments["mean"]).shape[1]
  for i in range(1, h):
    out = merge_moments(out, {"count": row_moments["count"],
                              "mean": np.asarray(row_moments["mean"])[:, i],
                              "m2": np.asarray(row_moments["m2"])[:, i]})
  return out


# ----------------------------------------------------------------------------- PCA


def eigh_descending(cov):
  """Eigenvalues (descending, clipped at 0) [..., D] and eigenvectors [..., D, D] (columns)."""
  vals, vecs = np.linalg.eigh(np.asarray(cov, np.float64))
  return np.clip(vals[..., ::-1], 0.0, None), vecs[..., ::-1]


def explained_variance(cov) -> np.ndarray:
  """[..., D] cumulative explained-variance ratio at k = 1..D of covariance [..., D, D]."""
  vals, _ = eigh_descending(cov)
  total = vals.sum(-1, keepdims=True)
  return np.cumsum(vals, -1) / np.maximum(total, 1e-30)


def dimension_at(ratio, level: float) -> np.ndarray:
  """Smallest k whose explained variance reaches `level`, from `explained_variance`."""
  return (np.asarray(ratio) < level - 1e-12).sum(-1) + 1


def top_basis(cov, k: int) -> np.ndarray:
  """[..., D, k] orthonormal top-k eigenvectors of covariance [..., D, D]."""
  return eigh_descending(cov)[1][..., :k]


def subspace_overlap(u_a, u_b) -> jax.Array:
  """‖U_aᵀU_b‖_F² / k of orthonormal [..., D, k] bases (broadcast); 1 = same subspace."""
  k = u_a.shape[-1]
  return jnp.sum(jnp.einsum("...dk,...dl->...kl", u_a, u_b) ** 2, axis=(-2, -1)) / k


# Uniformly random orthonormal [*batch, dim, k] bases (the EigenViT's `basis_init="random"`).
random_basis = eigen_vit.random_basis


def pairwise_overlap(bases) -> np.ndarray:
  """[n, n] overlaps of n orthonormal [D, k] bases ([n, D, k])."""
  bases = jnp.asarray(bases)
  return np.asarray(subspace_overlap(bases[:, None], bases[None, :]))


# ----------------------------------------------------------------------------- partial


def choose_keys(rule: str, basis, m: int, seed: int = 0) -> np.ndarray:
  """[H, m] sorted key subsets per head.

  Args:
    rule: "strided" (evenly spread), "random" (a fixed draw from `seed`) or "pivoted_qr"
      (the first k column pivots of QR with column pivoting on Uᵀ [k, T], the keys on which
      U_S is best conditioned, then strided keys up to m).
    basis: [H, T, k] per-head bases (only their shape for the first two rules).
    m: keys kept, k <= m <= T.
    seed: for "random".
  """
  basis = np.asarray(basis)
  h, t, _ = basis.shape
  if rule == "pivoted_qr":
    out = []
    for u in basis:                                   # u [T, k]
      piv = scipy.linalg.qr(u.T, pivoting=True, mode="r")[1][:min(u.shape[1], m)]
      fill = [j for j in eigen_vit.strided_keys(t, t) if j not in set(piv)]
      # Then evenly spread keys not yet chosen, nearest to a stride first.
      spread = [j for j in eigen_vit.strided_keys(t, m) if j not in set(piv)]
      rest = spread + [j for j in fill if j not in set(spread)]
      out.append(np.sort(np.concatenate([piv, rest[:m - len(piv)]]).astype(np.int32)))
    return np.stack(out)
  return eigen_vit.rule_keys(rule, t, m, h, seed)


def partial_reconstruction(apply_fn, variables, inputs, *, labels=None, key=None, mask=None,
                           bases, means, keys) -> dict[str, jax.Array]:
  """Errors of reconstructing each layer's scores from m exact keys, one batch.

  Each layer is reconstructed from its own exact scores (the model itself is unchanged;
  for the frozen model run with reconstructed attention see `EigenViT`).

  Args:
    apply_fn, variables, inputs: see `attention_logits`.
    labels, key: unused.
    mask: optional [B] example weights.
    bases: [L, H, T, k] per layer and head (orthonormal or not).
    means: [L, H, T] mean score rows.
    keys: [L, H, m] int key subsets.

  Returns:
    {"score_mse": [L], "tv": [L]} weighted means over this batch's examples (mean over
    heads, queries and keys / rows), and "count" (Σ mask) to pool batches.
  """
  del labels, key
  logits = attention_logits(apply_fn, variables, inputs)
  b = inputs.shape[0]
  w = jnp.ones((b,), jnp.float32) if mask is None else mask.astype(jnp.float32)
  valid = key_mask(inputs)
  mse, tv = [], []
  for layer, a in enumerate(logits):
    ks = keys[layer]
    a_s = jnp.take_along_axis(a, jnp.broadcast_to(ks[None, :, None], a.shape[:3] + ks.shape[-1:]),
                              axis=-1)
    est = eigen_vit.reconstruct_logits(a_s, bases[layer], means[layer], ks)
    per_mse = ((est - a) ** 2).mean(axis=(1, 2, 3))
    per_tv = 0.5 * jnp.abs(probabilities(est, valid) - probabilities(a, valid)).sum(-1)
    mse.append(per_mse)
    tv.append(per_tv.mean(axis=(1, 2)))
  norm = jnp.maximum(w.sum(), 1e-12)
  return {"score_mse": jnp.stack(mse) @ w / norm, "tv": jnp.stack(tv) @ w / norm,
          "count": w.sum()}
