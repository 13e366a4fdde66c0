"""BiT ResNet-v2: pre-activation bottlenecks, weight-standardised convs, GroupNorm.

Kolesnikov et al. 2020, "Big Transfer (BiT): General Visual Representation
Learning", arXiv 1912.11370; layout and computation of the public
google-research/big_transfer models (R50x1 = block_units (3, 4, 6, 3),
width_factor 1), so `xsens.models.pretrained.load_bit` maps their `.npz`
checkpoints onto this tree name for name:

  root_block/standardized_conv2d/kernel            7x7 stride 2, then zero-pad 1
                                                    and 3x3 stride-2 max-pool
  block{b}/unit{u:02d}/a/group_norm/{scale,bias}    GN -> ReLU on the unit input
  block{b}/unit{u:02d}/a/standardized_conv2d/kernel 1x1 to the bottleneck width
  block{b}/unit{u:02d}/a/proj/standardized_conv2d/kernel  1x1 (stride) shortcut
                                                    from the activated input,
                                                    first unit of each block
  block{b}/unit{u:02d}/b/...                        GN -> ReLU -> 3x3 (stride)
  block{b}/unit{u:02d}/c/...                        GN -> ReLU -> 1x1 to 4x width
  group_norm/{scale,bias}, head/{kernel,bias}       GN -> ReLU -> mean -> Dense

Weight standardisation: each output channel of a conv kernel [kh, kw, cin,
cout] is normalised over (kh, kw, cin) to zero mean and unit variance
(epsilon 1e-10) before the convolution. GroupNorm uses epsilon 1e-5.
Strides sit on the 3x3 conv; blocks 2-4 halve the resolution.

Unit removal without retraining (Bhojanapalli et al. 2021, arXiv 2103.14586): the static
field `skip` lists units by flat index (0.. sum(block_units) - 1, in the order
block1/unit01, block1/unit02, ..., block2/unit01, ...) whose residual branch is dropped,
so the unit is the identity. Only units with an identity shortcut can be removed
(`identity_units`: every unit but the first of each block, which projects). The
parameter tree does not depend on `skip`.

`dtype` ("float32" | "bfloat16") is the compute dtype (`xsens.models.precision`): kernels are
standardised in float32 and then cast, GroupNorm statistics are float32, the logits float32.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from xsens.errors import ConfigError
from xsens.models import _checks
from xsens.models import precision

BASE_WIDTH = 64
STRIDES = (1, 2, 2, 2)
EXPANSION = 4
WS_EPSILON = 1e-10
GN_EPSILON = 1e-5


def standardize(kernel: jnp.ndarray, eps: float = WS_EPSILON) -> jnp.ndarray:
  """[kh, kw, cin, cout] -> per-output-channel zero mean, unit variance."""
  mean = kernel.mean(axis=(0, 1, 2), keepdims=True)
  var = jnp.square(kernel - mean).mean(axis=(0, 1, 2), keepdims=True)
  return (kernel - mean) / jnp.sqrt(var + eps)


def unit_names(block_units) -> tuple[str, ...]:
  """'block{b}/unit{u:02d}' of every unit, in flat order."""
  return tuple(f"block{b + 1}/unit{u + 1:02d}" for b, n in enumerate(block_units)
               for u in range(n))


def identity_units(block_units) -> tuple[int, ...]:
  """Flat indices of the units whose shortcut is the identity (all but each block's first)."""
  out, start = [], 0
  for n in block_units:
    out.extend(range(start + 1, start + n))
    start += n
  return tuple(out)


def check_skip(skip, block_units) -> frozenset[int]:
  """Validates `skip` (flat unit indices); returns it as a set."""
  allowed = identity_units(block_units)
  for index in skip:
    if isinstance(index, bool) or not isinstance(index, int) or index not in allowed:
      names = unit_names(block_units)
      detail = (f" ({names[index]} has a projection shortcut)"
                if isinstance(index, int) and 0 <= index < len(names) else "")
      raise ConfigError(
          "model.skip", f"can only remove units with an identity shortcut{detail}; got "
          f"{index!r}; allowed: {', '.join(map(str, allowed))}")
  return frozenset(skip)


def widths(width_factor: float) -> tuple[int, tuple[int, ...]]:
  """(root width, bottleneck width of blocks 1-4); outputs are 4x bottleneck."""
  mid = tuple(max(1, round(BASE_WIDTH * 2**i * width_factor)) for i in range(4))
  return max(1, round(BASE_WIDTH * width_factor)), mid


class StdConv(nn.Module):
  """Bias-free conv with a weight-standardised kernel. [B,H,W,Cin] -> [B,H',W',F]."""
  features: int
  kernel_size: int
  strides: int = 1
  padding: int = 0
  dtype: Any = None   # Compute dtype (None: float32).

  @nn.compact
  def __call__(self, x):
    k = self.kernel_size
    kernel = self.param("kernel", nn.initializers.lecun_normal(),
                        (k, k, x.shape[-1], self.features), jnp.float32)
    x = precision.cast(x, self.dtype)
    pad = ((self.padding, self.padding),) * 2
    return jax.lax.conv_general_dilated(
        x, standardize(kernel).astype(x.dtype), (self.strides,) * 2, pad,
        dimension_numbers=("NHWC", "HWIO", "NHWC"))


class _Proj(nn.Module):
  """The unit's 1x1 (strided) shortcut projection."""
  features: int
  strides: int
  dtype: Any = None

  @nn.compact
  def __call__(self, x):
    return StdConv(self.features, 1, self.strides, dtype=self.dtype,
                   name="standardized_conv2d")(x)


class _NormConv(nn.Module):
  """GN -> ReLU -> StdConv; optionally also the projection of that activation.

  Returns (conv output, projected shortcut or None).
  """
  features: int
  kernel_size: int
  num_groups: int
  strides: int = 1
  proj_features: int | None = None
  proj_strides: int = 1
  dtype: Any = None

  @nn.compact
  def __call__(self, x):
    y = nn.relu(nn.GroupNorm(num_groups=self.num_groups, epsilon=GN_EPSILON,
                             dtype=self.dtype, name="group_norm")(x))
    out = StdConv(self.features, self.kernel_size, self.strides,
                  self.kernel_size // 2, dtype=self.dtype, name="standardized_conv2d")(y)
    if self.proj_features is None:
      return out, None
    return out, _Proj(self.proj_features, self.proj_strides, self.dtype, name="proj")(y)


class PreActUnit(nn.Module):
  """Pre-activation bottleneck. [B, H, W, Cin] -> [B, H/s, W/s, 4 * mid].

  x + c(b(a(x))), each of a, b, c = GN -> ReLU -> conv (1x1, 3x3 with the
  stride, 1x1). Where the shape changes, the shortcut is a strided 1x1 conv of
  the activated input relu(GN_a(x)) instead of x.
  """
  mid: int
  num_groups: int
  strides: int = 1
  dtype: Any = None

  @nn.compact
  def __call__(self, x):
    out = self.mid * EXPANSION
    project = x.shape[-1] != out or self.strides != 1
    y, shortcut = _NormConv(self.mid, 1, self.num_groups,
                            proj_features=out if project else None,
                            proj_strides=self.strides, dtype=self.dtype, name="a")(x)
    y, _ = _NormConv(self.mid, 3, self.num_groups, self.strides, dtype=self.dtype, name="b")(y)
    y, _ = _NormConv(out, 1, self.num_groups, dtype=self.dtype, name="c")(y)
    return y + (x if shortcut is None else shortcut)


class _Block(nn.Module):
  """`units` PreActUnits named unit01, unit02, ...; the first one strided. Units whose
  index is in `skip` are the identity (built, so initialised, either way)."""
  units: int
  mid: int
  num_groups: int
  strides: int
  skip: tuple[int, ...] = ()
  dtype: Any = None

  @nn.compact
  def __call__(self, x):
    for u in range(self.units):
      unit = PreActUnit(self.mid, self.num_groups, self.strides if u == 0 else 1, self.dtype,
                        name=f"unit{u + 1:02d}")
      if self.is_initializing() or u not in self.skip:
        y = unit(x)
        x = x if u in self.skip else y
    return x


class BiTResNet(nn.Module):
  """BiT ResNet-v2 classifier: [B, H, W, C] -> logits [B, num_classes]."""
  num_classes: int
  block_units: tuple[int, ...] = (3, 4, 6, 3)
  width_factor: float = 1.0
  num_groups: int = 32
  # Flat indices of units to drop (identity on the residual stream); see the module docstring.
  skip: tuple[int, ...] = ()
  dtype: str = "float32"   # Compute dtype: module docstring.

  def check_input(self, image_shape: tuple[int, int, int]) -> None:
    """Raises ConfigError for settings impossible on (H, W, C) inputs."""
    _checks.image(image_shape, self.num_classes)
    _checks.positive_ints("block_units", self.block_units)
    if len(self.block_units) != len(STRIDES):
      raise ConfigError("model.block_units",
                        f"must hold {len(STRIDES)} unit counts (e.g. R50: 3, 4, 6, "
                        f"3); got {tuple(self.block_units)!r}")
    _checks.positive_float("width_factor", self.width_factor)
    _checks.positive_int("num_groups", self.num_groups)
    _checks.dtype(self.dtype)
    root, mid = widths(self.width_factor)
    channels = sorted({root, *mid, *(m * EXPANSION for m in mid)})
    bad = [c for c in channels if c % self.num_groups]
    if bad:
      raise ConfigError(
          "model.num_groups",
          f"{self.num_groups} must divide every normalised width "
          f"{', '.join(map(str, channels))} (width_factor={self.width_factor}); "
          f"{bad[0]} is not a multiple")
    check_skip(self.skip, self.block_units)

  def removable_layers(self, parts=("block",)) -> tuple[tuple[int, str], ...]:
    """(i, 'block') for every unit i with an identity shortcut (`identity_units`).

    A unit has no separate attention / MLP, so only the 'block' entry of `parts`
    applies; ValueError when `parts` lacks it.
    """
    _checks.removal_parts(parts)
    if "block" not in parts:
      raise ValueError(f"BiT units have no {', '.join(map(repr, parts))} sub-layer; "
                       f"only 'block' (a whole unit) can be removed.")
    return tuple((i, "block") for i in identity_units(self.block_units))

  def remove_layers(self, layers) -> "BiTResNet":
    """A copy whose units (i, 'block') (flat index) are the identity.

    Any existing `skip` is replaced; the copy applies to the same variables.

    Raises:
      ValueError: for a part other than 'block'.
      ConfigError: naming `model.skip` for a unit with a projection shortcut.
    """
    skip = _checks.whole_block_indices(layers, "BiT units")
    check_skip(skip, self.block_units)
    return self.clone(skip=skip)

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train  # No dropout or batch statistics.
    root, mid = widths(self.width_factor)
    dt = precision.compute_dtype(self.dtype)
    skip = check_skip(self.skip, self.block_units)
    x = _Root(root, dt, name="root_block")(x)
    start = 0
    for b, (units, width, stride) in enumerate(zip(self.block_units, mid, STRIDES)):
      local = tuple(sorted(i - start for i in skip if start <= i < start + units))
      x = _Block(units, width, self.num_groups, stride, local, dt, name=f"block{b + 1}")(x)
      start += units
    x = nn.relu(nn.GroupNorm(num_groups=self.num_groups, epsilon=GN_EPSILON, dtype=dt,
                             name="group_norm")(x))
    x = x.mean(axis=(1, 2))
    return nn.Dense(self.num_classes, dtype=dt, name="head")(x).astype(jnp.float32)


class _Root(nn.Module):
  """7x7 stride-2 StdConv (pad 3), zero pad 1, 3x3 stride-2 max-pool."""
  features: int
  dtype: Any = None

  @nn.compact
  def __call__(self, x):
    x = StdConv(self.features, 7, 2, 3, self.dtype, name="standardized_conv2d")(x)
    x = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    return nn.max_pool(x, (3, 3), strides=(2, 2), padding="VALID")
