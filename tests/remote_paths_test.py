"""Remote workdirs (`gs://...`) on an in-memory fsspec filesystem, and `--workdir` URLs.

`fake_gcs` registers `fsspec.implementations.memory.MemoryFileSystem` (a private store) as
fsspec's `gs` / `gcs` protocol; `etils.epath` serves `gs://` paths through fsspec when
TensorFlow is absent (etils `epath/gpath.py`, `epath/backend.py`), so every `gs://` path the
library touches lands in that store (fast; no server). Orbax's checkpoints, which TensorStore
writes itself, and the CLI on `gs://` run against a real server in tests/remote_gcs_test.py.
"""

import json
import os
import re
import subprocess
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
  assert _events(fake_gcs) == {("loss", 1), ("loss", 2), ("loss", 3)}
  wd.truncate(2)  # A resume from step 2 drops what came after.
  metrics_lib.truncate_events("gs://b/run/tb", 3)
  assert [r["step"] for r in metrics_lib.read_metrics("gs://b/run")] == [1, 2]
  assert [(a, b) for a, b, _ in wd.step_log_files()] == [(0, 2)]
  names = stored(fake_gcs)
  assert "config.json" in names and "lock.json" in names
  assert "metrics/part-000000.jsonl" in names and "metrics.jsonl" not in names
  assert _events(fake_gcs) == {("loss", 1), ("loss", 2)}   # Truncated: TensorBoard's too.
  wd.release_lock()
  assert "lock.json" not in stored(fake_gcs)
  assert wd.read_json("config.json") == {"a": 1}


def _events(fs, prefix="/b/run/") -> set:
  """(tag, step) of the scalar summaries of every event file under `prefix`/tb/."""
  return set().union(*(_scalars(data.getvalue()) for name, data in fs.store.items()
                       if name.startswith(prefix + "tb/events.out.tfevents.")))


def _summary_values(data: bytes):
  """(step, summary value) of every summary value in an event file's bytes (TFRecord
  framing)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  pos = 0
  while pos < len(data):
    (length,) = np.frombuffer(data[pos:pos + 8], np.uint64)
    event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + int(length)])
    pos += 12 + int(length) + 4
    for value in event.summary.value:
      yield event.step, value


def _scalars(data: bytes) -> set:
  """(tag, step) of the scalar summaries in an event file's bytes."""
  return {(value.tag, step) for step, value in _summary_values(data)}


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


def test_each_flush_uploads_only_what_was_written_since_the_last(fake_gcs, monkeypatch):
  """Metric records and TensorBoard events: every upload is a new object holding only its
  new data (constant size here), read back as one stream; a resume truncates across parts
  and a new writer numbers its parts after the last one."""
  uploads = []
  write_bytes = paths.write_bytes

  def counted(path, data):
    uploads.append((os.fspath(path), len(data)))
    write_bytes(path, data)

  monkeypatch.setattr(paths, "write_bytes", counted)
  writer = metrics_lib.MetricWriter("gs://b/run", flush_secs=0)
  for step in range(1, 201):
    writer.write(step, {"loss": 0.5, "accuracy": 0.25})
    if step % 10 == 0:
      writer.flush()
  writer.close()
  parts = [n for p, n in uploads if "/metrics/part-" in p]
  events = [n for p, n in uploads if "/tb/" in p]
  assert len(parts) == 20 and max(parts) <= 1.1 * min(parts)   # Not growing.
  assert len(events) >= 20 and max(events[1:]) <= 1.5 * min(events[1:])
  assert [r["step"] for r in metrics_lib.read_metrics("gs://b/run")] == list(range(1, 201))
  assert ("loss", 200) in _events(fake_gcs)
  metrics_lib.truncate_metrics("gs://b/run", 95)   # Part 9 (steps 91-100) is rewritten.
  metrics_lib.truncate_events("gs://b/run/tb", 96)
  assert [r["step"] for r in metrics_lib.read_metrics("gs://b/run")] == list(range(1, 96))
  assert max(s for _, s in _events(fake_gcs)) == 95
  assert len(stored(fake_gcs, "/b/run/metrics/")) == 10
  again = metrics_lib.MetricWriter("gs://b/run", flush_secs=0)
  again.write(96, {"loss": 0.5})
  again.close()
  assert stored(fake_gcs, "/b/run/metrics/")[-1] == "part-000010.jsonl"
  assert [r["step"] for r in metrics_lib.read_metrics("gs://b/run")] == list(range(1, 97))


def test_a_remote_workdir_with_only_metric_parts_holds_a_run(fake_gcs):
  paths.write_text("gs://b/run/metrics/part-000000.jsonl", '{"step": 1}\n')
  paths.write_text("gs://b/run/config.json", json.dumps({"a": 1}))
  assert Workdir("gs://b/run").has_run()
  with pytest.raises(ConfigError, match="holds a run of a different config"):
    Workdir("gs://b/run").check({"a": 2})
  wd = Workdir.open("gs://b/run", {"a": 2}, overwrite=True)   # --overwrite removes them.
  wd.release_lock()
  assert not paths.exists("gs://b/run/metrics")


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
  assert events and all(".results" in n for n in events)
  assert _events(fake_gcs, "/b/out/") >= {("results/0/a", 0)}
  assert fake_gcs.store["/b/out/bar.png"].getvalue()[:4] == b"\x89PNG"
  for key in [k for k in fake_gcs.store if k.startswith("/b/out/tb/")]:   # An older write.
    fake_gcs.store[re.sub(r"tfevents\.\d+", "tfevents.1000000000", key)] = (
        fake_gcs.store.pop(key))
  tables.write_results("gs://b/out", "t", [{"a": 2}], plots=[name])   # Replaces them all.
  # (How many part files a write leaves depends on when tensorboardX's writer thread
  # flushes; what must hold is that only the second write's numbers remain.)
  values = [value.simple_value for name, data in fake_gcs.store.items()
            if name.startswith("/b/out/tb/")
            for _, value in _summary_values(data.getvalue()) if value.tag == "results/0/a"]
  assert values == [2.0]


# ----------------------------------------------------------------------------- --workdir


BAD_WORKDIRS = {
    "memory://x": "unsupported scheme memory://",
    "file://x": "unsupported scheme file://.*give the local path itself",
    "s3://bucket/run": "unsupported scheme s3://.*orbax",
    "ftp://host/run": "unsupported scheme ftp://",
    "gs:/bucket/run": "neither a URL \\(gs: takes two slashes",
    "gs://": "names no bucket",
    "gs:///run": "names no bucket",
    "": "empty",
}


@pytest.mark.parametrize("url", sorted(BAD_WORKDIRS))
def test_bad_workdir_urls_are_refused_naming_what_is_allowed(url):
  with pytest.raises(ConfigError) as e:
    paths.check_workdir(url)
  assert e.value.flag == "--workdir"
  assert re.search(BAD_WORKDIRS[url], e.value.message), e.value.message
  if url:
    assert e.value.message.endswith(paths.ALLOWED_WORKDIRS)


@pytest.mark.parametrize("url", ["run", "workdirs/run", "/abs/run", "run:1", "./a:b/c"])
def test_local_workdirs_pass_unchecked(url):
  paths.check_workdir(url)


def test_gs_without_gcsfs_is_refused_naming_the_package(monkeypatch):
  monkeypatch.setitem(sys.modules, "gcsfs", None)   # As if it were not installed.
  with pytest.raises(ConfigError, match=r"gs://b/run needs the gcsfs package \(pip install"):
    paths.check_workdir("gs://b/run", timeout_s=1)


@pytest.mark.slow
def test_cli_refuses_bad_workdirs_in_one_line_before_writing_anything(tmp_path):
  """Each bad `--workdir` (and gs:// with gcsfs hidden): exit 2, one line naming
  --workdir, nothing written in the working directory (`gs:/b/run` is not a folder)."""
  from tests.helpers import REPO  # pylint: disable=g-import-not-at-top
  hide = "import sys; sys.modules['gcsfs'] = None; "
  cases = [(u, m, "") for u, m in BAD_WORKDIRS.items() if u] + [
      ("gs://bucket/run", "needs the gcsfs package", hide)]
  for url, message, prefix in cases:
    code = (f"{prefix}import runpy, sys; sys.argv[0] = 'xsens'; "
            "runpy.run_module('xsens', run_name='__main__')")
    proc = subprocess.run(
        [sys.executable, "-c", code,
         f"--config={REPO}/mlcollections_configs/train.py:model=mlp,smoke", f"--workdir={url}"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 2, (url, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xsens: error: --workdir: "), (url, lines)
    assert re.search(message, lines[0]), (url, lines[0])
    assert not os.listdir(tmp_path), (url, os.listdir(tmp_path))


def test_study_record_guards_and_overwrites_a_remote_workdir(fake_gcs):
  from xsens.train import study_record  # pylint: disable=g-import-not-at-top
  paths.write_text("gs://b/run/notes.txt", "mine")
  study_record.claim("gs://b/run", "grokking")
  for name in ("results.md", "grokking.png", "logs/epochs_0_10.npz", "tb/events.out.x"):
    paths.write_text(f"gs://b/run/{name}", "old")
  with pytest.raises(ConfigError, match="holds results of study 'grokking'; this config "
                     "runs study 'train'"):
    study_record.claim("gs://b/run", "train")
  study_record.claim("gs://b/run", "train", overwrite=True)
  assert stored(fake_gcs) == ["notes.txt", "study.json"]
  assert json.loads(paths.read_text("gs://b/run/study.json")) == {
      "study": "train", "others": ["notes.txt"]}
  study_record.claim("gs://b/new", "train").release_if_unused()  # Nothing written: no record.
  assert not paths.exists("gs://b/new")
