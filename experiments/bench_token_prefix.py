"""Benchmark: `token_sensitivity` with and without reuse of the per-token prefix (CPU).

  python experiments/bench_token_prefix.py             # ~6 min idle on 2 cores
  python experiments/bench_token_prefix.py --quick     # ~1 min
  python experiments/bench_token_prefix.py --cases=vit_d1_p4,ola_n16_d64 --rounds=7

For each model (the ViT of experiments/bench_sensitivity.py at several depths and patch
sizes, the one-layer attention layer, the one-layer ViT of Jiang et al.) and each chunk
plan, the jitted estimator runs with `token_split=None` (plain: every copy's whole
forward) and `token_split="always"` (the clean pass's prefix reused), AOT-compiled,
interleaved A/B in one process for `--rounds` rounds. Printed: evals/s = B * T * R / time
(best of the rounds, and the median), the speed-up best/best and the spread of the
per-round ratios (min, median, max; each round times both variants back to back), the
model's `prefix_share` (what "auto" decides from), and whether the two results agree
(per-example flip frequencies equal). The CPU model and load average are printed too:
on a shared machine the per-round ratios are the figure to read.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
import jax
import jax.numpy as jnp
import numpy as np

from experiments import machine
from xsens.measures import sensitivity as sens
from xsens.measures import token_prefix
from xsens.models import get_model
# pylint: enable=g-import-not-at-top

SIGMA = 1.0
VIT_KW = dict(width=128, num_heads=4, mlp_dim=256)
IMAGE_SHAPE = (28, 28, 1)


def _vit(depth, patch_size, attention_impl="einsum"):
  def build():
    model = get_model("vit", 10, IMAGE_SHAPE, patch_size=patch_size, depth=depth,
                      attention_impl=attention_impl, **VIT_KW)
    x = jax.random.normal(jax.random.key(0), (1, *IMAGE_SHAPE))
    return (functools.partial(model.apply, train=False), model.init(jax.random.key(1), x),
            IMAGE_SHAPE, patch_size)
  return build


def _one_layer_attention(n, d):
  def build():
    model = get_model("one_layer_attention", 2, (n, d))
    x = jax.random.normal(jax.random.key(0), (1, n, d))
    return functools.partial(model.apply, train=False), model.init(jax.random.key(1), x), (
        n, d), None
  return build


def _one_layer_vit(m, d, d_h):
  def build():
    model = get_model("one_layer_vit", 2, (m, d), d_h=d_h, d_v=d_h)
    x = jax.random.normal(jax.random.key(0), (1, m, d))
    apply = token_prefix.with_output(functools.partial(model.apply, train=False),
                                     lambda f: jnp.stack([-f, f], -1))
    return apply, model.init(jax.random.key(1), x), (m, d), None
  return build


CASES = {
    "vit_d6_p4": _vit(6, 4),            # experiments/bench_sensitivity.py's ViT, T = 49.
    "vit_d6_p7": _vit(6, 7),            # T = 16.
    "vit_d2_p4": _vit(2, 4),
    "vit_d1_p4": _vit(1, 4),
    "vit_d1_p7": _vit(1, 7),
    "vit_d6_p4_folded": _vit(6, 4, "folded"),
    "ola_n16_d64": _one_layer_attention(16, 64),
    "ola_n64_d32": _one_layer_attention(64, 32),
    "olvit_m16_d64": _one_layer_vit(16, 64, 64),
}
QUICK = ("vit_d1_p4", "vit_d6_p4", "ola_n16_d64")
# (chunk_size, example_chunk_size): the default plan, and forward batches of about 64.
PLANS = {"auto": ("auto", "auto"), "fb64": (None, None)}


def _plan_sizes(name, batch, num_pairs):
  if name == "fb64":
    return max(1, min(num_pairs, 64 // batch)), None
  return PLANS[name]


def run_case(name, batch, num_draws, plans, rounds):
  apply, variables, shape, patch = CASES[name]()
  x = jax.random.normal(jax.random.key(2), (batch, *shape))
  split = token_prefix.find_split(apply, patch, shape)
  t = (shape[0] // patch) * (shape[1] // patch) if patch else shape[0]
  rows = []
  for plan in plans:
    chunk, examples = _plan_sizes(plan, batch, t * num_draws)
    fns = {}
    for variant, option in (("plain", None), ("reuse", "always")):
      def fn(v, x, key, option=option):
        out = sens.token_sensitivity(apply, v, x, key=key, sigma=SIGMA,
                                     num_draws=num_draws, patch_size=patch,
                                     chunk_size=chunk, example_chunk_size=examples,
                                     token_split=option)
        return out["per_example"]
      fns[variant] = jax.jit(fn).lower(variables, x, jax.random.key(3)).compile()
    outs = {k: np.asarray(f(variables, x, jax.random.key(3))) for k, f in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(rounds):
      for k, f in fns.items():
        t0 = time.perf_counter()
        jax.block_until_ready(f(variables, x, jax.random.key(3)))
        times[k].append(time.perf_counter() - t0)
    evals = batch * t * num_draws
    ratios = [a / b for a, b in zip(times["plain"], times["reuse"])]
    rows.append(dict(
        case=name, plan=plan, chunk=chunk, examples=examples, batch=batch, tokens=t,
        draws=num_draws, prefix_share=round(split.prefix_share, 3),
        plain_best=evals / min(times["plain"]), plain_median=evals / statistics.median(
            times["plain"]),
        reuse_best=evals / min(times["reuse"]), reuse_median=evals / statistics.median(
            times["reuse"]),
        speedup_best=min(times["plain"]) / min(times["reuse"]),
        ratio_min=min(ratios), ratio_median=statistics.median(ratios),
        ratio_max=max(ratios),
        equal=bool(np.array_equal(outs["plain"], outs["reuse"]))))
    print_row(rows[-1])
  return rows


def print_row(r):
  print(f"| {r['case']} | {r['plan']} ({r['chunk']}, {r['examples'] or 'all'}) | "
        f"{r['prefix_share']:.3f} | {r['plain_best']:,.0f} ({r['plain_median']:,.0f}) | "
        f"{r['reuse_best']:,.0f} ({r['reuse_median']:,.0f}) | {r['speedup_best']:.2f} | "
        f"{r['ratio_min']:.2f} / {r['ratio_median']:.2f} / {r['ratio_max']:.2f} | "
        f"{'yes' if r['equal'] else 'NO'} |", flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--cases", default=None, help="comma-separated; default all")
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--plans", default="auto,fb64")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--num_draws", type=int, default=1)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--json", default=None, help="write the rows here")
  args = parser.parse_args()
  cases = (args.cases.split(",") if args.cases else
           list(QUICK if args.quick else CASES))
  rounds = 3 if args.quick and args.rounds == 5 else args.rounds
  print(f"CPU: {machine.cpu_model()}; nproc {len(os.sched_getaffinity(0))}; "
        f"jax {jax.__version__}; load average {os.getloadavg()}; B {args.batch}, "
        f"R {args.num_draws}, {rounds} rounds; min prefix_share for 'auto': "
        f"{token_prefix.MIN_PREFIX_SHARE}")
  print("| case | plan (chunk, examples) | prefix_share | plain evals/s best (median) | "
        "reuse evals/s best (median) | speed-up best/best | per-round ratio min / median "
        "/ max | equal |")
  print("|---|---|---|---|---|---|---|---|")
  rows = []
  for name in cases:
    rows += run_case(name, args.batch, args.num_draws, args.plans.split(","), rounds)
  print(f"load average at the end {os.getloadavg()}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(cpu=machine.cpu_model(), rows=rows), f, indent=1)


if __name__ == "__main__":
  main()
