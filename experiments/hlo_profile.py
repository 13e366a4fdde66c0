"""Time per HLO instruction of a compiled JAX program, from a profiler trace (CPU).

Used by the benchmarks' profiles (`bench_sensitivity.py`, `bench_benign_overfitting.py
--profile`): XLA:CPU's thunk runtime records one trace event per executed instruction,
named as in `compiled.as_text()`, so summing the events by name gives where the time goes.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import shutil
import tempfile
from typing import Any, Callable, Iterable

import jax

_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%(\S+) = (\S+) ")


def instructions(compiled) -> dict[str, str]:
  """{instruction name: its HLO line} of a compiled program."""
  out = {}
  for line in compiled.as_text().splitlines():
    m = _INSTRUCTION.match(line)
    if m:
      out[m.group(1)] = line.strip()
  return out


def instruction_times(names: Iterable[str], call: Callable[[], Any],
                      calls: int) -> dict[str, float]:
  """{instruction name: microseconds per call} over `calls` runs of `call()`, for the
  instruction `names` of the program it runs (`instructions(compiled)`); {} where the
  profiler wrote no trace."""
  names = set(names)
  jax.block_until_ready(call())
  tmp = tempfile.mkdtemp(prefix="xsens_hlo_profile_")
  try:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      for _ in range(calls):
        jax.block_until_ready(call())
    files = glob.glob(os.path.join(tmp, "**", "*.trace.json.gz"), recursive=True)
    if not files:
      return {}
    with gzip.open(files[0]) as f:
      trace = json.load(f)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  us = collections.Counter()
  for e in trace.get("traceEvents", []):
    if e.get("ph") == "X" and e.get("name") in names:
      us[e["name"]] += e["dur"] / calls
  return dict(us)


def describe(hlo_line: str) -> str:
  """A short label of one HLO line: result shape, opcode or custom fusion, op_name tail."""
  m = re.match(r"(?:ROOT )?%\S+ = (\S+) (\S+?)\(", hlo_line)
  shape, opcode = (m.group(1), m.group(2)) if m else ("?", "?")
  kind = re.search(r"kind=(\w+)", hlo_line)
  op = re.search(r'op_name="([^"]+)"', hlo_line)
  tail = "/".join(op.group(1).split("/")[-2:]) if op else ""
  dims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", hlo_line)
  extra = f" lhs_contracting={{{dims.group(1)}}}" if dims else ""
  return f"{opcode}{'(' + kind.group(1) + ')' if kind else ''} {shape}{extra} {tail}".strip()
