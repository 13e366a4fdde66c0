"""Orbax checkpointing of the whole train state, and the workdir's config guard.

The train state is one plain pytree `{"params", "batch_stats", "opt", "step"}`. The data
position is the step itself (`xsens.data.pipeline.batch_indices` is a pure function of
it), so a restored state resumes the exact batch sequence.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import orbax.checkpoint as ocp

from xsens.errors import ConfigError

CHECKPOINT_DIR = "checkpoints"
CONFIG_FILE = "config.json"
# Fields that may change between a run and its resumption (they do not change the result).
RUN_CONTROL_FIELDS = ("progress", "log_every")


def make_manager(workdir: str, keep: int) -> ocp.CheckpointManager:
  """A CheckpointManager keeping the latest `keep` steps; saves are async and atomic."""
  options = ocp.CheckpointManagerOptions(
      preservation_policy=ocp.checkpoint_managers.LatestN(n=keep),
      cleanup_tmp_directories=True)
  return ocp.CheckpointManager(
      os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR)), options=options)


def latest_step(workdir: str) -> int | None:
  """The newest committed checkpoint step in `workdir`, or None (no manager created)."""
  path = os.path.join(workdir, CHECKPOINT_DIR)
  if not os.path.isdir(path):
    return None
  steps = [int(n) for n in os.listdir(path) if n.isdigit()]
  return max(steps) if steps else None


def save(manager: ocp.CheckpointManager, step: int, state) -> None:
  manager.save(step, args=ocp.args.StandardSave(state), force=True)


def restore(manager: ocp.CheckpointManager, step: int, abstract_state):
  """Restores `step` into the shapes, dtypes and shardings of `abstract_state`."""
  return manager.restore(step, args=ocp.args.StandardRestore(abstract_state))


def abstract_with_shardings(abstract_state, shardings):
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings)


def config_fingerprint(config) -> dict:
  """The config as a JSON-able dict, without run-control fields."""
  as_dict = json.loads(config.to_json_best_effort())
  for key in RUN_CONTROL_FIELDS:
    as_dict.pop(key, None)
  return as_dict


def _diff_fields(a, b, prefix="") -> list[str]:
  if isinstance(a, dict) and isinstance(b, dict):
    out = []
    for k in sorted(set(a) | set(b)):
      out += _diff_fields(a.get(k), b.get(k), f"{prefix}{k}.")
    return out
  return [] if a == b else [prefix.rstrip(".")]


def check_workdir(workdir: str, config, overwrite: bool) -> None:
  """Refuses a workdir whose checkpoints were written by a different config.

  Reads only. With `overwrite`, the mismatch is allowed and `prepare_workdir` clears the
  old run. Raises ConfigError naming `workdir` and the differing fields otherwise.
  """
  if overwrite or latest_step(workdir) is None:
    return
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise ConfigError(
        "workdir", f"{workdir!r} holds checkpoints but no {CONFIG_FILE}; pass --overwrite "
        "to start again there, or choose another --workdir")
  with open(path) as f:
    saved = json.load(f)
  diff = _diff_fields(saved, config_fingerprint(config))
  if diff:
    raise ConfigError(
        "workdir", f"{workdir!r} holds a checkpoint written by a different config "
        f"(differing fields: {', '.join(diff[:8])}); pass --overwrite to start again "
        "there, or choose another --workdir")


def prepare_workdir(workdir: str, config, overwrite: bool) -> None:
  """Creates `workdir` and writes config.json (after validation passed).

  With `overwrite`, removes the previous run's checkpoints and metrics first.
  """
  if overwrite and os.path.isdir(workdir):
    for name in (CHECKPOINT_DIR, "metrics.jsonl", "tb", "train_summary.json"):
      target = os.path.join(workdir, name)
      if os.path.isdir(target):
        shutil.rmtree(target)
      elif os.path.exists(target):
        os.remove(target)
  os.makedirs(workdir, exist_ok=True)
  if jax.process_index() == 0:
    tmp = os.path.join(workdir, CONFIG_FILE + ".tmp")
    with open(tmp, "w") as f:
      json.dump(config_fingerprint(config), f, indent=2, sort_keys=True)
    os.replace(tmp, os.path.join(workdir, CONFIG_FILE))
