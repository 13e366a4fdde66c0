"""ConvNeXt (Liu et al. 2022, "A ConvNet for the 2020s", arXiv 2201.03545).

[B, H, W, C] -> logits [B, num_classes]:

  stem      Conv p x p, stride p (p = `patch_size`, 4) -> LayerNorm
  stage i   (i > 0) LayerNorm -> Conv 2 x 2, stride 2 (downsampling), then `depths[i]`
            blocks of width `dims[i]`:
              x + drop_path(gamma * fc2(GELU(fc1(LayerNorm(dwconv7x7(x))))))
            (depthwise k x k conv, k = `kernel_size`, 7; fc1 to mlp_ratio * dim; layer
            scale gamma initialised to `layer_scale_init`, 1e-6)
  head      global average pool -> LayerNorm -> Dense

Every LayerNorm is channels-last (flax's LayerNorm over the last axis) with epsilon 1e-6
and GELU is exact (erf), as in the public implementations (facebookresearch/ConvNeXt;
timm `timm/models/convnext.py`, whose ImageNet weights `xsens.models.pretrained`
loads). Stochastic depth (`drop_path_rate`) rises linearly from 0 at the first block to
the rate at the last, one Bernoulli draw per example and block from the "dropout" RNG,
only when `train=True`.

Parameter names follow timm's where the layout allows: `stem_conv`, `stem_norm`,
`stage{i}_downsample_norm`, `stage{i}_downsample_conv`, `stage{i}_block{j}/{conv_dw, norm,
fc1, fc2, gamma}`, `head_norm`, `head` (i, j from 0, as timm's `stages.{i}.blocks.{j}`).

`PRESETS` holds ConvNeXt-T/S/B/L/XL (depths and dims of the paper's Table 9 / timm's
`convnext_tiny` ... `convnext_xlarge`), e.g.
`get_model("convnext", 1000, (224, 224, 3), **PRESETS["tiny"])`.

Block removal without retraining: every block has an identity shortcut (the downsampling
sits outside the blocks), so the static field `skip` lists blocks by flat index (stage
by stage) whose residual branch is dropped; the parameter tree does not depend on it.

`dtype` ("float32" | "bfloat16") is the compute dtype (`xsens.models.precision`): params,
LayerNorm statistics and logits stay float32.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xsens.errors import ConfigError
from xsens.models import _checks
from xsens.models import precision

PRESETS = {
    "tiny": {"depths": (3, 3, 9, 3), "dims": (96, 192, 384, 768)},
    "small": {"depths": (3, 3, 27, 3), "dims": (96, 192, 384, 768)},
    "base": {"depths": (3, 3, 27, 3), "dims": (128, 256, 512, 1024)},
    "large": {"depths": (3, 3, 27, 3), "dims": (192, 384, 768, 1536)},
    "xlarge": {"depths": (3, 3, 27, 3), "dims": (256, 512, 1024, 2048)},
}
LN_EPSILON = 1e-6


def layer_norm(name: str, dtype=None) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=LN_EPSILON, dtype=dtype, name=name)


def drop_path_rates(depths, rate: float) -> list[list[float]]:
  """Per-block stochastic-depth rates: linspace(0, rate, sum(depths)) split by stage."""
  rates = np.linspace(0.0, rate, sum(depths)).tolist()
  out, start = [], 0
  for d in depths:
    out.append(rates[start:start + d])
    start += d
  return out


class ConvNeXtBlock(nn.Module):
  """dwconv -> LayerNorm -> fc1 -> GELU -> fc2 -> gamma, plus the identity shortcut."""
  dim: int
  kernel_size: int = 7
  mlp_ratio: int = 4
  layer_scale_init: float | None = 1e-6
  drop_path: float = 0.0
  dtype: Any = None   # Compute dtype (None: float32).

  @nn.compact
  def __call__(self, x, train: bool):
    k, dt = self.kernel_size, self.dtype
    y = nn.Conv(self.dim, (k, k), padding=k // 2, feature_group_count=self.dim, dtype=dt,
                name="conv_dw")(x)
    y = layer_norm("norm", dt)(y)
    y = nn.Dense(self.mlp_ratio * self.dim, dtype=dt, name="fc1")(y)
    y = nn.gelu(y, approximate=False)
    y = nn.Dense(self.dim, dtype=dt, name="fc2")(y)
    if self.layer_scale_init is not None:
      gamma = self.param("gamma", nn.initializers.constant(self.layer_scale_init),
                         (self.dim,), jnp.float32)
      y = y * precision.cast(gamma, dt)
    if train and self.drop_path > 0:
      keep = 1.0 - self.drop_path
      mask = jax.random.bernoulli(self.make_rng("dropout"), keep, (x.shape[0], 1, 1, 1))
      y = jnp.where(mask, y / keep, 0.0)
    return x + y


class ConvNeXt(nn.Module):
  """ConvNeXt classifier (module docstring); defaults are ConvNeXt-T."""
  num_classes: int
  depths: tuple[int, ...] = (3, 3, 9, 3)
  dims: tuple[int, ...] = (96, 192, 384, 768)
  patch_size: int = 4
  kernel_size: int = 7
  mlp_ratio: int = 4
  layer_scale_init: float | None = 1e-6
  drop_path_rate: float = 0.0
  # Flat indices of blocks to remove (identity); see the module docstring.
  skip: tuple[int, ...] = ()
  dtype: str = "float32"   # Compute dtype: module docstring.

  def check_input(self, image_shape: tuple[int, int, int]) -> None:
    """Raises ConfigError for settings impossible on (H, W, C) inputs."""
    image_shape = _checks.image(image_shape, self.num_classes)
    _checks.positive_ints("depths", self.depths)
    _checks.positive_ints("dims", self.dims)
    if len(self.dims) != len(self.depths):
      raise ConfigError("model.dims", f"needs one width per stage: {len(self.depths)} "
                        f"(len(model.depths)); got {tuple(self.dims)!r}")
    for field in ("patch_size", "kernel_size", "mlp_ratio"):
      _checks.positive_int(field, getattr(self, field))
    if self.layer_scale_init is not None:
      _checks.positive_float("layer_scale_init", self.layer_scale_init)
    _checks.rate("drop_path_rate", self.drop_path_rate)
    _checks.dtype(self.dtype)
    h, w = image_shape[:2]
    need = self.patch_size * 2 ** (len(self.depths) - 1)
    if h < need or w < need:
      raise ConfigError("model.patch_size", f"a stem of stride {self.patch_size} and "
                        f"{len(self.depths) - 1} stride-2 downsamplings need an input of at "
                        f"least {need}x{need}; got {h}x{w}")
    self._check_skip(self.skip)

  def _check_skip(self, skip) -> frozenset[int]:
    n = sum(self.depths)
    for index in skip:
      if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
        raise ConfigError("model.skip", f"entries must be block indices in [0, {n}); got "
                          f"{index!r}")
    return frozenset(skip)

  def removable_layers(self, parts=("block",)) -> tuple[tuple[int, str], ...]:
    """(i, 'block') for every block (flat index); only the 'block' part exists."""
    _checks.removal_parts(parts)
    if "block" not in parts:
      raise ValueError(f"ConvNeXt blocks have no {', '.join(map(repr, parts))} "
                       f"sub-layer; only 'block' can be removed.")
    return tuple((i, "block") for i in range(sum(self.depths)))

  def remove_layers(self, layers) -> "ConvNeXt":
    """A copy whose blocks (i, 'block') (flat index) are the identity (same variables)."""
    skip = _checks.whole_block_indices(layers, "ConvNeXt blocks")
    self._check_skip(skip)
    return self.clone(skip=skip)

  @nn.compact
  def __call__(self, x, train: bool = False):
    p, dt = self.patch_size, precision.compute_dtype(self.dtype)
    x = nn.Conv(self.dims[0], (p, p), strides=(p, p), padding="VALID", dtype=dt,
                name="stem_conv")(x)
    x = layer_norm("stem_norm", dt)(x)
    skip = self._check_skip(self.skip)
    rates = drop_path_rates(self.depths, self.drop_path_rate)
    flat = 0
    for i, (depth, dim) in enumerate(zip(self.depths, self.dims)):
      if i > 0:
        x = layer_norm(f"stage{i}_downsample_norm", dt)(x)
        x = nn.Conv(dim, (2, 2), strides=(2, 2), padding="VALID", dtype=dt,
                    name=f"stage{i}_downsample_conv")(x)
      for j in range(depth):
        block = ConvNeXtBlock(dim, self.kernel_size, self.mlp_ratio, self.layer_scale_init,
                              rates[i][j], dt, name=f"stage{i}_block{j}")
        if self.is_initializing() or flat not in skip:
          y = block(x, train)
          x = x if flat in skip else y
        flat += 1
    x = layer_norm("head_norm", dt)(x.mean(axis=(1, 2)))
    return nn.Dense(self.num_classes, dtype=dt, name="head")(x).astype(jnp.float32)
