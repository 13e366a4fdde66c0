"""CIFAR-style ResNet-18: 3x3 stem, no max-pool, 4 stages of 2 BasicBlocks.

Block removal without retraining (Bhojanapalli et al. 2021, arXiv 2103.14586):
the static field `skip` lists BasicBlocks by flat index (0..7, in order
stage1_block1, stage1_block2, stage2_block1, ...) whose residual branch is
dropped, so the block is the identity. Only blocks with an identity shortcut
can be removed (`identity_blocks()`); the first block of stages 2-4 changes
shape through a projection and is refused. The parameter tree does not depend
on `skip`: `model.clone(skip=(3,)).apply(variables, x, train=False)`.

`dtype` ("float32" | "bfloat16") is the compute dtype (`xsens.models.precision`): params
and BatchNorm statistics stay float32, the logits are float32.
"""

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from xsens.errors import ConfigError
from xsens.models import _checks
from xsens.models import precision

BASE_WIDTHS = (64, 128, 256, 512)
STRIDES = (1, 2, 2, 2)
BLOCKS_PER_STAGE = 2


def block_names() -> tuple[str, ...]:
  """Module names of the BasicBlocks in forward order (flat index -> name)."""
  return tuple(f"stage{i + 1}_block{j + 1}" for i in range(len(STRIDES))
               for j in range(BLOCKS_PER_STAGE))


def identity_blocks() -> tuple[int, ...]:
  """Flat indices of the BasicBlocks whose shortcut is the identity.

  The stem and stage 1 share a width and stage 1 has stride 1, so every block
  but the first of a stride-2 stage keeps its input shape.
  """
  return tuple(i * BLOCKS_PER_STAGE + j for i, s in enumerate(STRIDES)
               for j in range(BLOCKS_PER_STAGE) if j > 0 or s == 1)


def check_skip(skip) -> frozenset[int]:
  """Validates `skip` (flat block indices); returns it as a set."""
  allowed = identity_blocks()
  for index in skip:
    if isinstance(index, bool) or not isinstance(index, int) or index not in allowed:
      names = block_names()
      detail = (f" ({names[index]} has a projection shortcut)"
                if isinstance(index, int) and 0 <= index < len(names) else "")
      raise ConfigError(
          "model.skip",
          f"can only remove blocks with an identity shortcut{detail}; got "
          f"{index!r}; allowed: {', '.join(map(str, allowed))}")
  return frozenset(skip)


def stage_widths(width_multiplier: float) -> tuple[int, ...]:
  """Per-stage widths: base * multiplier rounded to the nearest int, at least 1."""
  return tuple(max(1, round(w * width_multiplier)) for w in BASE_WIDTHS)


class BasicBlock(nn.Module):
  """conv3x3-BN-ReLU-conv3x3-BN + shortcut, then ReLU. [B,H,W,C] -> [B,H/s,W/s,F]."""
  features: int
  strides: int = 1
  dtype: Any = None   # Compute dtype (None: float32).

  @nn.compact
  def __call__(self, x, train: bool):
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, use_fast_variance=False,
                             momentum=0.9, epsilon=1e-5, dtype=self.dtype)
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
    s = (self.strides, self.strides)
    y = conv(self.features, (3, 3), s, padding=1)(x)
    y = nn.relu(norm()(y))
    y = conv(self.features, (3, 3), padding=1)(y)
    y = norm()(y)
    if x.shape[-1] != self.features or self.strides != 1:
      x = conv(self.features, (1, 1), s, name="proj_conv")(x)
      x = norm(name="proj_bn")(x)
    return nn.relu(x + y)


class ResNet18(nn.Module):
  """ResNet-18 for small images: [B, H, W, C] -> logits [B, num_classes]."""
  num_classes: int
  width_multiplier: float = 1.0
  # Flat indices of BasicBlocks to remove (identity); see the module docstring.
  skip: tuple[int, ...] = ()
  dtype: str = "float32"   # Compute dtype: module docstring.

  def check_input(self, image_shape: tuple[int, int, int]) -> None:
    """Raises ConfigError for settings impossible on (H, W, C) inputs."""
    image_shape = _checks.image(image_shape, self.num_classes)
    _checks.positive_float("width_multiplier", self.width_multiplier)
    _checks.dtype(self.dtype)
    # Nothing in the model config shrinks the downsampling, so blame the choice.
    _checks.halvings_fit("name", image_shape, sum(s == 2 for s in STRIDES),
                         "stride-2 stages of resnet18")
    check_skip(self.skip)

  def removable_layers(self, parts=("block",)) -> tuple[tuple[int, str], ...]:
    """(i, 'block') for every BasicBlock i with an identity shortcut (`identity_blocks`).

    A BasicBlock has no separate attention / MLP, so only the 'block' entry of
    `parts` applies; ValueError when `parts` lacks it.
    """
    _checks.removal_parts(parts)
    if "block" not in parts:
      raise ValueError(f"ResNet18 blocks have no {', '.join(map(repr, parts))} "
                       f"sub-layer; only 'block' can be removed.")
    return tuple((i, "block") for i in identity_blocks())

  def remove_layers(self, layers) -> "ResNet18":
    """A copy whose BasicBlocks (i, 'block') (flat index) are the identity.

    Any existing `skip` is replaced; the copy applies to the same variables.

    Raises:
      ValueError: for a part other than 'block'.
      ConfigError: naming `model.skip` for a block with a projection shortcut.
    """
    skip = _checks.whole_block_indices(layers, "ResNet18 blocks")
    check_skip(skip)
    return self.clone(skip=skip)

  @nn.compact
  def __call__(self, x, train: bool = False):
    widths = stage_widths(self.width_multiplier)
    dt = precision.compute_dtype(self.dtype)
    x = nn.Conv(widths[0], (3, 3), padding=1, use_bias=False, dtype=dt, name="stem_conv")(x)
    x = nn.BatchNorm(use_running_average=not train, use_fast_variance=False, momentum=0.9, epsilon=1e-5,
                     dtype=dt, name="stem_bn")(x)
    x = nn.relu(x)
    skip = check_skip(self.skip)
    for i, (width, stride) in enumerate(zip(widths, STRIDES)):
      for j in range(BLOCKS_PER_STAGE):
        block = BasicBlock(width, stride if j == 0 else 1, dt,
                           name=f"stage{i + 1}_block{j + 1}")
        if self.is_initializing() or i * BLOCKS_PER_STAGE + j not in skip:
          y = block(x, train)
          x = x if i * BLOCKS_PER_STAGE + j in skip else y
    x = x.mean(axis=(1, 2))
    return nn.Dense(self.num_classes, dtype=dt, name="head")(x).astype(jnp.float32)
