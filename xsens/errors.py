"""Errors that xsens raises for bad user input, and the checks that raise them."""

import math

import numpy as np


class ConfigError(ValueError):
  """A config field holds a value xsens cannot use.

  The message always names the field (e.g. ``model.patch_size``) and what is allowed,
  so the CLI can print it as one line and exit with code 2 before anything compiles.
  """

  def __init__(self, field: str, message: str):
    self.field = field
    self.message = message
    super().__init__(f"config.{field}: {message}")


def require(ok: bool, field: str, message: str) -> None:
  """Raises `ConfigError(field, message)` unless `ok`."""
  if not ok:
    raise ConfigError(field, message)


def is_int(value) -> bool:
  """True for Python / NumPy integers (not bools)."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_finite_number(value) -> bool:
  """True for finite Python / NumPy ints and floats (not bools)."""
  return (isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
          and math.isfinite(value))


def check_kind_block(block, path: str, fields_by_kind: dict, what: str) -> str:
  """The `kind` of a named config block, after checking it and the block's field names.

  `fields_by_kind` maps each allowed kind to the fields its block may hold (besides
  "kind"). Raises ConfigError naming `<path>.kind` or `<path>.<unknown field>`.
  """
  kind = block.get("kind")
  if kind not in fields_by_kind:
    raise ConfigError(f"{path}.kind", f"unknown {what} {kind!r}; allowed: "
                      f"{', '.join(fields_by_kind)}")
  allowed = ("kind",) + tuple(fields_by_kind[kind])
  unknown = [k for k in block.keys() if k not in allowed]
  if unknown:
    raise ConfigError(f"{path}.{unknown[0]}", f"unknown field for a {kind} {what}; "
                      f"allowed: {', '.join(allowed)}")
  return kind
