"""CIFAR-style DenseNet-BC (Huang et al. 2017): 3x3 stem, dense blocks, transitions."""

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from xsens.errors import ConfigError
from xsens.models import _checks
from xsens.models import precision


def _norm(train: bool, dtype=None, **kwargs):
  return nn.BatchNorm(use_running_average=not train, use_fast_variance=False, momentum=0.9, epsilon=1e-5,
                      dtype=dtype, **kwargs)


class DenseLayer(nn.Module):
  """BN-ReLU-Conv1x1(4k)-BN-ReLU-Conv3x3(k), concatenated: C -> C + k channels."""
  growth_rate: int
  bottleneck: bool = True
  dtype: Any = None   # Compute dtype (None: float32).

  @nn.compact
  def __call__(self, x, train: bool):
    y = x
    if self.bottleneck:
      y = nn.relu(_norm(train, self.dtype)(y))
      y = nn.Conv(4 * self.growth_rate, (1, 1), use_bias=False, dtype=self.dtype)(y)
    y = nn.relu(_norm(train, self.dtype)(y))
    y = nn.Conv(self.growth_rate, (3, 3), padding=1, use_bias=False, dtype=self.dtype)(y)
    return jnp.concatenate([x, y], axis=-1)


class Transition(nn.Module):
  """BN-ReLU-Conv1x1(features)-AvgPool2x2: [B,H,W,C] -> [B,H//2,W//2,features]."""
  features: int
  dtype: Any = None   # Compute dtype (None: float32).

  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.relu(_norm(train, self.dtype)(x))
    x = nn.Conv(self.features, (1, 1), use_bias=False, dtype=self.dtype)(x)
    return nn.avg_pool(x, (2, 2), strides=(2, 2), padding="VALID")


def transition_features(channels: int, compression: float) -> int:
  """Channels after a transition: floor(compression * channels), at least 1."""
  return max(1, int(compression * channels))


class DenseNet(nn.Module):
  """DenseNet classifier: [B, H, W, C] -> logits [B, num_classes].

  Defaults are the DenseNet-121 block layout with growth rate 12 (BC variant).
  Each of the len(block_sizes) - 1 transitions halves H and W (floor). `dtype` is the
  compute dtype (`xsens.models.precision`; params, BatchNorm statistics and logits float32).
  """
  num_classes: int
  growth_rate: int = 12
  block_sizes: tuple[int, ...] = (6, 12, 24, 16)
  compression: float = 0.5
  bottleneck: bool = True
  stem_features: int | None = None
  dtype: str = "float32"

  def check_input(self, image_shape: tuple[int, int, int]) -> None:
    """Raises ConfigError for settings impossible on (H, W, C) inputs."""
    image_shape = _checks.image(image_shape, self.num_classes)
    _checks.positive_int("growth_rate", self.growth_rate)
    _checks.positive_ints("block_sizes", self.block_sizes)
    if self.stem_features is not None:
      _checks.positive_int("stem_features", self.stem_features)
    if (isinstance(self.compression, bool)
        or not isinstance(self.compression, (int, float))
        or not 0 < self.compression <= 1):
      raise ConfigError("model.compression",
                        f"must be in (0, 1]; got {self.compression!r}")
    if not isinstance(self.bottleneck, bool):
      raise ConfigError("model.bottleneck",
                        f"must be True or False; got {self.bottleneck!r}")
    _checks.halvings_fit("block_sizes", image_shape, len(self.block_sizes) - 1,
                         "transitions (len(block_sizes) - 1)")
    _checks.dtype(self.dtype)

  @nn.compact
  def __call__(self, x, train: bool = False):
    k, dt = self.growth_rate, precision.compute_dtype(self.dtype)
    stem = self.stem_features or 2 * k
    x = nn.Conv(stem, (3, 3), padding=1, use_bias=False, dtype=dt, name="stem_conv")(x)
    layer = functools.partial(DenseLayer, k, self.bottleneck, dt)
    for i, size in enumerate(self.block_sizes):
      for j in range(size):
        x = layer(name=f"block{i + 1}_layer{j + 1}")(x, train)
      if i < len(self.block_sizes) - 1:
        features = transition_features(x.shape[-1], self.compression)
        x = Transition(features, dt, name=f"transition{i + 1}")(x, train)
    x = nn.relu(_norm(train, dt, name="final_bn")(x))
    x = x.mean(axis=(1, 2))
    return nn.Dense(self.num_classes, dtype=dt, name="head")(x).astype(jnp.float32)
