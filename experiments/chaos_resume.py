"""Chaos test of resume: a CLI run killed many times at random ends bit-identical.

  python experiments/chaos_resume.py --kills 20 --seed 0
  python experiments/chaos_resume.py --kills 20 --seed 0 --processes 4

Runs `python -m xsens --config=mlcollections_configs/train.py:model=mlp,smoke` once without
interruption (workdir `straight`) and once under fire (workdir `chaos`): each attempt is
sent SIGKILL or SIGTERM (at random) either at a random moment of its start-up or when its
metrics reach a random step, then the same command is run again, until `--kills` signals
were sent and a last attempt finishes. With `--processes N` each attempt is N processes
on this machine (`xsens.launch`, one coordinator) and each signal goes to one process
drawn at random. Prints one line per attempt (signal, process, the step it hit, exit codes,
newest checkpoint) and whether the final parameters and optimizer state of the two runs are
equal bit for bit (exit code 0 if they are, 1 if not).

Expected outcomes: SIGTERM inside the loop -> every process exits 143 after one checkpoint
at the step they agreed on; SIGTERM before the loop starts -> that process exits 143 at
once (nothing to save) and the others 75 (a lost process); SIGKILL -> that process dies
(exit 137), the others exit 75 within `--timeout_s` (or, when JAX's coordination service
sees the loss first, are ended by it: 134). Each rerun resumes from the newest committed
checkpoint (taking over a killed process's lock with a message).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import signal
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from xsens import launch  # pylint: disable=g-import-not-at-top,wrong-import-position


def arguments(workdir: str, total_steps: int) -> list[str]:
  """The CLI arguments of the run (after `python -m xsens`)."""
  return ["--config=mlcollections_configs/train.py:model=mlp,smoke",
          f"--config.train.total_steps={total_steps}", "--config.train.log_every=10",
          "--config.train.eval_every=100", "--config.train.checkpoint_every=50",
          f"--workdir={workdir}"]


def command(workdir: str, total_steps: int) -> list[str]:
  return [sys.executable, "-m", "xsens", *arguments(workdir, total_steps)]


def metrics_step(workdir: str) -> int:
  """The newest step in metrics.jsonl (-1 if none; a partial last line is ignored)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return -1
  step = -1
  with open(path) as f:
    for line in f:
      try:
        step = max(step, json.loads(line)["step"])
      except (ValueError, KeyError):
        pass
  return step


def checkpoint_steps(workdir: str) -> list[int]:
  folder = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(folder):
    return []
  return sorted(int(n) for n in os.listdir(folder) if n.isdigit())


def attempt(workdir: str, total_steps: int, rng: random.Random, fire: bool,
            spread: int, processes: int = 1, timeout_s: float = 30.0,
            deadline_s: float | None = None) -> dict:
  """One run of the command as `processes` processes; if `fire`, one signal to one of them
  at a random moment (at most `spread` steps after the step it resumes from). A dict of
  what happened. An attempt longer than `deadline_s` in all is killed (TimeoutError)."""
  env = {"JAX_PLATFORMS": "cpu"}
  if processes == 1:
    commands = [(env, command(workdir, total_steps))]
  else:
    commands = launch.local_commands(processes, arguments(workdir, total_steps),
                                     launch.free_port(), timeout_s=timeout_s)
  err = io.StringIO()
  run = launch.LocalRun(commands, timeout_s, out=io.StringIO(), err=err, cwd=REPO)
  run.start()
  sent, at_step, target = None, None, None
  if fire:
    sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
    target = rng.randrange(processes)
    start = (checkpoint_steps(workdir) or [0])[-1]   # Where this attempt resumes.
    if rng.random() < 0.2 or start >= total_steps - 1:  # During start-up (imports, compile).
      time.sleep(rng.uniform(0.5, 4.0))
    else:                                        # Inside the loop, at a random step.
      # Past the metrics a killed attempt left (this one truncates them once it starts).
      base = max(start, metrics_step(workdir))
      target_step = rng.randint(min(base + 1, total_steps - 1),
                                min(base + spread, total_steps - 1))
      t_start = time.monotonic()
      while (run.procs[target].poll() is None and metrics_step(workdir) < target_step
             and (deadline_s is None or time.monotonic() - t_start < deadline_s)):
        time.sleep(0.005)
    if run.procs[target].poll() is None:
      at_step = metrics_step(workdir)
      run.procs[target].send_signal(sig)
      sent = sig.name
  codes = run.wait(deadline_s=deadline_s)
  lines = [l for l in err.getvalue().splitlines() if l.startswith("[")]
  last = lines[-1].split("] ", 1)[-1] if lines else ""
  return {"signal": sent, "process": target if sent else None,
          "metrics_step_at_signal": at_step, "exits": codes,
          "newest_checkpoint": (checkpoint_steps(workdir) or [None])[-1],
          "last_stderr_line": last[:120]}


def final_state(workdir: str) -> dict:
  """The newest checkpoint's state, on this process's first device (a checkpoint of
  several processes restores here too: its arrays are read whole)."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step = checkpoint_steps(workdir)[-1]
  path = os.path.join(workdir, "checkpoints", str(step), "default")
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  with ocp.StandardCheckpointer() as ckpt:
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                          ckpt.metadata(path).item_metadata.tree)
    return ckpt.restore(path, target)


def compare(a: dict, b: dict) -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(
      np.asarray(x).shape == np.asarray(y).shape and np.array_equal(np.asarray(x),
                                                                    np.asarray(y))
      for x, y in zip(la, lb))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--kills", type=int, default=20)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--total_steps", type=int, default=2000)
  parser.add_argument("--processes", type=int, default=1,
                      help="processes of each attempt (xsens.launch on this machine)")
  parser.add_argument("--timeout_s", type=float, default=30.0,
                      help="XSENS_WAIT_TIMEOUT_S of a multi-process attempt")
  parser.add_argument("--attempt_deadline_s", type=float, default=900.0,
                      help="kill an attempt (all its processes) running longer; fail")
  parser.add_argument("--root", default=None, help="where the two workdirs go (default: a "
                      "temporary directory)")
  args = parser.parse_args(argv)
  root = args.root or tempfile.mkdtemp(prefix="xsens_chaos_")
  rng = random.Random(args.seed)
  straight, chaos = os.path.join(root, "straight"), os.path.join(root, "chaos")
  t0 = time.time()
  spread = max(2, 2 * args.total_steps // max(args.kills, 1))  # Kills spread over the run.
  run = lambda workdir, fire: attempt(workdir, args.total_steps, rng, fire, spread,
                                      args.processes, args.timeout_s,
                                      args.attempt_deadline_s)
  ref = run(straight, False)
  if any(ref["exits"]):
    print(f"the uninterrupted run failed: {ref}")
    return 1
  sent, attempts = 0, []
  while True:
    fire = sent < args.kills and (checkpoint_steps(chaos) or [0])[-1] < args.total_steps
    out = run(chaos, fire)
    attempts.append(out)
    sent += out["signal"] is not None
    who = f"to process {out['process']}" if args.processes > 1 else ""
    print(f"attempt {len(attempts):3d}: signal {str(out['signal']):8s}{who:13s} at metrics "
          f"step {str(out['metrics_step_at_signal']):>5s}  exits {out['exits']}  newest "
          f"checkpoint {str(out['newest_checkpoint']):>5s}  {out['last_stderr_line']}",
          flush=True)
    if out["signal"] is None:
      if any(out["exits"]):
        print("the final attempt failed")
        return 1
      break
    if len(attempts) > 4 * args.kills + 10:
      print("too many attempts")
      return 1
  same = compare(final_state(straight), final_state(chaos))
  exits = sorted({c for a in attempts for c in a["exits"]})
  print(f"signals sent: {sent} in {len(attempts)} attempts of {args.processes} process(es) "
        f"(exit codes {exits}); final parameters and optimizer state bit-identical to the "
        f"uninterrupted run: {same}; {time.time() - t0:.0f} s; workdirs in {root}")
  return 0 if same else 1


if __name__ == "__main__":
  sys.exit(main())
