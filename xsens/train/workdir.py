"""`Workdir`: the one object that owns a run's directory.

Every study keeps its files through it: the config fingerprint and its guard (one list of
fields that may change on a resume), atomic writes, the orbax checkpoint manager (the one
resume format: the whole state pytree), the metrics writer (JSON lines + TensorBoard),
per-step array logs (e.g. grokking's per-epoch curves, a sweep's per-run results) and the
study's outputs. On a resume, `truncate(step)` drops every log record after the restored
step, so a resumed run rewrites those steps exactly once.

Layout of `path`:
  config.json          the fingerprint of the config that wrote the checkpoints
  lock.json            who runs here now (pid, host, start time; see `acquire_lock`)
  study.json           the study whose outputs these are, at a study's top level
                       (`xsens.train.study_record`: another study is refused)
  checkpoints/<step>/  orbax checkpoints of the state
  damaged_checkpoints/<step>/  checkpoints that failed to restore, moved aside (never
                       deleted) when an older one restored instead
  metrics.jsonl, tb/   scalar metrics by step (`MetricWriter`); a remote workdir appends
                       them as metrics/part-<n>.jsonl and one event file per upload
  logs/epochs_<a>_<b>.npz   array logs of steps [a, b) ("epochs" in the name for every study)
  anything else        the study's outputs (results.md/json, plots, summaries)

Faults (each tested in tests/faults_test.py):
- a second process on the same workdir gets a ConfigError naming `workdir` (the holder's
  pid, host and start time); the lock of a dead process on the same host, or of another host
  not refreshed for `STALE_LOCK_S`, is taken over with a message;
- a checkpoint that fails to restore is named with the reason, moved to
  damaged_checkpoints/ and the next older one is tried; if none restores, ConfigError;
- a workdir with any run files (checkpoints, metrics, array logs) is guarded by the
  fingerprint even before its first checkpoint.

Remote workdirs (`gs://bucket/run`; `xsens.paths.check_workdir` says which URLs): every
file goes through `xsens.paths` (epath), orbax gets the URL unchanged (TensorStore writes
the arrays to GCS itself). An object store has no hard links, no rename and no process
ids, so the lock there is: write `lock.json` with a random token if absent, wait
`REMOTE_LOCK_SETTLE_S`, read it back and own it only if the token is still ours (two
racing writers: the last write wins, the other sees a foreign token and stops); the holder
rewrites the lock's `"refreshed"` time every LOCK_HEARTBEAT_S and a lock not refreshed for
STALE_LOCK_S is stale (hosts cannot see each other's processes).

Multi-host: process 0 alone writes files other than checkpoints (`is_writer`); every
process restores the same checkpoint step (process 0's list of steps is broadcast, and a
step counts as restored only if it restored on every process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import logging
import math
import os
import secrets
import socket
import sys
import threading
import time
from typing import Any, Iterable

import jax
import numpy as np
import orbax.checkpoint as ocp

from xsens import paths
from xsens.errors import ConfigError, Unavailable
from xsens.train import multihost
from xsens.train.metrics import (METRICS_FILE, METRICS_PARTS_DIR, MetricWriter,
                                 truncate_metrics)

CHECKPOINT_DIR = "checkpoints"
DAMAGED_DIR = "damaged_checkpoints"
CONFIG_FILE = "config.json"
LOCK_FILE = "lock.json"
LOCK_HEARTBEAT_S = 30.0   # The holder refreshes the lock's mtime this often ...
STALE_LOCK_S = 300.0      # ... so a lock of another host older than this is stale.
REMOTE_LOCK_SETTLE_S = 2.0  # A remote lock is read back after this (see above).
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
RUN_FILES = (CHECKPOINT_DIR, DAMAGED_DIR, METRICS_FILE, METRICS_PARTS_DIR, "tb",
             STEP_LOG_DIR, "train_summary.json")


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


def _with_absent(d: dict, values: dict) -> dict:
  """`d` with each dotted path of `values` set where `d` lacks it (its parent exists)."""
  for path, value in values.items():
    *parents, leaf = path.split(".")
    node = d
    for p in parents:
      node = node.get(p) if isinstance(node, dict) else None
    if isinstance(node, dict) and leaf not in node:
      node[leaf] = value
  return d


def diff_fields(a, b, prefix: str = "") -> list[str]:
  """Dotted paths at which two JSON trees differ."""
  if isinstance(a, dict) and isinstance(b, dict):
    out = []
    for k in sorted(set(a) | set(b)):
      out += diff_fields(a.get(k), b.get(k), f"{prefix}{k}.")
    return out
  return [] if a == b else [prefix.rstrip(".")]


DATA_ITEM = "data_iterator"   # Checkpoint item of the training-data iterator state.


@dataclasses.dataclass(frozen=True)
class _FrozenState:
  """An iterator state captured at save time (orbax may write it after the next step)."""
  state: bytes

  def get_state(self) -> bytes:
    return self.state


class Workdir:
  """A run's directory (see the module docstring). Only process 0 writes files."""

  def __init__(self, path: str, *, keep_checkpoints: int = 3,
               may_change: Iterable[str] = MAY_CHANGE_ON_RESUME,
               hints: dict[str, str] | None = None,
               added_defaults: dict[str, Any] | None = None):
    """`hints`: field -> a sentence added to the refusal when that field differs.
    `added_defaults`: field -> the value that reproduces a run whose saved config lacks the
    field (a saved config without the field matches a config holding that value)."""
    self.path = path
    self.keep_checkpoints = int(keep_checkpoints)
    self.may_change = tuple(may_change)
    self.hints = dict(hints or {})
    self.added_defaults = json.loads(json.dumps(dict(added_defaults or {})))
    self.is_writer = jax.process_index() == 0
    self._manager = None
    self._heartbeat = None    # (thread, stop event) while this object holds the lock
    if paths.is_remote(path):
      paths.bound_checkpoint_retries()   # A bucket that stops answering fails a save.

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
      has_state = self.has_run()
    if overwrite or not has_state:
      return
    saved = self.read_json(CONFIG_FILE)
    if saved is None:
      raise ConfigError(
          "workdir", f"{self.path!r} holds a run but no {CONFIG_FILE}; pass --overwrite "
          "to start again there, or choose another --workdir")
    saved = _with_absent(_without(saved, self.may_change), self.added_defaults)
    diff = diff_fields(saved, self.fingerprint(config))
    if diff:
      hints = "".join(f"; {h}" for h in dict.fromkeys(self.hints[f] for f in diff
                                                        if f in self.hints))
      raise ConfigError(
          "workdir", f"{self.path!r} holds a run of a different config "
          f"(differing fields: {', '.join(diff[:8])}){hints}; pass --overwrite to start "
          "again there, or choose another --workdir")

  def has_run(self) -> bool:
    """Whether the directory holds a run to protect: checkpoints, metrics or array logs."""
    return (self.latest_step() is not None or self.exists(METRICS_FILE)
            or self.exists(METRICS_PARTS_DIR) or bool(self.step_log_files()))

  def prepare(self, config, *, overwrite: bool = False) -> None:
    """Takes the lock, creates the directory and writes config.json; `overwrite` removes
    the old run's files first."""
    self.acquire_lock()
    if overwrite and self.is_writer and paths.isdir(self.path):
      for name in RUN_FILES:
        target = self.file(name)
        if paths.isdir(target):
          paths.rmtree(target)
        elif paths.exists(target):
          paths.remove(target)
    if self.is_writer:
      paths.makedirs(self.path)
    self.write_json(CONFIG_FILE, self.fingerprint(config), sort_keys=True)

  # --------------------------------------------------------------------------- the lock

  def acquire_lock(self) -> None:
    """Makes this process the only one writing here (process 0 only; re-entrant).

    Creates the directory if needed and `lock.json` atomically ({"pid", "host",
    "started"}). A lock held by this process is accepted as is. A lock of a dead process on
    this host, or of another host not refreshed for STALE_LOCK_S, is taken over with a
    message; otherwise ConfigError naming `workdir`. While held, a daemon thread refreshes
    the lock's mtime every LOCK_HEARTBEAT_S; `release_lock` (the loop calls it when a run
    ends) removes it.
    """
    if not self.is_writer or self._heartbeat is not None:
      return
    ensure_directory(self.path)
    path = self.file(LOCK_FILE)
    if paths.is_remote(path):
      self._acquire_remote_lock(path)
      return
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": datetime.datetime.now().isoformat(timespec="seconds")}
    tmp = self.file(f".tmp.lock.{me['pid']}")
    try:
      with open(tmp, "w") as f:
        json.dump(me, f)
      for _ in range(3):
        try:
          os.link(tmp, path)   # Atomic: fails if the lock exists.
          break
        except FileExistsError:
          holder = _read_lock(path)
          if holder.get("pid") == me["pid"] and holder.get("host") == me["host"]:
            return           # Held by this process (another Workdir object, e.g. a study's).
          why = _stale_reason(holder, path)
          if why is None:
            raise self._in_use(holder, path) from None
          self._say_takeover(holder, why)
          _remove(path)
      else:
        raise ConfigError("workdir", f"could not take the lock {path}; another process keeps "
                          "taking it")
    except OSError as e:
      raise ConfigError("workdir", f"{self.path!r} cannot be written: {e.strerror or e}"
                        ) from None
    finally:
      _remove(tmp)
    self._start_heartbeat(_heartbeat, path)

  def _acquire_remote_lock(self, path: str) -> None:
    """`acquire_lock` on an object store: write if absent, then read back (see the
    module docstring)."""
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": datetime.datetime.now().isoformat(timespec="seconds"),
          "token": secrets.token_hex(8), "refreshed": time.time()}
    try:
      for _ in range(3):
        holder = _read_lock(path) if paths.exists(path) else None
        if holder is not None:
          if holder.get("pid") == me["pid"] and holder.get("host") == me["host"]:
            return           # Held by this process (another Workdir object).
          why = _remote_stale_reason(holder, time.time())
          if why is None:
            raise self._in_use(holder, path)
          self._say_takeover(holder, why)
        paths.write_text(path, json.dumps(me))
        time.sleep(REMOTE_LOCK_SETTLE_S)
        if _read_lock(path).get("token") == me["token"]:
          break
      else:
        raise ConfigError("workdir", f"could not take the lock {path}; another process keeps "
                          "taking it")
    except OSError as e:
      raise ConfigError("workdir", f"{self.path!r} cannot be written: {e.strerror or e}"
                        ) from None
    self._start_heartbeat(_remote_heartbeat, path, me)

  def _in_use(self, holder: dict, path: str) -> ConfigError:
    return ConfigError(
        "workdir", f"{self.path!r} is in use by process {holder.get('pid')} on "
        f"{holder.get('host')} since {holder.get('started')}; wait for it, stop it, "
        f"or choose another --workdir (if it is gone, delete {path})")

  def _say_takeover(self, holder: dict, why: str) -> None:
    _say(f"xsens: taking over the lock of {self.path} from process "
         f"{holder.get('pid')} on {holder.get('host')} ({why})")

  def _start_heartbeat(self, target, *args) -> None:
    """Runs `target(*args, stop)` in a daemon thread until `release_lock`."""
    stop = threading.Event()
    thread = threading.Thread(target=target, args=(*args, stop), daemon=True,
                              name="xsens-workdir-lock")
    thread.start()
    self._heartbeat = (thread, stop)
    _HELD_LOCKS.add(self)

  def release_lock(self) -> None:
    """Removes the lock if this object took it."""
    if self._heartbeat is None:
      return
    thread, stop = self._heartbeat
    stop.set()
    thread.join()
    self._heartbeat = None
    _HELD_LOCKS.discard(self)
    paths.remove(self.file(LOCK_FILE))

  # --------------------------------------------------------------------------- files

  def file(self, name: str) -> str:
    return os.path.join(self.path, name)

  def exists(self, name: str) -> bool:
    return paths.exists(self.file(name))

  def write_json(self, name: str, obj, *, sort_keys: bool = False) -> None:
    """Atomically writes `obj` as JSON (process 0 only)."""
    if self.is_writer:
      paths.write_text(self.file(name), json.dumps(obj, indent=2, sort_keys=sort_keys))

  def read_json(self, name: str, default=None):
    path = self.file(name)
    if not paths.exists(path):
      return default
    return json.loads(paths.read_text(path))

  def write_bytes(self, name: str, data: bytes) -> None:
    """Atomically writes `data` to `name` (process 0 only)."""
    if self.is_writer:
      paths.write_bytes(self.file(name), data)

  def write_npz(self, name: str, arrays: dict) -> None:
    """Atomically writes `arrays` as an .npz (process 0 only). The temporary name of a
    local write never matches a log file's pattern (a kill may leave it behind)."""
    if self.is_writer:
      paths.save_npz(self.file(name), arrays)

  # --------------------------------------------------------------------------- checkpoints

  @property
  def manager(self) -> ocp.CheckpointManager:
    """The orbax manager (created on first use): latest `keep_checkpoints` steps, async."""
    if self._manager is None:
      options = ocp.CheckpointManagerOptions(
          preservation_policy=ocp.checkpoint_managers.LatestN(n=self.keep_checkpoints),
          cleanup_tmp_directories=True,
          # orbax's own waits on the other processes end as the loop's do.
          async_options=ocp.AsyncOptions(timeout_secs=math.ceil(multihost.wait_timeout_s())))
      self._manager = ocp.CheckpointManager(paths.absolute(self.checkpoint_dir()),
                                            options=options)
    return self._manager

  def checkpoint_dir(self) -> str:
    """Where orbax keeps the checkpoints (`checkpoints/` in the workdir)."""
    return self.file(CHECKPOINT_DIR)

  def checkpoint_steps(self) -> list[int]:
    """The committed checkpoint steps, oldest first (creates no manager)."""
    path = self.checkpoint_dir()
    if not paths.isdir(path):
      return []
    return sorted(int(n) for n in paths.listdir(path) if n.isdigit())

  def latest_step(self) -> int | None:
    """The newest committed checkpoint step, or None (creates no manager)."""
    steps = self.checkpoint_steps()
    return steps[-1] if steps else None

  def restore_latest(self, abstract_state, guard=None) -> tuple[Any, int | None]:
    """(state, step) of the newest checkpoint that restores, or (None, None) if none exists.

    A checkpoint that fails (truncated or missing files) is named with the reason on
    stderr and the next older one is tried; once one restores, the failed ones are moved to
    damaged_checkpoints/ (a later save at their step must not collide with them). If none
    restores: ConfigError naming `workdir` (nothing moved). `guard(what, step)`: a context
    manager around each wait on the other processes (`multihost.Watchdog.guard`).
    """
    guard = guard or (lambda what, step: contextlib.nullcontext())
    failed = []
    with guard("the checkpoint list of process 0", None):
      steps = _agreed_steps(self.checkpoint_steps())
    for step in reversed(steps):
      try:
        state, reason = self.restore(step, abstract_state), None
      except Exception as e:  # pylint: disable=broad-except  (orbax raises many kinds)
        state, reason = None, _first_line(e)
      with guard(f"every process to restore checkpoint {step}", step):
        reason = _agreed_failure(reason)
      if reason is not None:
        failed.append((step, reason))
        _say(f"xsens: checkpoint {step} in {self.checkpoint_dir()} cannot be restored "
             f"({reason}); trying an older one")
        continue
      if failed:
        self._move_damaged([s for s, _ in failed])
      return state, step
    if failed:
      self.close()  # No orbax manager (and its threads) left open behind the error.
      raise ConfigError(
          "workdir", f"no checkpoint in {self.checkpoint_dir()} can be restored (step "
          f"{failed[0][0]}: {failed[0][1]}); pass --overwrite to start again, or choose "
          "another --workdir")
    return None, None

  def _move_damaged(self, steps: list[int]) -> None:
    self.close()   # The manager lists steps when created: make a new one.
    if not self.is_writer:
      return
    for step in steps:
      target = self.file(os.path.join(DAMAGED_DIR, str(step)))
      if paths.exists(target):
        target += f".{int(time.time())}"
      paths.makedirs(self.file(DAMAGED_DIR))
      paths.rename(os.path.join(self.checkpoint_dir(), str(step)), target)
      _say(f"xsens: moved the damaged checkpoint {step} to {target}")

  def save(self, step: int, state, data_state: bytes | None = None) -> None:
    """Saves `state` at `step`. `data_state`: this process's training-data iterator state
    (grain's JSON bytes), kept beside it as the item `data_iterator` (one file per process,
    grain's orbax handler); None writes the state alone."""
    if data_state is None:
      self._plain_item = True
      self.manager.save(step, args=ocp.args.StandardSave(_as_global(state)), force=True)
      return
    if getattr(self, "_plain_item", False):  # A manager that handled one unnamed item
      self.close()                           # refuses Composite args: take a fresh one.
    import grain  # pylint: disable=g-import-not-at-top
    self.manager.save(step, args=ocp.args.Composite(
        default=ocp.args.StandardSave(_as_global(state)),
        **{DATA_ITEM: grain.checkpoint.CheckpointSave(_FrozenState(data_state))}),
                      force=True)

  def restore_data_state(self, step: int) -> bytes | None:
    """This process's data iterator state saved with checkpoint `step`, or None."""
    name = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    path = os.path.join(self.checkpoint_dir(), str(step), DATA_ITEM, name)
    return paths.read_bytes(path) if paths.exists(path) else None

  def restore(self, step: int, abstract_state):
    """Restores `step` into the shapes, dtypes and shardings of `abstract_state`."""
    self._plain_item = True
    restored = self.manager.restore(
        step, args=ocp.args.StandardRestore(_as_global(abstract_state)))
    return _as_local(restored, abstract_state)

  def close(self) -> None:
    """Waits for pending saves to commit and closes the manager."""
    if self._manager is not None:
      self._manager.wait_until_finished()
      self._manager.close()
      self._manager = None
    self._plain_item = False

  def abandon(self) -> None:
    """Drops the manager without waiting for its saves (another process is gone, so a
    multi-process commit cannot finish; the newest committed checkpoint stays the one a
    rerun restores)."""
    self._manager = None
    self._plain_item = False

  # --------------------------------------------------------------------------- logs

  def metric_writer(self, tensorboard: bool = True, purge_step: int | None = None
                    ) -> MetricWriter:
    return MetricWriter(self.path, enabled=self.is_writer, tensorboard=tensorboard,
                        purge_step=purge_step)

  def truncate(self, step: int) -> None:
    """Drops metrics and array logs after `step` (-1: all; a restart rewrites them)."""
    if not self.is_writer:
      return
    truncate_metrics(self.path, step)
    for start, end, path in self.step_log_files():
      if end > step:
        paths.remove(path)

  def step_log_files(self) -> list[tuple[int, int, str]]:
    """(start, end, path) of the array logs, sorted."""
    folder = self.file(STEP_LOG_DIR)
    if not paths.isdir(folder):
      return []
    out = []
    for name in paths.listdir(folder):
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
      z = paths.load_npz(path)
      for k in out:
        out[k][..., start:end] = z[k]
    return out


# The Workdir objects whose lock this process holds (released by `release_held_locks`).
_HELD_LOCKS: set = set()


def release_held_locks() -> None:
  """Releases every workdir lock this process holds: the last act of a process that ends
  without unwinding (a wait on another process timed out, a second signal)."""
  for wd in list(_HELD_LOCKS):
    try:
      wd.release_lock()
    except Exception:  # pylint: disable=broad-except  (best effort on the way out)
      pass


@contextlib.contextmanager
def locked(path: str):
  """Holds `path`'s lock for the block (a whole study: its runs' own locks are then this
  process's). A directory this created is removed again if it is empty at the end (bad
  input leaves nothing behind)."""
  created = not paths.exists(path)
  wd = Workdir(path)
  try:
    wd.acquire_lock()
    yield wd
  finally:
    wd.release_lock()
    if created and wd.is_writer and paths.isdir(path) and not paths.listdir(path):
      if paths.is_remote(path):
        paths.rmtree(path)
      else:
        os.rmdir(path)


# ----------------------------------------------------------------------------- helpers


def ensure_directory(path: str) -> None:
  """Creates `path` (and parents); ConfigError naming `workdir` if that is impossible."""
  if paths.exists(path) and not paths.isdir(path):
    raise ConfigError("workdir", f"{path!r} exists and is not a directory")
  try:
    paths.makedirs(path)
  except OSError as e:
    raise ConfigError("workdir", f"cannot create {path!r}: "
                      f"{e.strerror or e}") from None


def _say(message: str) -> None:
  logging.warning(message)
  print(message, file=sys.stderr, flush=True)


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except FileNotFoundError:
    pass


def _first_line(e: BaseException, limit: int = 160) -> str:
  text = (str(e).strip().splitlines() or [""])[0]
  text = text if len(text) <= limit else text[:limit] + "..."
  return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _read_lock(path: str) -> dict:
  try:
    holder = json.loads(paths.read_text(path))
    return holder if isinstance(holder, dict) else {}
  except (OSError, ValueError):
    return {}   # Removed meanwhile, or damaged: judged by its age.


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _stale_reason(holder: dict, path: str) -> str | None:
  """Why the lock at `path` held by `holder` may be taken over, or None if it is live."""
  try:
    age = time.time() - os.path.getmtime(path)
  except OSError:
    return "it was just released"
  pid = holder.get("pid")
  if holder.get("host") == socket.gethostname() and isinstance(pid, int):
    return None if _pid_alive(pid) else "that process no longer exists"
  if age > STALE_LOCK_S:
    return f"not refreshed for {age:.0f} s"
  return None


def _heartbeat(path: str, stop: threading.Event) -> None:
  while not stop.wait(LOCK_HEARTBEAT_S):
    try:
      os.utime(path)
    except OSError as e:
      if e.errno != errno.ENOENT:
        logging.warning("cannot refresh the workdir lock %s: %s", path, e)


def _remote_stale_reason(holder: dict, now: float) -> str | None:
  """Why a remote lock held by `holder` may be taken over (not refreshed for STALE_LOCK_S;
  a damaged lock counts as never refreshed), or None if it is live."""
  refreshed = holder.get("refreshed")
  if not isinstance(refreshed, (int, float)):
    return "it is damaged"
  age = now - refreshed
  return f"not refreshed for {age:.0f} s" if age > STALE_LOCK_S else None


def _remote_heartbeat(path: str, me: dict, stop: threading.Event) -> None:
  """Rewrites the remote lock's "refreshed" time while it is still ours."""
  while not stop.wait(LOCK_HEARTBEAT_S):
    try:
      holder = _read_lock(path)
      paths.check_answering(path)
      if holder.get("token") != me["token"]:
        logging.warning("the workdir lock %s was taken by another process", path)
        return
      paths.write_text(path, json.dumps({**me, "refreshed": time.time()}))
    except Unavailable:
      return              # The bucket stopped answering: the run reports it.
    except OSError as e:
      logging.warning("cannot refresh the workdir lock %s: %s", path, e)


def _agreed_steps(steps: list[int]) -> list[int]:
  """Process 0's checkpoint steps on every process (a multi-host run restores one step)."""
  if jax.process_count() == 1:
    return steps
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  n = int(multihost_utils.broadcast_one_to_all(np.int32(len(steps))))
  mine = np.asarray(steps if jax.process_index() == 0 else [0] * n, np.int64)
  if len(mine) != n:
    mine = np.zeros(n, np.int64)
  return [int(s) for s in multihost_utils.broadcast_one_to_all(mine)] if n else []


def _agreed_failure(reason: str | None) -> str | None:
  """`reason` (why this process could not restore a step, or None) made common to all
  processes: a step counts as restored only if it restored everywhere."""
  if jax.process_count() == 1:
    return reason
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  failed = multihost_utils.process_allgather(np.int32(reason is not None))
  if reason is None and np.any(failed):
    return "failed on another process"
  return reason


def _is_local(x) -> bool:
  """A multi-host run's leaf held whole by each process (a study's per-process state):
  a fully addressable jax.Array, or an abstract leaf without a multi-process sharding."""
  if isinstance(x, jax.Array):
    return x.is_fully_addressable
  if isinstance(x, jax.ShapeDtypeStruct):
    return x.sharding is None or x.sharding.is_fully_addressable
  return False


def _as_global(tree):
  """`tree` for orbax: in a multi-host run, orbax saves and restores global arrays only, so
  each per-process leaf (`_is_local`; identical on every process) becomes an array
  replicated over all devices (its abstract leaf: that sharding). One process: `tree`."""
  if jax.process_count() == 1:
    return tree
  replicated = jax.sharding.NamedSharding(
      jax.sharding.Mesh(np.asarray(jax.devices()), ("all",)), jax.sharding.PartitionSpec())

  def convert(x):
    if not _is_local(x):
      return x
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated)
    return jax.make_array_from_process_local_data(replicated, np.asarray(x))

  return jax.tree.map(convert, tree)


def _as_local(restored, abstract_state):
  """Undoes `_as_global` after a restore: each per-process leaf back on this process's
  device (or the abstract leaf's own sharding)."""
  if jax.process_count() == 1:
    return restored

  def convert(x, a):
    if not _is_local(a) or not isinstance(x, jax.Array):
      return x
    target = a.sharding if getattr(a, "sharding", None) is not None else jax.local_devices()[0]
    return jax.device_put(x.addressable_data(0), target)

  return jax.tree.map(convert, restored, abstract_state)
