"""Position encodings of the text encoder: at the input, or as a bias on the attention logits.

"A Simple and Effective Positional Encoding for Transformers" (DIET; Chen, Tsai,
Bhojanapalli, Chung, Chang, Ferng; EMNLP 2021, arXiv 2104.08698). The model field
`position` picks one of `POSITIONS`; per head h of layer l the attention logits are

  none:        A_ij = (x_i W_Q)(x_j W_K)ᵀ/√d_h                     (no position at all)
  absolute:    x = word + learned P at the input (BERT/RoBERTa; the default, unchanged)
  sinusoidal:  x = word + sin/cos table at the input (Vaswani et al. 2017; no parameters)
  shaw:        A_ij = q_i·(k_j + a_{clip(j−i, ±c)})/√d_h   (Shaw et al. 2018, key side:
               a ∈ R^{2c+1, d_h} per layer, shared by the heads)
  t5:          A_ij = q_i·k_j/√d_h + b_h[bucket(j−i)]      (Raffel et al. 2020: 32
               log-spaced buckets up to distance 128, one table shared by all layers)
  diet_abs:    A_ij = q_i·k_j/√d_h + (P_Q P_Kᵀ)_ij + E_S(s_i, s_j)
               P_Q, P_K ∈ R^{n×d_p} per head, learned directly (no projection, no √d),
               d_p = d_h by default, shared by all layers (the paper's best, Tables 5, 6)
  diet_rel:    A_ij = q_i·k_j/√d_h + R_{i−j} + E_S(s_i, s_j)
               one scalar per offset i − j (no buckets) per head and layer (unshared)

with nothing added at the input for shaw, t5, diet_abs and diet_rel. E_S is one learned
scalar per pair of segments, per head. Segments are read off the ids: in RoBERTa's pair
template "<s> A </s></s> B </s>" a token is in segment 1 once two separators (`SEP_ID`,
"</s>") precede it, else in segment 0 (`segment_ids`); a single sentence is segment 0.

The paper's Theorem 1: with position at the input the logit matrix of a head has rank at
most d_h; a per-head position term of rank d_p allows d_h + d_p (`xsens.measures.logit_rank`
measures it). DIET-ABS[LIN] (Linformer) is not implemented. The ViT takes "diet_abs" and
"diet_rel" too (`ViT.position_bias`, over its flattened tokens, without segments).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from xsens import choices
from xsens.errors import ConfigError

POSITIONS = choices.POSITION_ENCODINGS
INPUT_POSITIONS = ("absolute", "sinusoidal")     # Added to the token embeddings.
SEGMENT_POSITIONS = ("diet_abs", "diet_rel")     # Carry the segment scalar E_S.
SEP_ID = 2                                       # "</s>" (xsens.data.text.EOS_ID).
NUM_SEGMENTS = 2
T5_NUM_BUCKETS = 32                              # T5's defaults (bidirectional).
T5_MAX_DISTANCE = 128
_INIT = nn.initializers.normal(0.02)


def check_position_fields(model) -> None:
  """ConfigError naming `model.position`, `model.diet_dim` or `model.relative_clip`."""
  if model.position not in POSITIONS:
    raise ConfigError("model.position", f"unknown position encoding {model.position!r}; "
                      f"allowed: {', '.join(POSITIONS)}")
  for field in ("diet_dim", "relative_clip"):
    value = getattr(model, field)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or value < 1):
      raise ConfigError(f"model.{field}", f"must be None or an int >= 1, got {value!r}")
  if model.position != "absolute" and model.attention == "relu":
    raise ConfigError("model.position", f"{model.position!r} needs softmax attention "
                      "(model.attention='softmax'); ReLU attention takes 'absolute' only")


def sinusoidal_table(length: int, width: int) -> np.ndarray:
  """[length, width] float32: sin(p/10000^(2i/D)) in the even, cos in the odd columns."""
  pos = np.arange(length, dtype=np.float64)[:, None]
  freq = np.exp(-math.log(10000.0) * np.arange(0, width, 2) / width)
  table = np.zeros((length, width), np.float64)
  table[:, 0::2] = np.sin(pos * freq)
  table[:, 1::2] = np.cos(pos * freq[:width // 2])
  return table.astype(np.float32)


def segment_ids(ids, sep_id: int = SEP_ID):
  """ids [B, L] -> int32 [B, L]: 1 where two `sep_id` precede the token, else 0."""
  seps_before = jnp.cumsum(ids == sep_id, axis=-1) - (ids == sep_id)
  return (seps_before >= 2).astype(jnp.int32)


def offsets(length: int) -> np.ndarray:
  """[L, L] int: i − j (query i, key j)."""
  pos = np.arange(length)
  return pos[:, None] - pos[None, :]


def t5_buckets(relative_position, num_buckets: int = T5_NUM_BUCKETS,
               max_distance: int = T5_MAX_DISTANCE) -> np.ndarray:
  """T5's bidirectional bucket of `relative_position` = key − query (int array).

  Half the buckets for keys after the query; in each half, distances below
  num_buckets/4 get their own bucket, larger ones log-spaced buckets up to max_distance
  (T5's `_relative_position_bucket`).
  """
  rel = np.asarray(relative_position)
  half = num_buckets // 2
  out = np.where(rel > 0, half, 0)
  n = np.abs(rel)
  exact = half // 2
  large = exact + (np.log(np.maximum(n, 1) / exact) / math.log(max_distance / exact)
                   * (half - exact)).astype(np.int64)
  return out + np.where(n < exact, n, np.minimum(large, half - 1))


def segment_bias(table, segments):
  """table [H, S, S], segments [B, L] int -> [B, H, L, L]: table[h, s_i, s_j]."""
  one_hot = jnp.eye(table.shape[-1], dtype=table.dtype)[segments]          # [B, L, S]
  return jnp.einsum("bis,hst,bjt->bhij", one_hot, table, one_hot)


def toeplitz_bias(table, length: int):
  """table [H, 2n−1] (offset i − j at column i − j + n − 1) -> [H, L, L] for L <= n."""
  n = (table.shape[-1] + 1) // 2
  return table[:, offsets(length) + n - 1]


class SegmentBias(nn.Module):
  """E_S: one learned scalar per head and pair of segments. segments [B, L] -> [B, H, L, L]."""
  num_heads: int

  @nn.compact
  def __call__(self, segments):
    table = self.param("segment", nn.initializers.zeros,
                       (self.num_heads, NUM_SEGMENTS, NUM_SEGMENTS))
    return segment_bias(table, segments)


class DietAbsBias(nn.Module):
  """(P_Q P_Kᵀ)_ij + E_S per head. segments [B, L] -> [B, H, L, L]. Params: P_Q, P_K
  [H, max_length, dim], segment [H, 2, 2] (none with `use_segments=False`: [1, H, L, L])."""
  num_heads: int
  max_length: int
  dim: int
  use_segments: bool = True

  @nn.compact
  def __call__(self, segments):
    length = segments.shape[1]
    shape = (self.num_heads, self.max_length, self.dim)
    p_q = self.param("p_query", _INIT, shape)[:, :length]
    p_k = self.param("p_key", _INIT, shape)[:, :length]
    pos = jnp.einsum("hid,hjd->hij", p_q, p_k)[None]
    if not self.use_segments:
      return pos
    return pos + SegmentBias(self.num_heads, name="segments")(segments)


class DietRelBias(nn.Module):
  """R_{i−j} + E_S per head: one scalar per offset (Toeplitz). segments [B, L] ->
  [B, H, L, L]. Params: relative [H, 2·max_length − 1], segment [H, 2, 2] (none with
  `use_segments=False`: [1, H, L, L])."""
  num_heads: int
  max_length: int
  use_segments: bool = True

  @nn.compact
  def __call__(self, segments):
    table = self.param("relative", nn.initializers.zeros,
                       (self.num_heads, 2 * self.max_length - 1))
    rel = toeplitz_bias(table, segments.shape[1])[None]
    if not self.use_segments:
      return rel
    return rel + SegmentBias(self.num_heads, name="segments")(segments)


class T5Bias(nn.Module):
  """b_h[bucket(j − i)] per head. length -> [1, H, L, L]. Params: buckets [H, 32]."""
  num_heads: int

  @nn.compact
  def __call__(self, length: int):
    table = self.param("buckets", nn.initializers.zeros, (self.num_heads, T5_NUM_BUCKETS))
    return table[:, t5_buckets(-offsets(length))][None]


class ShawKeys(nn.Module):
  """Shaw et al.'s key-side relative embeddings a_{clip(j−i, ±c)}: length -> [L, L, d_h]
  (shared by the heads). Params: relative_keys [2c+1, d_h]."""
  head_dim: int
  clip: int

  @nn.compact
  def __call__(self, length: int):
    table = self.param("relative_keys", _INIT, (2 * self.clip + 1, self.head_dim))
    return table[np.clip(-offsets(length), -self.clip, self.clip) + self.clip]


def shaw_logits(query, relative_keys):
  """query [B, L, H, d_h] (unscaled), relative_keys [L, L, d_h] -> q_i·a_ij/√d_h
  [B, H, L, L]."""
  scale = math.sqrt(query.shape[-1])
  return jnp.einsum("bqhd,qkd->bhqk", query, relative_keys.astype(query.dtype)) / scale
