"""Benchmark: the token-wise sensitivity estimator on this machine (CPU).

  python experiments/bench_sensitivity.py                  # ~3 min idle
  python experiments/bench_sensitivity.py --quick          # ~25 s idle
  python experiments/bench_sensitivity.py --json=/tmp/bench_sensitivity.json
  python experiments/bench_sensitivity.py --compare_torch=einsum,folded,xla_fused  # ~1 min
  python experiments/bench_sensitivity.py --compare_streams=folded                 # ~1 min
  python experiments/bench_sensitivity.py --plans             # ~5 min: default vs best plan
  python experiments/bench_sensitivity.py --plans --quick     # < 1 min smoke

Measures, and prints as markdown tables:
  * peak: the fp32 matmul peak, best jitted 2048x2048 @ 2048x2048 over the
    whole run (sampled between all other timings, so the ratios below use the
    machine's best moment, a conservative choice on a shared machine);
  * forward sweep: GFLOP/s of one jitted forward per forward batch size, the
    reason for the chunk sizes used below;
  * estimator: `token_sensitivity` (patch_size=p) for a ViT (28x28x1, width 128,
    depth 6, 4 heads, MLP 256) at patch 4 (T = 49) and 7 (T = 16) and the
    small CNN (patch 4), at batch 64 and 256, for several (chunk_size,
    example_chunk_size); evaluations/s = B * T * R / time, GFLOP/s = forward
    flops per example (XLA cost analysis of the forward) * B * (T * R + 1)
    (clean forward included) / time. XLA's cost analysis of the whole
    estimator counts each `lax.map` body once; its ratio to the forward-based
    count is printed in column `ca/fwd` to show this;
  * forward only: the same number of forwards at the same forward batch on
    pre-made inputs (the estimator's ceiling: its overhead is the gap);
  * baselines on the same (token, draw) evaluations: (a)
    `token_sensitivity_loop` (a Python loop over (token, draw) of jitted
    batch forwards); (b) the official code's per-example pattern written in
    JAX (for each example, token and draw, one jitted forward of batch 1),
    timed on a subsample of examples and extrapolated per evaluation — an
    emulation, not PyTorch (that is the next item);
  * default plan: `token_sensitivity` (and `text_token_sensitivity`) at its default sizes
    ('auto'), with chunk_size='tune', and at explicit forward batches, for the ViT p4, the
    CNN, the MLP and a text RoBERTa (B = 64, R = 1), interleaved, best and median of N,
    with the sizes each ran at (`plan`) and PyTorch eager / torch.compile on the same
    tokens for each model (`torch_baselines.bench_model`);
  * PyTorch (the real thing, `pip install -e ".[bench]"`; experiments/torch_baselines.py):
    the same ViT shapes in PyTorch on the same tokens of the first ViT case, the official
    per-example pattern, batched eager, and batched under `torch.compile`; the summary
    gives the estimator's speed as a ratio to each (same run, same machine);
  * memory: `memory_analysis()` of the compiled estimator (temp + argument +
    output bytes) as R grows, chunked vs unchunked (compiled, not run);
  * profile: the ViT forward's thunk time by op kind (XLA profiler trace)
    with analytic matmul flops per kind.
All timings are best-of-N, interleaved round-robin within each group so that
ratios compare the same moments of a noisy, shared machine. XLA flags and
thread counts are whatever the environment sets (recorded in the output).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import os
import platform
import re
import sys
import time
from typing import Any, Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
import flax
import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from experiments import hlo_profile, machine
from xsens.measures import sensitivity as sens
from xsens.measures import sensitivity_loop
from xsens.measures import text_sensitivity as ts
from xsens.measures import tokens as tokens_lib
from xsens.models import get_model
# pylint: enable=g-import-not-at-top

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
VIT_KW = dict(width=128, depth=6, num_heads=4, mlp_dim=256)
SIGMA = 1.0
PEAK_N = 2048


# ----------------------------------------------------------------------------
# Machine and timing helpers.
# ----------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
  """nproc, CPU model, versions, XLA_FLAGS and load average."""
  return dict(
      nproc=len(os.sched_getaffinity(0)), cpu_model=machine.cpu_model(),
      machine=platform.machine(), python=platform.python_version(),
      jax=jax.__version__, jaxlib=jaxlib.__version__, flax=flax.__version__,
      backend=jax.default_backend(), devices=str(jax.devices()),
      xla_flags=os.environ.get("XLA_FLAGS", ""),
      loadavg_start=os.getloadavg())


def _flops(compiled) -> float:
  ca = compiled.cost_analysis()
  if isinstance(ca, (list, tuple)):
    ca = ca[0]
  return float(ca.get("flops", float("nan")))


def _memory(compiled) -> dict[str, int]:
  m = compiled.memory_analysis()
  out = dict(temp=int(m.temp_size_in_bytes),
             argument=int(m.argument_size_in_bytes),
             output=int(m.output_size_in_bytes))
  out["total"] = out["temp"] + out["argument"] + out["output"]
  return out


class Timer:
  """Best-of-N wall times of thunks, interleaved; also samples the peak."""

  def __init__(self):
    a = jax.random.normal(jax.random.key(0), (PEAK_N, PEAK_N), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (PEAK_N, PEAK_N), jnp.float32)
    mm = jax.jit(jnp.matmul).lower(a, b).compile()
    self._peak_thunk = lambda: mm(a, b)
    self._peak_thunk().block_until_ready()
    self.peak_best_s = math.inf

  @property
  def peak_gflops(self) -> float:
    return 2 * PEAK_N**3 / self.peak_best_s / 1e9

  def sample_peak(self, n: int = 1) -> None:
    for _ in range(n):
      t0 = time.perf_counter()
      self._peak_thunk().block_until_ready()
      self.peak_best_s = min(self.peak_best_s, time.perf_counter() - t0)

  def best(self, thunks: dict[str, Callable[[], Any]], rounds: int,
           warm_up: tuple[str, ...] = ()) -> dict[str, dict[str, float]]:
    """{name: dict(s=best wall seconds, cpu=process CPU / wall at best)}.

    Args:
      thunks: name -> zero-argument callable (AOT-compiled where possible).
      rounds: N of best-of-N; the thunks run round-robin.
      warm_up: names to run once, untimed, first: those that compile on
        their first call. The others are AOT-compiled already.
    """
    for name, fn in thunks.items():
      if name in warm_up:
        jax.block_until_ready(fn())
    out = {k: dict(s=math.inf, cpu=float("nan")) for k in thunks}
    for _ in range(rounds):
      self.sample_peak()
      for name, fn in thunks.items():
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn())
        wall = time.perf_counter() - t0
        if wall < out[name]["s"]:
          out[name] = dict(s=wall, cpu=(time.process_time() - c0) / wall)
    return out


# ----------------------------------------------------------------------------
# Models.
# ----------------------------------------------------------------------------


def build_model(name: str, patch_size: int, attention_impl: str = "einsum"):
  """(label, predict_fn(variables, images), variables); `attention_impl` for the ViT;
  name "vit", "cnn" or "mlp" (the registry's defaults: hidden 512, 128)."""
  if name == "vit":
    model = get_model("vit", NUM_CLASSES, IMAGE_SHAPE, patch_size=patch_size,
                      attention_impl=attention_impl, **VIT_KW)
    label = f"ViT p{patch_size}"
  else:
    model = get_model(name, NUM_CLASSES, IMAGE_SHAPE)
    label = f"{name.upper()} p{patch_size}"
  x = jnp.zeros((1, *IMAGE_SHAPE), jnp.float32)
  variables = model.init(jax.random.key(1), x)
  return label, (lambda v, im: model.apply(v, im, train=False)), variables


def forward_flops_per_example(apply, variables, batch: int) -> float:
  x = jnp.zeros((batch, *IMAGE_SHAPE), jnp.float32)
  return _flops(jax.jit(apply).lower(variables, x).compile()) / batch


def images_for(batch: int, seed: int = 0) -> jax.Array:
  return jax.random.normal(jax.random.key(seed), (batch, *IMAGE_SHAPE))


# ----------------------------------------------------------------------------
# Estimator, baselines.
# ----------------------------------------------------------------------------


def estimator_fn(apply, patch_size: int, num_draws: int,
                 chunk_size, example_chunk_size):
  def fn(variables, images, key):
    out = sens.token_sensitivity(
        apply, variables, images, key=key, patch_size=patch_size,
        sigma=SIGMA, num_draws=num_draws, chunk_size=chunk_size,
        example_chunk_size=example_chunk_size)
    return out["per_token"], out["mean"]
  return fn


def loop_thunk(apply, variables, images, key, patch_size, num_draws):
  """Baseline (a): `token_sensitivity_loop`, T * R jitted batch forwards."""
  return lambda: sensitivity_loop.token_sensitivity_loop(
      apply, variables, images, key=key, patch_size=patch_size, sigma=SIGMA,
      num_draws=num_draws)["per_token"]


def per_example_thunk(apply, variables, images, key, patch_size, num_draws,
                      num_examples):
  """Baseline (b): per example, token and draw, one jitted batch-1 forward.

  The pattern of the official PyTorch code (estija/sensitivity, language/
  utils.py `embedding_label_sensitivity`): clone the example, add noise to
  one token, run the model on that single input. Runs `num_examples`
  examples; returns (thunk, evaluations per call).
  """
  token_fn, tok = tokens_lib.token_view(apply, images[:num_examples],
                                        patch_size)  # tok [n, T, D]
  t, d = tok.shape[1:]

  @jax.jit
  def clean(v, x1):
    return jnp.argmax(token_fn(v, x1), -1)

  @jax.jit
  def one(v, x1, y1, q):                             # x1 [1, T, D]
    noise = jax.random.normal(jax.random.fold_in(key, q), (1, d))
    x1 = x1.at[:, q // num_draws].add(SIGMA * noise)
    return jnp.argmax(token_fn(v, x1), -1) != y1

  def thunk():
    flips = []
    for b in range(num_examples):
      x1 = tok[b:b + 1]
      y1 = clean(variables, x1)
      for q in range(t * num_draws):
        flips.append(one(variables, x1, y1, jnp.int32(q)))
    return flips

  return thunk, num_examples * t * num_draws


# ----------------------------------------------------------------------------
# Sections.
# ----------------------------------------------------------------------------


def forward_sweep(timer, models, batches, rounds):
  """GFLOP/s of one jitted forward per forward batch size."""
  rows = []
  for name, patch in models:
    label, apply, variables = build_model(name, patch)
    thunks, flops = {}, {}
    for fb in batches:
      x = images_for(fb)
      compiled = jax.jit(apply).lower(variables, x).compile()
      flops[fb] = _flops(compiled)
      # Repeat small batches so each sample is >= ~20 ms of work.
      reps = max(1, 256 // fb)
      thunks[fb] = (lambda c=compiled, x=x, reps=reps:
                    [c(variables, x) for _ in range(reps)])
      flops[fb] *= reps
    times = timer.best(thunks, rounds, warm_up=tuple(thunks))
    for fb in batches:
      gf = flops[fb] / times[fb]["s"] / 1e9
      rows.append(dict(model=label, forward_batch=fb, gflops=gf,
                       cpu_util=times[fb]["cpu"],
                       mflop_per_example=flops[fb] / max(1, 256 // fb) / fb
                       / 1e6))
      print(f"  {label:8s} forward batch {fb:5d}: {gf:6.1f} GFLOP/s "
            f"(cpu {times[fb]['cpu']:.2f})", flush=True)
  return rows


def estimator_case(timer, name, patch, batch, num_draws, configs, rounds,
                   per_example_n, with_forward_only=True):
  """Estimator configs and baselines for one (model, batch, R).

  with_forward_only=False skips the forward-only reference to keep the
  default run short.
  """
  label, apply, variables = build_model(name, patch)
  t = (IMAGE_SHAPE[0] // patch) * (IMAGE_SHAPE[1] // patch)
  images, key = images_for(batch), jax.random.key(2)
  fpe = forward_flops_per_example(apply, variables, 64)
  evals = batch * t * num_draws
  model_flops = fpe * batch * (t * num_draws + 1)

  thunks, meta = {}, {}
  # Reference: the same number of forwards at the first config's forward
  # batch on pre-made inputs, under lax.map like the estimator's chunks.
  cs, ecs = configs[0]
  fb0 = min(ecs or batch, batch) * min(cs or t * num_draws, t * num_draws)
  total = batch * (t * num_draws + 1)
  if with_forward_only and total % fb0 == 0:
    inputs = jax.random.normal(jax.random.key(3),
                               (total // fb0, fb0, *IMAGE_SHAPE))
    fwd = jax.jit(lambda v, xs: jax.lax.map(
        lambda x: jnp.argmax(apply(v, x), -1), xs)).lower(
            variables, inputs).compile()
    thunks["forward only"] = lambda: fwd(variables, inputs)
    meta["forward only"] = dict(forward_batch=fb0, ca_flops=_flops(fwd))
  for cs, ecs in configs:
    fn = estimator_fn(apply, patch, num_draws, cs, ecs)
    compiled = jax.jit(fn).lower(variables, images, key).compile()
    name_ = f"chunk={cs} examples={ecs}"
    fb = min(ecs or batch, batch) * min(cs or t * num_draws, t * num_draws)
    meta[name_] = dict(chunk_size=cs, example_chunk_size=ecs,
                       forward_batch=fb, ca_flops=_flops(compiled))
    thunks[name_] = (lambda c=compiled: c(variables, images, key))
  thunks["(a) loop"] = loop_thunk(apply, variables, images, key, patch,
                                  num_draws)
  pe_thunk, pe_evals = per_example_thunk(apply, variables, images, key, patch,
                                         num_draws, per_example_n)
  thunks["(b) per-example"] = pe_thunk
  # The loop compiles on its first call: with rounds >= 2 the best-of drops
  # that call, so it is not warmed up separately (it is the slowest thunk).
  times = timer.best(thunks, max(2, rounds), warm_up=("(b) per-example",))

  rows = []
  pe_per_eval = times["(b) per-example"]["s"] / pe_evals
  for k, tm in times.items():
    if k == "(b) per-example":
      seconds, note = pe_per_eval * evals, (
          f"extrapolated from {pe_evals} evaluations "
          f"({per_example_n} examples)")
    else:
      seconds, note = tm["s"], ""
    row = dict(model=label, tokens=t, batch=batch, num_draws=num_draws,
               method=k, seconds=seconds, evals_per_s=evals / seconds,
               gflops=model_flops / seconds / 1e9, cpu_util=tm["cpu"],
               note=note)
    row["pct_peak"] = 100 * row["gflops"] / timer.peak_gflops
    if k in meta:
      row.update(meta[k])
      row["ca_over_forward_flops"] = meta[k]["ca_flops"] / model_flops
    rows.append(row)
  best = min((r for r in rows if r["method"].startswith("chunk=")),
             key=lambda r: r["seconds"])
  for r in rows:
    r["time_vs_best_estimator"] = r["seconds"] / best["seconds"]
  return rows


def memory_table(patch, batch, draws_list, chunk_sizes):
  """memory_analysis() bytes of the compiled ViT estimator (not run)."""
  label, apply, variables = build_model("vit", patch)
  images, key = images_for(batch), jax.random.key(2)
  rows = []
  for r in draws_list:
    for cs, ecs in chunk_sizes:
      fn = estimator_fn(apply, patch, r, cs, ecs)
      compiled = jax.jit(fn).lower(variables, images, key).compile()
      t = (IMAGE_SHAPE[0] // patch) * (IMAGE_SHAPE[1] // patch)
      rows.append(dict(model=label, batch=batch, tokens=t, num_draws=r,
                       chunk_size=cs, example_chunk_size=ecs,
                       **_memory(compiled)))
      m = rows[-1]
      print(f"  R={r:3d} chunk={cs} examples={ecs}: total "
            f"{m['total'] / 2**20:9.1f} MiB (temp {m['temp'] / 2**20:.1f})",
            flush=True)
  return rows


def _vit_kind(op_name: str) -> str:
  if "hqk" in op_name or "qhd" in op_name or "softmax" in op_name:
    return "attention (QK^T, softmax, AV)"
  if "dot_general" in op_name:
    return "dense matmuls (QKV, out, MLP, head)"
  if "conv" in op_name:
    return "patch embedding (conv)"
  if "LayerNorm" in op_name or "encoder_norm" in op_name:
    return "LayerNorm"
  if "MlpBlock" in op_name:
    return "GELU / bias"
  return "other elementwise (bias, residual, transpose, concat)"


def vit_matmul_flops(patch: int, batch: int) -> dict[str, float]:
  """Analytic matmul flops of the ViT forward per op kind (batch examples)."""
  t = (IMAGE_SHAPE[0] // patch) * (IMAGE_SHAPE[1] // patch)
  n, d, m = t + 1, VIT_KW["width"], VIT_KW["mlp_dim"]
  dense = VIT_KW["depth"] * (2 * n * d * 4 * d + 2 * 2 * n * d * m)
  dense += 2 * d * NUM_CLASSES
  attention = VIT_KW["depth"] * 2 * 2 * n * n * d
  embed = 2 * t * patch * patch * IMAGE_SHAPE[2] * d
  return {"dense matmuls (QKV, out, MLP, head)": dense * batch,
          "attention (QK^T, softmax, AV)": attention * batch,
          "patch embedding (conv)": embed * batch}


def profile_vit(patch: int, batch: int, calls: int) -> list[dict[str, Any]]:
  """Thunk time of the ViT forward by op kind, from a profiler trace."""
  _, apply, variables = build_model("vit", patch)
  x = images_for(batch)
  compiled = jax.jit(apply).lower(variables, x).compile()
  kinds = {}
  for name, line in hlo_profile.instructions(compiled).items():
    op = re.search(r'op_name="([^"]+)"', line)
    kinds[name] = _vit_kind(op.group(1) if op else line)
  times = hlo_profile.instruction_times(kinds, lambda: compiled(variables, x), calls)
  if not times:
    return []
  us = collections.Counter()
  for name, t in times.items():
    us[kinds[name]] += t
  total = sum(us.values())
  flops = vit_matmul_flops(patch, batch)
  rows = []
  for kind, v in us.most_common():
    fl = flops.get(kind, 0.0)
    rows.append(dict(kind=kind, us=v, share=100 * v / total,
                     matmul_gflop=fl / 1e9,
                     gflops=fl / (v * 1e-6) / 1e9 if fl else 0.0))
  return rows


# ----------------------------------------------------------------------------
# Printing.
# ----------------------------------------------------------------------------


def torch_section(cases, rounds: int, quick: bool) -> list[dict[str, Any]]:
  """PyTorch patterns on the first ViT case's shapes; [] when torch is not installed."""
  try:
    import torch_baselines  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    print(f"  skipped ({e}): pip install -e \".[bench]\" for the PyTorch baselines")
    return []
  vit_cases = [r for r in cases if r["model"].startswith("ViT")]
  if not vit_cases:
    return []
  first = vit_cases[0]
  key = (first["model"], first["batch"], first["num_draws"])
  same = [r for r in vit_cases if (r["model"], r["batch"], r["num_draws"]) == key
          and r["method"].startswith("chunk=")]
  best = max(same, key=lambda r: r["evals_per_s"])
  patch = int(first["model"].split("p")[-1])
  _, tok = tokens_lib.token_view(lambda v, x: x, images_for(first["batch"]), patch)
  res = torch_baselines.bench(
      np.asarray(tok), sigma=SIGMA, num_draws=first["num_draws"], vit_kw=VIT_KW,
      num_classes=NUM_CLASSES, rounds=rounds, per_example_n=1 if quick else 2)
  print(f"  torch {res['torch_version']}, {res['torch_threads']} threads: " + ", ".join(
      f"{k} {v:,.0f}" for k, v in res.items() if k.endswith("evals_per_s")), flush=True)
  label = f"{first['model']} B={first['batch']} R={first['num_draws']}"
  return [{"case": label, "xsens_evals_per_s": best["evals_per_s"], "pattern": k[:-len(
      "_evals_per_s")], "torch_evals_per_s": v, "ratio": best["evals_per_s"] / v,
           "torch_version": res["torch_version"], "compile_s": res.get("compile_s")}
          for k, v in res.items() if k.endswith("evals_per_s")]


def matmul_ceiling(timer: Timer, batch: int, patch: int, rounds: int) -> list[dict[str, Any]]:
  """GFLOP/s of the ViT forward's own matmul shapes, alone (forward batch `batch`).

  Rows: the dense projections ([B·(T+1), width] · [width, n]) and attention's two batched
  matmuls with heads folded ([B·H, T+1, Dh] · [B·H, Dh, T+1] and back); the share of
  the forward's matmul FLOPs each carries, and its rate as % of the run's peak. The
  FLOP-weighted time of these shapes alone bounds what the whole forward can reach.
  """
  t = (IMAGE_SHAPE[0] // patch) ** 2 + 1
  w, h, m = VIT_KW["width"], VIT_KW["num_heads"], VIT_KW["mlp_dim"]
  rows_, dh = batch * t, w // h
  shapes = {  # name: (lhs shape, rhs shape, uses per layer)
      "Q, K, V, out proj [B·T, w]·[w, w]": ((rows_, w), (w, w), 4),
      "MLP in [B·T, w]·[w, mlp]": ((rows_, w), (w, m), 1),
      "MLP out [B·T, mlp]·[mlp, w]": ((rows_, m), (m, w), 1),
      "attention QKᵀ [B·H, T, Dh]·[B·H, Dh, T]": ((batch * h, t, dh), (batch * h, dh, t), 1),
      "attention AV [B·H, T, T]·[B·H, T, Dh]": ((batch * h, t, t), (batch * h, t, dh), 1),
  }
  reps = 20  # Calls per timed thunk: one matmul is well under a millisecond.
  thunks, flops = {}, {}
  for name, (ls, rs, uses) in shapes.items():
    a = jax.random.normal(jax.random.key(0), ls, jnp.float32)
    b = jax.random.normal(jax.random.key(1), rs, jnp.float32)
    mm = jax.jit(jnp.matmul).lower(a, b).compile()
    thunks[name] = lambda mm=mm, a=a, b=b: [mm(a, b) for _ in range(reps)][-1]
    flops[name] = 2 * math.prod(ls) * rs[-1], uses
  best = timer.best(thunks, rounds)
  per_layer = sum(f * u for f, u in flops.values())
  out, total_s = [], 0.0
  for name, (fl, uses) in flops.items():
    gf = fl * reps / best[name]["s"] / 1e9
    share = fl * uses / per_layer
    total_s += share / gf
    out.append(dict(shape=name, gflops=gf, pct_peak=100 * gf / timer.peak_gflops,
                    flop_share=share))
  out.append(dict(shape="FLOP-weighted, all of the above", gflops=1 / total_s,
                  pct_peak=100 / total_s / timer.peak_gflops, flop_share=1.0))
  print(f"\n## The ViT p{patch} forward's matmul shapes alone (forward batch {batch}; "
        f"peak {timer.peak_gflops:.1f} GFLOP/s)")
  print("| matmul | share of matmul FLOPs | GFLOP/s | % peak |\n|---|---|---|---|")
  for r in out:
    print(f"| {r['shape']} | {100 * r['flop_share']:.1f} % | {r['gflops']:.1f} | "
          f"{r['pct_peak']:.0f} % |")
  return out


def _vs_torch_row(seconds: float, evals: int, flops: float, peak: float,
                  torch_rates: dict[str, float]) -> dict[str, Any]:
  """Rates of a JAX timing and its ratio to each PyTorch rate (evals/s)."""
  return dict(seconds=seconds, evals_per_s=evals / seconds, gflops=flops / seconds / 1e9,
              pct_peak=100 * flops / seconds / 1e9 / peak,
              vs_torch={k: evals / seconds / v for k, v in torch_rates.items()})


def _print_vs_torch(label: str, rows: dict[str, dict], peak: float,
                    torch_rates: dict[str, float]) -> None:
  print(f"peak {peak:.1f} GFLOP/s; PyTorch evals/s: " + ", ".join(
      f"{k} {v:,.0f}" for k, v in torch_rates.items()))
  print(f"| {label} | evals/s | GFLOP/s | % peak | " + " | ".join(
      f"/ {k}" for k in torch_rates) + " |")
  print("|---|---|---|---|" + "---|" * len(torch_rates))
  for name, r in rows.items():
    print(f"| {name} | {r['evals_per_s']:,.0f} | {r['gflops']:.1f} | {r['pct_peak']:.0f}% | "
          + " | ".join(f"{v:.2f}×" for v in r["vs_torch"].values()) + " |")


def torch_comparison(impls, rounds: int, batch: int = 64, patch: int = 4,
                     num_draws: int = 1) -> dict[str, Any]:
  """ViT p`patch`, B = `batch`: the estimator (forward batch B) per attention core against
  the PyTorch patterns on the same token arrays. The JAX cores are timed before and after
  PyTorch (best of both); GFLOP/s counts the `einsum` forward's FLOPs (same arithmetic)."""
  import torch_baselines  # pylint: disable=import-outside-toplevel
  timer = Timer()
  timer.sample_peak(5)
  t = (IMAGE_SHAPE[0] // patch) ** 2
  images, key = images_for(batch), jax.random.key(2)
  thunks = {}
  for impl in impls:
    _, apply, variables = build_model("vit", patch, attention_impl=impl)
    if not thunks:
      flops = forward_flops_per_example(apply, variables, batch) * batch * (t * num_draws + 1)
    compiled = jax.jit(estimator_fn(apply, patch, num_draws, 1, None)).lower(
        variables, images, key).compile()
    thunks[impl] = lambda c=compiled, v=variables: c(v, images, key)
  before = timer.best(thunks, rounds)
  _, tok = tokens_lib.token_view(lambda v, x: x, images, patch)
  res = torch_baselines.bench(np.asarray(tok), sigma=SIGMA, num_draws=num_draws,
                              vit_kw=VIT_KW, num_classes=NUM_CLASSES, rounds=rounds,
                              per_example_n=2)
  after = timer.best(thunks, rounds)
  evals = batch * t * num_draws
  torch_rates = {k[:-len("_evals_per_s")]: v for k, v in res.items()
                 if k.endswith("_evals_per_s")}
  rows = {impl: _vs_torch_row(min(before[impl]["s"], after[impl]["s"]), evals, flops,
                             timer.peak_gflops, torch_rates) | dict(
                                 attention_impl=impl, cpu_util=before[impl]["cpu"])
          for impl in impls}
  print(f"\n## ViT p{patch}, B = {batch}, R = {num_draws}: estimator (forward batch {batch}) "
        f"per attention core vs PyTorch {res['torch_version']} ({res['torch_threads']} threads)")
  _print_vs_torch("attention", rows, timer.peak_gflops, torch_rates)
  rows = list(rows.values())
  ceiling = matmul_ceiling(timer, batch, patch, rounds)
  return dict(peak_gflops=timer.peak_gflops, torch=res, rows=rows, matmul_ceiling=ceiling)


def streams_comparison(impl: str, rounds: int, batch: int = 64, patch: int = 4,
                       num_streams: int | None = None) -> dict[str, Any]:
  """ViT p`patch` (attention core `impl`), R = 1, on S batches of `batch` images, S =
  `num_streams` (default: one per core, `xsens.train.streams.resolve`): the estimator one
  batch after another and S batches at once (one host thread each, as
  `sensitivity_vision` measures with `sensitivity.streams`), against PyTorch's batched
  pattern one batch after another and in S threads (`torch_baselines.bench_streams`), on
  the same token arrays; JAX timed before and after PyTorch, best of both."""
  import torch_baselines  # pylint: disable=import-outside-toplevel
  from xsens.train import streams  # pylint: disable=import-outside-toplevel
  num_streams = streams.resolve(num_streams)
  timer = Timer()
  timer.sample_peak(5)
  t = (IMAGE_SHAPE[0] // patch) ** 2
  _, apply, variables = build_model("vit", patch, attention_impl=impl)
  flops = forward_flops_per_example(apply, variables, batch) * batch * (t + 1) * num_streams
  batches = [images_for(batch, seed=i) for i in range(num_streams)]
  key = jax.random.key(2)
  compiled = jax.jit(estimator_fn(apply, patch, 1, 1, None)).lower(
      variables, batches[0], key).compile()
  call = lambda x: jax.device_get(compiled(variables, x, key))
  thunks = {"one_by_one": lambda: [call(x) for x in batches],
            "streams": lambda: streams.ordered_map(call, batches, num_streams)}
  before = timer.best(thunks, rounds)
  tokens = np.stack([np.asarray(tokens_lib.token_view(lambda v, x: x, x, patch)[1])
                     for x in batches])
  res = torch_baselines.bench_streams(tokens, sigma=SIGMA, vit_kw=VIT_KW,
                                      num_classes=NUM_CLASSES, rounds=rounds)
  after = timer.best(thunks, rounds)
  evals = num_streams * batch * t
  torch_rates = {k[:-len("_evals_per_s")]: v for k, v in res.items()
                 if k.endswith("_evals_per_s")}
  rows = {name: _vs_torch_row(min(before[name]["s"], after[name]["s"]), evals, flops,
                             timer.peak_gflops, torch_rates) for name in thunks}
  print(f"\n## ViT p{patch} ({impl}), {num_streams} batches of B = {batch}, R = 1: the "
        f"estimator one batch after another and in {num_streams} streams vs PyTorch "
        f"{res['torch_version']}")
  _print_vs_torch("xsens", rows, timer.peak_gflops, torch_rates)
  return dict(peak_gflops=timer.peak_gflops, streams=num_streams, attention_impl=impl,
              torch=res, rows=rows)


# The text model of the plan rows: the RoBERTa of `sensitivity_language`'s synthetic
# variant (width 64, depth 2, 4 heads, MLP 128) on sequences of its maximum length.
TEXT_KW = dict(vocab_size=64, max_length=26, width=64, depth=2, num_heads=4, mlp_dim=128)


def _plan_case(name: str, batch: int, quick: bool):
  """The plan rows' case of one model (the ViT at patch 7 when quick): {label, evals,
  flops (per run), fns ({plan name: jitted (variables, x, key) -> the estimator's dict}),
  variables, x, tokens [B, T, D] (what is perturbed), torch_model (torch_baselines module
  -> the same shapes in PyTorch)}; the plans: 'auto' (the default), 'tune' (not when
  quick) and explicit forward batches."""
  fbs = (8, 64) if quick else (16, 32, 64, 128, 256, 512, 1024)
  if name == "text":
    model = get_model("roberta", 2, (TEXT_KW["max_length"],), **TEXT_KW)
    ids = jax.random.randint(jax.random.key(0), (batch, TEXT_KW["max_length"]), 5,
                             TEXT_KW["vocab_size"])
    variables = model.init(jax.random.key(1), ids)
    x = model.apply(variables, ids, method=model.embed)
    mask = jnp.ones(ids.shape, bool)
    encode = lambda v, x, m: model.apply(v, x, m, method=model.encode)
    t = x.shape[1]
    plans = {"default ('auto')": "auto"} if quick else {"default ('auto')": "auto",
                                                        "'tune'": "tune"}
    plans.update({f"chunk={c}": c for c in (1, 2, 4, 8, 16) if c * batch in fbs or c == 1})
    fns = {k: jax.jit(lambda v, x, key, c=c: ts.text_token_sensitivity(
        encode, v, x, key=key, token_mask=mask, sigma=SIGMA, num_draws=1, chunk_size=c))
           for k, c in plans.items()}
    flops = _flops(jax.jit(encode).lower(variables, x, mask).compile()) / batch
    label = "RoBERTa (text)"
    tokens = x
    torch_model = lambda tb: tb.TokenText(
        num_classes=2, **{k: v for k, v in TEXT_KW.items()
                          if k in ("width", "depth", "num_heads", "mlp_dim")})
  else:
    patch = 7 if (quick and name == "vit") else 4
    label, _, variables = build_model(name, patch)
    # As `TrainResult.apply_fn`, so the defaults include what the estimator finds in the
    # model (`token_split`).
    kw = dict(patch_size=patch, **VIT_KW) if name == "vit" else {}
    apply = functools.partial(get_model(name, NUM_CLASSES, IMAGE_SHAPE, **kw).apply,
                              train=False)
    x = images_for(batch)
    t = (IMAGE_SHAPE[0] // patch) ** 2
    plans = {"default ('auto')": ("auto", "auto")}
    if not quick:
      plans["'tune'"] = ("tune", "auto")
    for fb in fbs:
      if fb < batch:
        plans[f"chunk=1 examples={fb}"] = (1, fb)
      elif fb // batch <= t:
        plans[f"chunk={fb // batch} examples=None"] = (fb // batch, None)
    fns = {k: jax.jit(lambda v, x, key, c=c, e=e: sens.token_sensitivity(
        apply, v, x, key=key, patch_size=patch, sigma=SIGMA, num_draws=1, chunk_size=c,
        example_chunk_size=e)) for k, (c, e) in plans.items()}
    flops = forward_flops_per_example(apply, variables, batch)
    _, tokens = tokens_lib.token_view(lambda v, im: im, x, patch)
    d = tokens.shape[-1]
    torch_model = {
        "vit": lambda tb: tb.TokenViT(d, t, num_classes=NUM_CLASSES, **VIT_KW),
        "cnn": lambda tb: tb.TokenCNN(patch, IMAGE_SHAPE[2], IMAGE_SHAPE[0],
                                      num_classes=NUM_CLASSES),
        "mlp": lambda tb: tb.TokenMLP(t * d, num_classes=NUM_CLASSES)}[name]
  return dict(label=label, evals=batch * t, flops=flops * batch * (t + 1), fns=fns,
              variables=variables, x=x, tokens=np.asarray(tokens), torch_model=torch_model)


def plan_rows(timer: Timer, rounds: int, quick: bool, batch: int = 64,
              with_torch: bool = True) -> list[dict[str, Any]]:
  """The default plan beside 'tune' and explicit forward batches, per model (ViT, CNN,
  MLP, text; B = `batch`, R = 1), interleaved best-of-`rounds` (the median too), and
  PyTorch (eager, compiled) on the same tokens where torch is installed."""
  rows = []
  for name in ("vit", "cnn", "mlp", "text"):
    case = _plan_case(name, batch, quick)
    label, evals, flops, fns = case["label"], case["evals"], case["flops"], case["fns"]
    variables, x = case["variables"], case["x"]
    key = jax.random.key(2)
    compiled, sizes = {}, {}
    for k, fn in fns.items():
      t0 = time.perf_counter()
      compiled[k] = fn.lower(variables, x, key).compile()   # 'tune' times here.
      sizes[k] = {n: int(v) for n, v in compiled[k](variables, x, key)["plan"].items()}
      if k.startswith(("default", "'tune'")):
        print(f"  {label} {k}: {sizes[k]}, compiled in {time.perf_counter() - t0:.1f} s",
              flush=True)
    samples = {k: [] for k in compiled}
    for _ in range(rounds):
      timer.sample_peak()
      for k, c in compiled.items():
        t0 = time.perf_counter()
        jax.block_until_ready(c(variables, x, key))
        samples[k].append(time.perf_counter() - t0)
    best = min(min(v) for v in samples.values())
    for k, v in samples.items():
      v = sorted(v)
      rows.append(dict(model=label, plan=k, forward_batch=sizes[k]["forward_batch"],
                       seconds=v[0], median_s=v[len(v) // 2], worst_s=v[-1],
                       evals_per_s=evals / v[0], gflops=flops / v[0] / 1e9,
                       vs_best=best / v[0]))
      print(f"  {label:15s} {k:28s} fwd batch {rows[-1]['forward_batch']!s:>5} "
            f"{v[0]:7.3f} s (median {v[len(v) // 2]:.3f}) "
            f"{evals / v[0]:10,.0f} evals/s  {best / v[0]:.2f} of best", flush=True)
    if with_torch:
      chunks = sorted({1, sizes["default ('auto')"]["chunk_size"]})
      rows += _torch_plan_rows(case, chunks, quick, rounds, best)
  return rows


def _torch_plan_rows(case: dict[str, Any], chunks: Sequence[int], quick: bool, rounds: int,
                     best_s: float) -> list[dict[str, Any]]:
  """PyTorch's batched pattern (eager and, unless quick, torch.compile) on the case's
  tokens, `chunk` tokens noised per forward call (forward batch B * chunk) for each of
  `chunks`; [] without torch."""
  try:
    from experiments import torch_baselines  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    print(f"  PyTorch rows skipped ({e})")
    return []
  label, evals, tokens = case["label"], case["evals"], case["tokens"]
  rows = []
  for chunk in chunks:
    torch_baselines.torch.manual_seed(0)
    res = torch_baselines.bench_model(case["torch_model"](torch_baselines), tokens,
                                      sigma=SIGMA, chunk=chunk, rounds=rounds,
                                      compile_model=not quick)
    for k, v in res.items():
      if k.endswith("_evals_per_s"):
        rows.append(dict(model=label, plan=f"PyTorch {res['torch_version']} {k[:-12]}",
                         forward_batch=tokens.shape[0] * chunk, seconds=evals / v,
                         median_s=None, worst_s=None, evals_per_s=v, gflops=None,
                         vs_best=v * best_s / evals))
        print(f"  {label:15s} {rows[-1]['plan']:36s} fwd batch "
              f"{rows[-1]['forward_batch']:>5} {v:10,.0f} evals/s  "
              f"{rows[-1]['vs_best']:.2f} of best", flush=True)
  return rows


def print_plan_rows(rows: list[dict[str, Any]]) -> None:
  print("\n## Default plan against the best plan (token sensitivity, R = 1)")
  print("| model | plan | fwd batch | best s | median s | evals/s | GFLOP/s | of best |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    med = "" if r["median_s"] is None else f"{r['median_s']:.3f}"
    gf = "" if r["gflops"] is None else f"{r['gflops']:.1f}"
    print(f"| {r['model']} | {r['plan']} | {r['forward_batch']} | {r['seconds']:.3f} | "
          f"{med} | {r['evals_per_s']:,.0f} | {gf} | {r['vs_best']:.2f} |")


def _fmt_bytes(n: int) -> str:
  return f"{n / 2**20:,.1f} MiB"


def print_cases(rows, peak):
  print(f"\nPeak (fp32 matmul {PEAK_N}^3, best over run): {peak:.1f} GFLOP/s")
  print("| model | T | B | R | method | fwd batch | s | evals/s | GFLOP/s | "
        "% peak | time / best estimator | cpu/wall | ca/fwd |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    ca = r.get("ca_over_forward_flops")
    print(f"| {r['model']} | {r['tokens']} | {r['batch']} | {r['num_draws']} "
          f"| {r['method']} | {r.get('forward_batch', '')} "
          f"| {r['seconds']:.3f} | {r['evals_per_s']:,.0f} "
          f"| {r['gflops']:.1f} | {r['pct_peak']:.0f}% "
          f"| {r['time_vs_best_estimator']:.2f} | {r['cpu_util']:.2f} "
          f"| {'' if ca is None else f'{ca:.3f}'} |")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="< 1 min: fewer models, sizes and repeats.")
  parser.add_argument("--json", default=None, help="write results here.")
  parser.add_argument("--rounds", type=int, default=None,
                      help="best-of-N rounds per timing (default 3, quick 2).")
  parser.add_argument("--forward_batch", type=int, default=64,
                      help="target examples per forward call for the "
                           "'sensible' estimator config.")
  parser.add_argument("--compare_torch", default=None,
                      help="only the ViT p4 B=64 estimator per attention core (comma list "
                           "of einsum, folded, xla_fused) against PyTorch (the `bench` "
                           "extra), and the forward's matmul shapes alone, then exit.")
  parser.add_argument("--plans", action="store_true",
                      help="only the default plan beside 'tune' and explicit forward "
                           "batches for the ViT, CNN, MLP and a text model (and PyTorch "
                           "on each), then exit; with --quick: B = 8, ViT p7, no 'tune' "
                           "and no torch.compile, < 1 min.")
  parser.add_argument("--compare_streams", default=None,
                      help="only the ViT p4 estimator (this attention core) on one batch "
                           "of B = 64 per core, one after another and in concurrent "
                           "streams, against PyTorch the same two ways, then exit.")
  args = parser.parse_args(argv)
  rounds = args.rounds or (2 if args.quick else 3)
  if args.plans:
    info = machine_info()
    print("## Machine\n" + "\n".join(f"  {k}: {v}" for k, v in info.items()), flush=True)
    timer = Timer()
    rows = plan_rows(timer, 1 if args.quick and not args.rounds else rounds, args.quick,
                     batch=8 if args.quick else 64)
    print_plan_rows(rows)
    info["loadavg_end"] = os.getloadavg()
    print(f"peak {timer.peak_gflops:.1f} GFLOP/s; loadavg start {info['loadavg_start']}, "
          f"end {info['loadavg_end']}")
    out = dict(machine=info, peak_gflops=timer.peak_gflops, plans=rows, quick=args.quick)
    if args.json:
      with open(args.json, "w") as f:
        json.dump(out, f, indent=1, default=str)
    return out
  if args.compare_torch or args.compare_streams:
    info = machine_info()
    print("## Machine\n" + "\n".join(f"  {k}: {v}" for k, v in info.items()), flush=True)
    out = (torch_comparison(args.compare_torch.split(","), rounds) if args.compare_torch
           else streams_comparison(args.compare_streams, rounds))
    out["machine"], out["loadavg_end"] = info, os.getloadavg()
    print(f"loadavg start {info['loadavg_start']}, end {out['loadavg_end']}")
    if args.json:
      with open(args.json, "w") as f:
        json.dump(out, f, indent=1, default=str)
    return out
  fb = args.forward_batch
  t_start = time.perf_counter()

  def section(title):
    print(f"\n## {title} [{time.perf_counter() - t_start:.0f} s]", flush=True)

  info = machine_info()
  print("## Machine")
  for k, v in info.items():
    print(f"  {k}: {v}")
  timer = Timer()
  timer.sample_peak(5)
  print(f"  matmul peak (initial best of 5): {timer.peak_gflops:.1f} GFLOP/s",
        flush=True)

  section("Forward sweep")
  sweep_models = [("vit", 4)] if args.quick else [("vit", 4), ("vit", 7),
                                                   ("cnn", 4)]
  sweep_batches = [64, 256] if args.quick else [16, 32, 64, 128, 256, 512]
  sweep = forward_sweep(timer, sweep_models, sweep_batches, rounds)

  section("Estimator and baselines")

  def sensible(batch, pairs):
    """(chunk_size, example_chunk_size) giving forward batches of ~fb."""
    if batch >= fb:
      return (1, fb if batch > fb else None)
    return (min(pairs, max(1, fb // batch)), None)

  if args.quick:
    plan = [("vit", 7, 64, 1), ("cnn", 4, 64, 1)]
  else:
    plan = [("vit", 4, 64, 1), ("vit", 4, 256, 1), ("vit", 7, 64, 4),
            ("vit", 7, 256, 1), ("cnn", 4, 64, 1), ("cnn", 4, 256, 1)]
  cases = []
  for name, patch, batch, r in plan:
    t = (IMAGE_SHAPE[0] // patch) ** 2
    configs = [sensible(batch, t * r)]
    if batch > fb:
      configs.append((1, None))                    # Forward batch = B.
    if not args.quick and batch <= fb:
      configs.append((max(1, 4 * fb // batch), None))  # Forward batch 4 fb.
      configs.append((None, None))                 # One forward of B * T * R.
    configs = list(dict.fromkeys(configs))
    heavy = name == "vit" and patch == 4 and batch > fb   # ~5 s per call.
    case = estimator_case(
        timer, name, patch, batch, r, configs,
        rounds=max(2, rounds - 1) if heavy else rounds,
        with_forward_only=not heavy,
        per_example_n=1 if (args.quick or name == "vit" and patch == 4) else 2)
    for row in case:
      print(f"  {row['model']} B={batch} R={r} {row['method']:28s} "
            f"{row['seconds']:8.3f} s {row['evals_per_s']:10,.0f} evals/s "
            f"{row['gflops']:6.1f} GFLOP/s", flush=True)
    cases.extend(case)

  section("PyTorch baselines")
  torch_rows = torch_section(cases, rounds, args.quick)

  plans = []
  if not args.quick:
    section("Default plan against the best plan")
    plans = plan_rows(timer, rounds, quick=False)

  section("Memory (compiled, not run)")
  draws = [1, 4] if args.quick else [1, 4, 16, 64]
  mem = memory_table(4, 64, draws, [(1, None), (4, None), (None, None)]
                     if not args.quick else [(1, None), (None, None)])

  section("Profile of the ViT forward")
  prof_batches = (fb,) if args.quick else (fb, 4 * fb)
  prof = {pb: profile_vit(4, pb, calls=3 if args.quick else 5)
          for pb in prof_batches}

  info["loadavg_end"] = os.getloadavg()
  peak = timer.peak_gflops
  for r in cases:                                  # Final (best) peak.
    r["pct_peak"] = 100 * r["gflops"] / peak
  for r in sweep:
    r["pct_peak"] = 100 * r["gflops"] / peak

  print("\n# Results")
  print(f"loadavg start {info['loadavg_start']}, end {info['loadavg_end']}")
  print("\n## Forward GFLOP/s by forward batch")
  print("| model | MFLOP/example | " + " | ".join(
      f"B={b}" for b in sweep_batches) + " |")
  print("|---|---|" + "---|" * len(sweep_batches))
  for label in dict.fromkeys(r["model"] for r in sweep):
    rs = [r for r in sweep if r["model"] == label]
    print(f"| {label} | {rs[0]['mflop_per_example']:.1f} | " + " | ".join(
        f"{r['gflops']:.0f} ({r['pct_peak']:.0f}%)" for r in rs) + " |")
  print("\n## Estimator and baselines")
  print_cases(cases, peak)
  print("\n## Memory of the compiled ViT p4 estimator, B = 64: "
        "temp + argument + output")
  print("| R | T x R | chunk_size | example_chunk_size | temp | argument | "
        "output | total |")
  print("|---|---|---|---|---|---|---|---|")
  for m in mem:
    print(f"| {m['num_draws']} | {m['tokens'] * m['num_draws']} | "
          f"{m['chunk_size']} | "
          f"{m['example_chunk_size']} | {_fmt_bytes(m['temp'])} | "
          f"{_fmt_bytes(m['argument'])} | {_fmt_bytes(m['output'])} | "
          f"{_fmt_bytes(m['total'])} |")
  print("\n## ViT p4 forward: thunk time by op kind (profiler trace)")
  print("| op kind | " + " | ".join(
      f"B={pb}: us/example | share | GFLOP/s" for pb in prof) + " |")
  print("|---|" + "---|---|---|" * len(prof))
  kinds = list(dict.fromkeys(p["kind"] for rows in prof.values()
                             for p in rows))
  for kind in kinds:
    cells = []
    for pb, rows in prof.items():
      p = next((p for p in rows if p["kind"] == kind), None)
      if p is None:
        cells.append("- | - | -")
      else:
        gf = f"{p['gflops']:.0f}" if p["matmul_gflop"] else "-"
        cells.append(f"{p['us'] / pb:.1f} | {p['share']:.0f}% | {gf}")
    print(f"| {kind} | " + " | ".join(cells) + " |")
  print("\n## Summary: best estimator config per case")
  print("| model | T | B | R | config | fwd batch | evals/s | GFLOP/s | % peak "
        "| estimator / forward-only time (same fwd batch) | (a) loop / "
        "estimator time | (b) per-example / estimator time |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  for key in dict.fromkeys((r["model"], r["batch"], r["num_draws"])
                           for r in cases):
    rs = [r for r in cases if (r["model"], r["batch"], r["num_draws"]) == key]
    est = min((r for r in rs if r["method"].startswith("chunk=")),
              key=lambda r: r["seconds"])
    ratio = {r["method"]: r["seconds"] / est["seconds"] for r in rs}
    fwd = [r for r in rs if r["method"] == "forward only"]
    same = [r for r in rs if fwd and r["method"].startswith("chunk=")
            and r["forward_batch"] == fwd[0]["forward_batch"]]
    if same:
      ratio["forward only"] = same[0]["seconds"] / fwd[0]["seconds"]
    fmt = lambda k: f"{ratio[k]:.2f}" if k in ratio else "-"
    print(f"| {est['model']} | {est['tokens']} | {est['batch']} | "
          f"{est['num_draws']} | {est['method']} | {est['forward_batch']} | "
          f"{est['evals_per_s']:,.0f} | {est['gflops']:.1f} | "
          f"{est['pct_peak']:.0f}% | {fmt('forward only')} | "
          f"{fmt('(a) loop')} | {fmt('(b) per-example')} |")
  if plans:
    print_plan_rows(plans)
  if torch_rows:
    print("\n## Against PyTorch (same shapes, same tokens, this run)")
    print("| case | xsens estimator evals/s | PyTorch pattern | PyTorch evals/s | "
          "xsens / PyTorch |")
    print("|---|---|---|---|---|")
    for r in torch_rows:
      print(f"| {r['case']} | {r['xsens_evals_per_s']:,.0f} | {r['pattern']} | "
            f"{r['torch_evals_per_s']:,.0f} | {r['ratio']:.2f} |")
  elapsed = time.perf_counter() - t_start
  print(f"\nTotal benchmark time: {elapsed:.0f} s")

  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(machine=info, peak_gflops=peak, forward_sweep=sweep,
                     estimator=cases, torch=torch_rows, memory=mem, profile=prof, plans=plans,
                     seconds=elapsed, quick=args.quick), f, indent=1,
                default=str)
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
