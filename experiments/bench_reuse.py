"""Benchmark: cost of reuse attention vs a standard ViT on this machine.

Bhojanapalli et al. 2021, "Leveraging redundancy in attention with Reuse
Transformers", arXiv 2110.06821.

  python experiments/bench_reuse.py                 # ~2-4 min on 2 CPU cores
  python experiments/bench_reuse.py --quick         # < 1 min
  python experiments/bench_reuse.py --json=/tmp/bench_reuse.json

For a ViT (depth 4, width 64, 4 heads, MLP 128, CLS pooling) on 28x28x1 (and
32x32x3 for longer sequences) and every (P, K) in {0, H/2, H} x {L/2, L-1}
(P = 0 is the baseline ViT) and several patch sizes (sequence lengths T), prints
a markdown table of:
  * forward GFLOPs of one batch and the attention part (XLA cost analysis;
    attention = model minus the same model with every attention sub-layer
    skipped);
  * peak temp memory of one loss+grad step (XLA `memory_analysis()`);
  * step time of one jitted loss+grad call, best of N, interleaved round-robin
    across the grid so every config sees the same moments of a noisy machine.
Randomly initialised weights (costs do not depend on the values).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
import jax
import jax.numpy as jnp
import optax

from xsens.lab import model_cost
from xsens.models import get_model


def _configs(quick: bool):
  depth, heads = 4, 4
  grid = [(0, 0)] + [(p, k) for p in (heads // 2, heads) for k in (depth // 2, depth - 1)]
  shapes = [((28, 28, 1), 7), ((28, 28, 1), 4), ((32, 32, 3), 2)]
  if quick:
    shapes = shapes[:2]
    grid = [(0, 0), (heads, depth - 1)]
  for image_shape, patch in shapes:
    for p, k in grid:
      yield image_shape, patch, p, k


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  base = dict(width=64, depth=4, num_heads=4, mlp_dim=128)
  entries = []
  for image_shape, patch, p, k in _configs(args.quick):
    if p == 0:
      model = get_model("vit", 10, image_shape, patch_size=patch, **base)
    else:
      model = get_model("reuse_vit", 10, image_shape, patch_size=patch, reuse_heads=p,
                        reuse_layers=k, **base)
    x = jax.random.normal(jax.random.key(0), (args.batch, *image_shape))
    y = jnp.zeros((args.batch,), jnp.int32)
    variables = jax.jit(lambda x, m=model: m.init(jax.random.key(1), x))(x[:1])
    total = model_cost.forward_flops(model, variables, x)
    attn = model_cost.attention_flops(model, variables, x)

    def loss(params, x, y, m=model, v=variables):
      logits = m.apply({**v, "params": params}, x, train=False)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    step = jax.jit(jax.value_and_grad(loss)).lower(variables["params"], x, y).compile()
    temp = step.memory_analysis().temp_size_in_bytes
    jax.block_until_ready(step(variables["params"], x, y))
    tokens = (image_shape[0] // patch) * (image_shape[1] // patch) + 1
    entries.append(dict(image=f"{image_shape[0]}x{image_shape[1]}x{image_shape[2]}",
                        patch=patch, T=tokens, P=p, K=k,
                        params=sum(a.size for a in jax.tree.leaves(variables["params"])),
                        fwd_gflops=total / 1e9, attn_gflops=attn / 1e9,
                        peak_temp_mb=temp / 2**20, step_ms=float("inf"),
                        _call=(step, variables["params"], x, y)))
  for _ in range(args.repeats):       # round-robin timing
    for e in entries:
      step, params, x, y = e["_call"]
      t0 = time.perf_counter()
      jax.block_until_ready(step(params, x, y))
      e["step_ms"] = min(e["step_ms"], 1e3 * (time.perf_counter() - t0))
  for e in entries:
    del e["_call"]
    b = next(r for r in entries if r["T"] == e["T"] and r["P"] == 0)
    e["flops_vs_base"] = e["fwd_gflops"] / b["fwd_gflops"]
    e["attn_vs_base"] = e["attn_gflops"] / b["attn_gflops"]
    e["mem_vs_base"] = e["peak_temp_mb"] / b["peak_temp_mb"]
    e["time_vs_base"] = e["step_ms"] / b["step_ms"]

  machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
             f"jax {jax.__version__}, {jax.devices()[0].device_kind}, batch {args.batch}")
  print(f"Machine: {machine}\n")
  cols = ["image", "patch", "T", "P", "K", "params", "fwd_gflops", "attn_gflops",
          "flops_vs_base", "attn_vs_base", "peak_temp_mb", "mem_vs_base", "step_ms",
          "time_vs_base"]
  print("| " + " | ".join(cols) + " |")
  print("|" + "---|" * len(cols))
  for e in entries:
    print("| " + " | ".join(f"{e[c]:.3g}" if isinstance(e[c], float) else str(e[c])
                            for c in cols) + " |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"machine": machine, "rows": entries}, f, indent=2)


if __name__ == "__main__":
  main()
