"""Validation helpers shared by the models' `check_input` methods.

Every helper raises `ConfigError` with the field prefixed `model.`, so a bad
config stops before anything is traced.
"""

from collections.abc import Sequence

from xsens.errors import ConfigError

DTYPES = ("float32", "bfloat16")   # A model's compute dtype (`xsens.models.precision`).


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def positive_int(field: str, value) -> None:
  """Refuses anything but an int >= 1."""
  if not _is_int(value) or value < 1:
    raise ConfigError(f"model.{field}", f"must be a positive int; got {value!r}")


def positive_ints(field: str, values, allow_empty: bool = False) -> None:
  """Refuses a sequence that is empty (unless allowed) or holds a non-positive int."""
  if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
    raise ConfigError(
        f"model.{field}", f"must be a sequence of positive ints; got {values!r}")
  if not values and not allow_empty:
    raise ConfigError(f"model.{field}", "must not be empty")
  if not all(_is_int(v) and v >= 1 for v in values):
    raise ConfigError(
        f"model.{field}", f"must hold only positive ints; got {tuple(values)!r}")


def positive_float(field: str, value) -> None:
  """Refuses anything but a finite number > 0."""
  if (isinstance(value, bool) or not isinstance(value, (int, float))
      or not 0 < value < float("inf")):
    raise ConfigError(f"model.{field}", f"must be a positive number; got {value!r}")


def rate(field: str, value) -> None:
  """Refuses anything but a number in [0, 1)."""
  if (isinstance(value, bool) or not isinstance(value, (int, float))
      or not 0 <= value < 1):
    raise ConfigError(f"model.{field}", f"must be in [0, 1); got {value!r}")


def one_of(field: str, value, allowed: Sequence[str]) -> None:
  """Refuses a name outside `allowed`, listing the allowed ones."""
  if value not in allowed:
    raise ConfigError(
        f"model.{field}", f"unknown value {value!r}; allowed: {', '.join(allowed)}")


def dtype(value) -> None:
  """Refuses a compute dtype (`model.dtype`) outside `DTYPES`, listing them."""
  one_of("dtype", value, DTYPES)


def image(image_shape, num_classes) -> tuple[int, int, int]:
  """Checks `num_classes` and an (H, W, C) shape; returns it as a tuple of ints."""
  positive_int("num_classes", num_classes)
  shape = tuple(image_shape) if isinstance(image_shape, Sequence) else None
  if (shape is None or len(shape) != 3
      or not all(_is_int(v) and v >= 1 for v in shape)):
    raise ConfigError(
        "model.image_shape",
        f"must be three positive ints (height, width, channels); got {image_shape!r}")
  return shape


def removal_parts(parts, allowed: Sequence[str] = ("block", "attention", "mlp")) -> None:
  """Refuses (ValueError) a layer-removal part outside `allowed`."""
  for part in parts:
    if part not in allowed:
      raise ValueError(f"unknown part {part!r}; allowed: {', '.join(allowed)}")


def whole_block_indices(layers, what: str) -> tuple[int, ...]:
  """Flat indices of layers (i, 'block'); ValueError naming `what` (e.g. "ResNet18
  blocks") for any other part: these models' units have no attention / MLP sub-layer."""
  layers = tuple((int(i), str(p)) for i, p in layers)
  bad = [p for _, p in layers if p != "block"]
  if bad:
    raise ValueError(f"{what} have no {bad[0]!r} sub-layer; only 'block' can be removed.")
  return tuple(i for i, _ in layers)


def tokens(input_shape) -> tuple[int, int]:
  """Checks a per-example token shape (n, d) (float tokens [B, n, d])."""
  shape = tuple(input_shape) if isinstance(input_shape, Sequence) else None
  if (shape is None or len(shape) != 2
      or not all(_is_int(v) and v >= 1 for v in shape)):
    raise ConfigError(
        "model.name", f"takes tokens [B, n, d] (two positive ints per example: n tokens "
        f"of dimension d); the data has per-example shape {input_shape!r}")
  return shape


def halvings_fit(field: str, image_shape, halvings: int, what: str) -> None:
  """Refuses `halvings` floor-halvings that would shrink H or W below 1.

  Args:
    field: the config field to blame (without the `model.` prefix).
    image_shape: (H, W, C).
    halvings: how many times the spatial size is halved (floor).
    what: what does the halving, for the message (e.g. "stride-2 stages").
  """
  h, w = image_shape[:2]
  need = 2**halvings
  if h < need or w < need:
    raise ConfigError(
        f"model.{field}",
        f"{halvings} {what} need an input of at least {need}x{need}; got {h}x{w}")


def divides(field: str, value: int, image_shape) -> None:
  """Refuses a patch size that does not divide both H and W."""
  h, w = image_shape[:2]
  if h % value == 0 and w % value == 0:
    return
  allowed = [d for d in range(1, min(h, w) + 1) if h % d == 0 and w % d == 0]
  size = f"{h}" if h == w else f"{h}x{w} (height x width)"
  raise ConfigError(
      f"model.{field}",
      f"{value} must divide the image size {size}; "
      f"allowed: {', '.join(map(str, allowed))}")
