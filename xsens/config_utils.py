"""Helpers for `mlcollections_configs/*.py`: variant strings and per-run configs."""

from __future__ import annotations

import ml_collections


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses a config variant string such as `"smoke,model=vit,steps=50"` (big_vision style).

  Bare words are booleans set to True; `k=v` pairs are cast to the type of the default
  (`defaults` lists every allowed key). Unknown keys raise ValueError naming the allowed ones.
  """
  out = ml_collections.ConfigDict(dict(defaults))
  for item in filter(None, (arg or "").split(",")):
    key, eq, value = item.partition("=")
    if key not in defaults:
      raise ValueError(
          f"unknown config variant {key!r}; allowed: {', '.join(sorted(defaults))}")
    default = defaults[key]
    if not eq:
      out[key] = True
    elif isinstance(default, bool):
      out[key] = value.lower() in ("1", "true", "yes")
    elif default is None:
      out[key] = value
    else:
      out[key] = type(default)(value)
  return out


def run_config(config: ml_collections.ConfigDict, run_name: str) -> ml_collections.ConfigDict:
  """The training config of one run of a multi-run study.

  Starts from `config.train` (data, optimizer, schedule shared by all runs), then applies
  `config.runs[run_name]` (a nested dict of overrides, e.g. the model) on top. A run's
  `model` that names a model replaces the base model whole (fields differ per model).
  """
  base = config.train.copy_and_resolve_references()
  overrides = config.runs[run_name].to_dict()
  with base.unlocked():
    if "name" in overrides.get("model", {}):
      base.model = ml_collections.ConfigDict(overrides.pop("model"))
    _update(base, overrides)
  return base


def _update(cfg: ml_collections.ConfigDict, overrides: dict) -> None:
  for key, value in overrides.items():
    if isinstance(value, dict) and key in cfg and isinstance(cfg[key], ml_collections.ConfigDict):
      with cfg[key].unlocked():
        _update(cfg[key], value)
    else:
      cfg[key] = value
