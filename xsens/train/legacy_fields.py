"""Config fields that no longer exist, with what replaces them (a one-line ConfigError).

Light on imports: the CLI reads it while it checks `--config.<field>` overrides.
"""

from __future__ import annotations

from xsens.errors import ConfigError

LEGACY_FIELDS = {
    "regularizer": "replaced by objective terms (xsens/train/objectives.py): e.g. "
                   "--config.objective.ce.kind=cross_entropy --config.objective.ce.weight=0.5 "
                   "--config.objective.penalty.kind=sensitivity (or min_entropy) "
                   "--config.objective.penalty.weight=0.5"}


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
