"""Text classifiers (flax.linen): a RoBERTa-style encoder, a GPT-2-style decoder, an LSTM.

The language models of "Transformers Learn Low Sensitivity Functions" (ICLR 2025,
arXiv 2403.06925, §5 / App. Fig. 20), trained from scratch for sequence classification
(official code: github.com/estija/sensitivity, language/; paper scripts: 4 layers,
hidden 256, 8 heads; docs/results.md (sensitivity sections) §2.3, §7, §8).

Inputs are int32 token ids [B, L], right-padded with `PAD_ID` = 0; the attention/validity
mask is `ids != PAD_ID` (`padding_mask`). Every model exposes the token interface of
`xsens.measures.tokens` as two methods, used through `model.apply(..., method=...)`:

  tokens = model.apply(v, ids, method=model.embed)                 # [B, L, D]
  logits = model.apply(v, tokens, mask, method=model.encode)       # [B, K]
  model.apply(v, ids) == encode(embed(ids), padding_mask(ids))

`embed` ends exactly where the paper puts the noise (docs/papers/sensitivity.md §2.3):
- `roberta`: token + learned position embeddings -> embedding LayerNorm | noise | encoder.
- `gpt2`: wte + wpe (wpe added once; the official code adds it twice, docs/papers/sensitivity.md §8
defect 7)
  | noise | blocks. GPT-2 has no embedding LayerNorm, so the noise enters on the raw
  embedding sum, before the first block's ln_1.
- `lstm`: embedding -> LayerNorm | noise | LSTM layers.

A second placement, before the embedding LayerNorm (our variant; docs/papers/sensitivity.md §2.3
says the paper's is after it), is exposed the same way by `embed_pre_norm` / `encode_pre_norm`
(`encode_pre_norm(embed_pre_norm(ids), mask) == __call__(ids)`): RoBERTa's word +
position embedding sum, the LSTM's raw embedding; GPT-2 has no embedding LayerNorm, so its
two placements coincide (`embed_pre_norm` is `embed`).

Our design choices where the paper is silent (not confirmed from the paper):
- position ids are 0..L-1 (HF RoBERTa offsets them by padding_idx + 1 = 2; this only
  relabels rows of the position table) and RoBERTa's single token-type embedding (a
  constant vector added to every token) is left out;
- ReLU attention (`attention="relu"`, the paper's "RoBERTa (ReLU)", official
  modeling_roberta_relu.py per docs/papers/sensitivity.md §8) is relu(q.k / sqrt(d_head)) with no
  normalisation; padded keys get weight 0 (HF adds a large negative mask before the
  activation, which relu maps to 0);
- initialisation follows HF (normal(0.02) for Dense/Embed, GPT-2's residual projections
  scaled by 1/sqrt(2 * depth)) and PyTorch's nn.LSTM (uniform(+-1/sqrt(H)), both biases).

RoBERTa and GPT-2 take the launch fields of the ViT (their defaults give the numbers of
the models without them): `dtype` ("float32" | "bfloat16": compute dtype,
params float32, logits float32), `remat` (rematerialised layers) and `attention_impl`
(the softmax attention core, `xsens.models.attention`; ReLU attention always forms
its weights explicitly, and "xla_fused" / "cudnn" use "folded" while attention dropout
is active, which needs the weights). The LSTM takes `dtype` too: its matrix products run
in that dtype, its gates and recurrent state (h, c) in float32.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from xsens.errors import ConfigError
from xsens.models import _checks
from xsens.models import attention as attention_lib
from xsens.models import position as position_lib
from xsens.models import precision

PAD_ID = 0
ATTENTIONS = ("softmax", "relu")
_LN_EPS = 1e-5
_INIT = nn.initializers.normal(0.02)

Array = jax.Array


def padding_mask(ids: Array) -> Array:
  """ids [B, L] int -> bool [B, L], True on real (non-pad) tokens."""
  return ids != PAD_ID


def last_index(mask: Array) -> Array:
  """mask [B, L] bool -> [B] int32 index of the last True (0 for an all-False row)."""
  positions = jnp.arange(mask.shape[-1], dtype=jnp.int32)
  return jnp.max(jnp.where(mask, positions, 0), axis=-1)


def _check_ids_shape(input_shape, num_classes, max_length: int | None) -> None:
  _checks.positive_int("num_classes", num_classes)
  shape = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else None
  if shape is None or len(shape) != 1 or not isinstance(shape[0], int) or shape[0] < 1:
    raise ConfigError("model.name", f"text models take token ids [B, L]; the data has "
                      f"per-example shape {input_shape!r} (use a text dataset such as "
                      "data.name='text/synthetic', 'glue/mrpc' or 'glue/qqp')")
  if max_length is not None and shape[0] > max_length:
    raise ConfigError("model.max_length", f"{max_length} position embeddings cannot hold "
                      f"sequences of length {shape[0]}; use max_length >= {shape[0]}")


def _check_heads(width: int, num_heads: int) -> None:
  if width % num_heads:
    raise ConfigError("model.width", f"{width} must be divisible by model.num_heads="
                      f"{num_heads}")


def _check_transformer(model, input_shape) -> None:
  """The config checks shared by the RoBERTa and GPT-2 modules on ids of shape (L,)."""
  for field in ("vocab_size", "max_length", "width", "depth", "num_heads", "mlp_dim"):
    _checks.positive_int(field, getattr(model, field))
  _check_ids_shape(input_shape, model.num_classes, model.max_length)
  _check_heads(model.width, model.num_heads)
  _checks.rate("dropout_rate", model.dropout_rate)
  attention_lib.check_launch_fields(model)


class SelfAttention(nn.Module):
  """Multi-head self-attention with a key-padding mask, optional causal mask and ReLU.

  x [B, L, D], mask [B, L] bool -> [B, L, D].
  """
  width: int
  num_heads: int
  dropout_rate: float
  attention: str = "softmax"
  causal: bool = False
  out_init: Callable = _INIT
  attention_impl: str = "einsum"
  dtype: object = None   # Compute dtype (None: float32, from the params).

  @nn.compact
  def __call__(self, x, mask, train: bool = False, bias=None, relative_keys=None):
    """`bias` [B|1, H, L, L] is added to the scaled logits; `relative_keys` [L, L, dh]
    (Shaw et al.) add q_i·a_ij/√dh (`xsens.models.position`). The logits are sown as
    `attention_logits` ([B, H, L, L], before masking) on the einsum path when
    `intermediates` is mutable."""
    head_dim = self.width // self.num_heads
    dense = lambda name: nn.DenseGeneral((self.num_heads, head_dim), kernel_init=_INIT,
                                         dtype=self.dtype, name=name)
    q, k, v = dense("query")(x), dense("key")(x), dense("value")(x)   # [B, L, H, dh]
    if relative_keys is not None:
      shaw = position_lib.shaw_logits(q, relative_keys)
      bias = shaw if bias is None else bias + shaw
    allowed = mask[:, None, None, :]                                   # [B, 1, 1, L]
    if self.causal:
      length = x.shape[1]
      allowed = allowed & jnp.tril(jnp.ones((length, length), bool))[None, None]
    drop = nn.Dropout(self.dropout_rate, deterministic=not train)
    impl = self.attention_impl
    if self.attention == "relu" or impl == "einsum":
      scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
      if bias is not None:
        scores = scores + bias.astype(scores.dtype)
      if self.is_mutable_collection("intermediates"):
        self.sow("intermediates", "attention_logits", scores)
      if self.attention == "relu":
        weights = jnp.where(allowed, jax.nn.relu(scores), 0.0)
      else:
        scores = jnp.where(allowed, scores, jnp.finfo(scores.dtype).min)
        weights = jax.nn.softmax(scores, axis=-1)
      out = jnp.einsum("bhqk,bkhd->bqhd", drop(weights), v)
    elif impl == "folded" or (train and self.dropout_rate > 0):
      weights = drop(attention_lib.folded_weights(q, k, allowed, bias))  # [B, H, L, L]
      out = attention_lib.weights_times_values(weights, v)
    else:
      out = attention_lib.attend(q, k, v, allowed, impl=impl, bias=bias)
    return nn.DenseGeneral(self.width, axis=(-2, -1), kernel_init=self.out_init,
                           dtype=self.dtype, name="out")(out)


class EncoderLayer(nn.Module):
  """Post-LN transformer layer (BERT/RoBERTa): LN(x + attn(x)), LN(x + mlp(x))."""
  width: int
  num_heads: int
  mlp_dim: int
  dropout_rate: float
  attention: str = "softmax"
  attention_impl: str = "einsum"
  dtype: object = None
  position: str = "absolute"     # `xsens.models.position`: the per-layer terms live here.
  max_length: int = 128
  relative_clip: int = 16

  @nn.compact
  def __call__(self, x, mask, train: bool = False, bias=None, segments=None):
    """`bias`: the layer-shared logit bias [B|1, H, L, L] (or None); `segments` [B, L]."""
    drop = lambda y: nn.Dropout(self.dropout_rate, deterministic=not train)(y)
    dt = self.dtype
    relative_keys = None
    if self.position == "diet_rel":
      own = position_lib.DietRelBias(self.num_heads, self.max_length,
                                     name="position_bias")(segments)
      bias = own if bias is None else bias + own
    elif self.position == "shaw":
      relative_keys = position_lib.ShawKeys(self.width // self.num_heads,
                                            self.relative_clip,
                                            name="position_keys")(x.shape[1])
    a = SelfAttention(self.width, self.num_heads, self.dropout_rate, self.attention,
                      attention_impl=self.attention_impl, dtype=dt,
                      name="attention")(x, mask, train, bias, relative_keys)
    x = nn.LayerNorm(epsilon=_LN_EPS, dtype=dt, name="attention_norm")(x + drop(a))
    h = nn.Dense(self.mlp_dim, kernel_init=_INIT, dtype=dt, name="intermediate")(x)
    h = nn.Dense(self.width, kernel_init=_INIT, dtype=dt, name="output")(
        nn.gelu(h, approximate=False))
    return nn.LayerNorm(epsilon=_LN_EPS, dtype=dt, name="output_norm")(x + drop(h))


class RoBERTa(nn.Module):
  """RoBERTa-style post-LN encoder classifier (HF RobertaForSequenceClassification layout).

  ids -> token + position embeddings -> LayerNorm -> [noise] -> dropout -> `depth`
  encoder layers -> head on the first (<s>) token: dropout, Dense(width), tanh, dropout,
  Dense(num_classes). Paper scripts: width 256, depth 4, 8 heads, intermediate 3072
  (left at roberta-base's value), dropout 0.1, max length 128.

  Parameters: V*D + P*D + 2D (embeddings, LN) + depth*(4D^2 + 4D + 2*D*F + F + D + 4D)
  + D^2 + D + D*K + K, with V vocab, P max_length, D width, F mlp_dim, K classes.

  `position` (`xsens.models.position.POSITIONS`) is where position information enters:
  "absolute" (the default: the learned table above),
  "sinusoidal", "none", or a term on the attention logits ("shaw", "t5", "diet_abs",
  "diet_rel"; P*D is then replaced by that term's parameters). `diet_dim` is DIET-ABS's
  d_p (None: the head width), `relative_clip` Shaw et al.'s clipping distance. Segment
  ids (DIET's E_S) are read off the ids in `__call__` (`position.segment_ids`); `encode`
  on tokens treats every token as segment 0 unless given `segments`.
  """
  num_classes: int
  vocab_size: int = 8192
  max_length: int = 128
  width: int = 256
  depth: int = 4
  num_heads: int = 8
  mlp_dim: int = 3072
  dropout_rate: float = 0.1
  attention: str = "softmax"
  dtype: str = "float32"         # Launch fields: module docstring.
  remat: bool = False
  attention_impl: str = "einsum"
  position: str = "absolute"     # Position encoding: see above.
  diet_dim: int | None = None
  relative_clip: int = 16

  def check_input(self, input_shape) -> None:
    """Raises ConfigError for settings impossible on ids of per-example shape (L,)."""
    _check_transformer(self, input_shape)
    _checks.one_of("attention", self.attention, ATTENTIONS)
    position_lib.check_position_fields(self)

  def setup(self):
    dt = precision.compute_dtype(self.dtype)
    self.word_embeddings = nn.Embed(self.vocab_size, self.width, embedding_init=_INIT,
                                    dtype=dt)
    if self.position == "absolute":
      self.position_embeddings = nn.Embed(self.max_length, self.width,
                                          embedding_init=_INIT, dtype=dt)
    elif self.position == "t5":
      self.position_bias = position_lib.T5Bias(self.num_heads)
    elif self.position == "diet_abs":
      self.position_bias = position_lib.DietAbsBias(
          self.num_heads, self.max_length, self.diet_dim or self.width // self.num_heads)
    self.embedding_norm = nn.LayerNorm(epsilon=_LN_EPS, dtype=dt)
    # `train` (argument 3, `self` being 0) is static under remat.
    layer = nn.remat(EncoderLayer, static_argnums=(3,)) if self.remat else EncoderLayer
    self.layers = [layer(self.width, self.num_heads, self.mlp_dim, self.dropout_rate,
                         self.attention, self.attention_impl, dt, position=self.position,
                         max_length=self.max_length, relative_clip=self.relative_clip)
                   for _ in range(self.depth)]
    self.head_dense = nn.Dense(self.width, kernel_init=_INIT, dtype=dt)
    self.head_out = nn.Dense(self.num_classes, kernel_init=_INIT, dtype=dt)
    self.dropout = nn.Dropout(self.dropout_rate)

  def embed(self, ids, train: bool = False):
    """ids [B, L] -> tokens [B, L, D]: LayerNorm(word + position embeddings)."""
    del train
    return self.embedding_norm(self.embed_pre_norm(ids))

  def embed_pre_norm(self, ids, train: bool = False):
    """ids [B, L] -> word + position embeddings [B, L, D], before the LayerNorm (word
    embeddings only where `position` is not an input encoding)."""
    del train
    positions = jnp.arange(ids.shape[1])
    words = self.word_embeddings(ids)
    if self.position == "absolute":
      return words + self.position_embeddings(positions)
    if self.position == "sinusoidal":
      table = position_lib.sinusoidal_table(ids.shape[1], self.width)
      return words + table.astype(words.dtype)
    return words

  def encode_pre_norm(self, tokens, mask, train: bool = False):
    """`encode` of the embedding LayerNorm of `tokens` (from `embed_pre_norm`)."""
    return self.encode(self.embedding_norm(tokens), mask, train)

  def logit_bias(self, segments):
    """The layer-shared logit bias of `position` ("t5", "diet_abs"): segments [B, L] ->
    [B|1, H, L, L], or None."""
    if self.position == "t5":
      return self.position_bias(segments.shape[1])
    if self.position == "diet_abs":
      return self.position_bias(segments)
    return None

  def hidden_states(self, tokens, mask, train: bool = False, segments=None):
    """tokens [B, L, D], mask [B, L], segments [B, L] int (None: all 0) -> last layer's
    hidden states [B, L, D]."""
    if segments is None:
      segments = jnp.zeros(tokens.shape[:2], jnp.int32)
    bias = self.logit_bias(segments)
    x = self.dropout(tokens, deterministic=not train)
    for layer in self.layers:
      x = (layer(x, mask, train) if self.position == "absolute"
           else layer(x, mask, train, bias, segments))
    return x

  def encode(self, tokens, mask, train: bool = False, segments=None):
    """tokens [B, L, D], mask [B, L] bool -> logits [B, K] from the first token."""
    x = self.hidden_states(tokens, mask, train, segments)[:, 0]
    x = jnp.tanh(self.head_dense(self.dropout(x, deterministic=not train)))
    return self.head_out(self.dropout(x, deterministic=not train)).astype(jnp.float32)

  def __call__(self, ids, train: bool = False):
    segments = None if self.position == "absolute" else position_lib.segment_ids(ids)
    return self.encode(self.embed(ids, train), padding_mask(ids), train, segments)


class GPT2Block(nn.Module):
  """Pre-LN causal block: x + attn(ln_1(x)), x + mlp(ln_2(x)) (GELU tanh approximation)."""
  width: int
  num_heads: int
  mlp_dim: int
  dropout_rate: float
  depth: int
  attention_impl: str = "einsum"
  dtype: object = None

  @nn.compact
  def __call__(self, x, mask, train: bool = False):
    drop = lambda y: nn.Dropout(self.dropout_rate, deterministic=not train)(y)
    dt = self.dtype
    proj_init = nn.initializers.normal(0.02 / math.sqrt(2 * self.depth))
    a = SelfAttention(self.width, self.num_heads, self.dropout_rate, causal=True,
                      out_init=proj_init, attention_impl=self.attention_impl, dtype=dt,
                      name="attn")(
                          nn.LayerNorm(epsilon=_LN_EPS, dtype=dt, name="ln_1")(x), mask, train)
    x = x + drop(a)
    h = nn.Dense(self.mlp_dim, kernel_init=_INIT, dtype=dt, name="c_fc")(
        nn.LayerNorm(epsilon=_LN_EPS, dtype=dt, name="ln_2")(x))
    h = nn.Dense(self.width, kernel_init=proj_init, dtype=dt, name="c_proj")(
        nn.gelu(h, approximate=True))
    return x + drop(h)


class GPT2(nn.Module):
  """GPT-2-style causal decoder classifier (HF GPT2ForSequenceClassification layout).

  ids -> wte + wpe -> [noise] -> dropout -> `depth` pre-LN causal blocks -> ln_f ->
  Dense(num_classes, no bias) on the last non-pad token. Paper (App. Fig. 20): 4 layers,
  8 heads, width 256; the MLP is 4 * width wide as in GPT-2.

  Parameters: V*D + P*D + depth*(4D^2 + 4D + 2*D*F + F + D + 4D) + 2D + D*K.
  """
  num_classes: int
  vocab_size: int = 8192
  max_length: int = 128
  width: int = 256
  depth: int = 4
  num_heads: int = 8
  mlp_dim: int = 1024
  dropout_rate: float = 0.1
  dtype: str = "float32"         # Launch fields: module docstring.
  remat: bool = False
  attention_impl: str = "einsum"

  def check_input(self, input_shape) -> None:
    """Raises ConfigError for settings impossible on ids of per-example shape (L,)."""
    _check_transformer(self, input_shape)

  def setup(self):
    dt = precision.compute_dtype(self.dtype)
    self.wte = nn.Embed(self.vocab_size, self.width, embedding_init=_INIT, dtype=dt)
    self.wpe = nn.Embed(self.max_length, self.width, embedding_init=_INIT, dtype=dt)
    # `train` (argument 3, `self` being 0) is static under remat.
    block = nn.remat(GPT2Block, static_argnums=(3,)) if self.remat else GPT2Block
    self.blocks = [block(self.width, self.num_heads, self.mlp_dim, self.dropout_rate,
                         self.depth, self.attention_impl, dt) for _ in range(self.depth)]
    self.ln_f = nn.LayerNorm(epsilon=_LN_EPS, dtype=dt)
    self.score = nn.Dense(self.num_classes, use_bias=False, kernel_init=_INIT, dtype=dt)
    self.dropout = nn.Dropout(self.dropout_rate)

  def embed(self, ids, train: bool = False):
    """ids [B, L] -> tokens [B, L, D] = wte(ids) + wpe(0..L-1) (no LayerNorm in GPT-2)."""
    del train
    return self.wte(ids) + self.wpe(jnp.arange(ids.shape[1]))

  def embed_pre_norm(self, ids, train: bool = False):
    """= `embed`: GPT-2 has no embedding LayerNorm, so both noise placements coincide."""
    return self.embed(ids, train)

  def encode_pre_norm(self, tokens, mask, train: bool = False):
    """= `encode` (see `embed_pre_norm`)."""
    return self.encode(tokens, mask, train)

  def hidden_states(self, tokens, mask, train: bool = False):
    """tokens [B, L, D], mask [B, L] -> ln_f(blocks(tokens)) [B, L, D]; causal."""
    x = self.dropout(tokens, deterministic=not train)
    for block in self.blocks:
      x = block(x, mask, train)
    return self.ln_f(x)

  def encode(self, tokens, mask, train: bool = False):
    """tokens [B, L, D], mask [B, L] bool -> logits [B, K] at the last non-pad token."""
    h = self.hidden_states(tokens, mask, train)
    last = jnp.take_along_axis(h, last_index(mask)[:, None, None], axis=1)[:, 0]
    return self.score(last).astype(jnp.float32)

  def __call__(self, ids, train: bool = False):
    return self.encode(self.embed(ids, train), padding_mask(ids), train)


def _torch_uniform(bound: float) -> Callable:
  """uniform(-bound, bound), PyTorch's nn.LSTM initialisation."""
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


class LSTMLayer(nn.Module):
  """One LSTM layer in PyTorch's parametrisation (gate order i, f, g, o; two biases).

    g_t = x_t W_ih + b_ih + h_{t-1} W_hh + b_hh = [i, f, g, o]
    c_t = sigmoid(f) c_{t-1} + sigmoid(i) tanh(g),   h_t = sigmoid(o) tanh(c_t)

  Where mask_t is False (padding) the state is carried unchanged, so the final carry is
  the state after the last valid token. x [B, L, In], mask [B, L] -> (h [B, L, H],
  h_last [B, H]), float32. The matrix products run in `dtype` (None: float32); the gates
  and the state (h, c) are float32.
  """
  hidden_dim: int
  dtype: Any = None

  @nn.compact
  def __call__(self, x, mask):
    hid, dt = self.hidden_dim, self.dtype
    init = _torch_uniform(1.0 / math.sqrt(hid))
    w_ih = precision.cast(self.param("w_ih", init, (x.shape[-1], 4 * hid)), dt)
    w_hh = precision.cast(self.param("w_hh", init, (hid, 4 * hid)), dt)
    b_ih = precision.cast(self.param("b_ih", init, (4 * hid,)), dt)
    b_hh = precision.cast(self.param("b_hh", init, (4 * hid,)), dt)
    gates_x = precision.cast(x, dt) @ w_ih + b_ih + b_hh          # [B, L, 4H], all steps.

    def step(carry, inputs):
      h_prev, c_prev = carry
      gx, m = inputs
      gates = (gx + precision.cast(h_prev, dt) @ w_hh).astype(jnp.float32)
      i, f, g, o = jnp.split(gates, 4, axis=-1)
      c = jax.nn.sigmoid(f) * c_prev + jax.nn.sigmoid(i) * jnp.tanh(g)
      h = jax.nn.sigmoid(o) * jnp.tanh(c)
      m = m[:, None]
      h, c = jnp.where(m, h, h_prev), jnp.where(m, c, c_prev)
      return (h, c), h

    zeros = jnp.zeros((x.shape[0], hid), jnp.float32)
    (h_last, _), hs = jax.lax.scan(
        step, (zeros, zeros), (jnp.swapaxes(gates_x, 0, 1), jnp.swapaxes(mask, 0, 1)))
    return jnp.swapaxes(hs, 0, 1), h_last


class LSTM(nn.Module):
  """LSTM classifier: Embedding -> LayerNorm -> [noise] -> `depth` LSTM layers -> Dense.

  The official model (language/, docs/papers/sensitivity.md §8): Embedding(V, 256) ->
  LayerNorm(256) -> 4-layer LSTM(256) -> Linear, dropout 0.1 (applied here between LSTM layers, as
  PyTorch's nn.LSTM(dropout=) does). The head reads the hidden state after the last valid token.

  Parameters: V*D + 2D + sum_l 4H*(in_l + H + 2) + H*K + K, in_0 = D, in_l = H.

  `official_frozen=True` is the official code as released (docs/papers/sensitivity.md §8 defect 5:
  its optimiser gets only the LSTM parameters): the embedding, the LayerNorm and the head stay
  at their initial values, only the LSTM layers train. Here the LayerNorm has no scale
  and bias (its initial values, 1 and 0) and the embedding table and the head get no
  gradient (`jax.lax.stop_gradient`); decoupled AdamW weight decay still multiplies those
  two by (1 - lr * wd) per step (0.985 after 1,500 steps at lr 1e-3, wd 0.01): the
  LayerNorm removes that scale from the embedding exactly, and on the head it rescales
  the logits uniformly (the argmax, and so every flip, is unchanged).

  `dtype` is the compute dtype ("float32" | "bfloat16"; module docstring).
  """
  num_classes: int
  vocab_size: int = 8192
  width: int = 256
  hidden_dim: int = 256
  depth: int = 4
  dropout_rate: float = 0.1
  official_frozen: bool = False
  dtype: str = "float32"

  def check_input(self, input_shape) -> None:
    """Raises ConfigError for settings impossible on ids of per-example shape (L,)."""
    for field in ("vocab_size", "width", "hidden_dim", "depth"):
      _checks.positive_int(field, getattr(self, field))
    _check_ids_shape(input_shape, self.num_classes, None)
    _checks.rate("dropout_rate", self.dropout_rate)
    if not isinstance(self.official_frozen, bool):
      raise ConfigError("model.official_frozen", f"must be True or False, got "
                        f"{self.official_frozen!r}")
    _checks.dtype(self.dtype)

  def setup(self):
    dt = precision.compute_dtype(self.dtype)
    self.embedding = nn.Embed(self.vocab_size, self.width,
                              embedding_init=nn.initializers.normal(1.0), dtype=dt)
    # Frozen at initialisation: a LayerNorm with scale 1 and bias 0, i.e. none.
    self.embedding_norm = nn.LayerNorm(epsilon=_LN_EPS, use_scale=not self.official_frozen,
                                       use_bias=not self.official_frozen, dtype=dt)
    self.layers = [LSTMLayer(self.hidden_dim, dt) for _ in range(self.depth)]
    self.head = nn.Dense(self.num_classes, dtype=dt,
                         kernel_init=_torch_uniform(1.0 / math.sqrt(self.hidden_dim)))
    self.dropout = nn.Dropout(self.dropout_rate)

  def embed(self, ids, train: bool = False):
    """ids [B, L] -> tokens [B, L, D] = LayerNorm(embedding(ids))."""
    return self.embedding_norm(self.embed_pre_norm(ids, train))

  def embed_pre_norm(self, ids, train: bool = False):
    """ids [B, L] -> embedding(ids) [B, L, D], before the LayerNorm."""
    del train
    if self.official_frozen:
      table = jax.lax.stop_gradient(self.embedding.embedding)
      return precision.cast(jnp.take(table, ids, axis=0), self.embedding.dtype)
    return self.embedding(ids)

  def encode_pre_norm(self, tokens, mask, train: bool = False):
    """`encode` of the LayerNorm of `tokens` (from `embed_pre_norm`)."""
    return self.encode(self.embedding_norm(tokens), mask, train)

  def hidden_states(self, tokens, mask, train: bool = False):
    """tokens [B, L, D], mask [B, L] -> (top layer outputs [B, L, H], last state [B, H])."""
    x, last = tokens, None
    for i, layer in enumerate(self.layers):
      if i:
        x = self.dropout(x, deterministic=not train)
      x, last = layer(x, mask)
    return x, last

  def encode(self, tokens, mask, train: bool = False):
    """tokens [B, L, D], mask [B, L] bool -> logits [B, K]."""
    h = self.hidden_states(tokens, mask, train)[1]
    logits = self.head(h)
    if self.official_frozen:  # The same map, no gradient to the head's parameters.
      p = jax.tree.map(jax.lax.stop_gradient, self.head.variables["params"])
      dt = self.head.dtype
      logits = (precision.cast(h, dt) @ precision.cast(p["kernel"], dt)
                + precision.cast(p["bias"], dt))
    return logits.astype(jnp.float32)

  def __call__(self, ids, train: bool = False):
    return self.encode(self.embed(ids, train), padding_mask(ids), train)


TEXT_MODELS = {"roberta": RoBERTa, "gpt2": GPT2, "lstm": LSTM}
