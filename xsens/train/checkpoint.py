"""Workdir helpers kept for callers that hold a path, all delegating to `Workdir`.

The train state is one plain pytree; the data position is the step itself
(`xsens.data.pipeline.batch_indices` is a pure function of it), so a restored state resumes
the exact batch sequence. New code uses `xsens.train.workdir.Workdir` directly.
"""

from __future__ import annotations

from xsens.train.sharding import abstract_with_shardings  # pylint: disable=unused-import
from xsens.train.workdir import (CHECKPOINT_DIR, CONFIG_FILE,  # pylint: disable=unused-import
                                 MAY_CHANGE_ON_RESUME, Workdir, config_fingerprint)


def latest_step(workdir: str) -> int | None:
  """The newest committed checkpoint step in `workdir`, or None."""
  return Workdir(workdir).latest_step()


def check_workdir(workdir: str, config, overwrite: bool) -> None:
  """Refuses (ConfigError) a workdir whose checkpoints were written by another config."""
  Workdir(workdir).check(config, overwrite=overwrite)


def prepare_workdir(workdir: str, config, overwrite: bool) -> None:
  """Creates `workdir` and writes config.json; `overwrite` removes the previous run."""
  Workdir(workdir).prepare(config, overwrite=overwrite)
