"""Remote workdirs (`gs://...`) on an in-memory fsspec filesystem: nothing lands on local disk.

`fake_gcs` registers `fsspec.implementations.memory.MemoryFileSystem` (a private store) as
fsspec's `gs` / `gcs` protocol; `etils.epath` serves `gs://` paths through fsspec when
TensorFlow is absent (etils `epath/gpath.py`, `epath/backend.py`), so every `gs://` path the
library touches lands in that store. Orbax writes arrays with TensorStore, which talks to
GCS itself (no fsspec), so the trainer test keeps the checkpoints alone on a local path.
"""

import json
import os
import sys

import fsspec  # pylint: disable=unused-import  (fsspec.registry is loaded)
from fsspec.implementations import memory
import numpy as np
import pytest

from xsens import paths
from xsens.errors import ConfigError
from xsens.train import metrics as metrics_lib
from xsens.train import workdir as workdir_lib
from xsens.train.workdir import Workdir

pytest.importorskip("etils.epath")
from etils.epath import backend as epath_backend  # pylint: disable=g-import-not-at-top
from etils.epath import gpath  # pylint: disable=g-import-not-at-top


class FakeGCS(memory.MemoryFileSystem):
  """An in-memory `gs://` (its own store; accepts gcsfs' `finalize_on_close`)."""

  protocol = ("gs", "gcs")
  store = {}
  pseudo_dirs = [""]

  def __init__(self, *args, finalize_on_close=False, **kwargs):
    del finalize_on_close
    super().__init__(*args, **kwargs)

  @classmethod
  def _strip_protocol(cls, path):
    for prefix in ("gs://", "gcs://"):
      if path.startswith(prefix):
        path = path[len(prefix):]
    path = path.strip("/")
    return "/" + path if path else ""


@pytest.fixture
def fake_gcs(monkeypatch, tmp_path):
  """`gs://` served from memory; the test runs in an empty local cwd (checked at the end)."""
  if gpath._is_tf_installed():  # pylint: disable=protected-access
    pytest.skip("epath serves gs:// through TensorFlow here, not fsspec")
  registry = sys.modules["fsspec.registry"]._registry  # pylint: disable=protected-access
  for p in FakeGCS.protocol:
    monkeypatch.setitem(registry, p, FakeGCS)  # Restored after the test.
  epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  FakeGCS.store.clear()
  FakeGCS.pseudo_dirs[:] = [""]
  monkeypatch.setattr(workdir_lib, "REMOTE_LOCK_SETTLE_S", 0.0)
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  yield FakeGCS
  epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  assert not os.listdir(cwd), "a remote workdir wrote to the local disk"


def stored(fs, prefix="/b/run/"):
  """Names (relative to `prefix`) of the objects in the fake store."""
  return sorted(k[len(prefix):] for k in fs.store if k.startswith(prefix))


def test_paths_helpers_on_the_fake_store(fake_gcs):
  paths.write_text("gs://b/x/a.txt", "hi")
  paths.save_npz("gs://b/x/b.npz", {"v": np.arange(3)})
  assert paths.is_remote("gs://b/x") and not paths.is_remote("/tmp/x")
  assert paths.absolute("gs://b/x") == "gs://b/x"
  assert sorted(paths.listdir("gs://b/x")) == ["a.txt", "b.npz"]
  assert paths.isfile("gs://b/x/a.txt") and paths.isdir("gs://b/x")
  assert paths.read_text("gs://b/x/a.txt") == "hi"
  np.testing.assert_array_equal(paths.load_npz("gs://b/x/b.npz")["v"], np.arange(3))
  paths.rename("gs://b/x/a.txt", "gs://b/x/c.txt")
  paths.remove("gs://b/x/b.npz")
  assert paths.listdir("gs://b/x") == ["c.txt"]


def test_workdir_files_logs_and_metrics_go_to_the_remote_store(fake_gcs):
  wd = Workdir.open("gs://b/run", {"a": 1})
  assert wd._heartbeat is not None  # pylint: disable=protected-access
  wd.write_step_log(0, 2, {"x": np.arange(2, dtype=np.float32)})
  wd.write_step_log(2, 4, {"x": np.arange(2, 4, dtype=np.float32)})
  writer = wd.metric_writer()
  for step in (1, 2, 3):
    writer.write(step, {"loss": step / 10})
  writer.close()
  assert [r["step"] for r in metrics_lib.read_metrics("gs://b/run")] == [1, 2, 3]
  np.testing.assert_array_equal(wd.read_step_log(4, ["x"])["x"], np.arange(4))
  wd.truncate(2)  # A resume from step 2 drops what came after.
  assert [r["step"] for r in metrics_lib.read_metrics("gs://b/run")] == [1, 2]
  assert [(a, b) for a, b, _ in wd.step_log_files()] == [(0, 2)]
  names = stored(fake_gcs)
  assert "config.json" in names and "lock.json" in names and "metrics.jsonl" in names
  events = [n for n in names if n.startswith("tb/events.out.tfevents.")]
  assert len(events) == 1
  assert _scalars(fake_gcs.store["/b/run/" + events[0]].getvalue()) == {
      ("loss", 1), ("loss", 2), ("loss", 3)}
  wd.release_lock()
  assert "lock.json" not in stored(fake_gcs)
  assert wd.read_json("config.json") == {"a": 1}


def _scalars(data: bytes) -> set:
  """(tag, step) of the scalar summaries in an event file's bytes (TFRecord framing)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  out, pos = set(), 0
  while pos < len(data):
    (length,) = np.frombuffer(data[pos:pos + 8], np.uint64)
    event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + int(length)])
    pos += 12 + int(length) + 4
    for value in event.summary.value:
      out.add((value.tag, event.step))
  return out


def test_remote_lock_refuses_a_live_holder_and_takes_over_a_stale_one(fake_gcs):
  lock = "gs://b/run/lock.json"
  holder = {"pid": 1, "host": "elsewhere", "started": "then", "token": "t",
            "refreshed": workdir_lib.time.time()}
  paths.write_text(lock, json.dumps(holder))
  with pytest.raises(ConfigError, match="in use by process 1 on elsewhere"):
    Workdir("gs://b/run").acquire_lock()
  paths.write_text(lock, json.dumps({**holder, "refreshed": holder["refreshed"] - 1000}))
  wd = Workdir("gs://b/run")
  wd.acquire_lock()
  mine = json.loads(paths.read_text(lock))
  assert mine["pid"] == os.getpid() and mine["token"] != "t"
  Workdir("gs://b/run").acquire_lock()  # Re-entrant within this process.
  wd.release_lock()
  assert not paths.exists(lock)


def test_remote_lock_lost_to_a_racing_writer_is_refused(fake_gcs, monkeypatch):
  """Two processes write the absent lock at once: the one whose write was overwritten
  sees a foreign token when it reads back, and retries (here the other keeps it)."""
  rival = {"pid": 2, "host": "elsewhere", "started": "now", "token": "rival"}

  def racing_sleep(seconds):
    del seconds
    paths.write_text("gs://b/run/lock.json",
                     json.dumps({**rival, "refreshed": workdir_lib.time.time()}))

  monkeypatch.setattr(workdir_lib.time, "sleep", racing_sleep)
  with pytest.raises(ConfigError, match="in use by process 2 on elsewhere"):
    Workdir("gs://b/run").acquire_lock()


@pytest.fixture
def local_checkpoints(monkeypatch, tmp_path):
  """Orbax's checkpoints of every workdir under a local folder (TensorStore cannot reach the
  fake store); everything else stays remote."""
  root = tmp_path / "checkpoints"

  def checkpoint_dir(self):
    return str(root / self.path.replace("://", "/") / workdir_lib.CHECKPOINT_DIR)

  monkeypatch.setattr(Workdir, "checkpoint_dir", checkpoint_dir)
  return root


def test_trainer_writes_and_resumes_a_remote_workdir(fake_gcs, local_checkpoints):
  from tests.train_test import smoke_train  # pylint: disable=g-import-not-at-top
  from xsens.train import trainer  # pylint: disable=g-import-not-at-top
  config = smoke_train("mlp", total_steps=2, **{"data.test_split": "test[:64]"})
  first = trainer.train_and_evaluate(config, "gs://b/run")
  assert first.summary["steps"] == 2
  names = stored(fake_gcs)
  for name in ("config.json", "metrics.jsonl", "train_summary.json"):
    assert name in names
  assert any(n.startswith("tb/events.out.tfevents.") for n in names)
  assert "lock.json" not in names  # Released at the end of the run.
  assert Workdir("gs://b/run").latest_step() == 2  # (Its checkpoints: the local folder.)
  config = smoke_train("mlp", total_steps=4, **{"data.test_split": "test[:64]"})
  second = trainer.train_and_evaluate(config, "gs://b/run")  # Extends: resumes at step 2.
  assert second.summary["steps"] == 4
  records = metrics_lib.read_metrics("gs://b/run")
  assert [r["step"] for r in records if "train/loss" in r] == [2, 4]
  assert json.loads(paths.read_text("gs://b/run/train_summary.json"))["steps"] == 4
  assert len([n for n in stored(fake_gcs) if n.startswith("tb/events")]) == 2


def test_cli_lock_of_a_new_remote_workdir_leaves_nothing_behind(fake_gcs):
  with workdir_lib.locked("gs://b/new"):
    assert paths.exists("gs://b/new/lock.json")
  assert not paths.exists("gs://b/new")


def test_pretrained_checkpoints_and_plots_read_and_write_remote_paths(fake_gcs):
  from xsens.models import pretrained  # pylint: disable=g-import-not-at-top
  from xsens.report import plots, tables  # pylint: disable=g-import-not-at-top
  paths.save_npz("gs://b/ckpt.npz", {"embedding/kernel": np.ones((2, 3), np.float32)})
  assert set(pretrained.read_npz("gs://b/ckpt.npz")) == {"embedding/kernel"}
  name = plots.bar_plot("gs://b/out/bar.png", ["a", "b"], [1.0, 2.0])
  tables.write_results("gs://b/out", "t", [{"a": 1}], plots=[name])
  names = stored(fake_gcs, "/b/out/")
  assert [n for n in names if not n.startswith("tb/")] == [
      "bar.png", "results.json", "results.md"]
  events = [n for n in names if n.startswith("tb/")]  # The results' TensorBoard summaries.
  assert len(events) == 1 and events[0].endswith(".results")
  assert _scalars(fake_gcs.store["/b/out/" + events[0]].getvalue()) >= {("results/0/a", 0)}
  assert fake_gcs.store["/b/out/bar.png"].getvalue()[:4] == b"\x89PNG"
