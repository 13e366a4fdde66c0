"""The study a workdir belongs to: `study.json`, its guard, and what `--overwrite` removes.

`study.json` holds `{"study": <config.study>, "others": [...]}`: `others` names the
entries that were in the directory before the study first wrote there (a user's own files
beside a run). Every other top-level entry (results.md/json, plots, `runs/`, `tb/`,
checkpoints, logs, summaries) is the study's.

- Another study in the same workdir is refused (ConfigError naming `workdir`, nothing
  written); with `overwrite`, every entry of the old study is removed first, `others` and
  the lock kept.
- A workdir without `study.json` that holds an xsens run is taken as the running
  study's: it is recorded, and `others` keeps only the entries that do not look like xsens
  outputs (`looks_like_output`).
- `study.json` is written before the study starts (so an interrupted run is recorded), and
  removed again (`Claim.release_if_unused`) when the study ends having written nothing.

Process 0 alone writes and removes (through `xsens.paths`, so `gs://` works too).
"""

from __future__ import annotations

import dataclasses
import json
import os

from xsens import paths
from xsens.errors import ConfigError
from xsens.train.metrics import METRICS_FILE, METRICS_PARTS_DIR, TB_DIR
from xsens.train.workdir import (CHECKPOINT_DIR, CONFIG_FILE, LOCK_FILE, RUN_FILES,
                                 ensure_directory)

STUDY_FILE = "study.json"
RESULTS_FILES = ("results.json", "results.md")
# Top-level names of a run or a report, and file suffixes of a study's outputs.
OUTPUT_NAMES = frozenset({CONFIG_FILE, *RESULTS_FILES, *RUN_FILES})
OUTPUT_SUFFIXES = (".png", ".npz")


def read(path: str) -> dict | None:
  """`path`'s record ({"study", "others"}), or None if absent or unreadable."""
  file = os.path.join(path, STUDY_FILE)
  try:
    record = json.loads(paths.read_text(file)) if paths.isfile(file) else None
  except (OSError, ValueError):
    return None
  if not (isinstance(record, dict) and isinstance(record.get("study"), str)):
    return None
  others = record.get("others")
  record["others"] = [n for n in others if isinstance(n, str)] if isinstance(others, list) else []
  return record


def entries(path: str) -> set[str]:
  """Top-level names in `path` other than the record and the lock."""
  if not paths.isdir(path):
    return set()
  return {n for n in paths.listdir(path)
          if n not in (STUDY_FILE, LOCK_FILE) and not n.startswith(".tmp.lock")}


def holds_run(folder: str, depth: int = 3) -> bool:
  """Whether `folder`, or a folder at most `depth - 1` levels below it, is an xsens run
  (config.json beside checkpoints/, metrics.jsonl, metrics/ or tb/) or report
  (results.json and results.md)."""
  if depth <= 0 or not paths.isdir(folder):
    return False
  names = set(paths.listdir(folder))
  run_files = {CHECKPOINT_DIR, METRICS_FILE, METRICS_PARTS_DIR, TB_DIR}
  if ((CONFIG_FILE in names and names & run_files)
      or names.issuperset(RESULTS_FILES)):
    return True
  return any(holds_run(os.path.join(folder, n), depth - 1) for n in names)


def looks_like_output(path: str, name: str) -> bool:
  """Whether the entry `name` of a run's folder `path` looks written by xsens: a run or
  report file (`OUTPUT_NAMES`), a plot or array file, or a folder holding a run."""
  return (name in OUTPUT_NAMES or name.endswith(OUTPUT_SUFFIXES)
          or holds_run(os.path.join(path, name), depth=2))


@dataclasses.dataclass
class Claim:
  """A study's record in `path`, as `claim` left it."""
  path: str
  wrote: bool            # `claim` wrote study.json.
  created: bool          # `claim` created the directory.
  before: set[str]       # `entries(path)` right after `claim`.

  def release_if_unused(self) -> None:
    """Removes the record `claim` wrote (and the directory it created, if empty) when
    nothing else was added since (the study stopped before writing anything)."""
    if not (self.wrote and paths.is_writer()):
      return
    try:
      if entries(self.path) != self.before:
        return
      paths.remove(os.path.join(self.path, STUDY_FILE))
      if self.created and paths.isdir(self.path) and not paths.listdir(self.path):
        if paths.is_remote(self.path):
          paths.rmtree(self.path)
        else:
          os.rmdir(self.path)
    except OSError:
      pass   # Called while an error propagates: a record left behind does no harm.


def claim(path: str, study: str, *, overwrite: bool = False) -> Claim:
  """Checks that `path` holds no other study's results, then records `study` there.

  Another study's record: ConfigError naming `workdir` (nothing written), or with
  `overwrite` its entries are removed (all but its `others`). No record: see the module
  docstring. The same study: nothing changes.
  """
  record = read(path)
  found = entries(path)
  if record is not None and record["study"] == study:
    return Claim(path, wrote=False, created=False, before=found)
  if record is not None:
    if not overwrite:
      raise ConfigError(
          "workdir", f"{path!r} holds results of study {record['study']!r}; this config runs "
          f"study {study!r}; pass --overwrite to replace them, or choose another --workdir")
    others = set(record["others"])
    if paths.is_writer():
      for name in sorted(found - others):
        _remove(os.path.join(path, name))
    found &= others
  elif holds_run(path):
    others = {n for n in found if not looks_like_output(path, n)}
  else:
    others = found
  created = not paths.exists(path)
  if paths.is_writer():
    ensure_directory(path)   # ConfigError naming `workdir` if it cannot be.
    paths.write_text(os.path.join(path, STUDY_FILE),
                     json.dumps({"study": study, "others": sorted(others)}, indent=2))
  return Claim(path, wrote=True, created=created, before=found)


def _remove(target: str) -> None:
  if paths.isdir(target):
    paths.rmtree(target)
  else:
    paths.remove(target)
