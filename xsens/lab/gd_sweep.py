"""A resumable sweep of pure runs over a flattened grid, computed in chunks of one program.

Run r of the grid takes (key_r, *args[r]) with key_r = fold_in(key(seed), r) and returns
{field: scalar}; `run` computes the grid through the one loop (`xsens.train.loop`): a loop
step is one run, a chunk is `chunk_size` runs computed as ONE jitted program
(`chunk_program`: the run vmapped over groups of `vmap_size` runs, the groups in
sequence), saved as the array logs of those steps of a `Workdir` and checkpointed (state:
the number of runs done), so an interrupted sweep resumes at its last chunk. On CPU a
chunk's groups are split over `streams` pieces that run at once, one host thread each
(`stream_pieces`, `run_pieces`), with bit-identical results.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from xsens import paths
from xsens.errors import ConfigError
from xsens.train import loop
from xsens.train import sharding
from xsens.train import streams as streams_lib
from xsens.train.workdir import Workdir

# The index file of a chunk-file sweep (index.json + chunk_*.npz): refused; --overwrite
# recomputes the sweep.
LEGACY_INDEX_FILE = "index.json"
_KEEP_CHECKPOINTS = 2  # The state is one int32: the number of runs done.


def resolved_vmap_size(vmap_size: int | None) -> int:
  """Runs per vmapped group of a chunk: `vmap_size`, or for None 1 on CPU (XLA:CPU runs a
  run's small GEMMs fastest alone, and a vmapped `while_loop` runs every run until the
  group's slowest stops: docs/benchmarks.md) and 0 (the whole chunk in one vmap) on an
  accelerator."""
  if vmap_size is None:
    return 1 if jax.default_backend() == "cpu" else 0
  return int(vmap_size)


def chunk_program(run_fn, vmap_size: int):
  """Jitted chunk(*args [R, ...]) -> outputs [R, ...] (the sweep's: keys, n, mu ->
  {field: [R]}): `run_fn` vmapped over groups of `vmap_size` runs in sequence (`lax.map`),
  or over all R at once for `vmap_size` 0. Groups of one are not vmapped at all (a plain
  `lax.map`), so the `lax.cond` in `full_batch_gd.fit` stays a branch.

  Each run's numbers do not depend on its group but for float rounding (the batched
  matmuls' shapes change), so `vmap_size` is part of the sweep's fingerprint."""
  if vmap_size == 0:
    return jax.jit(jax.vmap(run_fn))
  batch_size = None if vmap_size == 1 else vmap_size
  return jax.jit(lambda *args: jax.lax.map(lambda a: run_fn(*a), args, batch_size=batch_size))


def stream_pieces(size: int, vmap_size: int, streams: int) -> tuple[int, int]:
  """(runs per piece, pieces): a chunk of `size` runs split into at most `streams` equal
  pieces of whole groups of `vmap_size` runs (one piece for `vmap_size` 0 or one stream),
  so that every group holds the runs it holds in the unsplit chunk; the last piece is
  padded by repeating the chunk's last run."""
  if vmap_size == 0 or streams <= 1:
    return size, 1
  groups = -(-size // vmap_size)
  piece = -(-groups // min(streams, groups)) * vmap_size
  return piece, -(-size // piece)


def piece_indices(size: int, vmap_size: int, streams: int):
  """(indices [piece·pieces] into a chunk of `size` runs, the last repeated as padding,
  piece, pieces): the `stream_pieces` layout as the rows to take."""
  piece, pieces = stream_pieces(size, vmap_size, streams)
  return np.minimum(np.arange(piece * pieces), size - 1), piece, pieces


def run_pieces(program, args, piece: int, num_pieces: int):
  """`program` (a `chunk_program`) on `args` ([piece·num_pieces, ...] each) cut into
  `num_pieces` pieces that run at once, one host thread each (`xsens.train.streams`); its
  outputs as NumPy [piece·num_pieces, ...]. Every run's numbers are those of one call on
  all of `args` when the pieces hold whole groups (`stream_pieces`)."""
  parts = streams_lib.ordered_map(
      lambda i: jax.device_get(program(*jax.tree.map(
          lambda a: a[i * piece:(i + 1) * piece], args))), range(num_pieces), num_pieces)
  return jax.tree.map(lambda *p: np.concatenate(p), *parts)


def _legacy_files(path: str) -> list[str]:
  """The files of a chunk-file sweep: index.json + chunk_*.npz."""
  if not paths.isdir(path):
    return []
  return [os.path.join(path, f) for f in sorted(paths.listdir(path))
          if f.startswith(LEGACY_INDEX_FILE) or (f.startswith("chunk_") and ".npz" in f)]


def check(path: str, fingerprint: dict, overwrite: bool = False, *,
          added_defaults: dict | None = None, hints: dict | None = None) -> Workdir:
  """The (unprepared) `Workdir` of a sweep at `path`; ConfigError on `workdir`, nothing
  written, if it holds a sweep of another fingerprint or a chunk-file sweep.
  `added_defaults` / `hints`: as `Workdir`'s, for fingerprint fields a sweep may lack."""
  if not overwrite and paths.exists(os.path.join(path, LEGACY_INDEX_FILE)):
    raise ConfigError(
        "workdir", f"{path!r} holds a sweep in the old format ({LEGACY_INDEX_FILE} + "
        "chunk_*.npz); rerun with --overwrite to recompute it there, or choose another "
        "--workdir")
  wd = Workdir(path, keep_checkpoints=_KEEP_CHECKPOINTS,
               added_defaults=added_defaults or {}, hints=hints or {})
  # Array logs without a checkpoint (a run stopped before its first save) count as a run.
  has_state = wd.latest_step() is not None or bool(wd.step_log_files())
  wd.check(fingerprint, overwrite=overwrite, has_state=has_state)
  return wd


def run(wd: Workdir, fingerprint: dict, args: tuple[np.ndarray, ...], *, seed: int,
        chunk_size: int, vmap_size: int, streams: int | None,
        program_for: Callable[..., Callable], name: str, overwrite: bool = False,
        max_chunks: int | None = None, log=print) -> tuple[float, int]:
  """Runs (or resumes) the sweep of `wd` (from `check`); its runs' results are the array
  logs of `wd` (`load`).

  Args:
    wd, fingerprint: the sweep's `Workdir` (from `check`) and what it was checked against.
    args: per-run arguments after the key, [R] each (R runs).
    seed: run r's key is fold_in(key(seed), r).
    chunk_size: runs per chunk (one program; the last chunk padded by repeating its last
      run).
    vmap_size: runs per vmapped group (`resolved_vmap_size`; 0: the whole chunk).
    streams: pieces of a chunk at once (`xsens.train.streams.resolve`).
    program_for: `program_for(*chunk_args)` (host arrays, the chunk's rows of `args`) ->
      the `chunk_program` to run it with (`program(keys, *args) -> {field: [rows]}`).
    name: in the progress bar ("sweep <name>") and the log lines ("[<name>] chunk i/n").
    overwrite: start again (the files of a chunk-file sweep are removed).
    max_chunks: stop after computing that many new chunks (None: all).
    log: called with one line per computed chunk.

  Returns:
    (wall seconds of the loop, chunks computed).
  """
  if overwrite and wd.is_writer:
    for f in _legacy_files(wd.path):
      paths.remove(f)
  wd.prepare(fingerprint, overwrite=overwrite)
  num_runs, size = len(args[0]), int(chunk_size)
  num_chunks = -(-num_runs // size)
  fill, piece, num_pieces = piece_indices(size, vmap_size, streams_lib.resolve(streams))
  base = jax.random.key(int(seed))
  repl = sharding.replicated(sharding.data_mesh())
  # From NumPy: `device_put` of a jax.Array onto a multi-process sharding builds a broken
  # array (jax 0.10; orbax cannot save it), of a NumPy value a correct one.
  as_state = lambda runs: {"runs_done": jax.device_put(np.asarray(runs, np.int32), repl)}

  def advance(state, start, length):
    del state
    # Always piece × pieces (≥ `size`) runs: the same program for every chunk; the last
    # chunk, and the last piece, are padded by repeating their last run.
    sel = np.minimum(start + fill, num_runs - 1)
    valid = np.arange(len(fill)) < length
    keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.asarray(sel))
    rows = tuple(a[sel] for a in args)
    out = run_pieces(program_for(*rows), (keys, *(jnp.asarray(r) for r in rows)), piece,
                     num_pieces)
    return as_state(start + length), None, {k: v[valid] for k, v in out.items()}

  computed = 0

  def on_chunk(start, end, logs, dt):
    nonlocal computed
    del end, logs
    computed += 1
    log(f"[{name}] chunk {start // size + 1}/{num_chunks}: {dt:.1f}s")

  program = loop.Program(
      init=lambda: as_state(0), advance=advance, on_chunk=on_chunk,
      abstract_state={"runs_done": jax.ShapeDtypeStruct((), jnp.int32, sharding=repl)})
  schedule = loop.Schedule(num_runs, checkpoint_every=size, max_chunk=size)
  out = loop.run(wd, program, schedule, desc=f"sweep {name}", max_chunks=max_chunks)
  return out.wall_s, computed


def load(path: str, num_runs: int, fields: tuple[str, ...]) -> tuple[dict, bool]:
  """({field: [num_runs] float64, NaN where missing}, whether every run is saved) of the
  sweep saved in `path`."""
  wd = Workdir(path)
  flat = wd.read_step_log(num_runs, fields, dtype=np.float64)
  done = np.zeros(num_runs, bool)
  for start, end, _ in wd.step_log_files():
    if end <= num_runs:
      done[start:end] = True
  return flat, bool(done.all())
