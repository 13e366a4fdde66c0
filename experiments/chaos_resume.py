"""Chaos test of resume: a CLI run killed many times at random ends bit-identical.

  python experiments/chaos_resume.py --kills 20 --seed 0

Runs `python -m xsens --config=mlcollections_configs/train.py:model=mlp,smoke` once without
interruption (workdir `straight`) and once under fire (workdir `chaos`): each attempt is
sent SIGKILL or SIGTERM (at random) either at a random moment of its start-up or when its
metrics reach a random step, then the same command is run again, until `--kills` signals
were sent and a last attempt finishes. Prints one line per attempt (signal, the step it hit,
exit code, newest checkpoint) and whether the final parameters and optimizer state of the
two runs are equal bit for bit (exit code 0 if they are, 1 if not).

Expected outcomes: SIGTERM inside the loop -> exit 143 after a checkpoint at the current
step; SIGTERM before the loop starts -> exit 143 at once (nothing to save); SIGKILL -> the
process dies (exit -9). Each rerun resumes from the newest committed checkpoint (taking over
a killed process's lock with a message).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(workdir: str, total_steps: int) -> list[str]:
  return [sys.executable, "-m", "xsens",
          "--config=mlcollections_configs/train.py:model=mlp,smoke",
          f"--config.train.total_steps={total_steps}", "--config.train.log_every=10",
          "--config.train.eval_every=100", "--config.train.checkpoint_every=50",
          f"--workdir={workdir}"]


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
            spread: int) -> dict:
  """One run of the command; if `fire`, one signal at a random moment (at most `spread`
  steps after the step it resumes from). A dict of what happened."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(command(workdir, total_steps), cwd=REPO, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  sent, at_step = None, None
  if fire:
    sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
    start = (checkpoint_steps(workdir) or [0])[-1]   # Where this attempt resumes.
    if rng.random() < 0.2 or start >= total_steps - 1:  # During start-up (imports, compile).
      time.sleep(rng.uniform(0.5, 4.0))
    else:                                        # Inside the loop, at a random step.
      # Past the metrics a killed attempt left (this one truncates them once it starts).
      base = max(start, metrics_step(workdir))
      target = rng.randint(min(base + 1, total_steps - 1), min(base + spread, total_steps - 1))
      while proc.poll() is None and metrics_step(workdir) < target:
        time.sleep(0.005)
    if proc.poll() is None:
      at_step = metrics_step(workdir)
      proc.send_signal(sig)
      sent = sig.name
  _, err = proc.communicate(timeout=600)
  last = err.strip().splitlines()[-1] if err.strip() else ""
  return {"signal": sent, "metrics_step_at_signal": at_step, "exit": proc.returncode,
          "newest_checkpoint": (checkpoint_steps(workdir) or [None])[-1],
          "last_stderr_line": last[:120]}


def final_state(workdir: str) -> dict:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step = checkpoint_steps(workdir)[-1]
  with ocp.StandardCheckpointer() as ckpt:
    return ckpt.restore(os.path.join(workdir, "checkpoints", str(step), "default"))


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
  parser.add_argument("--root", default=None, help="where the two workdirs go (default: a "
                      "temporary directory)")
  args = parser.parse_args(argv)
  root = args.root or tempfile.mkdtemp(prefix="xsens_chaos_")
  rng = random.Random(args.seed)
  straight, chaos = os.path.join(root, "straight"), os.path.join(root, "chaos")
  t0 = time.time()
  spread = max(2, 2 * args.total_steps // max(args.kills, 1))  # Kills spread over the run.
  ref = attempt(straight, args.total_steps, rng, fire=False, spread=spread)
  if ref["exit"] != 0:
    print(f"the uninterrupted run failed: {ref}")
    return 1
  sent, attempts = 0, []
  while True:
    fire = sent < args.kills and (checkpoint_steps(chaos) or [0])[-1] < args.total_steps
    out = attempt(chaos, args.total_steps, rng, fire=fire, spread=spread)
    attempts.append(out)
    sent += out["signal"] is not None
    print(f"attempt {len(attempts):3d}: signal {str(out['signal']):8s} at metrics step "
          f"{str(out['metrics_step_at_signal']):>5s}  exit {out['exit']:4d}  newest "
          f"checkpoint {str(out['newest_checkpoint']):>5s}  {out['last_stderr_line']}",
          flush=True)
    if out["signal"] is None:
      if out["exit"] != 0:
        print("the final attempt failed")
        return 1
      break
    if len(attempts) > 4 * args.kills + 10:
      print("too many attempts")
      return 1
  same = compare(final_state(straight), final_state(chaos))
  exits = sorted({a["exit"] for a in attempts})
  print(f"signals sent: {sent} in {len(attempts)} attempts (exit codes {exits}); "
        f"final parameters and optimizer state bit-identical to the uninterrupted run: "
        f"{same}; {time.time() - t0:.0f} s; workdirs in {root}")
  return 0 if same else 1


if __name__ == "__main__":
  sys.exit(main())
