"""Benchmark for one accelerator (GPU): training throughput, the sensitivity estimator and the
benign-overfitting paper grid (issue 16 item 8).

  python experiments/bench_accelerator.py                 # on a GPU, ~10-20 min
  python experiments/bench_accelerator.py --small         # anywhere (CPU), ~1 min (tested)
  python experiments/bench_accelerator.py --json=bench_accelerator.json

Measures, and prints as markdown tables (helpers shared with experiments/bench_training.py):
  * peaks: best 8192² (GPU) / 256² (--small) matmul in float32 and bfloat16;
  * training: ViT-S/16 and ViT-B/16 (224², 1000 classes, SGD momentum, batch `--batch`,
    default 128) for dtype ∈ {float32, bfloat16} × attention_impl ∈ {einsum, xla_fused,
    cudnn (GPU and bfloat16 only)}: images/s, GFLOP/s (XLA cost analysis of the float32
    einsum step), % of the matmul peak of the variant's dtype;
  * sensitivity: `token_sensitivity` of ViT-B/16 (224², T = 196, bfloat16, B 64, R 1,
    forward batch 256) per attention core, GFLOP/s counted as experiments/bench_sensitivity.py
    counts it, % of the bfloat16 matmul peak (goal: >= 60 %);
  * benign grid: the `paper` variant of mlcollections_configs/benign_overfitting.py (10,000
    ViT runs at d = 1024, <= 1000 GD steps) through the study's own sweep
    (`xsens.studies.benign_overfitting.run_sweep`, chunks of 500 vmapped runs) in a
    temporary workdir; wall time (goal: under 10 minutes on one modern GPU).
    `--grid_chunks=K` stops after K chunks and extrapolates (marked as such).

`--small` swaps in a tiny ViT at 32², a tiny estimator case and the `smoke` grid so that the
script runs in a test; every output names the backend, and a run that is not on a GPU says
so in its first and last lines: its numbers are not accelerator figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
import jax

from experiments import bench_training as bt
from mlcollections_configs import benign_overfitting as bo_config
from xsens.studies import benign_overfitting as bo
# pylint: enable=g-import-not-at-top


def on_gpu() -> bool:
  return jax.default_backend() == "gpu"


def banner() -> str:
  if on_gpu():
    return f"GPU run: {jax.devices()[0].device_kind}"
  return (f"NOT RUN ON A GPU (backend {jax.default_backend()}): these numbers are a "
          "smoke run of the script, not accelerator figures")


def impls_for(dtype: str) -> tuple[str, ...]:
  """The attention cores worth timing: cuDNN only on a GPU in bfloat16."""
  extra = ("cudnn",) if on_gpu() and dtype == "bfloat16" else ()
  return ("einsum", "xla_fused") + extra


def grid(variant: str, max_chunks: int | None) -> dict:
  """Wall time of the benign-overfitting sweep of `variant` (ViT) in a fresh workdir."""
  config = bo_config.get_config(variant)
  n, _, _ = bo.grid_points(config)
  size = int(config.sweep.chunk_size)
  chunks = -(-len(n) // size)
  with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter()
    res = bo.run_sweep(config, os.path.join(tmp, "sweep"), "vit", overwrite=True,
                       max_chunks=max_chunks, log=lambda *a: None)
    wall = time.perf_counter() - t0
  done = int(res["chunks_computed"])
  return dict(variant=variant, runs=len(n), d=int(config.data.d),
              max_steps=int(config.train.max_steps), chunk_size=size, chunks=chunks,
              chunks_computed=done, wall_s=wall,
              estimated_total_s=wall * chunks / max(done, 1),
              extrapolated=done < chunks)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--small", action="store_true", help="tiny sizes; runs on CPU.")
  parser.add_argument("--batch", type=int, default=None,
                      help="training batch (default 128; --small 4).")
  parser.add_argument("--rounds", type=int, default=3, help="best-of-N.")
  parser.add_argument("--grid_chunks", type=int, default=None,
                      help="stop the grid after this many chunks and extrapolate.")
  parser.add_argument("--skip", default="", help="sections to skip: training,sensitivity,grid.")
  parser.add_argument("--json", default=None, help="write the results here.")
  args = parser.parse_args(argv)
  skip = set(filter(None, args.skip.split(",")))
  batch = args.batch or (4 if args.small else 128)
  print(f"# {banner()}", flush=True)
  info = bt.machine_info()
  print("## Machine\n" + "\n".join(f"  {k}: {v}" for k, v in info.items()), flush=True)
  peaks = bt.Peaks(256 if args.small else 8192)
  out = dict(banner=banner(), on_gpu=on_gpu(), machine=info, training=[], sensitivity=[],
             grid=None)

  if "training" not in skip:
    plan = ([("tiny ViT/8", bt.TINY, 32, 10)] if args.small else
            [("ViT-S/16", bt.VIT_S16, 224, 1000), ("ViT-B/16", bt.VIT_B16, 224, 1000)])
    for label, fields, image, classes in plan:
      print(f"\n## Training: {label}", flush=True)
      rows = []
      for dt in bt.DTYPES:
        rows += bt.training_rows(label, fields, image, batch, classes, (dt,), impls_for(dt),
                                 args.rounds, peaks)
      bt.print_training(rows)
      out["training"] += rows

  if "sensitivity" not in skip:
    print("\n## Token sensitivity (goal: >= 60 % of the bfloat16 matmul peak)", flush=True)
    if args.small:
      kw = dict(fields=dict(bt.TINY, patch_size=4, channels=3), image=16, batch=8,
                forward_batch=16)
    else:
      kw = dict(fields=dict(bt.VIT_B16, channels=3), image=224, batch=64, forward_batch=256)
    rows = bt.sensitivity_rows(impls_for("bfloat16"), args.rounds, peaks, dtype="bfloat16",
                               peak_dtype="bfloat16", **kw)
    bt.print_sensitivity(rows)
    out["sensitivity"] = rows

  if "grid" not in skip:
    print("\n## Benign-overfitting grid (goal: paper grid under 10 minutes)", flush=True)
    g = grid("smoke" if args.small else "paper", args.grid_chunks)
    note = " (extrapolated)" if g["extrapolated"] else ""
    print(f"  {g['variant']}: {g['runs']} runs at d = {g['d']}, <= {g['max_steps']} steps, "
          f"{g['chunks_computed']}/{g['chunks']} chunks of {g['chunk_size']} in "
          f"{g['wall_s']:.1f} s; whole grid {g['estimated_total_s']:.1f} s{note}")
    out["grid"] = g

  out["peaks_gflops"] = {dt: peaks.gflops(dt) for dt in bt.DTYPES}
  info["loadavg_end"] = os.getloadavg()
  print("\n## Peaks: " + ", ".join(f"{dt} {g:.1f} GFLOP/s"
                                   for dt, g in out["peaks_gflops"].items()))
  print(f"# {banner()}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  main()
