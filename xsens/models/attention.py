"""Softmax attention cores shared by the transformers (ViT, ReuseViT, RoBERTa, GPT-2).

Every core maps query, key, value [B, T, H, Dh] (and an optional boolean mask
broadcastable to [B, H, T, S], True = may attend) to [B, T, H, Dh]; they differ only
in how the arithmetic is laid out (the model field `attention_impl`):

- "einsum": flax's `nn.dot_product_attention` (the einsums `bqhd,bkhd->bhqk` and
  `bhqk,bkhd->bqhd`), the default.
- "folded": heads folded into the batch, [B·H, T, Dh], and two `lax.batch_matmul`s;
  the same operations as "einsum" in a layout XLA:CPU runs faster (docs/benchmarks.md).
- "xla_fused": `jax.nn.dot_product_attention` (implementation=None: XLA's fused
  pattern; logits and softmax in float32 for bfloat16 inputs).
- "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")`, cuDNN's flash
  attention; GPU only, bfloat16 / float16 compute only.

The query is divided by sqrt(Dh) first, as flax does, by every core (a scaled query
such as LSA's is passed in already scaled). The explicit attention weights
[B, H, T, S] are only formed where something reads them (a sown `attention_weights`,
attention dropout, reused heads): `attention_fn` then falls back to "einsum", the
default core.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from xsens.errors import ConfigError
from xsens.models import _checks

ATTENTION_IMPLS = ("einsum", "folded", "xla_fused", "cudnn")


def check_launch_fields(model) -> None:
  """ConfigError naming `model.dtype`, `model.remat` or `model.attention_impl` for a value
  outside the allowed ones, or "cudnn" where it cannot run (no GPU, float32 compute)."""
  _checks.dtype(model.dtype)
  if not isinstance(model.remat, bool):
    raise ConfigError("model.remat", f"must be True or False; got {model.remat!r}")
  _checks.one_of("attention_impl", model.attention_impl, ATTENTION_IMPLS)
  if model.attention_impl == "cudnn":
    if jax.default_backend() != "gpu":
      raise ConfigError("model.attention_impl", "'cudnn' needs a GPU (the backend is "
                        f"{jax.default_backend()!r}); use 'xla_fused' or 'folded'")
    if model.dtype == "float32":
      raise ConfigError("model.attention_impl", "'cudnn' needs model.dtype='bfloat16' "
                        "(cuDNN flash attention has no float32 kernel)")


def _masked_softmax(logits, mask):
  """Softmax over the last axis with disallowed logits set to the dtype's minimum (flax)."""
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
  return jax.nn.softmax(logits, axis=-1)


def fold_heads(x):
  """[B, T, H, D] -> [B·H, T, D]."""
  b, t, h, d = x.shape
  return x.transpose(0, 2, 1, 3).reshape(b * h, t, d)


def unfold_heads(x, num_heads: int):
  """[B·H, T, D] -> [B, T, H, D]."""
  bh, t, d = x.shape
  return x.reshape(bh // num_heads, num_heads, t, d).transpose(0, 2, 1, 3)


def folded_weights(query, key, mask=None, bias=None):
  """Softmax attention weights [B, H, T, S] computed with heads folded into the batch.

  query [B, T, H, D] (not yet scaled), key [B, S, H, D], mask broadcastable to
  [B, H, T, S]; `bias` (broadcastable to [B, H, T, S]) is added to the scaled logits.
  """
  b, t, h, d = query.shape
  query = query / jnp.sqrt(d).astype(query.dtype)
  logits = lax.batch_matmul(fold_heads(query), fold_heads(key).transpose(0, 2, 1))
  logits = logits.reshape(b, h, t, key.shape[1])
  if bias is not None:
    logits = logits + bias.astype(logits.dtype)
  return _masked_softmax(logits, mask)


def weights_times_values(weights, value):
  """weights [B, H, T, S] · value [B, S, H, D] -> [B, T, H, D] (heads folded)."""
  b, h, t, s = weights.shape
  out = lax.batch_matmul(weights.reshape(b * h, t, s).astype(value.dtype),
                         fold_heads(value))
  return unfold_heads(out, h)


def folded_attention(query, key, value, mask=None, bias=None):
  """softmax(q kᵀ / √D + bias) v with heads folded into the batch. [B, T, H, D] ->
  [B, T, H, D]."""
  return weights_times_values(folded_weights(query, key, mask, bias), value)


def fused_attention(query, key, value, mask=None, implementation=None, bias=None):
  """`jax.nn.dot_product_attention` on flax-scaled queries. [B, T, H, D] -> [B, T, H, D].

  The query is divided by √D here (scale=1 in the call) so that every core rounds the
  same scaled query; `mask` and `bias` (added to the logits) are broadcast to [B, H, T, S].
  """
  b, t, h, d = query.shape
  query = query / jnp.sqrt(d).astype(query.dtype)
  if mask is not None:
    mask = jnp.broadcast_to(mask, (b, h, t, key.shape[1]))
  if bias is not None:
    bias = jnp.broadcast_to(bias, (b, h, t, key.shape[1])).astype(query.dtype)
  return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask, scale=1.0,
                                      implementation=implementation)


def attend(query, key, value, mask=None, *, impl: str, bias=None):
  """The core of `impl` (module docstring) without dropout. [B, T, H, D] -> [B, T, H, D];
  `bias` (broadcastable to [B, H, T, S]) is added to the scaled logits."""
  if impl == "einsum":
    return nn.dot_product_attention(query, key, value, bias=bias, mask=mask)
  if impl == "folded":
    return folded_attention(query, key, value, mask, bias)
  if impl == "xla_fused":
    return fused_attention(query, key, value, mask, bias=bias)
  if impl == "cudnn":
    return fused_attention(query, key, value, mask, implementation="cudnn", bias=bias)
  raise ValueError(f"unknown attention_impl {impl!r}; allowed: {', '.join(ATTENTION_IMPLS)}")


def attention_fn(query, key, value, mask=None, dropout_rng=None, dropout_rate=0.,
                 broadcast_dropout=True, deterministic=True, dtype=None, precision=None,
                 module=None, *, impl: str = "einsum", bias=None):
  """A flax `MultiHeadDotProductAttention` `attention_fn` running the core `impl`.

  Where the explicit weights are needed (flax passes `module` to sow them, or attention
  dropout is active) it is flax's `nn.dot_product_attention` exactly. `bias`
  (broadcastable to [B, H, T, S]) is added to the scaled logits.
  """
  if impl == "einsum" or module is not None or (dropout_rate > 0. and not deterministic):
    return nn.dot_product_attention(
        query, key, value, bias=bias, mask=mask, dropout_rng=dropout_rng,
        dropout_rate=dropout_rate, broadcast_dropout=broadcast_dropout,
        deterministic=deterministic, dtype=dtype, precision=precision, module=module)
  return attend(query, key, value, mask, impl=impl, bias=bias)
