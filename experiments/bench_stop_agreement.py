"""Cost of the loop's stop agreement in a multi-process run.

  python experiments/bench_stop_agreement.py --processes 2 4

For each N, on this machine (N CPU processes, one coordinator, as `xsens.launch` does):

1. *One agreement*: each process times, in lockstep, one data-parallel SGD step of the
   `train.py:model=mlp,smoke` model size (its gradient averaged over the processes by a
   collective), a bare barrier of JAX's coordination service, and one
   `multihost.StopAgreement.at(step, None, boundary=True)` (keys, a barrier, one read of the
   keys): medians over `--calls` repeats.
2. *In the loop*: the CLI trains `train.py:model=mlp,smoke` for `--steps` steps (log every
   10, one checkpoint at the end) as N processes, alternately as shipped and with
   `StopAgreement.at` replaced by a pass-through of the local signal (patched by this
   script's wrapper, never by the library), `--rounds` times each; the figure is each run's
   median `train/steps_per_sec` over its log windows, best of the rounds.

Prints the CPU model first; compare figures only within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from experiments import machine  # pylint: disable=g-import-not-at-top,wrong-import-position

# The CLI with the agreement replaced by a pass-through (the "off" side of the A/B).
_WITHOUT_AGREEMENT = """
import sys
from xsens.train import multihost
multihost.StopAgreement.at = lambda self, step, signum, boundary=False: signum
sys.argv[0] = "xsens"
from xsens import main
main.run()
"""


def median_ms(fn, calls: int) -> float:
  times = []
  for _ in range(calls):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return 1e3 * sorted(times)[len(times) // 2]


def worker(calls: int, batch: int) -> None:
  """Part 1 in one process (the coordinator variables are set by the parent)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  from xsens.train import multihost, sharding  # pylint: disable=g-import-not-at-top

  sharding.maybe_initialize_distributed()
  mesh = sharding.data_mesh()
  rng = np.random.default_rng(0)
  params = jax.device_put({"w1": rng.normal(size=(784, 32)).astype(np.float32) * 0.05,
                           "w2": rng.normal(size=(32, 10)).astype(np.float32) * 0.1},
                          sharding.replicated(mesh))
  local = batch // jax.process_count()
  x = sharding.global_batch(rng.normal(size=(local, 784)).astype(np.float32), mesh)
  y = sharding.global_batch(rng.integers(0, 10, size=(local,)).astype(np.int32), mesh)

  def loss(p, x, y):
    logits = jax.nn.relu(x @ p["w1"]) @ p["w2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

  @jax.jit
  def step(p, x, y):
    g = jax.grad(loss)(p, x, y)   # The batch is sharded: the mean is a cross-process sum.
    return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

  state = {"p": params}

  def train_step():
    state["p"] = step(state["p"], x, y)
    jax.block_until_ready(state["p"])

  client = distributed.global_state.client
  agreement, steps = multihost.StopAgreement(60.0), iter(range(10 ** 9))
  barrier = lambda: client.wait_at_barrier("bench_barrier", 60_000)
  agree = lambda: agreement.at(next(steps), None, boundary=True)
  for fn in (train_step, barrier, agree):   # Warm-up (compiles the step).
    median_ms(fn, 5)
  step_ms, barrier_ms, agree_ms = (median_ms(fn, calls) for fn in (train_step, barrier, agree))
  if jax.process_index() == 0:
    print(f"  one agreement: training step {step_ms:.3f} ms, barrier {barrier_ms:.3f} ms, "
          f"agreement {agree_ms:.3f} ms ({100 * agree_ms / step_ms:.0f} % of a step)",
          flush=True)


def one_agreement(n: int, calls: int, batch: int) -> int:
  from xsens import launch  # pylint: disable=g-import-not-at-top
  procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker",
                             f"--calls={calls}", f"--batch={batch}"],
                            env={**os.environ, **env}, cwd=REPO)
           for env, _ in launch.local_commands(n, [], launch.free_port())]
  for p in procs:
    p.wait(timeout=900)
  return max(p.returncode for p in procs)


def loop_steps_per_s(n: int, steps: int, agreement: bool, root: str) -> float:
  """Median train/steps_per_sec of one N-process CLI run (the agreement on or off)."""
  from xsens import launch  # pylint: disable=g-import-not-at-top
  from xsens.train.metrics import read_metrics  # pylint: disable=g-import-not-at-top
  workdir = tempfile.mkdtemp(dir=root)
  args = ["--config=mlcollections_configs/train.py:model=mlp,smoke",
          f"--config.train.total_steps={steps}", "--config.train.log_every=10",
          f"--config.train.eval_every={steps}", f"--config.train.checkpoint_every={steps}",
          f"--workdir={workdir}"]
  commands = launch.local_commands(n, args, launch.free_port())
  if not agreement:
    commands = [(env, [sys.executable, "-c", _WITHOUT_AGREEMENT, *argv[3:]])
                for env, argv in commands]
  procs = [subprocess.Popen(argv, env={**os.environ, **env}, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
           for env, argv in commands]
  for p in procs:
    p.wait(timeout=1800)
  if any(p.returncode for p in procs):
    raise RuntimeError(f"a run failed: exit codes {[p.returncode for p in procs]}")
  rates = [r["train/steps_per_sec"] for r in read_metrics(workdir)
           if "train/steps_per_sec" in r and 20 < r["step"] < steps]
  return statistics.median(rates)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--processes", type=int, nargs="+", default=[2, 4])
  parser.add_argument("--calls", type=int, default=300)
  parser.add_argument("--batch", type=int, default=32, help="global batch of part 1")
  parser.add_argument("--steps", type=int, default=1500, help="training steps of part 2")
  parser.add_argument("--rounds", type=int, default=3, help="A/B rounds of part 2")
  parser.add_argument("--json", default=None, help="also write the figures here")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    worker(args.calls, args.batch)
    return 0
  print(f"CPU: {machine.cpu_model()}, {os.cpu_count()} cores; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
  out = {}
  with tempfile.TemporaryDirectory() as root:
    for n in args.processes:
      print(f"processes {n}:", flush=True)
      if one_agreement(n, args.calls, args.batch):
        return 1
      on, off = [], []
      for i in range(args.rounds):   # Alternated, each side first in half of the rounds.
        order = (True, False) if i % 2 == 0 else (False, True)
        for agreement in order:
          (on if agreement else off).append(loop_steps_per_s(n, args.steps, agreement, root))
      print(f"  in the loop: {max(on):.0f} steps/s with the agreement, {max(off):.0f} "
            f"without ({100 * (max(on) / max(off) - 1):+.1f} %; best of {args.rounds}; all "
            f"rounds: with {[round(v) for v in on]}, without {[round(v) for v in off]})",
            flush=True)
      out[n] = {"with": on, "without": off}
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
