"""The machine a benchmark ran on, as the benchmarks print it."""

from __future__ import annotations


def cpu_model() -> str:
  """The CPU's model name from /proc/cpuinfo ("unknown" where there is none)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return "unknown"
