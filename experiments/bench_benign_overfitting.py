"""Benchmark: the vmapped benign-overfitting sweep vs a sequential per-run, per-step loop.

  python experiments/bench_benign_overfitting.py                     # CPU default dims
  python experiments/bench_benign_overfitting.py --variant=paper --runs=20 --steps=10

Measures, for one chunk of `--runs` ViT runs (the config's dims, N padded to max N) doing
exactly `--steps` full-batch GD steps (no early stop):
  * chunk: ONE jitted program over the runs of a `lax.while_loop` over steps (the study's
    `make_run_fn`, data draw and evaluation included), in the study's groups
    (`gd_sweep.chunk_program`, `sweep.vmap_size`: on CPU one run at a time) and, as
    chunk_one_vmap, as one `vmap` over all runs;
  * vmapped GD: the GD loop alone on pre-drawn data (`vmap` of a `fori_loop` over all
    runs); grouped GD: the same loop in the study's groups (`lax.map`, batch_size =
    vmap_size);
  * sweep (`--sweep_runs`): the heat map's real work, `sweep_runs` grid points of mixed
    (N, ‖μ‖) each trained by direct GD until train loss < ε or max_steps (the authors'
    rule), in the study's groups and as one vmap, against the authors' PyTorch loop with
    the same rule on `--sweep_torch_runs` of them; rates in whole runs per second;
  * streams: the grouped GD loop and the sweep's programs with their runs cut into
    `sweep.streams` pieces of whole groups that run at once, one host thread each
    (`gd_sweep.run_pieces`, as the study runs its chunks; default one per core on a CPU);
  * sequential jitted: a Python loop over runs and steps calling a jitted GD step;
  * PyTorch (the authors' pattern, the real thing; needs `pip install -e ".[bench]"`): per
    run, nn.Linear W_Q, W_K, W_V (no bias) and a frozen w_O, torch.optim.SGD(lr=η),
    SoftMarginLoss, a Python loop of zero_grad / backward / step on the full batch —
    `--torch_runs` runs from the same initial weights and data as the JAX runs, checked to
    end at the same weights (relative error printed), torch.set_num_threads(os.cpu_count());
    and, as a yardstick for the same parallelism as the streams, the same loop split over
    one process per core (1 torch thread each, started together; `torch_processes`);
  * sequential op-by-op JAX: a Python loop over runs and steps with un-jitted JAX ops,
    timed on a few runs/steps (not the authors' code: a dispatch-bound reference);
  * reduced: `xsens.train.reduced_vit_gd.fit` (exact, state in the span of the tokens);
  * achieved GFLOP/s = XLA cost analysis of one vmapped GD step × steps / vmapped-GD time, against
    the measured fp32 matmul peak (best of a 2048² (CPU) or 8192² (accelerator) jnp.dot).
`--profile=N` also prints the N slowest HLO instructions of the vmapped GD loop.
Prints a markdown table (and --json=PATH writes the numbers).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from experiments import hlo_profile  # pylint: disable=g-import-not-at-top
from mlcollections_configs import benign_overfitting as bo_config  # pylint: disable=g-import-not-at-top,line-too-long
from xsens.data import signal_noise as sn  # pylint: disable=g-import-not-at-top
from xsens.lab import gd_sweep  # pylint: disable=g-import-not-at-top
from xsens.models import one_layer_vit as vit  # pylint: disable=g-import-not-at-top
from xsens.studies import benign_overfitting as bo  # pylint: disable=g-import-not-at-top
from xsens.train import full_batch_gd as gd  # pylint: disable=g-import-not-at-top
from xsens.train import reduced_vit_gd  # pylint: disable=g-import-not-at-top
from xsens.train import streams  # pylint: disable=g-import-not-at-top


def _flops(compiled) -> float:
  ca = compiled.cost_analysis()
  if isinstance(ca, (list, tuple)):
    ca = ca[0]
  return float(ca.get("flops", float("nan")))


def _best_time(fn, repeats: int) -> float:
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t0)
  return best


def _compiled_and_timed(program, *args, repeats: int = 3):
  """(compiled program, its first output (the warm-up), best time of `repeats` calls)."""
  compiled = program.lower(*args).compile()
  first = jax.block_until_ready(compiled(*args))
  return compiled, first, _best_time(lambda: compiled(*args), repeats)


def matmul_peak(n: int, repeats: int = 5) -> float:
  """Best fp32 GFLOP/s of an n×n @ n×n jnp.dot (jitted)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(lambda a, b: a @ b)
  jax.block_until_ready(f(a, b))
  return 2 * n ** 3 / _best_time(lambda: f(a, b), repeats) / 1e9


@functools.cache
def _torch_vit_class():
  """The authors' one-layer ViT as a torch.nn.Module (built once; torch is optional)."""
  import torch  # pylint: disable=g-import-not-at-top

  class OneLayerViT(torch.nn.Module):
    """docs/papers/benign_overfitting.md §2 in the authors' matrix form: mean_l softmax(Q Kᵀ)_l · X
    W_V w_O."""

    def __init__(self, wq, wk, wv, wo):
      super().__init__()
      d, d_h = wq.shape
      self.q = torch.nn.Linear(d, d_h, bias=False)
      self.k = torch.nn.Linear(d, d_h, bias=False)
      self.v = torch.nn.Linear(d, wv.shape[1], bias=False)
      self.o = torch.nn.Linear(wv.shape[1], 1, bias=False)
      with torch.no_grad():  # nn.Linear stores the transposes.
        for lin, w in ((self.q, wq), (self.k, wk), (self.v, wv), (self.o, wo[:, None])):
          lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
      self.o.weight.requires_grad_(False)

    def forward(self, x):
      attn = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2), dim=-1)
      return self.o(attn @ self.v(x)).squeeze(-1).mean(-1)

  return OneLayerViT


def _torch_one_run(params, w_o, x, y, eta: float, i: int, max_steps: int, n=None,
                   eps: float = 0.0):
  """Run i of the authors' PyTorch loop: nn.Linear W_Q, W_K, W_V (no bias) and a frozen
  w_O, SGD(lr=η), SoftMarginLoss on the first n samples, zero_grad / backward / step until
  the loss before an update is < eps or max_steps updates. (final W_V, updates made)."""
  import torch  # pylint: disable=g-import-not-at-top
  model = _torch_vit_class()(params["wq"][i], params["wk"][i], params["wv"][i], w_o[i])
  opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=eta)
  n = len(y[i]) if n is None else int(n)
  xt, yt = torch.from_numpy(x[i][:n]), torch.from_numpy(y[i][:n].astype(np.float32))
  crit = torch.nn.SoftMarginLoss()
  steps = 0
  while steps < max_steps:
    loss = crit(model(xt), yt)
    if eps and loss.item() < eps:
      break
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps += 1
  return model.v.weight.detach().numpy().T.copy(), steps


def draw_runs(config, keys, mus, n_max: int):
  """(params, w_o, x, y), each [R, ...]: run r's signal/noise data at ‖μ‖ = mus[r] (n_max
  samples; fold 0 of keys[r]) and its ViT initialisation (fold 1), as the config sets."""
  dc, v = config.data, config.vit
  kw = bo._data_kwargs(dc)  # pylint: disable=protected-access

  def one(key, mu):
    x, y, _ = sn.sample(key, n_max, mu_norm=mu, **kw)
    params, w_o = vit.init(jax.random.fold_in(key, 1), int(dc.d), int(v.d_h), int(v.d_v),
                           init_divisor=float(v.init_divisor))
    return params, w_o, x, y

  return jax.jit(jax.vmap(one))(keys, mus)


def _numpy_runs(params, w_o, x, y):
  """Writable NumPy copies (torch.from_numpy needs them) of the vmapped JAX arrays."""
  return ({k: np.array(v) for k, v in params.items()}, np.array(w_o), np.array(x),
          np.array(y))


def torch_authors_loop(params, w_o, x, y, eta: float, steps: int, runs: int,
                       repeats: int = 3):
  """The authors' PyTorch step loop over `runs` runs; (run·steps/s of the best of
  `repeats` passes, final W_V of run 0).

  params/w_o/x/y: the vmapped JAX arrays ([runs, ...]); each run starts from its weights.
  """
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count())
  arrays = _numpy_runs(params, w_o, x, y)
  _torch_one_run(*arrays, eta, 0, min(steps, 10))  # Warm-up: threads, allocator, autograd.
  final_wv = []
  best = _best_time(lambda: final_wv.insert(0, [  # Best of `repeats`, as the JAX timings.
      _torch_one_run(*arrays, eta, i, steps)[0] for i in range(runs)][0]), repeats)
  return runs * steps / best, final_wv[0]


def _torch_worker(arrays, eta, runs, max_steps, ns, eps, barrier, queue):
  """One process of `torch_processes`: its runs of the authors' loop, one torch thread,
  timed from a barrier shared with the other processes; puts (seconds, steps)."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(1)
  _torch_one_run(*arrays, eta, runs[0], min(max_steps, 10))  # Warm-up.
  barrier.wait()
  t0 = time.perf_counter()
  steps = [_torch_one_run(*arrays, eta, i, max_steps, None if ns is None else ns[i], eps)[1]
           for i in runs]
  queue.put((time.perf_counter() - t0, steps))


def torch_processes(arrays, eta: float, max_steps: int, runs: int, procs: int, ns=None,
                    eps: float = 0.0, repeats: int = 2) -> float:
  """Wall seconds (best of `repeats`) of the authors' PyTorch loop on runs 0..runs-1 split
  over `procs` processes of one torch thread each, started together (a yardstick: what
  the authors' loop reaches on every core, one process per core; not their script)."""
  return min(_torch_processes_once(arrays, eta, max_steps, runs, procs, ns, eps)
             for _ in range(repeats))


def _torch_processes_once(arrays, eta, max_steps, runs, procs, ns, eps) -> float:
  import multiprocessing  # pylint: disable=g-import-not-at-top
  ctx = multiprocessing.get_context("spawn")
  barrier, queue = ctx.Barrier(procs), ctx.Queue()
  workers = [ctx.Process(target=_torch_worker, args=(
      arrays, eta, list(range(p, runs, procs)), max_steps, ns, eps, barrier, queue))
             for p in range(procs)]
  for w in workers:
    w.start()
  seconds = [queue.get()[0] for _ in workers]
  for w in workers:
    w.join()
  return max(seconds)


def gd_apply(config, autodiff: bool):
  """The ViT forward the GD rows differentiate: the study's (`model_fns`: the closed-form
  VJP of `one_layer_vit.apply_hand_vjp`) or, with `autodiff`, `apply` under JAX autodiff."""
  return vit.apply if autodiff else bo.model_fns(config, "vit")[1]


def early_stop_sweep(variant: str, runs: int, torch_runs: int, seed: int = 0,
                     autodiff: bool = False) -> dict:
  """The sweep's GD as the heat map runs it: `runs` grid points (N, ‖μ‖) drawn from the
  config's grid, each trained until its train loss < ε or max_steps (spec: the authors'
  heat-map rule), in the study's groups and as one vmap, against the authors' PyTorch loop
  with the same stopping rule on the first `torch_runs` of them (same data and weights).
  Rates in whole runs per second; the steps of the PyTorch runs are compared with JAX's."""
  config = bo_config.get_config(variant or None)
  t = config.train
  eta, max_steps, eps = float(t.learning_rate), int(t.max_steps), float(t.loss_threshold)
  n_grid, mu_grid, _ = bo.grid_points(config)
  sel = np.random.default_rng(seed).choice(len(n_grid), runs, replace=False)
  n_max = int(max(config.sweep.n_values))
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(seed), i))(jnp.asarray(sel))
  params, w_o, x, y = draw_runs(config, keys, jnp.asarray(mu_grid[sel]), n_max)
  mask = (jnp.arange(n_max)[None] < jnp.asarray(n_grid[sel])[:, None]).astype(jnp.float32)
  apply_fn = gd_apply(config, autodiff)
  fit = lambda p, w, x, y, m: gd.fit(apply_fn, p, w, x, y, m, eta=eta,
                                     max_steps=max_steps, eps=eps)[1]
  group = gd_sweep.resolved_vmap_size(config.sweep.get("vmap_size"))
  seconds, steps = {}, None
  for size in dict.fromkeys((group, 0)):
    _, steps, seconds[size] = _compiled_and_timed(gd_sweep.chunk_program(fit, size), params, w_o,
                                                  x, y, mask)
    steps = np.asarray(steps)
  # The study's chunks hold one N each (`sweep.pad_to` "chunk"): the same runs grouped by
  # N, each group trained on its N samples (no padding), one program per N.
  by_n = {}
  for v in np.unique(n_grid[sel]):
    rows = jnp.asarray(np.flatnonzero(n_grid[sel] == v))
    args = (jax.tree.map(lambda a, r=rows: a[r], params), w_o[rows], x[rows, :v],
            y[rows, :v], mask[rows, :v])
    by_n[int(v)] = (gd_sweep.chunk_program(fit, group).lower(*args).compile(), args, rows)
  per_n_steps = np.zeros_like(steps)
  for prog, args, rows in by_n.values():
    per_n_steps[np.asarray(rows)] = np.asarray(prog(*args))
  per_n_s = _best_time(lambda: [jax.block_until_ready(prog(*args))
                                for prog, args, _ in by_n.values()], 3)
  # The same in the study's concurrent streams (`sweep.streams`): each program's runs cut
  # into pieces of whole groups, run at once (one host thread each).
  # (The padding to whole pieces is done before timing: the study pads NumPy indices.)
  num_streams = streams.resolve(config.sweep.get("streams"))

  def pieces_of(args):
    fill, piece, pieces = gd_sweep.piece_indices(len(args[-1]), group, num_streams)
    return jax.tree.map(lambda a: a[fill], args), piece, pieces

  grouped = gd_sweep.chunk_program(fit, group)  # Jitted: compiles each pieces' shape once.
  whole = pieces_of((params, w_o, x, y, mask))
  streams_steps = gd_sweep.run_pieces(grouped, *whole)[:runs]  # (Also the warm-up.)
  streams_s = _best_time(lambda: gd_sweep.run_pieces(grouped, *whole), 3)
  per_n = [pieces_of(args) for _, args, _ in by_n.values()]
  for split in per_n:
    gd_sweep.run_pieces(grouped, *split)
  per_n_streams_s = _best_time(lambda: [gd_sweep.run_pieces(grouped, *split) for split in per_n], 3)
  out = {"sweep_runs": runs, "sweep_vmap_size": group, "sweep_streams": num_streams,
         "sweep_streams_same_steps_frac": float(np.mean(streams_steps == steps)),
         "sweep_streams_runs_per_s": runs / streams_s,
         "sweep_per_n_streams_runs_per_s": runs / per_n_streams_s,
         "sweep_mean_steps": float(steps.mean()), "sweep_max_steps": int(steps.max()),
         "sweep_grouped_runs_per_s": runs / seconds[group],
         "sweep_one_vmap_runs_per_s": runs / seconds[0],
         "sweep_per_n_runs_per_s": runs / per_n_s,
         "sweep_per_n_same_steps_frac": float(np.mean(per_n_steps == steps))}
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return out
  torch.set_num_threads(os.cpu_count())
  arrays = _numpy_runs(params, w_o, x, y)
  _torch_one_run(*arrays, eta, 0, 10)  # Warm-up.
  torch_steps = []
  best = _best_time(lambda: torch_steps.insert(0, [
      _torch_one_run(*arrays, eta, i, max_steps, n_grid[sel][i], eps)[1]
      for i in range(torch_runs)]), 3)
  torch_steps = torch_steps[0]
  torch_rate = torch_runs / best
  procs = streams.available_cores()
  procs_rate = torch_runs / torch_processes(arrays, eta, max_steps, torch_runs, procs,
                                            n_grid[sel], eps)
  return out | {
      "sweep_torch_processes": procs, "sweep_torch_processes_runs_per_s": procs_rate,
      "sweep_streams_speedup_vs_torch": out["sweep_streams_runs_per_s"] / torch_rate,
      "sweep_per_n_streams_speedup_vs_torch": (out["sweep_per_n_streams_runs_per_s"]
                                               / torch_rate),
      "sweep_streams_speedup_vs_torch_processes": (out["sweep_streams_runs_per_s"]
                                                   / procs_rate),
      "sweep_per_n_streams_speedup_vs_torch_processes": (
          out["sweep_per_n_streams_runs_per_s"] / procs_rate),
      "sweep_torch_runs": torch_runs, "sweep_torch_runs_per_s": torch_rate,
      "sweep_torch_mean_steps": float(np.mean(torch_steps)),
      "sweep_torch_same_steps_frac": float(np.mean(np.asarray(torch_steps)
                                                   == steps[:torch_runs])),
      "sweep_grouped_speedup_vs_torch": out["sweep_grouped_runs_per_s"] / torch_rate,
      "sweep_per_n_speedup_vs_torch": out["sweep_per_n_runs_per_s"] / torch_rate,
      "sweep_one_vmap_speedup_vs_torch": out["sweep_one_vmap_runs_per_s"] / torch_rate}


def bench(variant: str, runs: int, steps: int, eager_runs: int, eager_steps: int,
          torch_runs: int = 4, profile: int = 0, autodiff: bool = False) -> dict:
  """Fixed-steps GD rates. Every GD row differentiates `gd_apply(config, autodiff)` but
  `chunk_*`, the study's own program (closed-form VJP either way)."""
  config = bo_config.get_config(variant or None)
  apply_fn = gd_apply(config, autodiff)
  config.train.max_steps = steps
  config.train.loss_threshold = 1e-30  # Never stops early: exactly `steps` updates.
  n_max = int(max(config.sweep.n_values))
  mu = float(config.sweep.mu_norms[len(config.sweep.mu_norms) // 2])
  run_fn = bo.make_run_fn(config, "vit", n_max)
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(runs))
  ns = jnp.full((runs,), n_max, jnp.int32)
  mus = jnp.full((runs,), mu, jnp.float32)
  # The study's runs per vmapped group.
  group = gd_sweep.resolved_vmap_size(config.sweep.get("vmap_size"))
  chunk_s = {}
  for size in dict.fromkeys((group, 0)):  # The study's chunk, and one vmap over all runs.
    t0 = time.perf_counter()
    compiled = gd_sweep.chunk_program(run_fn, size).lower(keys, ns, mus).compile()
    if size == group:
      compile_s = time.perf_counter() - t0
    out = jax.device_get(compiled(keys, ns, mus))  # (Also the warm-up.)
    assert np.all(out["steps"] == steps), out["steps"]
    chunk_s[size] = _best_time(lambda c=compiled: c(keys, ns, mus), 3)
  vmapped_s = chunk_s[group]

  # FLOPs of one vmapped GD step (XLA cost analysis does not multiply loop trip counts).
  dc, v = config.data, config.vit
  params, w_o, x, y = draw_runs(config, keys, mus, n_max)
  mask = jnp.ones((runs, n_max))
  eta = float(config.train.learning_rate)
  step = jax.vmap(lambda p, w, x, y, m: gd.gd_step(apply_fn, p, w, x, y, m, eta))
  step_flops = _flops(jax.jit(step).lower(params, w_o, x, y, mask).compile())

  # The GD loop alone (pre-drawn data, no evaluation): what the sweep spends its time on.
  def gd_loop(p, w, x, y, m):
    body = lambda _, p: gd.gd_step(apply_fn, p, w, x, y, m, eta)[1]
    return jax.lax.fori_loop(0, steps, body, p)

  args = (params, w_o, x, y, mask)
  gd_only, gd_final, gd_s = _compiled_and_timed(jax.jit(jax.vmap(gd_loop)), *args)
  achieved = step_flops * steps / gd_s / 1e9
  # The same loop in the study's groups (`sweep.vmap_size`): lax.map over groups of runs.
  grouped_s = streams_s = gd_s
  num_streams = streams.resolve(config.sweep.get("streams"))
  if group:
    grouped_prog = gd_sweep.chunk_program(gd_loop, group)
    _, _, grouped_s = _compiled_and_timed(grouped_prog, *args)
    # The same in the study's concurrent streams (`sweep.streams`, `gd_sweep.run_pieces`).
    fill, piece, pieces = gd_sweep.piece_indices(runs, group, num_streams)
    padded = jax.tree.map(lambda a: a[fill], args)
    gd_sweep.run_pieces(grouped_prog, padded, piece, pieces)  # Compiles the pieces' shape.
    streams_s = _best_time(lambda: gd_sweep.run_pieces(grouped_prog, padded, piece, pieces), 3)
  top = gd_loop_profile(gd_only, args, steps, profile) if profile else []

  # The exact reduced-state solver (stretch): same updates, O(T² d_h) per step.
  red = jax.jit(jax.vmap(lambda p, w, x, y, m: reduced_vit_gd.fit(
      p, w, x, y, m, eta=eta, max_steps=steps, eps=1e-30)))
  _, _, red_s = _compiled_and_timed(red, *args)

  # Sequential, jitted step: loop over runs and steps in Python.
  one_step = jax.jit(lambda p, w, x, y, m: gd.gd_step(apply_fn, p, w, x, y, m, eta))
  take = lambda t, i: jax.tree.map(lambda a: a[i], t)
  jax.block_until_ready(one_step(take(params, 0), w_o[0], x[0], y[0], mask[0]))
  seq_runs = min(runs, max(2, eager_runs * 2))
  t0 = time.perf_counter()
  for i in range(seq_runs):
    p = take(params, i)
    for _ in range(steps):
      _, p = one_step(p, w_o[i], x[i], y[i], mask[i])
    jax.block_until_ready(p)
  seq_jit_rate = seq_runs * steps / (time.perf_counter() - t0)

  # Sequential eager (authors' style): op-by-op, no jit; a few runs and steps.
  with jax.disable_jit():
    p = take(params, 0)
    gd.gd_step(apply_fn, p, w_o[0], x[0], y[0], mask[0], eta)  # Warm the op caches.
    t0 = time.perf_counter()
    for i in range(eager_runs):
      p = take(params, i)
      for _ in range(eager_steps):
        _, p = gd.gd_step(apply_fn, p, w_o[i], x[i], y[i], mask[i], eta)
      jax.block_until_ready(p)
    eager_rate = eager_runs * eager_steps / (time.perf_counter() - t0)

  # The authors' PyTorch loop on the same data and initial weights (optional extra).
  torch_rate = torch_procs_rate = torch_rel_err = float("nan")
  procs = 0
  try:
    import torch  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    print('torch is not installed: pip install -e ".[bench]" for the PyTorch baseline',
          file=sys.stderr)
  else:
    torch_rate, wv_torch = torch_authors_loop(params, w_o, x, y, eta, steps,
                                              min(runs, torch_runs))
    procs = streams.available_cores()
    torch_procs_rate = min(runs, torch_runs) * steps / torch_processes(
        _numpy_runs(params, w_o, x, y), eta, steps, min(runs, torch_runs), procs)
    wv_jax = np.asarray(gd_final["wv"][0])
    torch_rel_err = float(np.linalg.norm(wv_torch - wv_jax) / np.linalg.norm(wv_jax))

  peak = matmul_peak(2048 if jax.default_backend() == "cpu" else 8192)
  rate = runs * steps / gd_s
  return {
      "variant": variant or "default", "backend": jax.default_backend(),
      "device": str(jax.devices()[0].device_kind), "cpu_count": os.cpu_count(),
      "machine": platform.processor() or platform.machine(),
      "d": int(dc.d), "M": int(dc.num_tokens), "N": n_max, "d_h": int(v.d_h), "d_v": int(v.d_v),
      "num_test": int(dc.num_test), "runs": runs, "steps": steps,
      "compile_s": compile_s, "vmapped_s": vmapped_s, "vmap_size": group,
      "chunk_run_steps_per_s": runs * steps / vmapped_s,
      "chunk_one_vmap_run_steps_per_s": runs * steps / chunk_s[0],
      "gd_only_s": gd_s, "vmapped_run_steps_per_s": rate,
      "grouped_run_steps_per_s": runs * steps / grouped_s,
      "streams": num_streams, "streams_run_steps_per_s": runs * steps / streams_s,
      "torch_processes": procs, "torch_processes_run_steps_per_s": torch_procs_rate,
      "streams_speedup_vs_torch": runs * steps / streams_s / torch_rate,
      "streams_speedup_vs_torch_processes": runs * steps / streams_s / torch_procs_rate,
      "sequential_jit_run_steps_per_s": seq_jit_rate,
      "sequential_eager_run_steps_per_s": eager_rate,
      "torch_authors_loop_run_steps_per_s": torch_rate,
      "torch_final_wv_rel_err": torch_rel_err,
      "torch_version": _torch_version(),
      "reduced_run_steps_per_s": runs * steps / red_s,
      "speedup_vs_torch": rate / torch_rate,
      "grouped_speedup_vs_torch": runs * steps / grouped_s / torch_rate,
      "reduced_speedup_vs_torch": runs * steps / red_s / torch_rate,
      "chunk_speedup_vs_torch": runs * steps / vmapped_s / torch_rate,
      "speedup_vs_eager": rate / eager_rate, "speedup_vs_seq_jit": rate / seq_jit_rate,
      "gd_step_gflop_per_run": step_flops / runs / 1e9,
      "achieved_gflops": achieved, "matmul_peak_gflops": peak,
      "fraction_of_peak": achieved / peak,
      "reduced_speedup_vs_eager": runs * steps / red_s / eager_rate,
      "profile": top,
  }


def gd_loop_profile(compiled, args, steps: int, top: int) -> list[dict]:
  """The `top` HLO instructions of the vmapped GD loop by time: ms per GD step (all runs
  together), share of the loop's instruction time, and what each instruction is."""
  lines = hlo_profile.instructions(compiled)
  times = hlo_profile.instruction_times(lines, lambda: compiled(*args), calls=2)
  total = sum(times.values()) or 1.0
  ranked = sorted(times.items(), key=lambda kv: -kv[1])[:top]
  return [dict(ms_per_step=us / steps / 1e3, share=us / total,
               instruction=hlo_profile.describe(lines[name])) for name, us in ranked]


def _torch_version() -> str:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return "not installed"
  return torch.__version__


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--variant", default="", help="config variant, e.g. '' or 'paper'")
  ap.add_argument("--runs", type=int, default=120)
  ap.add_argument("--steps", type=int, default=50)
  ap.add_argument("--eager_runs", type=int, default=2)
  ap.add_argument("--eager_steps", type=int, default=5)
  ap.add_argument("--torch_runs", type=int, default=4)
  ap.add_argument("--sweep_runs", type=int, default=120,
                  help="grid points for the early-stopping sweep comparison (0: skip)")
  ap.add_argument("--sweep_torch_runs", type=int, default=120,
                  help="of those, how many the PyTorch loop runs (the first ones)")
  ap.add_argument("--profile", type=int, default=0,
                  help="also print the N slowest HLO instructions of the vmapped GD loop")
  ap.add_argument("--autodiff", action="store_true",
                  help="GD rows differentiate one_layer_vit.apply with JAX autodiff instead "
                       "of the study's closed-form VJP (A/B of the two)")
  ap.add_argument("--json", default="")
  a = ap.parse_args()
  r = bench(a.variant, a.runs, a.steps, a.eager_runs, a.eager_steps, a.torch_runs,
            a.profile, a.autodiff)
  r["gd_gradient"] = "autodiff" if a.autodiff else "closed-form VJP"
  if a.sweep_runs:
    r |= early_stop_sweep(a.variant, a.sweep_runs, min(a.sweep_runs, a.sweep_torch_runs),
                          autodiff=a.autodiff)
  if r["profile"]:
    print("| ms per GD step (all runs) | share | HLO instruction |\n|---|---|---|")
    for row in r["profile"]:
      print(f"| {row['ms_per_step']:.2f} | {100 * row['share']:.1f} % | "
            f"`{row['instruction']}` |")
  print("| quantity | value |\n|---|---|")
  for k, v in r.items():
    if k == "profile":
      continue
    print(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |")
  if a.json:
    with open(a.json, "w") as f:
      json.dump(r, f, indent=2)


if __name__ == "__main__":
  main()
