"""Loading a config needs no JAX: every packaged config loads without importing jax, flax,
optax, orbax or TensorFlow (`HEAVY`), and the jax-free tables config files read
(`xsens.model_defaults`, `xsens.data.text_config`, `xsens.choices`) equal what the library
defines."""

import dataclasses
import glob
import os
import subprocess
import sys

from tests.helpers import REPO
from xsens import choices, model_defaults, models
from xsens.data import text, text_config
from xsens.measures import corruptions

# tensorflow_datasets (without TensorFlow) is allowed: modify_memories.py reads
# xsens.data.knowledge, which imports xsens.data.text and with it tfds.
HEAVY = ("jax", "flax", "optax", "orbax", "tensorflow")
CONFIGS = sorted(p for p in glob.glob(os.path.join(REPO, "mlcollections_configs", "*.py"))
                 if os.path.basename(p) not in ("__init__.py", "common.py"))


def test_model_defaults_are_the_dataclass_defaults_of_every_registered_model():
  assert list(model_defaults.MODEL_DEFAULTS) == list(models.REGISTRY)
  for name, entry in models.REGISTRY.items():
    fields = {f.name: f for f in dataclasses.fields(entry.module)}
    defaults = {k: fields[k].default for k in entry.config_fields}
    assert model_defaults.MODEL_DEFAULTS[name] == defaults, name
    # Equal and of the same type (1 == 1.0 == True would hide a changed field type).
    assert {k: type(v) for k, v in model_defaults.MODEL_DEFAULTS[name].items()} == {
        k: type(v) for k, v in defaults.items()}, name


def test_text_and_corruption_tables_are_the_library_s():
  assert text_config.SYNTHETIC_VOCAB == text.SYNTHETIC_VOCAB == (
      len(text.SPECIAL_TOKENS) + len(text.WORDS))
  assert choices.CORRUPTION_NAMES == tuple(corruptions.CORRUPTIONS) == corruptions.NAMES
  from xsens.models import position  # pylint: disable=g-import-not-at-top
  assert position.POSITIONS is choices.POSITION_ENCODINGS


def test_every_packaged_config_loads_without_jax():
  """Default and smoke variant of each config, through the CLI's loader, in a fresh process."""
  code = (
      "import sys\nfrom xsens import main\n"
      "for path in sys.argv[1:]:\n"
      "  for spec in (path, path + ':smoke'):\n"
      "    main.load_config(spec)\n"
      f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
  proc = subprocess.run([sys.executable, "-c", code, *CONFIGS], cwd=REPO, capture_output=True,
                        text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.splitlines()[-1] == "[]", proc.stdout[-500:]
