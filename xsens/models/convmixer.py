"""ConvMixer (Trockman & Kolter 2022): patch conv, then depthwise/pointwise mixing."""

import functools

import flax.linen as nn
import jax.numpy as jnp

from xsens.models import _checks
from xsens.models import precision


class ConvMixer(nn.Module):
  """ConvMixer classifier: [B, H, W, C] -> logits [B, num_classes].

  Patch conv (kernel = stride = patch_size) -> GELU -> BN, then `depth` blocks of
  x + BN(GELU(depthwise kxk(x))) -> BN(GELU(pointwise(.))), global pool, linear. `dtype` is
  the compute dtype (`xsens.models.precision`; params, BatchNorm statistics and logits
  float32).
  """
  num_classes: int
  width: int = 64
  depth: int = 4
  kernel_size: int = 3
  patch_size: int = 2
  dtype: str = "float32"

  def check_input(self, image_shape: tuple[int, int, int]) -> None:
    """Raises ConfigError for settings impossible on (H, W, C) inputs."""
    image_shape = _checks.image(image_shape, self.num_classes)
    for field in ("width", "depth", "kernel_size", "patch_size"):
      _checks.positive_int(field, getattr(self, field))
    _checks.divides("patch_size", self.patch_size, image_shape)
    _checks.dtype(self.dtype)

  @nn.compact
  def __call__(self, x, train: bool = False):
    dt = precision.compute_dtype(self.dtype)
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, use_fast_variance=False,
                             momentum=0.9, epsilon=1e-5, dtype=dt)
    conv = functools.partial(nn.Conv, dtype=dt)
    p, k = self.patch_size, self.kernel_size
    x = conv(self.width, (p, p), strides=(p, p), padding="VALID", name="patch_embed")(x)
    x = norm(name="patch_bn")(nn.gelu(x))
    for i in range(self.depth):
      y = conv(self.width, (k, k), padding="SAME",
               feature_group_count=self.width, name=f"block{i + 1}_depthwise")(x)
      x = x + norm(name=f"block{i + 1}_depthwise_bn")(nn.gelu(y))
      x = conv(self.width, (1, 1), name=f"block{i + 1}_pointwise")(x)
      x = norm(name=f"block{i + 1}_pointwise_bn")(nn.gelu(x))
    x = x.mean(axis=(1, 2))
    return nn.Dense(self.num_classes, dtype=dt, name="head")(x).astype(jnp.float32)
