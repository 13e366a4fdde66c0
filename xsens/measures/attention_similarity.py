"""How similar are the attention maps of different heads and layers?

Bhojanapalli et al. 2021, "Leveraging redundancy in attention with Reuse
Transformers", arXiv 2110.06821, docs/papers/google_papers.md §A.1: attention scores are
"considerably redundant, especially adjacent layers showing high similarity".
The paper's metric is "based on total variation distance"; its exact
normalisation is not known, so we use, for row-stochastic T x T head maps A, B,

  sim(A, B) = 1 - (1/T) Σ_i ½ ‖A_i − B_i‖₁   ∈ [0, 1],

averaged over inputs; layer ℓ vs ℓ' is the mean over heads h of ℓ of
max_{h'} sim(A_ℓ^h, A_ℓ'^{h'}) (so it is not symmetric in ℓ, ℓ' and the diagonal
is 1), and per head the k-th best match in the previous layer.

Calling convention (that of `xsens.measures`): the model enters as `apply_fn, variables`
with `apply_fn` a flax apply in eval mode that forwards the keyword `mutable` (e.g.
`TrainResult.apply_fn` = `functools.partial(model.apply, train=False)`), since the maps
are read from the `intermediates` collection; `batch_head_similarity(apply_fn, variables,
inputs, *, mask=None)` is the per-batch measure (a dict of masked sums; callers jit it
with `apply_fn` static and pool it over padded batches, as
`xsens.lab.head_similarity.collect_head_similarity` does). The other functions take maps or
similarity arrays.

Works for any model that sows `attention_weights` [B, H, T, T] into the
`intermediates` collection (xsens ViT and ReuseViT do), trained or freshly
initialised. Layers are ordered by the number in their module path
(`encoderblock_<i>`).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np


def attention_maps(apply_fn, variables, inputs) -> list[jax.Array]:
  """Per-layer attention maps of one batch, in layer order.

  Args:
    apply_fn: a flax apply in eval mode forwarding `mutable`, e.g.
      `functools.partial(model.apply, train=False)` of a model that sows
      `attention_weights`.
    variables: its variables.
    inputs: [B, ...] inputs.

  Returns:
    A list of [B, H, T, T] arrays, one per (non-skipped) attention layer.
  """
  _, state = apply_fn(variables, inputs, mutable=["intermediates"])
  found = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]:
    keys = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
    if "attention_weights" in keys:
      nums = tuple(int(n) for k in keys for n in re.findall(r"\d+", k)
                   if k != "attention_weights")
      found.append((nums, "/".join(keys), leaf))
  found.sort(key=lambda t: (t[0], t[1]))
  return [leaf for _, _, leaf in found]


def similarity(a: jax.Array, b: jax.Array) -> jax.Array:
  """1 − mean over query rows of the total-variation distance.

  Args:
    a: [..., T, T] row-stochastic maps.
    b: [..., T, T] (broadcast against `a`).

  Returns:
    [...] similarities in [0, 1] (1 for identical maps).
  """
  tv = 0.5 * jnp.abs(a - b).sum(axis=-1)   # [..., T]
  return 1.0 - tv.mean(axis=-1)


def head_similarity(maps: jax.Array) -> jax.Array:
  """Every head against every head, averaged over the batch.

  Args:
    maps: [L, B, H, T, T] attention maps of L layers.

  Returns:
    [L, H, L, H]: entry (ℓ, h, ℓ', h') = mean_b sim(A_ℓ^h, A_ℓ'^{h'}).
  """
  def one_pair(a, b):  # [B, H, T, T] x [B, H, T, T] -> [H, H]
    return similarity(a[:, :, None], b[:, None, :]).mean(axis=0)
  rows = jax.vmap(lambda a: jax.vmap(lambda b: one_pair(a, b))(maps))(maps)
  return rows.transpose(0, 2, 1, 3)   # [L, L, H, H] -> [L, H, L, H]


def batch_head_similarity(apply_fn, variables, inputs, *, labels=None, key=None, mask=None
                          ) -> dict[str, jax.Array]:
  """`head_similarity` of one (padded) batch as a masked sum, to pool over batches.

  Args:
    apply_fn: see `attention_maps`; every layer must have the same head count.
    variables: its variables (trained or random-init).
    inputs: [B, ...] inputs.
    labels, key: unused (the common convention).
    mask: optional [B] weights (0 for padding rows).

  Returns:
    {"head_similarity": [L, H, L, H] masked mean over the batch,
     "count": the weighted number of examples}; over batches,
    sum_b head_similarity_b * count_b / sum_b count_b is the dataset mean.
  """
  maps = jnp.stack(attention_maps(apply_fn, variables, inputs))   # [L, B, H, T, T]
  maps = maps.astype(jnp.float32)
  del labels, key
  if mask is None:
    mask = jnp.ones((maps.shape[1],), jnp.float32)
  w = mask / jnp.maximum(mask.sum(), 1.0)

  def one_pair(a, b):
    s = similarity(a[:, :, None], b[:, None, :])   # [B, H, H]
    return jnp.einsum("b,bhk->hk", w, s)
  rows = jax.vmap(lambda a: jax.vmap(lambda b: one_pair(a, b))(maps))(maps)
  return {"head_similarity": rows.transpose(0, 2, 1, 3), "count": mask.sum()}


def layer_similarity(head_sim: np.ndarray) -> np.ndarray:
  """[L, H, L, H] -> [L, L]: mean over heads h of ℓ of max_{h'} sim(ℓ h, ℓ' h')."""
  return np.asarray(head_sim).max(axis=3).mean(axis=1)


def adjacent_kth_best(head_sim: np.ndarray) -> np.ndarray:
  """Per head, its sorted similarities to the previous layer's heads.

  Args:
    head_sim: [L, H, L, H] mean similarities (`batch_head_similarity`, pooled).

  Returns:
    [L - 1, H, H]: entry (ℓ - 1, h, k) is the (k+1)-th best sim of head h of
    layer ℓ to any head of layer ℓ - 1 (k = 0: best match).
  """
  head_sim = np.asarray(head_sim)
  num_layers = head_sim.shape[0]
  out = [np.sort(head_sim[l, :, l - 1, :], axis=-1)[:, ::-1]
         for l in range(1, num_layers)]
  return np.stack(out) if out else np.zeros((0,) + head_sim.shape[1:2] * 2)
