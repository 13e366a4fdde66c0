"""One schema per study: each config file holds its defaults (`get_config`) and their field
checks (`validate`), and both import without JAX."""

import importlib
import pathlib
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO
from xsens.errors import ConfigError

CONFIGS = sorted(p.stem for p in (pathlib.Path(REPO) / "mlcollections_configs").glob("*.py")
                 if p.stem not in ("__init__", "common"))


def named_variants(name: str) -> list[str | None]:
  """The variants (`file.py:variant`) the config's docstring names; None is the default."""
  doc = importlib.import_module(f"mlcollections_configs.{name}").__doc__ or ""
  found = re.findall(rf"mlcollections_configs/{name}\.py(?::([^\s`]+))?", doc)
  return sorted({v or None for v in found if "..." not in v}, key=str)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_defines_validate_and_its_variants_pass(name):
  module = importlib.import_module(f"mlcollections_configs.{name}")
  assert callable(getattr(module, "validate", None)), f"{name}.py has no validate(config)"
  variants = named_variants(name)
  assert None in variants or variants, f"{name}.py's docstring names no run command"
  for variant in variants:
    module.validate(module.get_config(variant))


@pytest.mark.parametrize("name, field, value, message", [
    ("grokking", "data.modulus", 1, "must be an int >= 2, got 1"),
    ("benign_overfitting", "sweep.trials", 0, "must be a positive int, got 0"),
    ("synthetic_sensitivity", "num_seeds", 0, "must be a positive int, got 0"),
    ("modify_memories", "edit.replay_ratio", 0.0,
     "must be > 0 (replayed per modified sentence), got 0.0"),
])
def test_a_bad_value_is_refused_without_jax(name, field, value, message):
  """The config file's `validate` refuses the value (the same ConfigError the CLI prints)
  in a process that never imports JAX."""
  code = f"""
import sys
from mlcollections_configs import {name} as m
from xsens.errors import ConfigError
c = m.get_config("smoke")
c.{field} = {value!r}
try:
  m.validate(c)
except ConfigError as e:
  print(e)
print("jax" in sys.modules)
"""
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       check=True, env={"PYTHONPATH": REPO, "PATH": ""}).stdout.splitlines()
  assert out == [f"config.{field}: {message}", "False"]
  # In this process too, for the message (the study calls the same function first).
  module = importlib.import_module(f"mlcollections_configs.{name}")
  config = module.get_config("smoke")
  parent, _, leaf = field.rpartition(".")
  (config if not parent else config[parent] if "." not in parent
   else config[parent.split(".")[0]][parent.split(".")[1]])[leaf] = value
  with pytest.raises(ConfigError) as e:
    module.validate(config)
  assert str(e.value) == f"config.{field}: {message}"
