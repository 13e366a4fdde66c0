"""Benchmark: ViT training throughput by compute dtype and attention core (this CPU).

  python experiments/bench_training.py              # ViT-S/16, ViT-B/16 at 224², ~5 min
  python experiments/bench_training.py --small      # a tiny ViT at 32², seconds (tested)
  python experiments/bench_training.py --json=bench_training.json

Measures, and prints as markdown tables:
  * peaks: the best jitted n×n @ n×n matmul in float32 and in bfloat16 (n = 2048 on CPU,
    8192 on an accelerator), sampled between the other timings over the whole run (the
    machine's best moment, a conservative choice on a shared machine);
  * training: one jitted SGD-momentum step (softmax cross-entropy, float32 params and
    optimizer state) of ViT-S/16 and ViT-B/16 (Dosovitskiy et al. 2021) on random 224²
    images, 1000 classes, for `model.dtype` ∈ {float32, bfloat16} × `model.attention_impl`
    ∈ {einsum (the models' attention before issue 16), folded, xla_fused}
    (xsens/models/attention.py); images/s = batch / best step time; GFLOP/s = XLA cost
    analysis of the float32 "einsum" step (the same arithmetic for every variant) / time;
    % peak against the matmul peak of the variant's dtype;
  * sensitivity: `xsens.measures.sensitivity.token_sensitivity` of the ViT of
    experiments/bench_sensitivity.py (28×28×1, patch 4, width 128, depth 6, 4 heads, MLP
    256), B 64, R 1, forward batch 64, per attention core; GFLOP/s counted as that script
    counts it (forward flops per example × B × (T·R + 1) / time), % of the fp32 peak.
All timings are best-of-N with the variants run round-robin, so ratios within one run
compare the same moments of a noisy, shared machine; compare only ratios across runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
import jax
import jax.numpy as jnp
import optax

from experiments import machine
from xsens.measures import sensitivity as sens
from xsens.models import get_model
# pylint: enable=g-import-not-at-top

VIT_S16 = dict(patch_size=16, width=384, depth=12, num_heads=6, mlp_dim=1536)
VIT_B16 = dict(patch_size=16, width=768, depth=12, num_heads=12, mlp_dim=3072)
TINY = dict(patch_size=8, width=32, depth=2, num_heads=2, mlp_dim=64)
SENS_VIT = dict(patch_size=4, width=128, depth=6, num_heads=4, mlp_dim=256)
DTYPES = ("float32", "bfloat16")
CPU_IMPLS = ("einsum", "folded", "xla_fused")


def _flops(compiled) -> float:
  ca = compiled.cost_analysis()
  if isinstance(ca, (list, tuple)):
    ca = ca[0]
  return float(ca.get("flops", float("nan")))


class Peaks:
  """Best matmul GFLOP/s per dtype, sampled whenever `sample` is called."""

  def __init__(self, n: int, dtypes=DTYPES):
    self.n, self.best_s, self._fns = n, {}, {}
    for dt in dtypes:
      a = jax.random.normal(jax.random.key(0), (n, n)).astype(dt)
      b = jax.random.normal(jax.random.key(1), (n, n)).astype(dt)
      mm = jax.jit(jnp.matmul).lower(a, b).compile()
      self._fns[dt] = (lambda mm=mm, a=a, b=b: mm(a, b))
      self.best_s[dt] = math.inf
    self.sample(2)

  def sample(self, rounds: int = 1) -> None:
    for _ in range(rounds):
      for dt, fn in self._fns.items():
        t0 = time.perf_counter()
        fn().block_until_ready()
        self.best_s[dt] = min(self.best_s[dt], time.perf_counter() - t0)

  def gflops(self, dtype: str) -> float:
    return 2 * self.n ** 3 / self.best_s[dtype] / 1e9


def best_times(thunks: dict[str, Callable[[], Any]], rounds: int,
               peaks: Peaks) -> dict[str, float]:
  """{name: best wall seconds} over `rounds` round-robin calls (after one warm-up call
  each), sampling the matmul peaks once per round."""
  for fn in thunks.values():
    jax.block_until_ready(fn())
  best = {k: math.inf for k in thunks}
  for _ in range(rounds):
    peaks.sample()
    for name, fn in thunks.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      best[name] = min(best[name], time.perf_counter() - t0)
  return best


def train_step_fn(model, tx) -> Callable:
  """(params, opt_state, images [B, H, W, C], labels [B]) -> (params, opt_state, loss)."""
  def step(params, opt_state, images, labels):
    def loss_fn(p):
      logits = model.apply({"params": p}, images, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  return step


def compile_train_step(fields: dict, image: int, batch: int, num_classes: int, **launch):
  """(thunk running one step on fixed inputs, compiled step, compile seconds)."""
  shape = (image, image, 3)
  model = get_model("vit", num_classes, shape, **fields, **launch)
  params = model.init(jax.random.key(0), jnp.zeros((1, *shape)))["params"]
  tx = optax.sgd(0.01, momentum=0.9)
  opt_state = tx.init(params)
  images = jax.random.normal(jax.random.key(1), (batch, *shape))
  labels = jnp.arange(batch) % num_classes
  t0 = time.perf_counter()
  compiled = jax.jit(train_step_fn(model, tx)).lower(params, opt_state, images,
                                                      labels).compile()
  compile_s = time.perf_counter() - t0
  return (lambda: compiled(params, opt_state, images, labels)), compiled, compile_s


def training_rows(label: str, fields: dict, image: int, batch: int, num_classes: int,
                  dtypes, impls, rounds: int, peaks: Peaks) -> list[dict]:
  """One row per (dtype, attention_impl) of one model."""
  thunks, meta, flops = {}, {}, None
  for dt in dtypes:
    for impl in impls:
      thunk, compiled, compile_s = compile_train_step(
          fields, image, batch, num_classes, dtype=dt, attention_impl=impl)
      if flops is None:   # float32 einsum: the reference count of the step's arithmetic.
        flops = _flops(compiled)
      thunks[(dt, impl)] = thunk
      meta[(dt, impl)] = compile_s
  times = best_times(thunks, rounds, peaks)
  ref = times[(dtypes[0], impls[0])]
  rows = []
  for (dt, impl), s in times.items():
    gflops = flops / s / 1e9
    rows.append(dict(model=label, image=image, batch=batch, dtype=dt, attention_impl=impl,
                     step_s=s, images_per_s=batch / s, gflops=gflops,
                     pct_peak=100 * gflops / peaks.gflops(dt), compile_s=meta[(dt, impl)],
                     speedup=ref / s, step_gflop=flops / 1e9))
  return rows


def sensitivity_rows(impls, rounds: int, peaks: Peaks, *, fields=SENS_VIT, image=28,
                     batch: int = 64, dtype: str = "float32", peak_dtype: str = "float32",
                     forward_batch: int = 64) -> list[dict]:
  """Token-sensitivity estimator speed per attention core (module docstring)."""
  shape = (image, image, fields.get("channels", 1))
  fields = {k: v for k, v in fields.items() if k != "channels"}
  p = fields["patch_size"]
  t = (image // p) ** 2
  images = jax.random.normal(jax.random.key(0), (batch, *shape))
  key = jax.random.key(2)
  thunks, fpe = {}, None
  for impl in impls:
    model = get_model("vit", 10, shape, **fields, dtype=dtype, attention_impl=impl)
    variables = model.init(jax.random.key(1), jnp.zeros((1, *shape)))
    apply = lambda v, x, m=model: m.apply(v, x, train=False)
    if fpe is None:
      x = jnp.zeros((forward_batch, *shape))
      fpe = _flops(jax.jit(apply).lower(variables, x).compile()) / forward_batch

    def fn(v, x, k, apply=apply):
      out = sens.token_sensitivity(apply, v, x, key=k, patch_size=p, sigma=1.0,
                                   num_draws=1, chunk_size=max(1, forward_batch // batch),
                                   example_chunk_size=min(batch, forward_batch)
                                   if batch > forward_batch else None)
      return out["per_token"]
    compiled = jax.jit(fn).lower(variables, images, key).compile()
    thunks[impl] = (lambda c=compiled, v=variables: c(v, images, key))
  times = best_times(thunks, rounds, peaks)
  model_flops = fpe * batch * (t + 1)
  ref = times[impls[0]]
  return [dict(model=f"ViT p{p} w{fields['width']} d{fields['depth']}", batch=batch,
               tokens=t, dtype=dtype, attention_impl=impl, seconds=s,
               evals_per_s=batch * t / s, gflops=model_flops / s / 1e9,
               pct_peak=100 * model_flops / s / 1e9 / peaks.gflops(peak_dtype),
               speedup=ref / s)
          for impl, s in times.items()]


def machine_info() -> dict[str, Any]:
  return dict(cpus=len(os.sched_getaffinity(0)), cpu_model=machine.cpu_model(), machine=platform.machine(),
              backend=jax.default_backend(), device=jax.devices()[0].device_kind,
              jax=jax.__version__, xla_flags=os.environ.get("XLA_FLAGS", ""),
              loadavg_start=os.getloadavg())


def print_training(rows: list[dict]) -> None:
  print("| model | batch | dtype | attention | step (s) | images/s | GFLOP/s | % peak "
        "| vs first | compile (s) |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['model']} {r['image']}² | {r['batch']} | {r['dtype']} | "
          f"{r['attention_impl']} | {r['step_s']:.3f} | {r['images_per_s']:.2f} | "
          f"{r['gflops']:.1f} | {r['pct_peak']:.1f} | {r['speedup']:.2f}× | "
          f"{r['compile_s']:.1f} |")


def print_sensitivity(rows: list[dict]) -> None:
  print("| model | B | dtype | attention | time (s) | evals/s | GFLOP/s | % peak | vs first |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['model']} | {r['batch']} | {r['dtype']} | {r['attention_impl']} | "
          f"{r['seconds']:.3f} | {r['evals_per_s']:,.0f} | {r['gflops']:.1f} | "
          f"{r['pct_peak']:.1f} | {r['speedup']:.2f}× |")


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--small", action="store_true",
                      help="a tiny ViT at 32² and a small estimator case (seconds).")
  parser.add_argument("--batch", type=int, default=4, help="training batch (default 4).")
  parser.add_argument("--rounds", type=int, default=None, help="best-of-N (default 2).")
  parser.add_argument("--models", default="s16,b16", help="s16, b16 (comma-separated).")
  parser.add_argument("--dtypes", default=",".join(DTYPES), help="compute dtypes.")
  parser.add_argument("--impls", default=",".join(CPU_IMPLS), help="attention cores.")
  parser.add_argument("--json", default=None, help="write the results here.")
  args = parser.parse_args(argv)
  rounds = args.rounds or 2
  dtypes, impls = tuple(args.dtypes.split(",")), tuple(args.impls.split(","))
  t_start = time.perf_counter()
  info = machine_info()
  print("## Machine\n" + "\n".join(f"  {k}: {v}" for k, v in info.items()), flush=True)
  peaks = Peaks(256 if args.small else 2048, dtypes)

  if args.small:
    plan = [("tiny ViT/8", TINY, 32, 10)]
  else:
    named = {"s16": ("ViT-S/16", VIT_S16, 224, 1000), "b16": ("ViT-B/16", VIT_B16, 224, 1000)}
    plan = [named[m] for m in args.models.split(",")]
  train = []
  for label, fields, image, classes in plan:
    print(f"\n## Training: {label} [{time.perf_counter() - t_start:.0f} s]", flush=True)
    rows = training_rows(label, fields, image, args.batch, classes, dtypes, impls, rounds,
                         peaks)
    print_training(rows)
    train += rows

  print(f"\n## Token sensitivity [{time.perf_counter() - t_start:.0f} s]", flush=True)
  sens_kw = dict(fields=dict(TINY, patch_size=4), image=16, batch=8) if args.small else {}
  sens_rows = sensitivity_rows(impls, rounds, peaks, **sens_kw)
  print_sensitivity(sens_rows)

  info["loadavg_end"] = os.getloadavg()
  out = dict(machine=info, peaks_gflops={dt: peaks.gflops(dt) for dt in dtypes},
             training=train, sensitivity=sens_rows,
             total_s=time.perf_counter() - t_start)
  print(f"\n## Peaks (best over the run): " + ", ".join(
      f"{dt} {g:.1f} GFLOP/s" for dt, g in out["peaks_gflops"].items()))
  print(f"  load average: start {info['loadavg_start']}, end {info['loadavg_end']}; "
        f"total {out['total_s']:.0f} s")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  main()
