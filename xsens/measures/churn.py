"""Prediction churn between two models, overall and by confidence.

"On the reproducibility of neural network predictions" (Bhojanapalli, Wilber, Veit, Rawat,
Kim, Menon, Kumar; arXiv 2102.03349; docs/papers/google_papers.md §F) defines, for two models
trained independently by the same algorithm,

  Churn(f1, f2) = E_x 1[argmax f1(x) ≠ argmax f2(x)]

(abstract; the same definition is in the brauden/prediction-churn README), and observes
that churn is related to prediction confidence. The paper's confidence binning is not
known; ours (`churn_by_confidence`): an example's confidence is the mean of the two
models' top softmax probabilities, (max_k p1_k + max_k p2_k)/2, binned by `edges`.

Pure and jittable; shapes in the docstrings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

DEFAULT_EDGES = (0.0, 0.5, 0.7, 0.9, 0.99, 1.0)


def disagreement(logits1: Array, logits2: Array) -> Array:
  """1[argmax f1(x) ≠ argmax f2(x)] per example. [N, K], [N, K] -> [N] float32."""
  return (jnp.argmax(logits1, -1) != jnp.argmax(logits2, -1)).astype(jnp.float32)


@jax.jit
def churn(logits1: Array, logits2: Array, mask: Array | None = None) -> Array:
  """Disagreement rate of the argmax predictions. [N, K], [N, K], mask [N]? -> scalar."""
  d = disagreement(logits1, logits2)
  if mask is None:
    return d.mean()
  return jnp.sum(d * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def confidence(logits1: Array, logits2: Array) -> Array:
  """Mean of the two models' top softmax probabilities. [N, K], [N, K] -> [N] in (0, 1]."""
  top = lambda z: jax.nn.softmax(z.astype(jnp.float32), -1).max(-1)
  return 0.5 * (top(logits1) + top(logits2))


@jax.jit
def churn_by_confidence(logits1: Array, logits2: Array, edges: Array
                        ) -> tuple[Array, Array]:
  """Churn per confidence bin [edges[b], edges[b+1]) (the last bin includes its right edge).

  Args:
    logits1, logits2: [N, K] logits of the two models on the same examples.
    edges: [B + 1] increasing bin edges in [0, 1].

  Returns:
    (churn [B] (NaN for an empty bin), count [B] float32 examples per bin).
  """
  conf = confidence(logits1, logits2)
  d = disagreement(logits1, logits2)
  edges = jnp.asarray(edges, jnp.float32)
  b = jnp.clip(jnp.searchsorted(edges, conf, side="right") - 1, 0, edges.shape[0] - 2)
  onehot = jax.nn.one_hot(b, edges.shape[0] - 1, dtype=jnp.float32)
  count = onehot.sum(0)
  rate = jnp.where(count > 0, (onehot.T @ d) / jnp.maximum(count, 1.0), jnp.nan)
  return rate, count


def pairwise_churn(logits: list) -> np.ndarray:
  """Churn of every pair of a list of [N, K] logits -> [R, R] host matrix (0 diagonal)."""
  r = len(logits)
  out = np.zeros((r, r))
  for i in range(r):
    for j in range(i + 1, r):
      out[i, j] = out[j, i] = float(churn(logits[i], logits[j]))
  return out


def prediction_churn(apply_fn, variables, inputs: Array, *, labels: Array | None = None,
                     key: Array | None = None, mask: Array | None = None,
                     peer_apply_fn=None, peer_variables=None,
                     edges=DEFAULT_EDGES) -> dict:
  """Churn between a model and its peer on one batch, in the one measure convention.

  `apply_fn(variables, inputs)` and `peer_apply_fn(peer_variables, inputs)` (default: the
  same `apply_fn`) give logits [B, K]; `mask` [B] marks real examples. Returns {"churn"
  (masked mean), "per_example" [B] disagreement, "confidence" [B], "by_confidence" [E-1]
  (NaN for an empty bin), "bin_count" [E-1], "count"}. `labels` and `key` are unused.
  """
  del labels, key
  peer_apply_fn = apply_fn if peer_apply_fn is None else peer_apply_fn
  z1, z2 = apply_fn(variables, inputs), peer_apply_fn(peer_variables, inputs)
  m = jnp.ones(z1.shape[:1], jnp.float32) if mask is None else mask.astype(jnp.float32)
  d = disagreement(z1, z2)
  conf = confidence(z1, z2)
  edges = jnp.asarray(edges, jnp.float32)
  b = jnp.clip(jnp.searchsorted(edges, conf, side="right") - 1, 0, edges.shape[0] - 2)
  onehot = jax.nn.one_hot(b, edges.shape[0] - 1, dtype=jnp.float32) * m[:, None]
  count = onehot.sum(0)
  return {"churn": jnp.sum(d * m) / jnp.maximum(jnp.sum(m), 1.0), "per_example": d,
          "confidence": conf,
          "by_confidence": jnp.where(count > 0, (onehot.T @ d) / jnp.maximum(count, 1.0),
                                     jnp.nan),
          "bin_count": count, "count": jnp.sum(m)}
