"""Vision Transformer for small images (pre-LN, CLS or mean pooling).

The patch embedding is the first op on the pixels: a Conv with
kernel = stride = `patch_size`, so each grid-aligned, non-overlapping
p x p patch maps to exactly one token (row-major over the patch grid).

Attention weights are sown into the `intermediates` collection; get them with
`model.apply(variables, x, train=False, mutable=['intermediates'])`.
"""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from xsens.errors import ConfigError
from xsens.models import _checks

POOLINGS = ("cls", "mean")
POSEMBS = ("learned", "sincos")


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


class MlpBlock(nn.Module):
  """Dense(mlp_dim) -> GELU -> Dropout -> Dense(width) -> Dropout."""
  mlp_dim: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x, train: bool):
    width = x.shape[-1]
    x = nn.gelu(nn.Dense(self.mlp_dim)(x))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    x = nn.Dense(width)(x)
    return nn.Dropout(self.dropout_rate, deterministic=not train)(x)


class EncoderBlock(nn.Module):
  """Pre-LN block: x + MHSA(LN(x)); x + MLP(LN(x)). [B, T, D] -> [B, T, D]."""
  num_heads: int
  mlp_dim: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x, train: bool):
    y = nn.LayerNorm()(x)
    y = nn.MultiHeadDotProductAttention(num_heads=self.num_heads)(
        y, y, deterministic=True, sow_weights=True)
    x = x + nn.Dropout(self.dropout_rate, deterministic=not train)(y)
    y = nn.LayerNorm()(x)
    return x + MlpBlock(self.mlp_dim, self.dropout_rate)(y, train)


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

  @nn.compact
  def __call__(self, x, train: bool = False):
    p = self.patch_size
    x = nn.Conv(self.width, (p, p), strides=(p, p), padding="VALID",
                name="embedding")(x)
    b, h, w, d = x.shape
    x = x.reshape(b, h * w, d)

    if self.posemb == "learned":
      x = x + self.param("pos_embedding", nn.initializers.normal(stddev=0.02),
                         (1, h * w, d), jnp.float32)
    else:
      x = x + posemb_sincos_2d(h, w, d)

    if self.pooling == "cls":
      cls = self.param("cls", nn.initializers.zeros, (1, 1, d), jnp.float32)
      x = jnp.concatenate([jnp.tile(cls, (b, 1, 1)), x], axis=1)

    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    for i in range(self.depth):
      x = EncoderBlock(self.num_heads, self.mlp_dim, self.dropout_rate,
                       name=f"encoderblock_{i}")(x, train)
    x = nn.LayerNorm(name="encoder_norm")(x)

    x = x[:, 0] if self.pooling == "cls" else x.mean(axis=1)
    return nn.Dense(self.num_classes, name="head")(x).astype(jnp.float32)
