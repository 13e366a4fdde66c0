"""Config fields that no longer exist, with what replaces them (a one-line ConfigError).

Light on imports: the CLI reads it while it checks `--config.<field>` overrides.
"""

from __future__ import annotations

from xsens.errors import ConfigError

LEGACY_FIELDS = {
    "regularizer": "replaced by objective terms (xsens/train/objectives.py): set "
                   "config.objective, e.g. {'ce': {'kind': 'cross_entropy', 'weight': 0.5}, "
                   "'penalty': {'kind': 'sensitivity', 'weight': 0.5}} (or kind "
                   "'min_entropy', weight λ, beside a cross_entropy term of weight 1)"}


def legacy_field_error(path: str) -> str | None:
  """`"<field>: replaced by ..."` for a dotted config path through a removed field, or None."""
  for part in path.split("."):
    if part in LEGACY_FIELDS:
      return f"{part}: {LEGACY_FIELDS[part]}"
  return None


def refuse_legacy_fields(config) -> None:
  """ConfigError naming a removed field that `config` still sets, and what replaces it."""
  for field, message in LEGACY_FIELDS.items():
    if field in config:
      raise ConfigError(field, message)
