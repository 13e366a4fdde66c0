"""Reuse multi-head attention and a ViT built from it.

Bhojanapalli, Chakrabarti, Veit, Lukasik, Jain, Liu, Chang, Kumar (2021),
"Leveraging redundancy in attention with Reuse Transformers", arXiv 2110.06821
(docs/papers/google_papers.md §A.2; official code: tensorflow/models
`official/nlp/modeling/layers/reuse_attention.py`).

A reusing layer takes the previous layer's post-softmax attention S_prev
[B, H, T, T], reuses its first P heads and computes only H - P fresh heads (with
their own Q, K). The two groups have separate value and output projections whose
outputs are summed:

  A_new   = softmax(Q Kᵀ / √d_h)               # H - P heads (if P < H)
  A_reuse = S_prev[:, :P]                      # (if P > 0)
  out     = O_new(A_new · V_new) + O_reuse(A_reuse · V_reuse)
  S_out   = concat_heads(A_new, A_reuse)       # new heads first

so P = H passes S_prev on unchanged and P = 0 is a standard attention layer.
`ReuseAttention` is independent of images (it maps [B, T, D] tokens), so a text
encoder can use it as is.

`ReuseViT` is `xsens.models.vit.ViT` with two more fields: `reuse_heads` (P; -1
means all H heads) and `reuse_layers` (K: layers 1..K reuse, layer 0 never does;
later layers compute fresh attention). With K = 0 it is the ViT, parameter for
parameter, with each block's `MultiHeadDotProductAttention_0` renamed `attention`.
The attention each layer uses (all H heads, [B, H, T, T]) is sown into
`intermediates` as `attention_weights`, as the ViT does:
`model.apply(variables, x, train=False, mutable=['intermediates'])`.

The ViT's launch fields apply (`dtype`, `remat`, `attention_impl`): a layer whose
attention no later layer reuses, run without `intermediates` mutable and without
attention dropout, computes its fresh heads with the core `attention_impl`
(`xsens.models.attention`) and forms no [B, H, T, T] weights; reused weights are
multiplied into the values with heads folded into the batch unless
`attention_impl="einsum"`.
"""

import flax.linen as nn
import jax.numpy as jnp

from xsens.errors import ConfigError
from xsens.models import _checks
from xsens.models import attention as attention_lib
from xsens.models.vit import MlpBlock, ViT, classifier_head, encoder_input, skipped_parts


def resolve_reuse_heads(reuse_heads: int, num_heads: int) -> int:
  """P with -1 resolved to `num_heads`."""
  return num_heads if reuse_heads == -1 else reuse_heads


def layer_reuse_heads(layer: int, reuse_heads: int, reuse_layers: int,
                      num_heads: int) -> int:
  """Heads reused by `layer`: P for layers 1..K, 0 for layer 0 and layers > K."""
  if layer == 0 or layer > reuse_layers:
    return 0
  return resolve_reuse_heads(reuse_heads, num_heads)


class ReuseAttention(nn.Module):
  """Self-attention that reuses P heads of the previous layer's attention.

  (x [B, T, D], prev_scores [B, H', T, T] or None) -> (out [B, T, D],
  scores [B, H, T, T], or None when `need_scores` is False and `intermediates` is not
  mutable); prev_scores needs H' >= P heads and is ignored when P = 0.
  Parameter names: `query`, `key`, `value`, `out` for the fresh heads (as in
  flax's MultiHeadDotProductAttention), `value_reuse`, `out_reuse` for the reused
  ones. Under partial reuse `out` has no bias (docs/papers/google_papers.md §A.2); `out_reuse`
  always has.
  """
  num_heads: int
  reuse_heads: int = 0
  # Dropout on the attention probabilities where they are used (never on the
  # returned scores); off at 0.
  attention_dropout_rate: float = 0.0
  # Whether a later layer reads the returned scores (False: they may be left unformed).
  need_scores: bool = True
  attention_impl: str = "einsum"
  dtype: object = None   # Compute dtype (None: float32, from the params).

  @nn.compact
  def __call__(self, x, prev_scores=None, train: bool = False):
    b, t, d = x.shape
    h = self.num_heads
    p = resolve_reuse_heads(self.reuse_heads, h)
    if not 0 <= p <= h:
      raise ValueError(f"reuse_heads={self.reuse_heads} must be in [-1, {h}]")
    if d % h:
      raise ValueError(f"width {d} must be divisible by num_heads={h}")
    dh = d // h
    drop = nn.Dropout(self.attention_dropout_rate, deterministic=not train)
    impl, dt = self.attention_impl, self.dtype
    sow = self.is_mutable_collection("intermediates")
    explicit = (impl == "einsum" or self.need_scores or sow
                or (train and self.attention_dropout_rate > 0))

    def times_values(weights, value):  # [B, h, T, T] · [B, T, h, dh] -> [B, T, h, dh]
      if impl == "einsum":
        return jnp.einsum("bhqk,bkhd->bqhd", weights, value)
      return attention_lib.weights_times_values(weights, value)

    out = jnp.zeros((b, t, d), x.dtype)
    parts = []
    if p < h:
      dense = lambda name: nn.DenseGeneral((h - p, dh), dtype=dt, name=name)
      query, key, value = dense("query")(x), dense("key")(x), dense("value")(x)
      if explicit:
        a_new = nn.dot_product_attention_weights(query, key)  # [B, H-P, T, T]
        y = times_values(drop(a_new), value)
        parts.append(a_new)
      else:
        y = attention_lib.attend(query, key, value, impl=impl)
      out = out + nn.DenseGeneral(d, axis=(-2, -1), use_bias=p == 0, dtype=dt,
                                  name="out")(y)
    if p > 0:
      if prev_scores is None or prev_scores.shape[1] < p:
        raise ValueError(f"reuse_heads={p} needs previous scores with >= {p} heads")
      a_reuse = prev_scores[:, :p]
      value = nn.DenseGeneral((p, dh), dtype=dt, name="value_reuse")(x)
      y = times_values(drop(a_reuse), value)
      out = out + nn.DenseGeneral(d, axis=(-2, -1), dtype=dt, name="out_reuse")(y)
      parts.append(a_reuse)
    if not (self.need_scores or sow):
      return out.astype(x.dtype), None
    scores = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)
    self.sow("intermediates", "attention_weights", scores)
    return out.astype(x.dtype), scores


class ReuseEncoderBlock(nn.Module):
  """Pre-LN block with reuse attention: (x, prev_scores) -> (x, scores).

  A skipped attention branch passes `prev_scores` on (and sows nothing).
  """
  num_heads: int
  mlp_dim: int
  reuse_heads: int = 0
  dropout_rate: float = 0.0
  skip_attention: bool = False
  skip_mlp: bool = False
  need_scores: bool = True
  attention_impl: str = "einsum"
  dtype: object = None

  @nn.compact
  def __call__(self, x, prev_scores, train: bool):
    ln_0 = nn.LayerNorm(dtype=self.dtype, name="LayerNorm_0")
    attention = ReuseAttention(self.num_heads, self.reuse_heads,
                               need_scores=self.need_scores,
                               attention_impl=self.attention_impl, dtype=self.dtype,
                               name="attention")
    ln_1 = nn.LayerNorm(dtype=self.dtype, name="LayerNorm_1")
    mlp = MlpBlock(self.mlp_dim, self.dropout_rate, self.dtype, name="MlpBlock_0")
    init = self.is_initializing()
    scores = prev_scores
    if init or not self.skip_attention:
      y, new_scores = attention(ln_0(x), prev_scores, train)
      y = nn.Dropout(self.dropout_rate, deterministic=not train)(y)
      if not self.skip_attention:
        x, scores = x + y, new_scores
    if init or not self.skip_mlp:
      y = mlp(ln_1(x), train)
      x = x if self.skip_mlp else x + y
    return x, scores


class ReuseViT(ViT):
  """ViT whose layers 1..K reuse P heads of the previous layer's attention.

  [B, H, W, C] -> logits [B, num_classes]. Fields: those of `ViT` plus
  `reuse_heads` (P in [-1, num_heads], -1 = all) and `reuse_layers` (K in
  [0, depth - 1]).
  """
  reuse_heads: int = -1
  reuse_layers: int = 1

  def check_input(self, image_shape: tuple[int, int, int]) -> None:
    """Raises ConfigError for settings impossible on (H, W, C) inputs."""
    super().check_input(image_shape)
    if self.attention != "mha":
      raise ConfigError("model.attention", f"{self.attention!r} is not built for the "
                        "reuse ViT (its attention is ReuseAttention); use 'mha'")
    p, k = self.reuse_heads, self.reuse_layers
    if not _checks._is_int(p) or not -1 <= p <= self.num_heads:  # pylint: disable=protected-access
      raise ConfigError(
          "model.reuse_heads",
          f"must be an int in [-1, num_heads={self.num_heads}] (-1: all heads); got {p!r}")
    if not _checks._is_int(k) or not 0 <= k <= self.depth - 1:  # pylint: disable=protected-access
      raise ConfigError(
          "model.reuse_layers",
          f"must be an int in [0, depth - 1 = {self.depth - 1}] (layer 0 never "
          f"reuses); got {k!r}")
    skipped = skipped_parts(self.skip, self.depth)
    for i in range(1, self.depth):
      if (layer_reuse_heads(i, p, k, self.num_heads)
          and all("attention" in skipped.get(j, ()) for j in range(i))):
        raise ConfigError(
            "model.skip", f"layer {i} reuses attention but every attention "
            f"sub-layer before it is skipped")

  @nn.compact
  def __call__(self, x, train: bool = False):
    x, dt, skipped = encoder_input(self, x, train)
    reuses = [layer_reuse_heads(i, self.reuse_heads, self.reuse_layers, self.num_heads)
              for i in range(self.depth)]
    # `train` (argument 3, `self` being 0) is static under remat.
    block = (nn.remat(ReuseEncoderBlock, static_argnums=(3,)) if self.remat
             else ReuseEncoderBlock)
    scores = None
    for i in range(self.depth):
      parts = skipped.get(i, frozenset())
      x, scores = block(
          self.num_heads, self.mlp_dim, reuses[i], self.dropout_rate,
          skip_attention="attention" in parts, skip_mlp="mlp" in parts,
          need_scores=any(reuses[i + 1:]), attention_impl=self.attention_impl, dtype=dt,
          name=f"encoderblock_{i}")(x, scores, train)
    return classifier_head(self, x, dt)
