"""Numerical rank of attention logit matrices: DIET's Theorem 1 as a measurement.

"A Simple and Effective Positional Encoding for Transformers" (Chen et al., EMNLP 2021,
arXiv 2104.08698), Theorem 1: with position information added at the input, a head's
logit matrix A = (X W_Q)(X W_K)ᵀ/√d has rank at most d_h (the head width); a per-head
position term of rank d_p added to the logits (DIET-ABS: P_Q P_Kᵀ) allows up to d_h + d_p,
and a Toeplitz term (DIET-REL, T5) up to the sequence length.

The logits are read from the `intermediates` collection, where a model sows them as
`attention_logits` [B, H, L, L] (the text encoder does on its "einsum" attention path,
`xsens.models.text.SelfAttention`), in layer order.
"""

from __future__ import annotations

import re

import flax
import jax
import jax.numpy as jnp

LOGITS = "attention_logits"


def attention_logits(apply_fn, variables, inputs) -> list[jax.Array]:
  """The sown `attention_logits` [B, H, L, L] of every layer, in layer order.

  `apply_fn(variables, inputs, mutable=["intermediates"])` must forward `mutable` (e.g.
  `TrainResult.apply_fn`). Raises ValueError when the model sows none.
  """
  _, state = apply_fn(variables, inputs, mutable=["intermediates"])
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(state.get("intermediates", {})))
  found = sorted((tuple(int(n) for k in path for n in re.findall(r"\d+", str(k))), path, v)
                 for path, v in flat.items() if LOGITS in path)
  if not found:
    raise ValueError(f"the model sowed no {LOGITS!r}; the text encoder sows them with "
                     "model.attention_impl='einsum' only")
  return [v[0] for _, _, v in found]


def numerical_rank(matrices, *, rtol: float = 1e-4):
  """[..., L, L] -> [...] int32: the number of singular values above rtol · the largest."""
  s = jnp.linalg.svd(matrices.astype(jnp.float32), compute_uv=False)
  return jnp.sum(s > rtol * s[..., :1], axis=-1).astype(jnp.int32)


def attention_logit_rank(apply_fn, variables, inputs, *, labels=None, key=None, mask=None,
                         token_mask=None, rtol: float = 1e-4) -> dict:
  """Numerical rank of every layer's and head's attention logits on a batch.

  Args:
    apply_fn, variables, inputs: a model that sows `attention_logits` (module docstring).
    labels, key: unused (the common calling convention).
    mask: [B] bool, real examples of a padded batch (None: all).
    token_mask: [B, L] bool, real tokens (None: all); rows and columns of the others are
      zeroed before the SVD, so a rank is at most the number of real tokens.
    rtol: relative threshold on the singular values.

  Returns:
    {"rank": [layers, B, H] int32, "mean_rank": [layers, H] mean over the real examples,
     "max_rank": [layers] max over real examples and heads}.
  """
  del labels, key
  logits = jnp.stack(attention_logits(apply_fn, variables, inputs))     # [N, B, H, L, L]
  if token_mask is not None:
    keep = token_mask[:, None, :, None] & token_mask[:, None, None, :]
    logits = jnp.where(keep[None], logits, 0.0)
  rank = numerical_rank(logits, rtol=rtol)                               # [N, B, H]
  real = jnp.ones(rank.shape[1], bool) if mask is None else mask.astype(bool)
  weights = real.astype(jnp.float32)[None, :, None]
  mean = (rank * weights).sum(1) / jnp.maximum(weights.sum(1), 1.0)
  return {"rank": rank, "mean_rank": mean,
          "max_rank": jnp.where(real[None, :, None], rank, 0).max(axis=(1, 2))}
