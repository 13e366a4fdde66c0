"""`Workdir`: the one object that owns a run's directory.

Every study keeps its files through it: the config fingerprint and its guard (one list of
fields that may change on a resume), atomic writes, the orbax checkpoint manager (the one
resume format: the whole state pytree), the metrics writer (JSON lines + TensorBoard),
per-step array logs (e.g. grokking's per-epoch curves, a sweep's per-run results) and the
study's outputs. On a resume, `truncate(step)` drops every log record after the restored
step, so a resumed run rewrites those steps exactly once.

Layout of `path`:
  config.json          the fingerprint of the config that wrote the checkpoints
  checkpoints/<step>/  orbax checkpoints of the state
  metrics.jsonl, tb/   scalar metrics by step (`MetricWriter`)
  logs/epochs_<a>_<b>.npz   array logs of steps [a, b) (the name is historical: grokking's)
  anything else        the study's outputs (results.md/json, plots, summaries)
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Iterable

import jax
import numpy as np
import orbax.checkpoint as ocp

from xsens.errors import ConfigError
from xsens.train.metrics import METRICS_FILE, MetricWriter, truncate_metrics

CHECKPOINT_DIR = "checkpoints"
CONFIG_FILE = "config.json"
STEP_LOG_DIR = "logs"
_STEP_LOG_PREFIX = "epochs_"

# The one list of config fields (dotted paths) that may change between a run and its
# resumption, because they do not change the numbers a run produces:
MAY_CHANGE_ON_RESUME = (
    "progress",            # progress bar on/off
    "log_every",           # how often train means are written (not what is trained)
    "report",              # a study's report settings (thresholds, plot markers)
    "train.epochs",        # grokking: a longer run continues a shorter one exactly
    "train.chunk_epochs",  # grokking: lax.scan chunk length (same steps, same numbers)
    "train.keep_checkpoints",
)
# Files of a previous run that --overwrite removes (study outputs are rewritten anyway).
RUN_FILES = (CHECKPOINT_DIR, METRICS_FILE, "tb", STEP_LOG_DIR, "train_summary.json")


def config_fingerprint(config, may_change: Iterable[str] = MAY_CHANGE_ON_RESUME) -> dict:
  """The config (ConfigDict or dict) as a JSON-able dict without the `may_change` fields."""
  as_dict = (json.loads(config.to_json_best_effort()) if hasattr(config, "to_json_best_effort")
             else json.loads(json.dumps(config, default=str)))
  return _without(as_dict, may_change)


def _without(d: dict, paths: Iterable[str]) -> dict:
  d = json.loads(json.dumps(d))
  for path in paths:
    *parents, leaf = path.split(".")
    node = d
    for p in parents:
      node = node.get(p) if isinstance(node, dict) else None
    if isinstance(node, dict):
      node.pop(leaf, None)
  return d


def diff_fields(a, b, prefix: str = "") -> list[str]:
  """Dotted paths at which two JSON trees differ."""
  if isinstance(a, dict) and isinstance(b, dict):
    out = []
    for k in sorted(set(a) | set(b)):
      out += diff_fields(a.get(k), b.get(k), f"{prefix}{k}.")
    return out
  return [] if a == b else [prefix.rstrip(".")]


class Workdir:
  """A run's directory (see the module docstring). Only process 0 writes files."""

  def __init__(self, path: str, *, keep_checkpoints: int = 3,
               may_change: Iterable[str] = MAY_CHANGE_ON_RESUME):
    self.path = path
    self.keep_checkpoints = int(keep_checkpoints)
    self.may_change = tuple(may_change)
    self.is_writer = jax.process_index() == 0
    self._manager = None

  # --------------------------------------------------------------------------- the guard

  @classmethod
  def open(cls, path: str, config, *, overwrite: bool = False, keep_checkpoints: int = 3,
           may_change: Iterable[str] = MAY_CHANGE_ON_RESUME,
           has_state: Any = None) -> "Workdir":
    """Checks `path` against `config` (ConfigError, nothing written), then prepares it."""
    wd = cls(path, keep_checkpoints=keep_checkpoints, may_change=may_change)
    wd.check(config, overwrite=overwrite, has_state=has_state)
    wd.prepare(config, overwrite=overwrite)
    return wd

  def fingerprint(self, config) -> dict:
    return config_fingerprint(config, self.may_change)

  def check(self, config, *, overwrite: bool = False, has_state: Any = None) -> None:
    """Refuses a workdir whose state was written by a different config (read only).

    `has_state` (default: a checkpoint exists) says whether there is a run to protect.
    """
    if has_state is None:
      has_state = self.latest_step() is not None
    if overwrite or not has_state:
      return
    saved = self.read_json(CONFIG_FILE)
    if saved is None:
      raise ConfigError(
          "workdir", f"{self.path!r} holds checkpoints but no {CONFIG_FILE}; pass --overwrite "
          "to start again there, or choose another --workdir")
    diff = diff_fields(_without(saved, self.may_change), self.fingerprint(config))
    if diff:
      raise ConfigError(
          "workdir", f"{self.path!r} holds a checkpoint written by a different config "
          f"(differing fields: {', '.join(diff[:8])}); pass --overwrite to start again "
          "there, or choose another --workdir")

  def prepare(self, config, *, overwrite: bool = False) -> None:
    """Creates the directory and writes config.json; `overwrite` removes the old run."""
    if overwrite and self.is_writer and os.path.isdir(self.path):
      for name in RUN_FILES:
        target = self.file(name)
        if os.path.isdir(target):
          shutil.rmtree(target)
        elif os.path.exists(target):
          os.remove(target)
    os.makedirs(self.path, exist_ok=True)
    self.write_json(CONFIG_FILE, self.fingerprint(config), sort_keys=True)

  # --------------------------------------------------------------------------- files

  def file(self, name: str) -> str:
    return os.path.join(self.path, name)

  def exists(self, name: str) -> bool:
    return os.path.exists(self.file(name))

  def write_json(self, name: str, obj, *, sort_keys: bool = False) -> None:
    """Atomically writes `obj` as JSON (process 0 only)."""
    if not self.is_writer:
      return
    path = self.file(name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
      json.dump(obj, f, indent=2, sort_keys=sort_keys)
    os.replace(path + ".tmp", path)

  def read_json(self, name: str, default=None):
    path = self.file(name)
    if not os.path.exists(path):
      return default
    with open(path) as f:
      return json.load(f)

  def write_npz(self, name: str, arrays: dict) -> None:
    """Atomically writes `arrays` as an .npz (process 0 only)."""
    if not self.is_writer:
      return
    path = self.file(name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # The temporary name never matches a log file's pattern (a kill may leave it behind).
    tmp = os.path.join(os.path.dirname(path), ".tmp." + os.path.basename(path))
    np.savez(tmp, **arrays)
    os.replace(tmp, path)

  # --------------------------------------------------------------------------- checkpoints

  @property
  def manager(self) -> ocp.CheckpointManager:
    """The orbax manager (created on first use): latest `keep_checkpoints` steps, async."""
    if self._manager is None:
      options = ocp.CheckpointManagerOptions(
          preservation_policy=ocp.checkpoint_managers.LatestN(n=self.keep_checkpoints),
          cleanup_tmp_directories=True)
      self._manager = ocp.CheckpointManager(os.path.abspath(self.file(CHECKPOINT_DIR)),
                                            options=options)
    return self._manager

  def latest_step(self) -> int | None:
    """The newest committed checkpoint step, or None (creates no manager)."""
    path = self.file(CHECKPOINT_DIR)
    if not os.path.isdir(path):
      return None
    steps = [int(n) for n in os.listdir(path) if n.isdigit()]
    return max(steps) if steps else None

  def save(self, step: int, state) -> None:
    self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore(self, step: int, abstract_state):
    """Restores `step` into the shapes, dtypes and shardings of `abstract_state`."""
    return self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

  def close(self) -> None:
    """Waits for pending saves to commit and closes the manager."""
    if self._manager is not None:
      self._manager.wait_until_finished()
      self._manager.close()
      self._manager = None

  # --------------------------------------------------------------------------- logs

  def metric_writer(self, tensorboard: bool = True) -> MetricWriter:
    return MetricWriter(self.path, enabled=self.is_writer, tensorboard=tensorboard)

  def truncate(self, step: int) -> None:
    """Drops metrics and array logs after `step` (a resume rewrites those steps)."""
    if not self.is_writer:
      return
    truncate_metrics(self.path, step)
    for start, end, path in self.step_log_files():
      if end > step:
        os.remove(path)

  def step_log_files(self) -> list[tuple[int, int, str]]:
    """(start, end, path) of the array logs, sorted."""
    folder = self.file(STEP_LOG_DIR)
    if not os.path.isdir(folder):
      return []
    out = []
    for name in os.listdir(folder):
      bounds = name[len(_STEP_LOG_PREFIX):-len(".npz")].split("_")
      if (name.startswith(_STEP_LOG_PREFIX) and name.endswith(".npz") and len(bounds) == 2
          and all(b.isdigit() for b in bounds)):
        out.append((int(bounds[0]), int(bounds[1]), os.path.join(folder, name)))
    return sorted(out)

  def write_step_log(self, start: int, end: int, arrays: dict) -> None:
    """Array logs of steps [start, end): each array's step axis is its LAST axis."""
    self.write_npz(os.path.join(STEP_LOG_DIR, f"{_STEP_LOG_PREFIX}{start:07d}_{end:07d}.npz"),
                   {k: np.asarray(v) for k, v in arrays.items()})

  def read_step_log(self, upto: int, fields: Iterable[str], lead_shape=(),
                    dtype=np.float32) -> dict:
    """{field: [*lead_shape, upto]} from the array logs of steps [0, upto) (NaN if missing)."""
    out = {k: np.full((*lead_shape, upto), np.nan, dtype) for k in fields}
    for start, end, path in self.step_log_files():
      if end > upto:
        continue
      with np.load(path) as z:
        for k in out:
          out[k][..., start:end] = z[k]
    return out
