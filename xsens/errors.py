"""Errors that xsens raises for bad user input, and the checks that raise them."""

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping

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

  @property
  def flag(self) -> str:
    """The command-line flag that sets the field: ``--config.<field>``, or ``--workdir``."""
    return "--workdir" if self.field == "workdir" else f"--config.{self.field}"


# sysexits.h EX_TEMPFAIL: another process, or the run's storage, stopped answering; a
# rerun of the same command resumes from the newest committed checkpoint.
EXIT_UNAVAILABLE = 75


class Unavailable(RuntimeError):
  """Another process of the run, or the run's storage, stopped answering during the run.

  The message says what was waited for; the CLI prints it as one line `xsens: error: ...`
  and exits with EXIT_UNAVAILABLE (a rerun resumes; docs/launch.md).
  """

  exit_code = EXIT_UNAVAILABLE


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


# Fields of ConfigErrors that are not config fields (the --workdir flag); `prefixed` keeps them.
NOT_CONFIG_FIELDS = ("workdir",)


@contextlib.contextmanager
def prefixed(prefix: str | Callable[[str], str], note: str = "") -> Iterator[None]:
  """Re-raises a ConfigError from the block naming the field's full path in the config.

  Code that validates a sub-config (e.g. `config.train`) names fields relative to it
  (`model.patch_size`); under `prefixed("train")` the error names `train.model.patch_size`.
  `prefix` may instead be a function from the relative field to its full path (a run merged
  from several blocks). `note` is appended to the message (e.g. " (run vit)"). Errors on
  `NOT_CONFIG_FIELDS` pass through unchanged.
  """
  try:
    yield
  except ConfigError as e:
    if e.field in NOT_CONFIG_FIELDS:
      raise
    field = prefix(e.field) if callable(prefix) else f"{prefix}.{e.field}"
    raise ConfigError(field, e.message + note) from None


def require_finite(config: Mapping, allow: tuple[str, ...] = ()) -> None:
  """Refuses a NaN or infinite float anywhere in `config` (a nested dict / ConfigDict).

  Names the full dotted path (a list or tuple is named as a whole: it is set as a whole on
  the command line). `allow` lists the paths that may hold a non-finite value; no study
  needs one today.
  """
  for path, value in _leaves(config, ""):
    if path not in allow and not _all_finite(value):
      raise ConfigError(path, f"must be a finite number, got {value!r}" if _is_float(value)
                        else f"must hold finite numbers, got {value!r}")


def _leaves(node, path: str):
  """(dotted path, value) of every non-mapping value under `node`."""
  if _is_mapping(node):
    for key, value in node.items():
      yield from _leaves(value, f"{path}.{key}" if path else str(key))
  else:
    yield path, node


def _is_mapping(value) -> bool:
  """A dict or an ml_collections ConfigDict (which is not a `Mapping`)."""
  return isinstance(value, Mapping) or (hasattr(value, "items") and hasattr(value, "keys"))


def _is_float(value) -> bool:
  return isinstance(value, (float, np.floating))


def _all_finite(value) -> bool:
  if _is_float(value):
    return math.isfinite(value)
  if isinstance(value, (list, tuple)):
    return all(_all_finite(v) for v in value)
  if _is_mapping(value):
    return all(_all_finite(v) for _, v in _leaves(value, ""))
  return True
