"""How the chunked estimators cut their perturbed copies into forward calls.

An estimator evaluates N perturbed copies of each of B examples (N = T * R token-draw
pairs, or R draws). A plan is (chunk_size c, example_chunk_size e): each forward call sees
e examples times c copies, its forward batch e * c. Results never depend on the plan (the
noise of a copy depends on its index only); speed and memory do.

`chunk_size` and `example_chunk_size` are each a positive int, None (all N copies / all B
examples) or "auto"; `chunk_size` may also be "tune". "auto" resolves to the largest
forward batch within
  - the memory cap: memory_budget_bytes // (item_bytes * FORWARD_BYTES_PER_INPUT_BYTE)
    inputs per call (item_bytes: one perturbed input), and
  - on CPU, the speed target: CPU_MATMUL_ROWS_PER_CORE * cores // M inputs, M the rows
    per example of the model's largest matmul (`matmul_rows_per_example`: T + 1 for a ViT
    of T patches, L for a text transformer of length L, 1 for an MLP or a CNN's dense
    head), so that each matmul of a call has about a cache-sized activation; on GPU and
    TPU (or a forward without matmuls) the memory cap alone.
  The resolved forward batch is the one a plan can reach (B * c, or a strided block of
  ceil(B / n) examples) nearest the target in ratio, within the memory cap.
"tune" replaces the speed target by the fastest of the forward batches `TUNE_FACTORS`
times it (times the memory cap on GPU and TPU), within the memory cap, where it is faster
than the target by more than `TUNE_MARGIN`; timed once per
(backend, model structure, input shapes and dtypes, memory budget) on stand-in inputs (and
zeros for traced variables) and kept in `TUNED_FORWARD_BATCH` for the process; the first
call costs a compilation and TUNE_ROUNDS runs of about 4 * target inputs per candidate.

Each estimator's result holds `plan`: {"chunk_size": c, "example_chunk_size": e,
"forward_batch": e * c}, the sizes one forward call actually used (an example block of
ceil(B / ceil(B / e)) examples). They are Python ints in an eager call; through `jax.jit`
they come back as int32 scalars, and under `jax.vmap` (e.g. `sigma_sweep`) broadcast to the
mapped axis. The plan is logged at DEBUG on logger "xsens.measures" when the estimator is
traced, a tuning result at INFO.
"""

import logging
import math
import os
import time
from typing import Any, Callable, Optional, Sequence, Union

import jax
from jax.extend import core as jex_core
import jax.numpy as jnp

Array = jax.Array
ChunkSize = Union[int, None, str]

AUTO = "auto"
TUNE = "tune"
# Default budget for the memory of one forward call of the estimators.
DEFAULT_MEMORY_BUDGET_BYTES = 256 * 2**20
# Bytes a forward pass is assumed to hold per byte of its input (the memory cap): measured
# 65-110 for a small ViT (28x28x1, patch 4, width 128, 6 layers, float32;
# docs/benchmarks.md memory table), rounded up.
FORWARD_BYTES_PER_INPUT_BYTE = 128
# CPU speed target: matmul rows (inputs per forward call times the rows per example of the
# forward's largest matmul) per core, inside the range where the ViT's and RoBERTa's
# forwards run fastest in `experiments/bench_sensitivity.py --plans` (docs/benchmarks.md).
CPU_MATMUL_ROWS_PER_CORE = 1000
# "tune": candidate forward batches (multiples of the speed target, or of the memory cap
# where there is no target), timing rounds (best of).
TUNE_FACTORS = (0.25, 0.5, 1, 2, 4)
TUNE_ROUNDS = 3
# "tune" keeps the speed target unless another candidate's forward is faster by more than
# this: the forward timed alone differs from the estimator's by run-to-run noise of about
# that size (docs/benchmarks.md).
TUNE_MARGIN = 0.1

# "tune"'s choices in this process: (backend, model fingerprint, per-example input shapes
# and dtypes, memory_budget_bytes) -> forward batch.
TUNED_FORWARD_BATCH: dict[tuple, int] = {}

log = logging.getLogger("xsens.measures")


def check_positive_int(name: str, value: Any) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name} must be a positive Python int, got {value!r}.")


def _check_chunk_size(chunk_size: ChunkSize, name: str = "chunk_size",
                      allowed: tuple[str, ...] = (AUTO,)) -> None:
  if chunk_size is None or chunk_size in allowed:
    return
  if isinstance(chunk_size, str):
    names = " or ".join(repr(a) for a in allowed)
    raise ValueError(f"{name} must be {names}, None or a positive int, got "
                     f"{chunk_size!r}.")
  check_positive_int(name, chunk_size)


def plan_chunks(
    batch: int,
    num_items: int,
    item_bytes: int,
    *,
    chunk_size: ChunkSize = AUTO,
    example_chunk_size: ChunkSize = AUTO,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES,
    target_batch: Optional[int] = None,
) -> tuple[Optional[int], Optional[int]]:
  """Resolves 'auto' chunk sizes: forward calls within a memory cap, near a target.

  capacity = memory_budget_bytes // (item_bytes * FORWARD_BYTES_PER_INPUT_BYTE) inputs
  per call (at least 1). Without target_batch, the largest plan within it:
  - both 'auto': the whole batch (e = None) and c = capacity // batch copies
    (clipped to [1, num_items]) when the batch fits, else c = 1 and
    e = capacity examples;
  - chunk_size 'auto' only: c = capacity // e (clipped to [1, num_items]);
  - example_chunk_size 'auto' only: the whole batch if batch * c fits, else
    e = max(1, capacity // c).
  With target_batch, the 'auto' sizes give the forward batch nearest target_batch
  in ratio (the larger on a tie) among those within the capacity (the smallest if
  none is): batch * c for c in [1, num_items], or blocks of ceil(batch / n)
  examples (one copy each when chunk_size is 'auto' too).
  Explicit values (positive ints, or None = all) are returned unchanged. The
  memory estimate covers the model's activations only as far as the factor does;
  vmapping an estimator (e.g. over sigma) multiplies its memory.

  Args:
    batch: B, examples in the batch.
    num_items: N, perturbed copies per example (T * R pairs, or R draws).
    item_bytes: bytes of one perturbed example input (e.g. T * D * itemsize).
    chunk_size: copies per example per forward call: 'auto', None or an int.
    example_chunk_size: examples per forward call: 'auto', None or an int.
    memory_budget_bytes: the budget of one forward call (default 256 MiB).
    target_batch: inputs per forward call wanted for speed (the estimators pass
      the CPU target or the tuned one); None: as many as the memory cap allows.

  Returns:
    (chunk_size, example_chunk_size), each a positive int or None.
  """
  _check_chunk_size(chunk_size)
  _check_chunk_size(example_chunk_size, "example_chunk_size")
  check_positive_int("memory_budget_bytes", memory_budget_bytes)
  check_positive_int("batch", batch)
  check_positive_int("num_items", num_items)
  if target_batch is not None:
    check_positive_int("target_batch", target_batch)
  capacity = max(1, memory_budget_bytes //
                 max(1, item_bytes * FORWARD_BYTES_PER_INPUT_BYTE))
  if target_batch is not None and AUTO in (chunk_size, example_chunk_size):
    return _nearest_plan(batch, num_items, chunk_size, example_chunk_size, capacity,
                         target_batch)
  clip = lambda c: max(1, min(num_items, c))
  if chunk_size == AUTO and example_chunk_size == AUTO:
    if batch <= capacity:
      return clip(capacity // batch), None
    return 1, capacity
  if chunk_size == AUTO:
    e = batch if example_chunk_size is None else min(example_chunk_size, batch)
    return clip(capacity // e), example_chunk_size
  if example_chunk_size == AUTO:
    c = num_items if chunk_size is None else min(chunk_size, num_items)
    return chunk_size, (None if batch * c <= capacity else
                        max(1, capacity // c))
  return chunk_size, example_chunk_size


def _nearest_plan(batch: int, num_items: int, chunk_size: ChunkSize,
                  example_chunk_size: ChunkSize, capacity: int,
                  target: int) -> tuple[Optional[int], Optional[int]]:
  """plan_chunks with a target: the reachable plan nearest it (see there)."""
  plans = []                                        # (chunk_size, example_chunk_size)
  if chunk_size == AUTO:
    plans += [(c, example_chunk_size) for c in range(1, num_items + 1)]
    if example_chunk_size == AUTO:
      plans = [(c, None) for c in range(1, num_items + 1)]
      plans += [(1, -(-batch // n)) for n in range(2, batch + 1)]
  else:
    plans += [(chunk_size, None)]
    plans += [(chunk_size, -(-batch // n)) for n in range(2, batch + 1)]
  sized = [(plan_sizes(batch, num_items, *p)["forward_batch"], p) for p in plans]
  fits = [s for s in sized if s[0] <= capacity] or [min(sized, key=lambda s: s[0])]
  return min(fits, key=lambda s: (abs(math.log(s[0] / target)), -s[0]))[1]


def plan_sizes(batch: int, num_items: int, chunk_size: Optional[int],
               example_chunk_size: Optional[int]) -> dict[str, int]:
  """The sizes a resolved plan runs at: {"chunk_size": copies per example per call,
  "example_chunk_size": examples per call (one strided block), "forward_batch": their
  product}, Python ints."""
  c = num_items if chunk_size is None else min(chunk_size, num_items)
  e = batch
  if example_chunk_size is not None and example_chunk_size < batch:
    e = -(-batch // -(-batch // example_chunk_size))
  return {"chunk_size": c, "example_chunk_size": e, "forward_batch": c * e}


# ------------------------------------------------------------------------------------------
# The speed target.
# ------------------------------------------------------------------------------------------


def _num_cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:                           # Not on Linux.
    return os.cpu_count() or 1


def _abstract(tree: Any) -> Any:
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)),
                      tree)


def _example_specs(inputs: Sequence[Array]) -> list[jax.ShapeDtypeStruct]:
  return [jax.ShapeDtypeStruct((1, *x.shape[1:]), x.dtype) for x in inputs]


def _forward_jaxpr(fn: Callable[..., Array], variables: Any,
                   inputs: Sequence[Array]) -> Optional[jex_core.ClosedJaxpr]:
  """The jaxpr of fn(variables, *inputs at batch 1), or None where it cannot be traced
  on abstract values."""
  try:
    return jax.make_jaxpr(fn)(_abstract(variables), *_example_specs(inputs))
  except Exception as e:  # pylint: disable=broad-except  # Any user model may refuse.
    log.debug("planning: no jaxpr of the forward (%s: %s); memory cap only",
              type(e).__name__, e)
    return None


def _free_size(shape: Sequence[int], used: Sequence[int]) -> int:
  return math.prod(n for i, n in enumerate(shape) if i not in used)


def _depends(v: Any, dependent: set) -> bool:
  return not isinstance(v, jex_core.Literal) and v in dependent


def _max_rows(jaxpr: jex_core.Jaxpr, dependent: set) -> int:
  """Largest row count of the dot_generals of jaxpr with exactly one operand computed
  from a variable in `dependent` (activations times weights): that operand's size
  outside its contracting and batch axes."""
  rows = 0
  for eqn in jaxpr.eqns:
    if not any(_depends(v, dependent) for v in eqn.invars):
      continue
    if eqn.primitive.name == "dot_general":
      (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
      lhs, rhs = eqn.invars
      if _depends(lhs, dependent) != _depends(rhs, dependent):
        x, used = (lhs, (*lc, *lb)) if _depends(lhs, dependent) else (rhs, (*rc, *rb))
        rows = max(rows, _free_size(x.aval.shape, used))
    dependent.update(eqn.outvars)
    for sub in jex_core.jaxprs_in_params(eqn.params):
      n = len(sub.invars)
      outer = list(eqn.invars)[-n:] if n <= len(eqn.invars) else []
      inner = ({s for s, o in zip(sub.invars, outer) if _depends(o, dependent)}
               if len(outer) == n else set(sub.invars))
      rows = max(rows, _max_rows(sub, inner))
  return rows


def matmul_rows_per_example(fn: Callable[..., Array], variables: Any,
                            inputs: Sequence[Array]) -> Optional[int]:
  """Rows per example of the largest matmul of fn(variables, *inputs).

  Read off the jaxpr of one forward at batch 1 (no compilation, nothing run): over the
  dot_generals with an operand computed from the inputs, that operand's size outside its
  contracting and batch axes (tokens of a transformer layer, 1 for a dense layer on
  flat features).

  Args:
    fn: (variables, *inputs [B', ...]) -> outputs.
    variables: fn's variables (concrete or traced; only shapes are read).
    inputs: arrays [B, ...] (concrete or traced; only shapes from axis 1 on are read).

  Returns:
    rows, or None where fn has no such matmul or cannot be traced on abstract values.
  """
  return _rows_of(_forward_jaxpr(fn, variables, inputs), variables)


def _rows_of(closed: Optional[jex_core.ClosedJaxpr], variables: Any) -> Optional[int]:
  """`matmul_rows_per_example` of the forward's jaxpr (None: None)."""
  if closed is None:
    return None
  jaxpr = closed.jaxpr
  n_vars = len(jax.tree.leaves(variables))
  return _max_rows(jaxpr, set(jaxpr.invars[n_vars:])) or None


def forward_batch_target(rows_per_example: Optional[int],
                         backend: Optional[str] = None) -> Optional[int]:
  """Inputs per forward call wanted for speed: on CPU, CPU_MATMUL_ROWS_PER_CORE times
  the cores over the rows per example (`matmul_rows_per_example`); None (no target
  beyond memory) on GPU and TPU or when rows_per_example is None."""
  backend = backend or jax.default_backend()
  if backend != "cpu" or not rows_per_example:
    return None
  return max(1, CPU_MATMUL_ROWS_PER_CORE * _num_cores() // rows_per_example)


# ------------------------------------------------------------------------------------------
# "tune".
# ------------------------------------------------------------------------------------------


def _standin(x: Any, i: int) -> Array:
  """A concrete array of x's shape and dtype (normal floats, ones elsewhere)."""
  if jnp.issubdtype(x.dtype, jnp.floating):
    return jax.random.normal(jax.random.key(i), x.shape, x.dtype)
  return jnp.ones(x.shape, x.dtype)


def _concrete(tree: Any) -> Any:
  """tree with every traced leaf replaced by zeros of its shape and dtype."""
  return jax.tree.map(lambda a: jnp.zeros(jnp.shape(a), jnp.result_type(a))
                      if isinstance(a, jax.core.Tracer) else a, tree)


def _time_forward_batches(fn: Callable[..., Array], variables: Any,
                          inputs: Sequence[Array], candidates: Sequence[int],
                          vmapped_batch: Optional[int] = None) -> dict[int, float]:
  """Inputs per second of fn at each forward batch (best of TUNE_ROUNDS, interleaved);
  each timing runs ceil(max(candidates) / batch) calls under `lax.map`. With
  vmapped_batch = B, a call is fn vmapped over B examples of batch / B inputs each
  (as the text estimators run it)."""
  most = max(candidates)

  def call(v, x):
    if vmapped_batch is None:
      return jnp.argmax(fn(v, *x), axis=-1)
    return jax.vmap(lambda *xe: jnp.argmax(fn(v, *xe), axis=-1))(*x)

  with jax.ensure_compile_time_eval():
    v = _concrete(variables)
    programs = {}
    for fb in candidates:
      calls = -(-most // fb)
      lead = (fb,) if vmapped_batch is None else (vmapped_batch, fb // vmapped_batch)
      xs = [_standin(jax.ShapeDtypeStruct((calls, *lead, *x.shape[1:]), x.dtype), i)
            for i, x in enumerate(inputs)]
      run = jax.jit(lambda v, xs: jax.lax.map(lambda x: call(v, x), xs))
      programs[fb] = (run.lower(v, xs).compile(), xs, calls * fb)
    best = {fb: math.inf for fb in candidates}
    for _ in range(TUNE_ROUNDS):
      for fb, (compiled, xs, _) in programs.items():
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(v, xs))
        best[fb] = min(best[fb], time.perf_counter() - t0)
  return {fb: programs[fb][2] / best[fb] for fb in candidates}


def tuned_forward_batch(fn: Callable[..., Array], variables: Any, inputs: Sequence[Array],
                        *, capacity: int, target: Optional[int], name: str = "forward",
                        vmapped_batch: Optional[int] = None,
                        closed: Optional[jex_core.ClosedJaxpr] = None) -> int:
  """The fastest forward batch of fn among `TUNE_FACTORS` times `target` (None:
  `capacity`; the target itself unless another is faster by more than `TUNE_MARGIN`),
  all <= capacity (multiples of vmapped_batch, when given: see
  `_time_forward_batches`); timed once per (backend, model, input shapes, capacity,
  vmapped_batch) and cached in `TUNED_FORWARD_BATCH`. closed: fn's jaxpr at batch 1
  (`_forward_jaxpr`) where the caller has it."""
  if closed is None:
    closed = _forward_jaxpr(fn, variables, inputs)
  backend = jax.default_backend()
  key = (backend, hash(str(closed)) if closed is not None else id(fn),
         tuple((tuple(x.shape[1:]), str(x.dtype)) for x in inputs), capacity,
         vmapped_batch)
  if key in TUNED_FORWARD_BATCH:
    return TUNED_FORWARD_BATCH[key]
  base = min(target or capacity, capacity)
  unit = vmapped_batch or 1
  candidates = sorted({unit * max(1, min(capacity, int(base * f)) // unit)
                       for f in TUNE_FACTORS})
  rates = _time_forward_batches(fn, variables, inputs, candidates, vmapped_batch)
  best = max(rates, key=rates.get)
  base = min(candidates, key=lambda fb: abs(math.log(fb / base)))
  if rates[best] <= (1 + TUNE_MARGIN) * rates[base]:
    best = base
  TUNED_FORWARD_BATCH[key] = best
  log.info("%s: tuned forward batch %d on %s (inputs/s: %s)", name, best, backend,
           ", ".join(f"{fb}: {r:,.0f}" for fb, r in rates.items()))
  return best


# ------------------------------------------------------------------------------------------
# What the estimators call.
# ------------------------------------------------------------------------------------------


def resolve(name: str, fn: Callable[..., Array], variables: Any, inputs: Sequence[Array],
            num_items: int, chunk_size: ChunkSize, example_chunk_size: ChunkSize,
            memory_budget_bytes: int, vmapped_batch: Optional[int] = None
            ) -> tuple[Optional[int], Optional[int], dict[str, int]]:
  """An estimator's plan: (chunk_size, example_chunk_size, the `plan` entry).

  Args:
    name: the estimator, for the log.
    fn: the forward, (variables, *inputs [B', ...]) -> logits [B', K].
    variables: its variables.
    inputs: what fn takes, each [B, ...]; inputs[0] is the perturbed one.
    num_items: N copies per example.
    chunk_size: 'auto', 'tune', None or an int.
    example_chunk_size: 'auto', None or an int.
    memory_budget_bytes: the memory cap of one forward call.
    vmapped_batch: B when the estimator vmaps fn over the B examples (text), so that
      a forward call is B times chunk_size copies; example_chunk_size is then None.
  """
  _check_chunk_size(chunk_size, allowed=(AUTO, TUNE))
  _check_chunk_size(example_chunk_size, "example_chunk_size")
  check_positive_int("memory_budget_bytes", memory_budget_bytes)
  x = inputs[0]
  batch = x.shape[0]
  item_bytes = math.prod(x.shape[1:]) * jnp.dtype(x.dtype).itemsize
  target = closed = None
  if AUTO in (chunk_size, example_chunk_size) or chunk_size == TUNE:
    closed = _forward_jaxpr(fn, variables, inputs)
    target = forward_batch_target(_rows_of(closed, variables))
  if chunk_size == TUNE:
    capacity = max(1, memory_budget_bytes // max(1, item_bytes * FORWARD_BYTES_PER_INPUT_BYTE))
    target = tuned_forward_batch(fn, variables, inputs, capacity=capacity, target=target,
                                 name=name, vmapped_batch=vmapped_batch, closed=closed)
    chunk_size = AUTO
  c, e = plan_chunks(batch, num_items, item_bytes, chunk_size=chunk_size,
                     example_chunk_size=example_chunk_size,
                     memory_budget_bytes=memory_budget_bytes, target_batch=target)
  sizes = plan_sizes(batch, num_items, c, e)
  log.debug("%s plan: chunk_size=%d example_chunk_size=%d forward_batch=%d (B=%d, N=%d, "
            "speed target %s)", name, sizes["chunk_size"], sizes["example_chunk_size"],
            sizes["forward_batch"], batch, num_items, target)
  return c, e, sizes
