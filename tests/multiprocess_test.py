"""Signals and lost processes in multi-process runs (`xsens.launch`, `xsens.train.multihost`).

The slow tests start 2 or 4 CPU processes of the CLI on one coordinator and send signals to
single processes: every process must stop at the step they agree on and exit 143, a killed
process must end the others within XSENS_WAIT_TIMEOUT_S (one line, exit 75), and the run
must end bit-identical to an uninterrupted one. Every wait here has a hard limit.
"""

import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from experiments import chaos_resume
from tests.helpers import REPO
from xsens import launch
from xsens.train import multihost
from xsens.train.metrics import read_metrics

WAIT_S = 15             # XSENS_WAIT_TIMEOUT_S of the runs below
DEADLINE_S = 300        # hard limit of one attempt (all its processes)
LOST = (multihost.EXIT_PEER_LOST, 134)  # ours, or JAX's coordination service's abort


# ----------------------------------------------------------------------------- units


def test_worst_exit_code_ranks_bad_input_over_failures_over_losses_over_preemption():
  assert launch.worst_exit_code([0, 0]) == 0
  assert launch.worst_exit_code([143, 0]) == 143
  assert launch.worst_exit_code([143, 75, 143]) == 75
  assert launch.worst_exit_code([75, 137]) == 137
  assert launch.worst_exit_code([137, 1]) == 1
  assert launch.worst_exit_code([1, 2, 75]) == 2
  assert launch.exit_code(-9) == 137 and launch.exit_code(3) == 3
  assert launch.resumable(75) and launch.resumable(137) and launch.resumable(143)
  assert not any(launch.resumable(c) for c in (0, 1, 2, 130))


def test_dry_run_prints_each_process_command_with_the_coordinator_variables(capsys):
  code = launch.main(["--local_processes=3", "--timeout_s=30", "--dry_run", "--",
                      "--config=mlcollections_configs/train.py", "--workdir=w d"])
  assert code == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 3
  port = lines[0].split("JAX_COORDINATOR_ADDRESS=127.0.0.1:")[1].split()[0]
  for i, line in enumerate(lines):
    assert f"JAX_COORDINATOR_ADDRESS=127.0.0.1:{port} " in line
    assert f"JAX_NUM_PROCESSES=3 JAX_PROCESS_ID={i} " in line
    assert f"{multihost.TIMEOUT_ENV}=30 " in line
    assert line.endswith("-m xsens --config=mlcollections_configs/train.py '--workdir=w d'")


def _script(args, capsys) -> str:
  assert launch.main([*args, "--dry_run", "--", "--config=mlcollections_configs/train.py",
                      "--workdir=gs://bucket/run"]) == 0
  script = capsys.readouterr().out
  check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True,
                         timeout=30)
  assert check.returncode == 0, check.stderr   # The printed script is valid bash.
  return script


def test_tpu_dry_run_prints_a_script_that_installs_runs_on_every_worker_and_reruns(capsys):
  script = _script(["--tpu=xs", "--zone=us-central2-b", "--accelerator=v4-16", "--spot",
                    "--data_dir=gs://bucket/tfds", "--timeout_s=300"], capsys)
  lines = script.splitlines()
  assert ('  gcloud compute tpus tpu-vm create "$TPU" --zone="$ZONE" --accelerator-type=v4-16 '
          "--version=tpu-ubuntu2204-base --spot || return 1") in lines
  assert "TPU=xs; ZONE=us-central2-b" in lines
  assert "pip wheel --no-deps --wheel-dir=dist . || exit 2" in lines
  run = [l for l in lines if "python3 -m xsens" in l]
  assert run == ['  "${SSH[@]}" --command=\'XSENS_DISTRIBUTED=1 XSENS_WAIT_TIMEOUT_S=300 '
                 "TFDS_DATA_DIR=gs://bucket/tfds python3 -m xsens "
                 "--config=mlcollections_configs/train.py --workdir=gs://bucket/run 2>&1 | "
                 "tee -a ~/xsens.log; exit ${PIPESTATUS[0]}'"]
  assert 'SSH=(gcloud compute tpus tpu-vm ssh "$TPU" --zone="$ZONE" --worker=all)' in lines
  assert "for attempt in $(seq 0 20); do" in lines
  assert any(l.startswith("  case $code in 0|1|2|130) exit $code;;") for l in lines)


def test_slurm_dry_run_prints_an_sbatch_script_with_one_process_per_node(capsys):
  script = _script(["--slurm", "--nodes=4", "--gpus_per_node=8", "--partition=gpu"], capsys)
  lines = script.splitlines()
  for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1",
               "#SBATCH --gpus-per-node=8", "#SBATCH --signal=TERM@300", "#SBATCH --requeue",
               "#SBATCH --partition=gpu"):
    assert line in lines
  assert ("srun --kill-on-bad-exit=0 env XSENS_DISTRIBUTED=1 python3 -m xsens "
          "--config=mlcollections_configs/train.py --workdir=gs://bucket/run") in lines


@pytest.mark.parametrize("args, message", [
    (["--local_processes=0", "--", "--config=x"], "--local_processes: must be a positive"),
    (["--tpu=x", "--accelerator=v4-8", "--", "x"], "--zone: needed with --tpu"),
    (["--tpu=x", "--slurm", "--", "x"], "exactly one of --local_processes, --tpu, --slurm"),
    (["--local_processes=2"], "no xsens arguments"),
    (["--local_processes=2", "--timeout_s=-1", "--", "x"], "--timeout_s: must be a positive"),
])
def test_bad_launch_input_is_one_line_and_exit_2(args, message):
  proc = subprocess.run([sys.executable, "-m", "xsens.launch", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2
  assert proc.stderr.startswith("xsens.launch: error: ") and message in proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("value, expected", [(None, 120.0), ("", 120.0), ("2.5", 2.5)])
def test_wait_timeout_from_the_environment(value, expected):
  env = {} if value is None else {multihost.TIMEOUT_ENV: value}
  assert multihost.wait_timeout_s(env) == expected


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf", "nan"])
def test_a_bad_wait_timeout_names_the_variable(value):
  with pytest.raises(ValueError, match=f"^{multihost.TIMEOUT_ENV}: must be a positive"):
    multihost.wait_timeout_s({multihost.TIMEOUT_ENV: value})


def test_cli_refuses_a_bad_wait_timeout_in_one_line(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "xsens", "--config=mlcollections_configs/train.py:model=mlp,smoke",
       f"--workdir={tmp_path / 'wd'}"], cwd=REPO, capture_output=True, text=True, timeout=120,
      env={**os.environ, multihost.TIMEOUT_ENV: "soon"})
  assert proc.returncode == 2
  assert proc.stderr.strip() == (f"xsens: error: {multihost.TIMEOUT_ENV}: must be a positive "
                                 "number of seconds, got 'soon'")
  assert not (tmp_path / "wd").exists()


def test_one_process_agrees_with_itself_at_every_boundary():
  agreement = multihost.StopAgreement(1.0)
  assert agreement.at(7, None) is None
  assert agreement.at(8, signal.SIGINT) == signal.SIGINT
  assert agreement.at(9, signal.SIGTERM, boundary=True) == signal.SIGTERM


def test_a_stuck_wait_ends_the_process_in_one_line_with_its_lock_released(tmp_path):
  """A guarded wait that never returns (a sleep in place of a barrier): the watchdog prints
  one line naming the wait and the step, releases the workdir lock and exits 75."""
  script = textwrap.dedent(f"""
      import time
      from xsens.train import multihost, workdir
      wd = workdir.Workdir({str(tmp_path / 'wd')!r})
      wd.acquire_lock()
      with multihost.Watchdog(1.0, workdir.release_held_locks) as dog:
        with dog.guard("the save of checkpoint 40", 40):
          time.sleep(60)
      """)
  t0 = time.monotonic()
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                        text=True, timeout=60)
  assert proc.returncode == multihost.EXIT_PEER_LOST, proc.stderr
  assert time.monotonic() - t0 < 30
  assert proc.stderr.strip().splitlines() == [
      "xsens: error: gave up waiting for the save of checkpoint 40 at step 40 (no progress "
      "for 1 s); rerun the same command to resume from the newest checkpoint"]
  assert not (tmp_path / "wd" / "lock.json").exists()


def test_peer_failures_are_told_from_other_errors():
  import jax  # pylint: disable=g-import-not-at-top
  gloo = jax.errors.JaxRuntimeError(
      "INTERNAL: Error dispatching computation: Error dispatching computation: Gloo "
      "all-reduce failed: Read error [127.0.0.1]:1: Connection reset by peer")
  assert multihost.is_peer_failure(gloo)
  assert not multihost.is_peer_failure(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: oom"))
  assert not multihost.is_peer_failure(ValueError("Connection reset by peer"))
  assert multihost.first_line(gloo) == (
      "INTERNAL: Error dispatching computation: Gloo all-reduce failed: Read error "
      "[127.0.0.1]:1: Connection reset by peer")


# ----------------------------------------------------------------------------- processes


def _start(workdir, processes, total_steps=300, extra=()):
  commands = launch.local_commands(
      processes, [*chaos_resume.arguments(str(workdir), total_steps), *extra],
      launch.free_port(), timeout_s=WAIT_S)
  run = launch.LocalRun(commands, WAIT_S, out=io.StringIO(), err=io.StringIO(), cwd=REPO)
  run.start()
  return run


def _wait_until(run, condition, what, timeout=DEADLINE_S):
  t0 = time.monotonic()
  while not condition():
    if any(p.poll() is not None for p in run.procs):
      pytest.fail(f"a process ended while waiting for {what}:\n{run.err.getvalue()[-3000:]}")
    if time.monotonic() - t0 > timeout:
      run.signal_all(signal.SIGKILL)
      pytest.fail(f"timed out waiting for {what}")
    time.sleep(0.005)


def _at_step(run, workdir, step):
  _wait_until(run, lambda: chaos_resume.metrics_step(str(workdir)) >= step, f"step {step}")


def _last_lines(run) -> dict[int, str]:
  """Each process's last line on stderr (the launcher prefixes them `[i] `)."""
  out = {}
  for line in run.err.getvalue().splitlines():
    if line.startswith("[") and "] " in line:
      i, text = line[1:].split("] ", 1)
      out[int(i)] = text
  return out


def _stopped_together(run, workdir, processes) -> int:
  """Asserts every process exited 143 after one line naming the same step; that step."""
  codes = run.wait(deadline_s=DEADLINE_S)
  assert codes == [143] * processes, run.err.getvalue()[-4000:]
  lines = _last_lines(run)
  steps = set()
  for i in range(processes):
    assert lines[i].startswith("xsens: preempted (SIGTERM) at step "), lines
    assert lines[i].endswith("rerun the same command to resume"), lines
    steps.add(int(lines[i].split(" at step ")[1].split(";")[0]))
  assert len(steps) == 1, lines
  step = steps.pop()
  assert chaos_resume.checkpoint_steps(str(workdir))[-1] == step
  assert max(r["step"] for r in read_metrics(str(workdir))) == step
  assert not (workdir / "lock.json").exists()
  return step


def _lost_one(run, workdir, killed, processes, t_kill) -> None:
  """Asserts the killed process died and every other one ended within the wait timeout,
  its last line (ours) naming what it waited for."""
  codes = run.wait(deadline_s=DEADLINE_S)
  assert time.monotonic() - t_kill < WAIT_S + 30, "the survivors took too long"
  assert codes[killed] == 137
  lines = _last_lines(run)
  for i in range(processes):
    if i == killed:
      continue
    assert codes[i] in LOST, run.err.getvalue()[-4000:]
    if codes[i] == multihost.EXIT_PEER_LOST:
      assert lines[i].startswith(f"xsens: error: process {i} gave up waiting for "), lines
  assert codes[0] in (137, 134) or not (workdir / "lock.json").exists()


@pytest.mark.slow
def test_two_processes_signalled_in_turn_end_bit_identical(tmp_path):
  """SIGTERM to process 1, then SIGKILL to process 0, then SIGTERM to process 0, then
  SIGTERM to process 1 during start-up, each attempt rerun: every SIGTERM in the loop stops
  both at one step; the kill and the start-up signal end the other process within the
  timeout; the final state equals an uninterrupted 2-process run's bit for bit."""
  straight, wd = tmp_path / "straight", tmp_path / "chaos"
  run = _start(straight, 2)
  assert run.wait(deadline_s=DEADLINE_S) == [0, 0], run.err.getvalue()[-3000:]

  run = _start(wd, 2)
  _at_step(run, wd, 40)
  run.procs[1].send_signal(signal.SIGTERM)
  first = _stopped_together(run, wd, 2)

  run = _start(wd, 2)
  _at_step(run, wd, first + 30)
  run.procs[0].send_signal(signal.SIGKILL)
  _lost_one(run, wd, 0, 2, time.monotonic())

  run = _start(wd, 2)
  _at_step(run, wd, first + 90)
  run.procs[0].send_signal(signal.SIGTERM)
  second = _stopped_together(run, wd, 2)
  assert second > first

  # During start-up (process 0 holds the lock: jax.distributed is up), before the loop.
  run = _start(wd, 2)
  _wait_until(run, lambda: (wd / "lock.json").exists(), "the lock")
  run.procs[1].send_signal(signal.SIGTERM)
  t_signal = time.monotonic()
  codes = run.wait(deadline_s=DEADLINE_S)
  assert codes[1] == 143 and codes[0] in LOST, run.err.getvalue()[-3000:]
  assert time.monotonic() - t_signal < WAIT_S + 30
  assert _last_lines(run)[1].startswith("xsens: SIGTERM outside the training loop; stopped")
  assert chaos_resume.checkpoint_steps(str(wd))[-1] == second

  run = _start(wd, 2)
  assert run.wait(deadline_s=DEADLINE_S) == [0, 0], run.err.getvalue()[-3000:]
  assert chaos_resume.compare(chaos_resume.final_state(str(straight)),
                              chaos_resume.final_state(str(wd)))


@pytest.mark.slow
def test_four_processes_stop_together_even_during_a_checkpoint_write(tmp_path):
  """SIGTERM to process 2 mid-run; on the rerun SIGTERM to process 0 while a checkpoint is
  being written; then SIGKILL to process 3: the other three end within the timeout; the
  last rerun finishes."""
  wd = tmp_path / "run"
  run = _start(wd, 4)
  _at_step(run, wd, 30)
  run.procs[2].send_signal(signal.SIGTERM)
  first = _stopped_together(run, wd, 4)

  run = _start(wd, 4)
  folder = wd / "checkpoints"
  _wait_until(run, lambda: any("tmp" in n for n in os.listdir(folder)),
              "a checkpoint being written")
  run.procs[0].send_signal(signal.SIGTERM)
  assert _stopped_together(run, wd, 4) > first

  run = _start(wd, 4)
  _at_step(run, wd, chaos_resume.checkpoint_steps(str(wd))[-1] + 20)
  run.procs[3].send_signal(signal.SIGKILL)
  _lost_one(run, wd, 3, 4, time.monotonic())

  run = _start(wd, 4)
  assert run.wait(deadline_s=DEADLINE_S) == [0] * 4, run.err.getvalue()[-3000:]
  assert chaos_resume.checkpoint_steps(str(wd))[-1] == 300


def _children(pid: int) -> list[int]:
  """The process ids of `pid`'s children (Linux /proc)."""
  try:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
      return [int(c) for c in f.read().split()]
  except FileNotFoundError:
    return []


def _launcher(workdir, log, *options, total_steps=300):
  """`python -m xsens.launch --local_processes=2 OPTIONS -- ARGS` (the command of
  docs/launch.md), its stderr into the file `log`."""
  return subprocess.Popen(
      [sys.executable, "-m", "xsens.launch", "--local_processes=2", f"--timeout_s={WAIT_S}",
       *options, "--", *chaos_resume.arguments(str(workdir), total_steps)],
      cwd=REPO, stdout=subprocess.DEVNULL, stderr=log, text=True)


def _end_launcher(proc, deadline_s=DEADLINE_S) -> int:
  """Its exit code; past `deadline_s`, kills it and its processes and fails."""
  try:
    return proc.wait(timeout=deadline_s)
  except subprocess.TimeoutExpired:
    for child in _children(proc.pid):
      os.kill(child, signal.SIGKILL)
    proc.kill()
    proc.wait()
    pytest.fail(f"the launcher ran longer than {deadline_s} s")


@pytest.mark.slow
def test_launcher_forwards_sigint_and_reruns_after_a_lost_process(tmp_path):
  """`python -m xsens.launch --local_processes=2`, as a user runs it: SIGINT (Ctrl-C) to the
  launcher reaches both processes, which stop at one step with one checkpoint, exit 130,
  and the launcher exits 130 after its summary line. With `--max_restarts=1`, SIGKILL of one
  process ends the attempt (the other within the wait timeout), the launcher reruns it, and
  the rerun resumes and finishes: exit 0."""
  wd, log_path = tmp_path / "run", tmp_path / "launch.log"
  with open(log_path, "w") as log:
    proc = _launcher(wd, log)
    t0 = time.monotonic()
    while chaos_resume.metrics_step(str(wd)) < 20:
      assert proc.poll() is None, log_path.read_text()[-3000:]
      if time.monotonic() - t0 > DEADLINE_S:
        _end_launcher(proc, 0.1)
      time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    assert _end_launcher(proc) == 130, log_path.read_text()[-3000:]
  lines = log_path.read_text().splitlines()
  assert lines[-1] == "xsens.launch: exit codes [130, 130]; exit 130", lines[-10:]
  stops = [l for l in lines if " xsens: preempted (SIGINT) at step " in l]
  assert sorted(l[:4] for l in stops) == ["[0] ", "[1] "], lines[-10:]
  steps = {int(l.split(" at step ")[1].split(";")[0]) for l in stops}
  assert len(steps) == 1, stops
  step = steps.pop()
  assert 20 <= step < 300 and chaos_resume.checkpoint_steps(str(wd))[-1] == step
  assert max(r["step"] for r in read_metrics(str(wd))) == step
  assert not (wd / "lock.json").exists()

  with open(log_path, "w") as log:
    proc = _launcher(wd, log, "--max_restarts=1")
    t0 = time.monotonic()
    while chaos_resume.metrics_step(str(wd)) < step + 20 or len(_children(proc.pid)) < 2:
      assert proc.poll() is None, log_path.read_text()[-3000:]
      if time.monotonic() - t0 > DEADLINE_S:
        _end_launcher(proc, 0.1)
      time.sleep(0.005)
    os.kill(_children(proc.pid)[1], signal.SIGKILL)
    assert _end_launcher(proc, 2 * DEADLINE_S) == 0, log_path.read_text()[-3000:]
  text = log_path.read_text()
  summaries = [l for l in text.splitlines()
               if l.startswith(("xsens.launch: exit codes ", "xsens.launch: rerun "))]
  assert len(summaries) == 3, text[-3000:]
  first, rerun, last = summaries
  codes = sorted(int(c) for c in first.split("exit codes [")[1].split("]")[0].split(", "))
  assert codes[1] == 137 and codes[0] in LOST, summaries
  assert rerun == "xsens.launch: rerun 1 of 1"
  assert last == "xsens.launch: exit codes [0, 0]; exit 0"
  assert chaos_resume.checkpoint_steps(str(wd))[-1] == 300
  assert not (wd / "lock.json").exists()


@pytest.mark.slow
def test_chaos_two_processes_random_signals_end_bit_identical(tmp_path, capsys):
  """`experiments/chaos_resume.py --processes 2` with two random signals (SIGKILL or SIGTERM
  to a random process), each attempt bounded: the final state equals an uninterrupted
  2-process run's bit for bit (the 4-process, 20-signal run: docs/benchmarks.md)."""
  code = chaos_resume.main(["--processes", "2", "--kills", "2", "--seed", "1",
                            "--total_steps", "300", "--timeout_s", str(WAIT_S),
                            "--attempt_deadline_s", str(DEADLINE_S), "--root", str(tmp_path)])
  out = capsys.readouterr().out
  assert code == 0, out
  assert "bit-identical to the uninterrupted run: True" in out
  assert out.count("attempt ") >= 3
