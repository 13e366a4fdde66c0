"""Vision Transformer for small images (pre-LN, CLS or mean pooling).

The patch embedding is the first op on the pixels: a Conv with
kernel = stride = `patch_size`, so each grid-aligned, non-overlapping
p x p patch maps to exactly one token (row-major over the patch grid).

Attention weights are sown into the `intermediates` collection; get them with
`model.apply(variables, x, train=False, mutable=['intermediates'])`. They are formed only
then: otherwise the attention core `attention_impl` runs (xsens/models/attention.py:
"einsum", the default; "folded", heads folded into the batch, faster on CPU; "xla_fused" /
"cudnn", `jax.nn.dot_product_attention`).

Launch fields, all off by default (the same numbers as without them): `dtype`
"bfloat16" computes in bfloat16 (flax `dtype=`; params stay float32, the logits are
returned in float32); `remat=True` rematerialises each encoder block in the backward pass
(`nn.remat`, `train` static). Neither changes the parameter tree, so checkpoints load with
them or without them.

Layer removal without retraining (Bhojanapalli et al. 2021, "Understanding
Robustness of Transformers for Image Classification", arXiv 2103.14586): the
static field `skip` names (layer, part) pairs, part in 'block' | 'attention' |
'mlp', whose residual branch is dropped (identity on the residual stream). The
parameter tree does not depend on `skip`, so the same variables apply:
`model.clone(skip=((3, "mlp"),)).apply(variables, x, train=False)`. A skipped
attention sub-layer sows no attention weights.

The parameter names follow google-research/vision_transformer (Dosovitskiy et
al. 2021, "An Image is Worth 16x16 Words", arXiv 2010.11929) where they can;
`xsens.models.pretrained` maps its `.npz` checkpoints onto this tree. LayerNorm
uses flax's default epsilon 1e-6, as vit_jax does.

Small-dataset options (Lee, Lee, Song 2021, "Vision Transformer for Small-Size
Datasets", arXiv 2112.13492; the ViT of the official sensitivity code,
estija/sensitivity `cifar/cifar_sens.py`, model 'vit'). Both are off by default, and
the default ViT's parameter tree and numbers do not change:

- `tokenizer="spt"`, Shifted Patch Tokenization: the image is concatenated on the
  channel axis with 4 zero-filled shifted copies of itself, [x, lu, ru, lb, rb] (5C
  channels), cut into the same grid-aligned p x p patches, and each patch
  (flattened row, column, channel) goes through LayerNorm then a Dense to `width`
  (params `spt_norm`, `spt_embedding` in place of the conv `embedding`).
  `spt_shifts="diagonal"` (the paper's; aanna0701/SPT_LSA_ViT `PatchShifting`)
  shifts by p // 2 pixels diagonally, copy lu holding x[i - s, j - s] at (i, j),
  ru x[i - s, j + s], lb x[i + s, j - s], rb x[i + s, j + s]; "axis" shifts by one
  pixel right, left, down and up (lucidrains/vit-pytorch `vit_for_small_dataset.py`,
  the SPT most ports of it copy). What a "token" is for the token-wise sensitivity
  (`xsens.measures.sensitivity`, `xsens.measures.tokens`): still the p x p pixel
  patch of the unshifted image. The noise goes into those pixels and the model
  computes its shifted copies from the noised image, so noise in patch i also
  reaches the neighbouring tokens through their shifted channels, as it would in
  the PyTorch model.
- `attention="lsa"`, Locality Self-Attention: each block's attention logits are
  scaled by exp(tau) instead of 1/sqrt(head_dim), tau a learnable scalar per block
  (param `lsa_temperature`, initialised to log(head_dim ** -0.5), so the first
  forward equals plain attention but for the mask), and each token's logit to itself
  (the diagonal, the CLS token included) is masked out before the softmax.
"""

import functools

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from xsens.errors import ConfigError
from xsens.models import _checks
from xsens.models import attention as attention_lib
from xsens.models import position as position_lib
from xsens.models import precision as precision_lib
from xsens.models import token_split as split_lib

POOLINGS = ("cls", "mean")
POSEMBS = ("learned", "sincos", "none")
POSITION_BIASES = ("none", "diet_abs", "diet_rel")   # DIET's logit terms (position.py).
TOKENIZERS = ("patch", "spt")
SPT_SHIFTS = ("diagonal", "axis")
ATTENTIONS = ("mha", "lsa")
SKIP_PARTS = ("block", "attention", "mlp")


def skipped_parts(skip, depth: int) -> dict[int, frozenset[str]]:
  """Validates `skip` and groups it by layer.

  Args:
    skip: sequence of (layer, part) pairs, layer in [0, depth), part in
      SKIP_PARTS.
    depth: number of encoder blocks.

  Returns:
    {layer: set of parts}; 'block' stands for both 'attention' and 'mlp'.

  Raises:
    ConfigError: naming `model.skip` for a malformed pair.
  """
  out: dict[int, set[str]] = {}
  for pair in skip:
    if (not isinstance(pair, (tuple, list)) or len(pair) != 2
        or not isinstance(pair[0], int) or isinstance(pair[0], bool)
        or not 0 <= pair[0] < depth or pair[1] not in SKIP_PARTS):
      raise ConfigError(
          "model.skip",
          f"entries must be (layer, part) with layer in [0, {depth}) and part in "
          f"{', '.join(SKIP_PARTS)}; got {pair!r}")
    parts = {"attention", "mlp"} if pair[1] == "block" else {pair[1]}
    out.setdefault(pair[0], set()).update(parts)
  return {k: frozenset(v) for k, v in out.items()}


def posemb_sincos_2d(h: int, w: int, width: int,
                     temperature: float = 10_000.) -> jnp.ndarray:
  """2D sin-cos position embedding for an h x w token grid.

  Quarter of the channels each: sin(x), cos(x), sin(y), cos(y), with
  frequencies 1 / temperature**(i / (width/4 - 1)).

  Args:
    h: grid rows.
    w: grid columns.
    width: embedding size; a multiple of 4.
    temperature: the longest wavelength.

  Returns:
    [1, h * w, width] float32, tokens in row-major order.
  """
  quarter = width // 4
  y, x = np.mgrid[:h, :w]
  omega = np.arange(quarter) / max(quarter - 1, 1)
  omega = 1. / temperature**omega
  y = np.outer(y.reshape(-1), omega)
  x = np.outer(x.reshape(-1), omega)
  pe = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
  return jnp.asarray(pe, jnp.float32)[None]


def shift_image(x: jnp.ndarray, dy: int, dx: int) -> jnp.ndarray:
  """[B, H, W, C] moved by (dy, dx) pixels, zero-filled: out[i, j] = x[i - dy, j - dx]."""
  h, w = x.shape[1:3]
  x = jnp.pad(x, ((0, 0), (max(dy, 0), max(-dy, 0)), (max(dx, 0), max(-dx, 0)), (0, 0)))
  top, left = max(-dy, 0), max(-dx, 0)
  return x[:, top:top + h, left:left + w]


def spt_offsets(patch_size: int, shifts: str) -> tuple[tuple[int, int], ...]:
  """The (dy, dx) of SPT's 4 shifted copies, in concatenation order (module docstring)."""
  if shifts == "diagonal":
    s = patch_size // 2
    return ((s, s), (s, -s), (-s, s), (-s, -s))     # lu, ru, lb, rb
  return ((0, 1), (0, -1), (1, 0), (-1, 0))         # F.pad (1, -1, 0, 0), ... in order


def shifted_patches(images: jnp.ndarray, patch_size: int, shifts: str) -> jnp.ndarray:
  """SPT's input: [B, H, W, C] -> [B, (H/p)(W/p), p*p*5C], patches row-major, each
  flattened (row, column, channel) over the channels [x, 4 shifted copies]."""
  x = jnp.concatenate([images] + [shift_image(images, dy, dx)
                                  for dy, dx in spt_offsets(patch_size, shifts)], axis=-1)
  b, h, w, c = x.shape
  p = patch_size
  x = x.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, (h // p) * (w // p), p * p * c)


def lsa_attention(query, key, value, mask=None, dropout_rng=None, dropout_rate=0.,
                  broadcast_dropout=True, deterministic=True, dtype=None, precision=None,
                  module=None, *, log_scale, impl="einsum"):
  """Locality self-attention as a flax `attention_fn`: logits q·k·exp(log_scale), the
  diagonal (each token to itself) masked, softmax, weights · v, with the attention core
  `impl` (`xsens.models.attention`). Sows the weights as `attention_weights` when flax
  passes `module` (sow_weights=True)."""
  head_dim = query.shape[-1]
  # dot_product_attention divides q by sqrt(head_dim); undo it and apply exp(tau).
  query = query * (jnp.exp(log_scale) * jnp.sqrt(head_dim)).astype(query.dtype)
  t = query.shape[-3]
  off_diagonal = ~jnp.eye(t, key.shape[-3], dtype=bool)[None, None]
  mask = off_diagonal if mask is None else jnp.logical_and(mask, off_diagonal)
  return attention_lib.attention_fn(
      query, key, value, mask=mask, dropout_rng=dropout_rng, dropout_rate=dropout_rate,
      broadcast_dropout=broadcast_dropout, deterministic=deterministic, dtype=dtype,
      precision=precision, module=module, impl=impl)


class MlpBlock(nn.Module):
  """Dense(mlp_dim) -> GELU -> Dropout -> Dense(width) -> Dropout."""
  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: object = None   # Compute dtype (None: float32, from the params).

  @nn.compact
  def __call__(self, x, train: bool):
    width = x.shape[-1]
    x = nn.gelu(nn.Dense(self.mlp_dim, dtype=self.dtype)(x))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    x = nn.Dense(width, dtype=self.dtype)(x)
    return nn.Dropout(self.dropout_rate, deterministic=not train)(x)


class EncoderBlock(nn.Module):
  """Pre-LN block: x + MHSA(LN(x)); x + MLP(LN(x)). [B, T, D] -> [B, T, D].

  `skip_attention` / `skip_mlp` drop that residual branch (x passes through
  unchanged). The sub-modules are built (and initialised) either way, so the
  parameter tree is the same with or without skipping. The attention weights are
  formed and sown only when `intermediates` is mutable; otherwise the core
  `attention_impl` (`xsens.models.attention`) runs.
  """
  num_heads: int
  mlp_dim: int
  dropout_rate: float = 0.0
  skip_attention: bool = False
  skip_mlp: bool = False
  attention: str = "mha"   # "lsa": locality self-attention (module docstring).
  attention_impl: str = "einsum"
  dtype: object = None     # Compute dtype (None: float32, from the params).
  # A flax `attention_fn` replacing the core (None: the ViT's; e.g. the partial
  # computation of `xsens.models.eigen_vit`).
  attention_core: object = None

  @nn.compact
  def __call__(self, x, train: bool, bias=None):
    # Explicit names equal flax's automatic ones, so skipping a branch never
    # renames the modules after it.
    ln_0 = nn.LayerNorm(dtype=self.dtype, name="LayerNorm_0")
    kwargs = {}
    if bias is not None:   # DIET's logit term [1, H, T, T] (ViT.position_bias).
      kwargs["attention_fn"] = functools.partial(attention_lib.attention_fn, bias=bias,
                                                 impl=self.attention_impl)
    elif self.attention == "lsa":
      head_dim = x.shape[-1] // self.num_heads
      tau = self.param("lsa_temperature", nn.initializers.constant(
          float(np.log(head_dim ** -0.5))), (), jnp.float32)
      kwargs["attention_fn"] = functools.partial(lsa_attention, log_scale=tau,
                                                 impl=self.attention_impl)
    elif self.attention_core is not None:
      kwargs["attention_fn"] = self.attention_core
    elif self.attention_impl != "einsum":
      kwargs["attention_fn"] = functools.partial(attention_lib.attention_fn,
                                                 impl=self.attention_impl)
    attention = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, dtype=self.dtype, name="MultiHeadDotProductAttention_0",
        **kwargs)
    ln_1 = nn.LayerNorm(dtype=self.dtype, name="LayerNorm_1")
    mlp = MlpBlock(self.mlp_dim, self.dropout_rate, self.dtype, name="MlpBlock_0")
    init = self.is_initializing()

    if init or not self.skip_attention:
      y = ln_0(x)
      sow = self.is_mutable_collection("intermediates")
      y = attention(y, y, deterministic=True, sow_weights=sow)
      y = nn.Dropout(self.dropout_rate, deterministic=not train)(y)
      x = x if self.skip_attention else x + y
    if init or not self.skip_mlp:
      y = mlp(ln_1(x), train)
      x = x if self.skip_mlp else x + y
    return x


def classifier_head(vit: nn.Module, x: jnp.ndarray, dt) -> jnp.ndarray:
  """The ViT's end, run inside `vit`'s compact `__call__`: encoder LayerNorm, CLS token
  or mean pooling, optional pre-logits, head. [B, T, width] -> float32 logits [B, K]."""
  x = nn.LayerNorm(dtype=dt, name="encoder_norm")(x)
  x = x[:, 0] if vit.pooling == "cls" else x.mean(axis=1)
  if vit.representation_size is not None:
    x = jnp.tanh(nn.Dense(vit.representation_size, dtype=dt, name="pre_logits")(x))
  return nn.Dense(vit.num_classes, dtype=dt, name="head")(x).astype(jnp.float32)


def encoder_input(vit: nn.Module, images: jnp.ndarray, train: bool):
  """The start of every ViT-family `__call__` (run inside its compact scope): the stem
  (`embed_tokens`), input dropout, and the parsed `vit.skip`.

  Returns (tokens [B, T (+1), width], compute dtype, {layer: skipped parts}).
  """
  x = embed_tokens(vit, images)
  x = nn.Dropout(vit.dropout_rate, deterministic=not train)(x)
  return x, precision_lib.compute_dtype(vit.dtype), skipped_parts(vit.skip, vit.depth)


def embed_tokens(vit: nn.Module, images: jnp.ndarray) -> jnp.ndarray:
  """The ViT stem, run inside `vit`'s compact `__call__` (params land in its scope).

  Patch embedding (a p×p conv with stride p, so one pixel patch is one token; or, for
  `tokenizer == "spt"`, the shifted patches through LayerNorm and a Dense), learned or
  sin-cos position embedding, then the CLS token when `vit.pooling == "cls"`.
  [B, H, W, C] -> [B, T (+1), width], in the compute dtype `vit.dtype`.
  """
  p = vit.patch_size
  dt = precision_lib.compute_dtype(getattr(vit, "dtype", "float32"))
  if getattr(vit, "tokenizer", "patch") == "spt":
    x = shifted_patches(images, p, vit.spt_shifts)
    x = nn.Dense(vit.width, dtype=dt, name="spt_embedding")(
        nn.LayerNorm(dtype=dt, name="spt_norm")(x))
    b, d = x.shape[0], vit.width
    h, w = images.shape[1] // p, images.shape[2] // p
  else:
    x = nn.Conv(vit.width, (p, p), strides=(p, p), padding="VALID", dtype=dt,
                name="embedding")(images)
    b, h, w, d = x.shape
    x = x.reshape(b, h * w, d)
  if vit.posemb == "learned":
    x = x + precision_lib.cast(vit.param(
        "pos_embedding", nn.initializers.normal(stddev=0.02), (1, h * w, d), jnp.float32), dt)
  elif vit.posemb == "sincos":
    x = x + precision_lib.cast(posemb_sincos_2d(h, w, d), dt)
  if vit.pooling == "cls":
    cls = precision_lib.cast(vit.param("cls", nn.initializers.zeros, (1, 1, d), jnp.float32), dt)
    x = jnp.concatenate([jnp.tile(cls, (b, 1, 1)), x], axis=1)
  return x


class ViT(nn.Module):
  """ViT classifier: [B, H, W, C] -> logits [B, num_classes]."""
  num_classes: int
  patch_size: int = 4
  width: int = 64
  depth: int = 2
  num_heads: int = 4
  mlp_dim: int = 128
  pooling: str = "cls"
  posemb: str = "learned"
  dropout_rate: float = 0.0
  # vit_jax's optional pre-logits layer: Dense(representation_size) -> tanh
  # between the pooled token and the head (None: no such layer).
  representation_size: int | None = None
  # (layer, part) residual branches to drop; see the module docstring.
  skip: tuple[tuple[int, str], ...] = ()
  # Small-dataset options (module docstring): "spt" shifted patch tokens, "lsa"
  # locality self-attention; the defaults are the plain ViT.
  tokenizer: str = "patch"
  spt_shifts: str = "diagonal"
  attention: str = "mha"
  # Launch options (the defaults give the numbers of the models without them):
  # the compute dtype ("float32" | "bfloat16"; params stay float32, logits float32),
  # rematerialised encoder blocks, and the attention core (`xsens.models.attention`).
  dtype: str = "float32"
  remat: bool = False
  attention_impl: str = "einsum"
  # DIET (xsens.models.position) on the flattened tokens, CLS included, no segments:
  # "diet_abs" (one P_Q P_Kᵀ per head, d_p = d_h, shared by the blocks) or "diet_rel"
  # (R_{i−j} per head and block); use with posemb="none" for nothing at the input.
  position_bias: str = "none"

  def check_input(self, image_shape: tuple[int, int, int]) -> None:
    """Raises ConfigError for settings impossible on (H, W, C) inputs."""
    image_shape = _checks.image(image_shape, self.num_classes)
    for field in ("patch_size", "width", "depth", "num_heads", "mlp_dim"):
      _checks.positive_int(field, getattr(self, field))
    _checks.divides("patch_size", self.patch_size, image_shape)
    if self.width % self.num_heads:
      raise ConfigError(
          "model.width",
          f"{self.width} must be divisible by model.num_heads={self.num_heads}")
    _checks.one_of("pooling", self.pooling, POOLINGS)
    _checks.one_of("posemb", self.posemb, POSEMBS)
    if self.posemb == "sincos" and self.width % 4:
      raise ConfigError(
          "model.width", f"{self.width} must be a multiple of 4 for posemb='sincos'")
    _checks.rate("dropout_rate", self.dropout_rate)
    if self.representation_size is not None:
      _checks.positive_int("representation_size", self.representation_size)
    skipped_parts(self.skip, self.depth)
    _checks.one_of("tokenizer", self.tokenizer, TOKENIZERS)
    _checks.one_of("spt_shifts", self.spt_shifts, SPT_SHIFTS)
    _checks.one_of("attention", self.attention, ATTENTIONS)
    _checks.one_of("position_bias", self.position_bias, POSITION_BIASES)
    if self.position_bias != "none" and (type(self) is not ViT or self.attention != "mha"):
      raise ConfigError("model.position_bias", f"{self.position_bias!r} needs the plain "
                        "ViT with attention='mha'; use 'none'")
    attention_lib.check_launch_fields(self)
    if (self.tokenizer == "spt" and self.spt_shifts == "diagonal"
        and self.patch_size < 2):
      raise ConfigError("model.patch_size", "must be >= 2 for tokenizer='spt' with "
                        "spt_shifts='diagonal' (the shift is patch_size // 2 pixels)")

  def removable_layers(self, parts=SKIP_PARTS) -> tuple[tuple[int, str], ...]:
    """Every (layer, part) pair `remove_layers` can drop, layer-major, parts in order."""
    _checks.removal_parts(parts, SKIP_PARTS)
    return tuple((i, p) for i in range(self.depth) for p in parts)

  def remove_layers(self, layers) -> "ViT":
    """A copy with the residual branches `layers` ((layer, part) pairs) dropped.

    (i, 'block') makes encoder block i the identity, (i, 'attention') keeps only
    its MLP branch x + MLP(LN(x)), (i, 'mlp') keeps only x + MHSA(LN(x)). Any
    existing `skip` is replaced; the copy applies to the same variables.

    Raises:
      ConfigError: naming `model.skip` for a malformed pair.
    """
    layers = tuple((int(i), str(p)) for i, p in layers)
    skipped_parts(layers, self.depth)  # Validates.
    return self.clone(skip=layers)

  @nn.nowrap
  def token_split(self, patch_size, input_shape):
    """The forward split at the first attention (`xsens.models.token_split`) for tokens
    that are this ViT's own patches, or None (another patch size, SPT tokens, a subclass)."""
    if (type(self) is not ViT or patch_size != self.patch_size or self.tokenizer != "patch"
        or len(input_shape) != 3):
      return None
    return vit_token_split(self, tuple(input_shape))

  @nn.compact
  def __call__(self, x, train: bool = False):
    x, dt, skipped = encoder_input(self, x, train)
    # `train` (argument 2, `self` being 0) is static under remat.
    block = nn.remat(EncoderBlock, static_argnums=(2,)) if self.remat else EncoderBlock
    tokens, bias = jnp.zeros((1, x.shape[1]), jnp.int32), None
    if self.position_bias == "diet_abs":
      bias = position_lib.DietAbsBias(self.num_heads, x.shape[1], self.width // self.num_heads,
                                      use_segments=False, name="position_bias")(tokens)
    for i in range(self.depth):
      parts = skipped.get(i, frozenset())
      if self.position_bias == "diet_rel":
        bias = position_lib.DietRelBias(self.num_heads, x.shape[1], use_segments=False,
                                        name=f"position_bias_{i}")(tokens)
      x = block(self.num_heads, self.mlp_dim, self.dropout_rate,
                skip_attention="attention" in parts,
                skip_mlp="mlp" in parts, attention=self.attention,
                attention_impl=self.attention_impl, dtype=dt,
                name=f"encoderblock_{i}")(x, train, bias)
    return classifier_head(self, x, dt)


def vit_token_split(vit: ViT, image_shape: tuple[int, int, int]) -> split_lib.TokenSplit:
  """The ViT split at its first attention, tokens = its p x p pixel patches (D = p*p*C).

  prefix: patch embedding (the conv on one patch), position embedding, and, where block 0
  keeps its attention, that block's LayerNorm and Q/K/V projections; features
  [N, (1 or 4) * width] = [embedding before the position term, q, k, v].
  rest: the ViT's own forward with those submodules replaced by the features (the CLS
  token, when pooling='cls', goes through them as usual).
  """
  h, w, c = image_shape
  p, width, heads = vit.patch_size, vit.width, vit.num_heads
  grid_h, grid_w = h // p, w // p
  t = grid_h * grid_w
  dt = precision_lib.compute_dtype(vit.dtype)
  qkv = "attention" not in skipped_parts(vit.skip, vit.depth).get(0, ())
  extra = 1 if vit.pooling == "cls" else 0
  names = ("query", "key", "value") if qkv else ()
  model = vit.clone(remat=False)   # Same forward; interception needs the plain blocks.

  def prefix(variables, tokens, positions):
    params = variables["params"]
    n = tokens.shape[0]
    emb = nn.Conv(width, (p, p), strides=(p, p), padding="VALID", dtype=dt).apply(
        {"params": params["embedding"]}, tokens.reshape(n, p, p, c)).reshape(n, width)
    if not qkv:
      return emb
    x = emb
    if vit.posemb == "learned":
      x = x + precision_lib.cast(params["pos_embedding"][0], dt)[positions]
    elif vit.posemb == "sincos":
      x = x + precision_lib.cast(posemb_sincos_2d(grid_h, grid_w, width)[0], dt)[positions]
    block = params["encoderblock_0"]
    y = nn.LayerNorm(dtype=dt).apply({"params": block["LayerNorm_0"]}, x)
    dense = nn.DenseGeneral(features=(heads, width // heads), axis=-1, dtype=dt)
    proj = [dense.apply({"params": block["MultiHeadDotProductAttention_0"][name]}, y)
            for name in names]
    return jnp.concatenate([emb] + [a.reshape(n, width).astype(emb.dtype) for a in proj], -1)

  def rest(variables, feats):
    n = feats.shape[0]
    parts = [feats[..., i * width:(i + 1) * width] for i in range(1 + len(names))]
    replace = {("embedding",): lambda *_: parts[0].reshape(n, grid_h, grid_w, width)}
    if qkv:
      block = ("encoderblock_0",)
      replace[block + ("LayerNorm_0",)] = split_lib.rows_then(
          extra, jnp.zeros_like(parts[0]))
      for name, part in zip(names, parts[1:]):
        replace[block + ("MultiHeadDotProductAttention_0", name)] = split_lib.rows_then(
            extra, part.reshape(n, t, heads, width // heads))
    with split_lib.intercept(replace):
      return model.apply(variables, jnp.zeros((n, h, w, c), jnp.float32), train=False)

  # Multiply-adds per example: the prefix per token, and one forward.
  tm = t + extra
  per_token = p * p * c * width + (3 * width * width if qkv else 0)
  blocks = vit.depth * (tm * (4 * width * width + 2 * width * vit.mlp_dim)
                        + 2 * tm * tm * width)
  total = t * p * p * c * width + blocks + width * vit.num_classes
  return split_lib.TokenSplit(prefix, rest, split_lib.share(per_token, t, total))
