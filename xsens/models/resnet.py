"""CIFAR-style ResNet-18: 3x3 stem, no max-pool, 4 stages of 2 BasicBlocks."""

import functools

import flax.linen as nn
import jax.numpy as jnp

from xsens.models import _checks

BASE_WIDTHS = (64, 128, 256, 512)
STRIDES = (1, 2, 2, 2)
BLOCKS_PER_STAGE = 2


def stage_widths(width_multiplier: float) -> tuple[int, ...]:
  """Per-stage widths: base * multiplier rounded to the nearest int, at least 1."""
  return tuple(max(1, round(w * width_multiplier)) for w in BASE_WIDTHS)


class BasicBlock(nn.Module):
  """conv3x3-BN-ReLU-conv3x3-BN + shortcut, then ReLU. [B,H,W,C] -> [B,H/s,W/s,F]."""
  features: int
  strides: int = 1

  @nn.compact
  def __call__(self, x, train: bool):
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, use_fast_variance=False,
                             momentum=0.9, epsilon=1e-5)
    s = (self.strides, self.strides)
    y = nn.Conv(self.features, (3, 3), s, padding=1, use_bias=False)(x)
    y = nn.relu(norm()(y))
    y = nn.Conv(self.features, (3, 3), padding=1, use_bias=False)(y)
    y = norm()(y)
    if x.shape[-1] != self.features or self.strides != 1:
      x = nn.Conv(self.features, (1, 1), s, use_bias=False, name="proj_conv")(x)
      x = norm(name="proj_bn")(x)
    return nn.relu(x + y)


class ResNet18(nn.Module):
  """ResNet-18 for small images: [B, H, W, C] -> logits [B, num_classes]."""
  num_classes: int
  width_multiplier: float = 1.0

  def check_input(self, image_shape: tuple[int, int, int]) -> None:
    """Raises ConfigError for settings impossible on (H, W, C) inputs."""
    image_shape = _checks.image(image_shape, self.num_classes)
    _checks.positive_float("width_multiplier", self.width_multiplier)
    # Nothing in the model config shrinks the downsampling, so blame the choice.
    _checks.halvings_fit("name", image_shape, sum(s == 2 for s in STRIDES),
                         "stride-2 stages of resnet18")

  @nn.compact
  def __call__(self, x, train: bool = False):
    widths = stage_widths(self.width_multiplier)
    x = nn.Conv(widths[0], (3, 3), padding=1, use_bias=False, name="stem_conv")(x)
    x = nn.BatchNorm(use_running_average=not train, use_fast_variance=False, momentum=0.9, epsilon=1e-5,
                     name="stem_bn")(x)
    x = nn.relu(x)
    for i, (width, stride) in enumerate(zip(widths, STRIDES)):
      for j in range(BLOCKS_PER_STAGE):
        x = BasicBlock(width, stride if j == 0 else 1,
                       name=f"stage{i + 1}_block{j + 1}")(x, train)
    x = x.mean(axis=(1, 2))
    return nn.Dense(self.num_classes, name="head")(x).astype(jnp.float32)
