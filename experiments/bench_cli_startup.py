"""Wall time of the command lines that only load a config: `--print_config`, a config error,
`--help` (`python -m xsens ...` in a fresh process, from a temporary directory).

  python experiments/bench_cli_startup.py                      # this checkout
  python experiments/bench_cli_startup.py --checkout=/tmp/old  # another one (e.g. git archive)

Prints best and median wall time of `--repeats` runs per command line, the best CPU time
(user + sys: what another job on the cores inflates least), the load average, and which of
jax / flax / tensorflow each command line imported. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import machine  # pylint: disable=g-import-not-at-top

COMMANDS = {
    "--print_config, train.py:smoke": ["--config=train.py:smoke", "--print_config"],
    "--print_config, sensitivity_language.py": ["--config=sensitivity_language.py",
                                                "--print_config"],
    "config error (misspelt field)": ["--config=train.py", "--config.train.batchsize=3"],
    "--help": ["--help"],
}
HEAVY = ("jax", "flax", "tensorflow")
_PROBE = ("import sys\nfrom xsens import main\nsys.argv = ['xsens'] + sys.argv[1:]\n"
          "try:\n  main.run()\nfinally:\n"
          f"  print(','.join(m for m in {HEAVY!r} if m in sys.modules) or '-', file=sys.stderr)\n")


def time_command(checkout: str, args: list[str], repeats: int
                 ) -> tuple[list[float], list[float], str]:
  """Wall and CPU seconds of `repeats` runs of `python -m xsens ARGS`, and which of `HEAVY`
  it imported."""
  env = {**os.environ, "PYTHONPATH": checkout}
  with tempfile.TemporaryDirectory() as cwd:
    subprocess.run([sys.executable, "-m", "xsens", *args], cwd=cwd, env=env,
                   capture_output=True, check=False)  # Writes the checkout's .pyc files.
    times, cpu = [], []
    for _ in range(repeats):
      before = resource.getrusage(resource.RUSAGE_CHILDREN)
      start = time.perf_counter()
      subprocess.run([sys.executable, "-m", "xsens", *args], cwd=cwd, env=env,
                     capture_output=True, check=False)
      times.append(time.perf_counter() - start)
      after = resource.getrusage(resource.RUSAGE_CHILDREN)
      cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    probe = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=cwd, env=env,
                           capture_output=True, text=True, check=False)
  return times, cpu, probe.stderr.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
  parser.add_argument("--checkout", default=os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), help="repository root whose xsens is timed")
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args(argv)
  print(f"checkout {args.checkout}; CPU {machine.cpu_model()}, {os.cpu_count()} cores; "
        f"load average before {os.getloadavg()[0]:.2f}")
  for name, cli in COMMANDS.items():
    times, cpu, imported = time_command(args.checkout, cli, args.repeats)
    print(f"{name:<42} wall best {min(times):5.2f} s  median {statistics.median(times):5.2f} s"
          f"  CPU best {min(cpu):5.2f} s  imports: {imported}")
  print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
