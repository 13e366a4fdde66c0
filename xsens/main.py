"""Command-line entry point: `xsens --config=mlcollections_configs/FILE.py[:args] --workdir=DIR`.

Also `python -m xsens`. Parses flags, then calls `xsens.studies.run(config, workdir)`;
the library below never reads flags. Bad input exits with code 2 and one line naming the
field; a diverged run exits with code 1 and keeps its last good checkpoint.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file, optionally with ':variant,args'.", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, metrics and the report "
    "(default: ./workdirs/<study>). Rerunning with it resumes.")
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Start again in a workdir whose checkpoints come from another config.")


def main(argv) -> None:
  del argv
  # Imported here so `--help` stays fast and flags are parsed before JAX starts.
  from xsens import studies  # pylint: disable=g-import-not-at-top
  from xsens.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from xsens.train.trainer import TrainingDivergedError  # pylint: disable=g-import-not-at-top

  config = _CONFIG.value
  if config is None:
    _fail("--config is required, e.g. --config=mlcollections_configs/sensitivity_vision.py")
  workdir = _WORKDIR.value or os.path.join("workdirs", str(config.get("study", "run")))
  logging.set_verbosity(logging.WARNING)
  try:
    out = studies.run(config, workdir, overwrite=_OVERWRITE.value)
  except ConfigError as e:
    _fail(str(e))
  except TrainingDivergedError as e:
    print(f"xsens: {e}", file=sys.stderr)
    sys.exit(1)
  if out.get("markdown"):
    print(out["markdown"])
  print(f"Results in {os.path.abspath(workdir)}: results.md, results.json and plots; "
        "per-run metrics.jsonl, TensorBoard events (tb/) and checkpoints.")


def _fail(message: str) -> None:
  print(f"xsens: error: {message}", file=sys.stderr)
  sys.exit(2)


def run() -> None:
  """Console-script entry point."""
  app.run(main)


if __name__ == "__main__":
  run()
