"""Launches a multi-process xsens run: N CPU processes on this machine (run and tested here),
or the script of a Cloud TPU VM / pod slice or a SLURM GPU cluster launch (printed by
`--dry_run`; docs/launch.md).

  python -m xsens.launch --local_processes=4 -- --config=mlcollections_configs/train.py \\
      --workdir=workdirs/train4
  python -m xsens.launch --tpu=NAME --zone=ZONE --accelerator=v5litepod-16 --spot \\
      --dry_run -- --config=... --workdir=gs://BUCKET/run
  python -m xsens.launch --slurm --nodes=2 --gpus_per_node=8 --dry_run -- --config=...

`--local_processes=N` starts N processes of `python -m xsens ARGS` on 127.0.0.1 with the
coordinator variables (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`),
each in its own session; prefixes each line of their output with `[i] `; forwards SIGTERM /
SIGINT to every process (the run stops at a step they agree on, `xsens.train.multihost`);
and returns the worst exit code (`worst_exit_code`). `--max_restarts=K` reruns all of them
after an exit a rerun resumes from (a lost process, 75; a crash), as a scheduler's retry
would. A process still running `--timeout_s + 60` s after another one failed is killed:
nothing waits forever.

`--tpu=NAME` writes a bash script (`tpu_script`), run from a checkout, that builds the xsens
wheel, creates the TPU VM, installs it and copies mlcollections_configs/ to every worker, runs `python3 -m xsens ARGS` on every worker and, while
the run ends with a code a rerun resumes from, reruns it (recreating a preempted spot TPU
first). `--slurm` writes an sbatch script (`slurm_script`): one task per node, every GPU
of the node, SIGTERM before the time limit, requeue. Without `--dry_run` the script is run
(`bash`, `sbatch`); with it, printed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

from xsens.train import multihost

EXIT_PREEMPTED = (128 + signal.SIGTERM, 128 + signal.SIGINT)
# Exit codes a rerun resumes from: a lost process (75), a process killed by a signal or
# aborted by JAX's coordination service (128 + n), a scheduler's stop.
_STOP_CODES = (0, 1, 2)   # done, diverged or a bug, bad input: a rerun changes nothing


def exit_code(returncode: int) -> int:
  """A Popen returncode as a shell shows it: a death by signal n as 128 + n."""
  return 128 - returncode if returncode < 0 else returncode


def worst_exit_code(codes: list[int]) -> int:
  """The exit code of a run from its processes' codes, worst first: bad input (2), a
  failure (1 or any other code), a process killed by a signal, a lost process (75), a
  preemption (143 / 130), success (0). Ties: the first process's."""
  def rank(code: int) -> int:
    if code == 0:
      return 0
    if code in EXIT_PREEMPTED:
      return 1
    if code == multihost.EXIT_PEER_LOST:
      return 2
    if code > 128:
      return 3
    return 5 if code == 2 else 4
  return max(codes, key=rank) if codes else 0


def resumable(code: int) -> bool:
  """Whether a rerun of a run that ended with `code` goes on from its newest checkpoint
  (not 0, 1 or 2, and not an interrupt from the keyboard)."""
  return code not in _STOP_CODES and code != 128 + signal.SIGINT


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def local_commands(num_processes: int, args: list[str], port: int,
                   devices_per_process: int = 1, timeout_s: float | None = None,
                   python: str = sys.executable) -> list[tuple[dict, list[str]]]:
  """(environment additions, argv) of each process of a local run."""
  out = []
  for i in range(num_processes):
    env = {"JAX_PLATFORMS": "cpu", "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
           "JAX_NUM_PROCESSES": str(num_processes), "JAX_PROCESS_ID": str(i)}
    if devices_per_process > 1:
      env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_"
                          f"device_count={devices_per_process}").strip()
    if timeout_s is not None:
      env[multihost.TIMEOUT_ENV] = f"{timeout_s:g}"
    out.append((env, [python, "-m", "xsens", *args]))
  return out


def shell_line(env: dict, argv: list[str]) -> str:
  return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()),
                   *map(shlex.quote, argv)])


class LocalRun:
  """The processes of one local attempt (see the module docstring)."""

  def __init__(self, commands, timeout_s: float, out=None, err=None, cwd=None):
    self.commands = commands
    self.cwd = cwd
    self.grace_s = timeout_s + 60.0
    self.out = out or sys.stdout
    self.err = err or sys.stderr
    self.procs: list[subprocess.Popen] = []
    self._print_lock = threading.Lock()
    self._copiers: list[threading.Thread] = []

  def start(self) -> None:
    for i, (env, argv) in enumerate(self.commands):
      proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=self.cwd,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
      self.procs.append(proc)
      for stream, sink in ((proc.stdout, self.out), (proc.stderr, self.err)):
        copier = threading.Thread(target=self._copy, args=(stream, sink, f"[{i}] "),
                                  daemon=True)
        copier.start()
        self._copiers.append(copier)

  def _copy(self, stream, sink, prefix: str) -> None:
    for line in stream:
      with self._print_lock:
        sink.write(prefix + line)
        sink.flush()

  def signal_all(self, signum: int) -> None:
    for proc in self.procs:
      if proc.poll() is None:
        try:
          proc.send_signal(signum)
        except ProcessLookupError:
          pass

  def wait(self, deadline_s: float | None = None) -> list[int]:
    """Waits for every process; kills those still running `grace_s` after the first
    failure. Their exit codes, process 0 first. `deadline_s`: kills all of them and raises
    TimeoutError if they run longer than that in all (a test's hard limit)."""
    failed_at, started = None, time.monotonic()
    while any(p.poll() is None for p in self.procs):
      if deadline_s is not None and time.monotonic() - started > deadline_s:
        for p in self.procs:
          p.kill()
          p.wait()
        raise TimeoutError(f"the processes ran longer than {deadline_s:.0f} s")
      codes = [p.returncode for p in self.procs]
      if failed_at is None and any(c not in (None, 0) for c in codes):
        failed_at = time.monotonic()
      if failed_at is not None and time.monotonic() - failed_at > self.grace_s:
        for i, p in enumerate(self.procs):
          if p.poll() is None:
            self._say(f"process {i} still runs {self.grace_s:.0f} s after another one "
                      "failed; killed")
            p.kill()
        break
      time.sleep(0.05)
    for p in self.procs:
      p.wait()
    for copier in self._copiers:
      copier.join(timeout=5)
    return [exit_code(p.returncode) for p in self.procs]

  def _say(self, message: str) -> None:
    with self._print_lock:
      print(f"xsens.launch: {message}", file=self.err, flush=True)


def run_local(num_processes: int, args: list[str], *, devices_per_process: int = 1,
              timeout_s: float | None = None, max_restarts: int = 0, out=None,
              err=None) -> int:
  """Runs `python -m xsens ARGS` as `num_processes` local processes (module docstring);
  returns the worst exit code of the last attempt."""
  err = err or sys.stderr
  wait_s = multihost.wait_timeout_s() if timeout_s is None else timeout_s
  attempt, code = 0, 0
  while True:
    run = LocalRun(local_commands(num_processes, args, free_port(), devices_per_process,
                                  timeout_s), wait_s, out, err)
    previous = {s: signal.signal(s, lambda signum, frame: run.signal_all(signum))
                for s in (signal.SIGTERM, signal.SIGINT)}
    try:
      run.start()
      codes = run.wait()
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)
    code = worst_exit_code(codes)
    print(f"xsens.launch: exit codes {codes}; exit {code}", file=err, flush=True)
    if attempt >= max_restarts or not resumable(code) or code in EXIT_PREEMPTED:
      return code
    attempt += 1
    print(f"xsens.launch: rerun {attempt} of {max_restarts}", file=err, flush=True)


def _quoted(args: list[str]) -> str:
  return " ".join(map(shlex.quote, args))


def tpu_script(name: str, zone: str, accelerator: str, args: list[str], *,
               version: str = "tpu-ubuntu2204-base", spot: bool = False,
               max_restarts: int = 20, timeout_s: float | None = None,
               data_dir: str | None = None) -> str:
  """The bash script of a Cloud TPU launch (module docstring). `data_dir`: the TFDS
  data_dir every worker reads (e.g. gs://BUCKET/tensorflow_datasets)."""
  env = ["XSENS_DISTRIBUTED=1"]   # jax.distributed detects the TPU workers itself.
  if timeout_s is not None:
    env.append(f"{multihost.TIMEOUT_ENV}={timeout_s:g}")
  if data_dir:
    env.append(f"TFDS_DATA_DIR={shlex.quote(data_dir)}")
  remote = f"{' '.join(env)} python3 -m xsens {_quoted(args)} 2>&1 | tee -a ~/xsens.log"
  create = [f'gcloud compute tpus tpu-vm create "$TPU" --zone="$ZONE" '
            f"--accelerator-type={shlex.quote(accelerator)} --version={shlex.quote(version)}"
            + (" --spot" if spot else "")]
  return "\n".join([
      "#!/usr/bin/env bash",
      f"# xsens on Cloud TPU {name} ({accelerator}, {zone}): python -m xsens.launch --tpu",
      "set -uo pipefail",
      f"TPU={shlex.quote(name)}; ZONE={shlex.quote(zone)}",
      "SSH=(gcloud compute tpus tpu-vm ssh \"$TPU\" --zone=\"$ZONE\" --worker=all)",
      "pip wheel --no-deps --wheel-dir=dist . || exit 2",
      "WHEEL=$(ls -t dist/xsens-*.whl | head -n 1)",
      "create() {",
      *(f"  {line} || return 1" for line in create),
      '  gcloud compute tpus tpu-vm scp "$WHEEL" "$TPU": --zone="$ZONE" --worker=all || '
      "return 1",
      "  # The configs, where the relative --config paths find them (the home directory).",
      '  gcloud compute tpus tpu-vm scp --recurse mlcollections_configs "$TPU": --zone="$ZONE" '
      "--worker=all || return 1",
      '  "${SSH[@]}" --command="pip install -U \'jax[tpu]\' && pip install ~/$(basename '
      '"$WHEEL")"',
      "}",
      "create || exit 1",
      f"for attempt in $(seq 0 {max_restarts}); do",
      f'  "${{SSH[@]}}" --command={shlex.quote(remote + "; exit ${PIPESTATUS[0]}")}',
      "  code=$?",
      "  case $code in 0|1|2|130) exit $code;; esac   # done, failed, bad input, Ctrl-C",
      '  state=$(gcloud compute tpus tpu-vm describe "$TPU" --zone="$ZONE" '
      "--format='value(state)')",
      '  if [ "$state" != READY ]; then   # preempted: a new TPU, then the rerun resumes',
      '    gcloud compute tpus tpu-vm delete "$TPU" --zone="$ZONE" --quiet',
      "    create || exit 1",
      "  fi",
      "done",
      "exit $code",
  ]) + "\n"


def slurm_script(nodes: int, gpus_per_node: int, args: list[str], *,
                 time_limit: str = "24:00:00", partition: str | None = None,
                 timeout_s: float | None = None, data_dir: str | None = None) -> str:
  """The sbatch script of a SLURM launch (module docstring): `srun` starts one process per
  node, which `jax.distributed` finds through SLURM's variables."""
  env = ["XSENS_DISTRIBUTED=1"]
  if timeout_s is not None:
    env.append(f"{multihost.TIMEOUT_ENV}={timeout_s:g}")
  if data_dir:
    env.append(f"TFDS_DATA_DIR={shlex.quote(data_dir)}")
  header = ["#!/usr/bin/env bash", "#SBATCH --job-name=xsens", f"#SBATCH --nodes={nodes}",
            "#SBATCH --ntasks-per-node=1", f"#SBATCH --gpus-per-node={gpus_per_node}",
            f"#SBATCH --time={time_limit}",
            "#SBATCH --signal=TERM@300", "#SBATCH --requeue", "#SBATCH --open-mode=append",
            "#SBATCH --output=xsens-%j.log"]
  if partition:
    header.append(f"#SBATCH --partition={partition}")
  return "\n".join([
      *header,
      "# --signal: SIGTERM to every process 5 min before the time limit (one checkpoint).",
      f"srun --kill-on-bad-exit=0 env {' '.join(env)} python3 -m xsens {_quoted(args)}",
      "code=$?",
      "# A preemption (143) or a lost process (75): back in the queue; the rerun resumes.",
      'case $code in 0|1|2) exit $code;; *) scontrol requeue "$SLURM_JOB_ID"; exit $code;; '
      "esac",
  ]) + "\n"


class _Parser(argparse.ArgumentParser):
  """argparse with bad input as one line: `xsens.launch: error: <message>`, exit 2."""

  def error(self, message: str):
    print(f"xsens.launch: error: {message}", file=sys.stderr)
    sys.exit(2)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  if "--" in argv:
    cut = argv.index("--")
    ours, args = argv[:cut], argv[cut + 1:]
  else:
    ours, args = argv, []
  parser = _Parser(
      prog="python -m xsens.launch", description=__doc__.split("\n")[0],
      usage="python -m xsens.launch (--local_processes=N | --tpu=NAME --zone=Z "
            "--accelerator=A | --slurm --nodes=N) [options] -- XSENS_ARGS")
  parser.add_argument("--local_processes", type=int, default=None,
                      help="start N CPU processes on this machine")
  parser.add_argument("--devices_per_process", type=int, default=1,
                      help="CPU devices each local process simulates")
  parser.add_argument("--tpu", default=None, help="name of the Cloud TPU VM to create")
  parser.add_argument("--zone", default=None, help="its zone, e.g. us-central1-a")
  parser.add_argument("--accelerator", default=None,
                      help="its accelerator type, e.g. v5litepod-8 (one host) or v5litepod-16")
  parser.add_argument("--version", default="tpu-ubuntu2204-base", help="its software version")
  parser.add_argument("--spot", action="store_true", help="a spot (preemptible) TPU")
  parser.add_argument("--slurm", action="store_true", help="an sbatch script for SLURM")
  parser.add_argument("--nodes", type=int, default=1, help="SLURM nodes")
  parser.add_argument("--gpus_per_node", type=int, default=8, help="GPUs of each SLURM node")
  parser.add_argument("--time_limit", default="24:00:00", help="SLURM --time")
  parser.add_argument("--partition", default=None, help="SLURM partition")
  parser.add_argument("--data_dir", default=None,
                      help="TFDS_DATA_DIR of every process (e.g. gs://BUCKET/tensorflow_datasets)")
  parser.add_argument("--timeout_s", type=float, default=None,
                      help=f"bound of every wait on another process ({multihost.TIMEOUT_ENV}"
                      f"; default {multihost.DEFAULT_TIMEOUT_S:g})")
  parser.add_argument("--max_restarts", type=int, default=None,
                      help="reruns after an exit a rerun resumes from (local: 0, TPU: 20)")
  parser.add_argument("--dry_run", action="store_true",
                      help="print the commands (script) and exit without starting anything")
  opts = parser.parse_args(ours)
  modes = [m for m, on in (("--local_processes", opts.local_processes is not None),
                           ("--tpu", opts.tpu is not None), ("--slurm", opts.slurm)) if on]
  if len(modes) != 1:
    parser.error("give exactly one of --local_processes, --tpu, --slurm"
                 + (f" (got {', '.join(modes)})" if modes else ""))
  if opts.local_processes is not None and opts.local_processes < 1:
    parser.error("--local_processes: must be a positive number of processes")
  if opts.tpu is not None:
    for flag in ("zone", "accelerator"):
      if not getattr(opts, flag):
        parser.error(f"--{flag}: needed with --tpu")
  if opts.nodes < 1 or opts.gpus_per_node < 0:
    parser.error("--nodes: must be at least 1 (and --gpus_per_node 0 or more)")
  if opts.devices_per_process < 1:
    parser.error("--devices_per_process: must be at least 1")
  if opts.timeout_s is not None and not opts.timeout_s > 0:
    parser.error("--timeout_s: must be a positive number of seconds")
  if opts.max_restarts is not None and opts.max_restarts < 0:
    parser.error("--max_restarts: must be 0 or more")
  if not args:
    parser.error("no xsens arguments: put them after `--`, e.g. -- --config=... "
                 "--workdir=...")
  return opts, args


def main(argv: list[str] | None = None) -> int:
  opts, args = parse(sys.argv[1:] if argv is None else argv)
  if opts.tpu is not None or opts.slurm:
    if opts.tpu is not None:
      script = tpu_script(opts.tpu, opts.zone, opts.accelerator, args, version=opts.version,
                          spot=opts.spot, max_restarts=20 if opts.max_restarts is None
                          else opts.max_restarts, timeout_s=opts.timeout_s,
                          data_dir=opts.data_dir)
      runner = ["bash", "-c", script]
    else:
      script = slurm_script(opts.nodes, opts.gpus_per_node, args, time_limit=opts.time_limit,
                            partition=opts.partition, timeout_s=opts.timeout_s,
                            data_dir=opts.data_dir)
      runner = ["sbatch"]
    if opts.dry_run:
      sys.stdout.write(script)
      return 0
    return subprocess.run(runner, input=script if runner == ["sbatch"] else None,
                          text=True, check=False).returncode
  commands = local_commands(opts.local_processes, args, free_port(),
                            opts.devices_per_process, opts.timeout_s)
  if opts.dry_run:
    for env, command in commands:
      print(shell_line(env, command))
    return 0
  return run_local(opts.local_processes, args, devices_per_process=opts.devices_per_process,
                   timeout_s=opts.timeout_s, max_restarts=opts.max_restarts or 0)


if __name__ == "__main__":
  sys.exit(main())
