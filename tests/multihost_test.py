"""Multi-host runs: 2 CPU processes (`jax.distributed` on localhost, gloo collectives) run
the CLI and write exactly one set of outputs with the numbers of one process.

Also the environment variables that start a multi-host run
(`sharding.distributed_arguments`), without starting one.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import REPO
from xsens.train import sharding

BENIGN = "--config=mlcollections_configs/benign_overfitting.py:smoke"
TRAIN = "--config=mlcollections_configs/train.py:model=mlp,smoke"


def test_distributed_arguments_from_the_documented_variables():
  assert sharding.distributed_arguments({}) is None
  assert sharding.distributed_arguments({"XSENS_DISTRIBUTED": "1"}) == {}
  env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
         "JAX_PROCESS_ID": "3"}
  assert sharding.distributed_arguments(env) == {
      "coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 3}
  # Auto-detection (TPU, SLURM) fills in what is not set.
  assert sharding.distributed_arguments({"XSENS_DISTRIBUTED": "1", "JAX_PROCESS_ID": "0"}
                                        ) == {"process_id": 0}


@pytest.mark.parametrize("env, variable, message", [
    ({"JAX_COORDINATOR_ADDRESS": "h:1"}, "JAX_NUM_PROCESSES", "not set, but JAX_COORDINATOR"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2"}, "JAX_PROCESS_ID",
     "not set"),
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "JAX_COORDINATOR_ADDRESS", "not set"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"},
     "JAX_NUM_PROCESSES", "non-negative integer"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"},
     "JAX_PROCESS_ID", "below JAX_NUM_PROCESSES=2"),
])
def test_partial_or_bad_variables_name_the_variable(env, variable, message):
  with pytest.raises(sharding.EnvironmentSettingError, match=message) as e:
    sharding.distributed_arguments(env)
  assert e.value.flag == variable


def test_cli_refuses_a_partial_multihost_environment_in_one_line(tmp_path):
  env = {**os.environ, "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1"}
  env.pop("JAX_NUM_PROCESSES", None)
  env.pop("JAX_PROCESS_ID", None)
  proc = subprocess.run([sys.executable, "-m", "xsens", TRAIN, f"--workdir={tmp_path / 'wd'}"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
  assert proc.stderr.startswith("xsens: error: JAX_NUM_PROCESSES: not set")
  assert not (tmp_path / "wd").exists()


# ----------------------------------------------------------------------------- 2 processes


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _cli(args, workdir, num_processes=1, devices=1, timeout=240):
  """Runs the CLI as `num_processes` processes (each with `devices` CPU devices) on one
  coordinator; returns their CompletedProcesses (process 0 first)."""
  base = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_DISABLE_MOST_OPTIMIZATIONS": "1",
          "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count={devices}").strip()}
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
               "XSENS_DISTRIBUTED"):
    base.pop(name, None)
  address = f"127.0.0.1:{_free_port()}"
  procs = []
  for pid in range(num_processes):
    env = dict(base)
    if num_processes > 1:
      env.update(JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=str(num_processes),
                 JAX_PROCESS_ID=str(pid))
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "xsens", *args, f"--workdir={workdir}"], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  out = []
  try:
    for p in procs:
      stdout, stderr = p.communicate(timeout=timeout)
      out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for p in out:
    assert p.returncode == 0, p.stderr[-3000:]
  return out


def _outputs(workdir) -> list[str]:
  """Relative paths of the files a run wrote, without checkpoint internals (orbax writes
  per-process files) and the TensorBoard file names (they hold the time; a resumed run
  starts a second file)."""
  names = []
  for root, _, files in os.walk(workdir):
    rel = os.path.relpath(root, workdir)
    if "checkpoints" in rel.split(os.sep):
      continue
    for f in files:
      names.append(os.path.join(rel, "events" if f.startswith("events.out") else f))
  return sorted(set(names))


def _without_times(tree):
  if isinstance(tree, dict):
    return {k: _without_times(v) for k, v in tree.items() if k not in ("wall_s",)}
  if isinstance(tree, list):
    return [_without_times(v) for v in tree]
  return tree


@pytest.mark.slow
def test_two_processes_run_a_study_once_with_the_numbers_of_one(tmp_path):
  one, two = tmp_path / "one", tmp_path / "two"
  _cli([BENIGN], one)
  procs = _cli([BENIGN], two, num_processes=2)
  assert _outputs(two) == _outputs(one)
  assert not [n for n in _outputs(two) if ".tmp" in n]
  assert _without_times(json.loads((two / "results.json").read_text())) == _without_times(
      json.loads((one / "results.json").read_text()))
  for name in ("grid_vit.npz", "grid_cnn.npz"):
    with np.load(one / name) as a, np.load(two / name) as b:
      for k in a.files:
        np.testing.assert_array_equal(a[k], b[k])
  assert "Results in" in procs[0].stdout and "Results in" not in procs[1].stdout


@pytest.mark.slow
def test_two_processes_train_and_resume_like_one_process_on_two_devices(tmp_path, monkeypatch):
  """Data-parallel training over 2 processes x 1 device equals 1 process x 2 devices; a
  resume (the run extended from 2 to 4 steps) restores the same step on both processes.
  The two processes start on an empty data_dir: process 0 prepares mnist5k, the other waits."""
  one, two = tmp_path / "one", tmp_path / "two"
  _cli([TRAIN], one, devices=2)
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "fresh_data_dir"))
  _cli([TRAIN, "--config.train.total_steps=2"], two, num_processes=2)
  assert (tmp_path / "fresh_data_dir" / "mnist5k").is_dir()
  _cli([TRAIN], two, num_processes=2)
  assert _outputs(two) == _outputs(one)
  metrics = [[json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
             for d in (one, two)]
  assert [r["step"] for r in metrics[1]] == [r["step"] for r in metrics[0]]
  for a, b in zip(*metrics):
    for k in a:
      if k != "step" and "wall" not in k and "per_s" not in k and not k.startswith("time/"):
        np.testing.assert_allclose(b[k], a[k], rtol=1e-5, err_msg=k)
  summaries = [json.loads((d / "train_summary.json").read_text()) for d in (one, two)]
  assert summaries[1]["steps"] == summaries[0]["steps"] == 4
  np.testing.assert_allclose(summaries[1]["test_accuracy"], summaries[0]["test_accuracy"])
  steps = sorted(int(n) for n in os.listdir(two / "checkpoints") if n.isdigit())
  assert steps[-1] == 4
