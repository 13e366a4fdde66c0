"""Concurrent streams: independent jitted calls issued from several host threads at once.

XLA:CPU runs a program's small operations (elementwise fusions, reductions, softmax, the
tiny batched matmuls of per-example attention) on one core; only its large GEMMs use the
intra-op thread pool. So one call at a time leaves the other cores idle for much of a call,
and two independent calls issued from two threads run at once (docs/benchmarks.md,
"Concurrent streams on CPU", has the measured throughputs). Dispatching the calls
asynchronously from one thread does not do this (they queue on the device's one stream).

`ordered_map` keeps the items' order, and each call is the same program on the same
inputs as in a plain loop, so results are bit-identical for any number of streams (the
caller combines them in order). `resolve(None)` picks one stream per core on a single CPU
device, and one stream otherwise: an accelerator runs a program in parallel itself, and
programs over a multi-device mesh (collectives) must be issued in one order on every
device.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
from typing import Callable, Iterable, TypeVar

import jax


T = TypeVar("T")
R = TypeVar("R")


def available_cores() -> int:
  """Cores this process may run on (its CPU affinity; os.cpu_count() where that is unknown)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not on Linux.
    return os.cpu_count() or 1


ENV_VAR = "XSENS_STREAMS"


def from_environment() -> int | None:
  """XSENS_STREAMS as an int, None when unset or empty; a one-line ValueError unless it is
  a positive int (the CLI checks it before anything runs)."""
  value = os.environ.get(ENV_VAR, "")
  if not value:
    return None
  if not (value.isdigit() and int(value) > 0):
    raise ValueError(f"{ENV_VAR}={value!r}: must be a positive int (concurrent streams per "
                     "process) or unset (one per core on a CPU)")
  return int(value)


def resolve(streams: int | None) -> int:
  """`streams`, or for None: XSENS_STREAMS when set (e.g. 1 where several jobs share the
  machine's cores), else `available_cores()` when the program runs on a single CPU device
  in a single process, else 1."""
  if streams is not None:
    return int(streams)
  env = from_environment()
  if env is not None:
    return env
  single_cpu = (jax.default_backend() == "cpu" and jax.device_count() == 1
                and jax.process_count() == 1)
  return available_cores() if single_cpu else 1


def ordered_map(fn: Callable[[T], R], items: Iterable[T], streams: int) -> list[R]:
  """[fn(item) for item in items], with up to `streams` calls running at once.

  `fn` should return host values (e.g. `jax.device_get` of its outputs), so that its
  thread waits for its program; the items are consumed lazily (at most `streams` in
  flight). Concurrent first calls of one jitted function trace and compile it once (jax's
  cache is thread-safe). An exception of any call is raised here; the calls already
  running finish first, and no later item is started.
  """
  if streams <= 1:
    return [fn(item) for item in items]
  out, pending = [], collections.deque()
  with concurrent.futures.ThreadPoolExecutor(streams) as pool:
    for item in items:
      if len(pending) == streams:
        out.append(pending.popleft().result())
      pending.append(pool.submit(fn, item))
    while pending:
      out.append(pending.popleft().result())
  return out
