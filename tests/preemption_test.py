"""Real signals and real concurrent processes against the CLI (subprocesses)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments import chaos_resume
from xsens.train.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _start(workdir, total_steps=3000):
  return subprocess.Popen(chaos_resume.command(str(workdir), total_steps), cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))


def _wait_for_step(proc, workdir, step, timeout=240):
  t0 = time.time()
  while chaos_resume.metrics_step(str(workdir)) < step:
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.time() - t0 < timeout
    time.sleep(0.01)


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_at_the_current_step_and_exits_143(tmp_path):
  wd = tmp_path / "run"
  proc = _start(wd)
  _wait_for_step(proc, wd, 20)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err[-3000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("xsens: preempted (SIGTERM) at step ") and last.endswith(
      "rerun the same command to resume"), err[-3000:]
  step = int(last.split(" at step ")[1].split(";")[0])
  assert step >= 20 and chaos_resume.checkpoint_steps(str(wd))[-1] == step
  assert max(r["step"] for r in read_metrics(str(wd))) == step   # Flushed, nothing later.
  assert not (wd / "lock.json").exists()


@pytest.mark.slow
def test_a_second_process_on_the_same_workdir_is_refused(tmp_path):
  wd = tmp_path / "run"
  first = _start(wd)
  try:
    _wait_for_step(first, wd, 10)
    config_before = (wd / "config.json").read_text()
    second = subprocess.run(chaos_resume.command(str(wd), 3000), cwd=REPO,
                            capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert second.returncode == 2, second.stderr[-3000:]
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xsens: error: --workdir: "), lines
    assert f"in use by process {first.pid}" in lines[0]
    assert (wd / "config.json").read_text() == config_before
  finally:
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
  records = read_metrics(str(wd))
  keys = [(r["step"], tuple(sorted(r))) for r in records]
  assert len(keys) == len(set(keys))   # One writer: no record twice.


@pytest.mark.slow
def test_chaos_random_kills_end_bit_identical(tmp_path, capsys):
  """Two signals at random (SIGKILL or SIGTERM), rerun each time: the final state equals an
  uninterrupted run's bit for bit (the long version: experiments/chaos_resume.py)."""
  code = chaos_resume.main(["--kills", "2", "--seed", "3", "--total_steps", "400",
                            "--root", str(tmp_path)])
  out = capsys.readouterr().out
  assert code == 0, out
  assert "bit-identical to the uninterrupted run: True" in out
  assert out.count("attempt ") >= 3
