"""Faults lose nothing: damaged checkpoints, partial metrics lines, runs without a
checkpoint, the workdir lock, TensorBoard after a resume, extending a finished run.

(Signals and concurrent processes: tests/preemption_test.py.)"""

import glob
import json
import os
import socket
import struct
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from tests.loop_test import _counter_program
from xsens.errors import ConfigError
from xsens.train import loop, workdir as workdir_lib
from xsens.train.metrics import METRICS_FILE, read_metrics
from xsens.train.workdir import Workdir

SCHEDULE = loop.Schedule(total_steps=12, log_every=2, eval_every=2, checkpoint_every=2,
                         max_chunk=2)


def _run(path, **kw):
  return loop.run(Workdir(str(path), keep_checkpoints=3), _counter_program(), SCHEDULE, **kw)


def _damage(step_dir, how):
  default = os.path.join(step_dir, "default")
  if how == "truncated_metadata":
    with open(os.path.join(default, "_METADATA"), "r+") as f:
      f.truncate(10)
  elif how == "truncated_data":
    files = glob.glob(os.path.join(default, "**", "d", "*"), recursive=True)
    assert files
    for path in files:
      with open(path, "r+") as f:
        f.truncate(5)
  else:
    os.remove(os.path.join(default, "manifest.ocdbt"))


@pytest.mark.parametrize("how", ["truncated_metadata", "truncated_data", "deleted_manifest"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, how, capfd):
  straight = _run(tmp_path / "straight")
  first = _run(tmp_path / "run", max_chunks=3)          # Checkpoints 2, 4, 6.
  assert first.step == 6
  _damage(str(tmp_path / "run" / "checkpoints" / "6"), how)
  resumed = _run(tmp_path / "run")
  err = capfd.readouterr().err
  assert "checkpoint 6 in" in err and "cannot be restored" in err, err
  assert resumed.restored_step == 4 and resumed.step == 12
  assert float(resumed.state["x"]) == float(straight.state["x"])
  assert os.path.isdir(tmp_path / "run" / "damaged_checkpoints" / "6")  # Kept, not deleted.
  steps = [r["step"] for r in read_metrics(str(tmp_path / "run")) if "eval/x" in r]
  assert steps == [2, 4, 6, 8, 10, 12]


def test_no_restorable_checkpoint_is_refused_and_nothing_moved(tmp_path):
  _run(tmp_path, max_chunks=2)
  for step in (2, 4):
    _damage(str(tmp_path / "checkpoints" / str(step)), "deleted_manifest")
  workdir = Workdir(str(tmp_path), keep_checkpoints=3)
  with pytest.raises(ConfigError, match=r"config.workdir: no checkpoint in .* can be "
                     r"restored \(step 4: .*\); pass --overwrite"):
    loop.run(workdir, _counter_program(), SCHEDULE)
  assert workdir._manager is None  # Closed behind the error, not left to the GC.
  assert Workdir(str(tmp_path)).checkpoint_steps() == [2, 4]
  assert not (tmp_path / "damaged_checkpoints").exists()


def test_partial_last_metrics_line_is_dropped_with_a_message(tmp_path, capfd):
  _run(tmp_path, max_chunks=2)
  with open(tmp_path / METRICS_FILE, "a") as f:
    f.write('{"step": 6, "eval/x"')                     # A kill during a write.
  assert [r["step"] for r in read_metrics(str(tmp_path))][-1] == 4   # Readers skip it.
  out = _run(tmp_path)
  assert "dropped a partial last line" in capfd.readouterr().err
  assert out.step == 12
  steps = [r["step"] for r in read_metrics(str(tmp_path)) if "eval/x" in r]
  assert steps == [2, 4, 6, 8, 10, 12]


def test_a_bad_line_inside_metrics_is_one_clear_error(tmp_path):
  _run(tmp_path, max_chunks=1)
  lines = (tmp_path / METRICS_FILE).read_text().splitlines()
  (tmp_path / METRICS_FILE).write_text("\n".join(["garbage"] + lines) + "\n")
  with pytest.raises(ConfigError, match=r"config.workdir: line 1 of .* is not JSON"):
    _run(tmp_path)


def test_restart_from_step_zero_drops_the_logs_of_the_earlier_start(tmp_path):
  """A run that stopped before its first checkpoint restarts from 0 without duplicates."""
  program = _counter_program()
  wd = Workdir(str(tmp_path))
  with pytest.raises(KeyboardInterrupt):
    def advance(state, step, n, good=program.advance):
      if step >= 2:
        raise KeyboardInterrupt   # Dies before the first checkpoint (step 4).
      return good(state, step, n)
    loop.run(wd, loop.Program(program.init, program.abstract_state, advance,
                              program.evaluate),
             loop.Schedule(6, log_every=2, eval_every=2, checkpoint_every=4, max_chunk=2))
  assert wd.latest_step() is None and read_metrics(str(tmp_path))
  loop.run(wd, _counter_program(),
           loop.Schedule(6, log_every=2, eval_every=2, checkpoint_every=4, max_chunk=2))
  steps = [r["step"] for r in read_metrics(str(tmp_path)) if "eval/x" in r]
  assert steps == [2, 4, 6]


def test_a_workdir_without_checkpoint_is_guarded_by_its_config(tmp_path):
  wd = Workdir.open(str(tmp_path), {"model": {"width": 8}})
  wd.metric_writer(tensorboard=False).write(1, {"train/loss": 1.0})  # Metrics, no checkpoint.
  with pytest.raises(ConfigError, match="holds a run of a different config"):
    Workdir.open(str(tmp_path), {"model": {"width": 16}})
  assert json.loads((tmp_path / "config.json").read_text()) == {"model": {"width": 8}}


def _events(folder):
  out = []
  for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
    data, records = open(path, "rb").read(), []
    i = 0
    while i < len(data):   # TFRecord: length, crc, payload, crc.
      (length,) = struct.unpack("<Q", data[i:i + 8])
      records.append(event_pb2.Event.FromString(data[i + 12:i + 12 + length]))
      i += 12 + length + 4
    out.append(records)
  return out


def test_tensorboard_purges_the_steps_a_resume_rewrites(tmp_path):
  _run(tmp_path, max_chunks=2)                 # Steps 2, 4; checkpoint 4.
  time.sleep(1.1)                              # Event files are named by the second.
  _run(tmp_path)
  files = _events(str(tmp_path / "tb"))
  assert len(files) == 2
  purge = [e.step for e in files[1] if e.HasField("session_log")
           and e.session_log.status == event_pb2.SessionLog.START]
  assert purge == [5]                          # TensorBoard hides old events at step >= 5.
  assert min(e.step for e in files[1] if e.HasField("summary")) == 6


# ----------------------------------------------------------------------------- the lock


def test_lock_is_reentrant_and_released_when_the_loop_ends(tmp_path):
  wd = Workdir(str(tmp_path))
  wd.acquire_lock()
  lock = json.loads((tmp_path / "lock.json").read_text())
  assert lock["pid"] == os.getpid() and lock["host"] == socket.gethostname()
  Workdir(str(tmp_path)).acquire_lock()        # Another object of this process: accepted.
  wd.release_lock()
  assert not (tmp_path / "lock.json").exists()
  _run(tmp_path / "run")
  assert not (tmp_path / "run" / "lock.json").exists()


def _write_lock(path, pid, host, age_s=0.0):
  os.makedirs(path, exist_ok=True)
  lock = os.path.join(path, "lock.json")
  with open(lock, "w") as f:
    json.dump({"pid": pid, "host": host, "started": "2026-01-01T00:00:00"}, f)
  t = time.time() - age_s
  os.utime(lock, (t, t))


def test_a_live_process_lock_refuses_in_one_line(tmp_path):
  sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    _write_lock(str(tmp_path), sleeper.pid, socket.gethostname())
    with pytest.raises(ConfigError, match=rf"config.workdir: .* is in use by process "
                       rf"{sleeper.pid} on {socket.gethostname()} since 2026-01-01"):
      Workdir.open(str(tmp_path), {"a": 1})
    assert not (tmp_path / "config.json").exists()   # Nothing written.
  finally:
    sleeper.kill()
    sleeper.wait()


def test_stale_locks_are_taken_over_with_a_message(tmp_path, capfd):
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  _write_lock(str(tmp_path / "a"), int(dead.stdout), socket.gethostname())
  Workdir.open(str(tmp_path / "a"), {"a": 1}).release_lock()
  assert "no longer exists" in capfd.readouterr().err
  # Another host: live while refreshed, stale after STALE_LOCK_S.
  _write_lock(str(tmp_path / "b"), 1, "elsewhere", age_s=10)
  with pytest.raises(ConfigError, match="in use by process 1 on elsewhere"):
    Workdir.open(str(tmp_path / "b"), {"a": 1})
  _write_lock(str(tmp_path / "b"), 1, "elsewhere", age_s=workdir_lib.STALE_LOCK_S + 5)
  Workdir.open(str(tmp_path / "b"), {"a": 1}).release_lock()
  assert "not refreshed for" in capfd.readouterr().err


@pytest.mark.parametrize("kind", ["file", "unwritable"])
def test_unusable_workdirs_are_one_clear_error(tmp_path, kind):
  if kind == "file":
    target = tmp_path / "f"
    target.write_text("x")
    match = "exists and is not a directory"
  else:
    if os.geteuid() == 0:
      target, match = "/proc/xsens_workdir", "cannot create"  # root ignores file modes.
    else:
      os.chmod(tmp_path, 0o500)
      target, match = tmp_path / "sub", "cannot create"
  with pytest.raises(ConfigError, match=f"config.workdir: .*{match}"):
    Workdir.open(str(target), {"a": 1})


# ----------------------------------------------------------------------------- extending


@pytest.mark.slow
def test_a_finished_run_is_extended_only_when_its_schedule_allows(tmp_path):
  from tests.train_test import smoke_train  # pylint: disable=g-import-not-at-top
  from xsens.train import trainer  # pylint: disable=g-import-not-at-top
  run = lambda name, **kw: trainer.train_and_evaluate(smoke_train("mlp", **kw),
                                                      str(tmp_path / name))
  run("ext", total_steps=4)                      # Constant schedule: extendable.
  extended = run("ext", total_steps=8)
  straight = run("straight", total_steps=8)
  assert extended.summary["steps"] == 8 and extended.summary["stop_reason"] == "max_steps"
  for a, b in zip(jax.tree.leaves(extended.variables), jax.tree.leaves(straight.variables)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  steps = [r["step"] for r in read_metrics(str(tmp_path / "ext")) if "train/loss" in r]
  assert steps == [2, 4, 6, 8]
  cosine = {"optimizer.schedule": "cosine"}
  run("cos", total_steps=4, **cosine)
  with pytest.raises(ConfigError, match=r"differing fields: total_steps\); to train a finished "
                     "run longer.*optimizer.decay_steps"):
    run("cos", total_steps=8, **cosine)
  fixed = dict(cosine, **{"optimizer.decay_steps": 4})
  run("fixed", total_steps=4, **fixed)
  assert run("fixed", total_steps=6, **fixed).summary["steps"] == 6
