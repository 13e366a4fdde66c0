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
