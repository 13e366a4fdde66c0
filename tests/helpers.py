"""Shared test utilities."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def snapshot(path: str) -> dict:
  """{relative path: (size, mtime_ns)} of every file below `path` (empty if missing)."""
  out = {}
  for root, _, files in os.walk(path):
    for name in files:
      full = os.path.join(root, name)
      st = os.stat(full)
      out[os.path.relpath(full, path)] = (st.st_size, st.st_mtime_ns)
  return out


def run_cli(*args: str, env_extra: dict | None = None, timeout: int = 300):
  """Runs `python -m xsens ARGS` from the repo root; returns the CompletedProcess.

  With fast XLA compiles, as in the test process (tests/conftest.py), unless `env_extra`
  sets JAX_DISABLE_MOST_OPTIMIZATIONS.
  """
  env = {**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": "1", **(env_extra or {})}
  return subprocess.run([sys.executable, "-m", "xsens", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)
