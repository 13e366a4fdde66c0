"""Benchmark: time to a duality gap of 1e-3 per property, the nonconvex reformulation
(FISTA, `xsens.verify.nonconvex`) vs HiGHS (`scipy.optimize.linprog`) on the same triangle
relaxation, for MLPs 784-w-w-10 trained on mnist5k (through the one trainer), w in
--widths, side by side in one run.

  python -m experiments.bench_verification --root=workdirs/bench_verification
  python -m experiments.bench_verification --root=workdirs/bench_verification_tiny --widths=100 --examples=1 \
      --train_steps=20

A property is (test example, ε, wrong class j): min f_y − f_j over the relaxation. Per
property: the nonconvex solver's wall time (`nonconvex.solve_margin`: FISTA until the gap
primal − dual ≤ --gap, --max_iters iterations or --patience iterations without primal
progress, then the dual polish at kinks; jitted, compiled beforehand, one property per
call) and HiGHS's `linprog` wall time (the LP built once per example, not timed). HiGHS
takes minutes per property at width ≥ 512 on a CPU, so each width stops starting new
properties once its HiGHS time passes --lp_budget_s (at least --min_properties). Reported
per width: median times, the speed-up (ratio of medians, and the median of per-property
ratios), the share of properties whose gap reached --gap, the largest |dual − LP optimum|
and |primal − LP optimum|, and the count of dual bounds above the LP optimum (unsound:
must be 0). Writes bench_verification.json / .md / .png under --root.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mlcollections_configs import common
from mlcollections_configs import verification as verification_config
from xsens.lab import multirun
from xsens.report import plots
from xsens.verify import bounds as bounds_lib
from xsens.verify import lp, nonconvex


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--root", required=True)
  p.add_argument("--widths", default="100,256,512,1024")
  p.add_argument("--examples", type=int, default=3)
  p.add_argument("--epsilon", type=float, default=0.02)
  p.add_argument("--properties", type=int, default=9,
                 help="wrong classes j per example (the first ones; 9 = all of MNIST's)")
  p.add_argument("--gap", type=float, default=1e-3)
  p.add_argument("--max_iters", type=int, default=2000)
  p.add_argument("--patience", type=int, default=50)
  p.add_argument("--lp_budget_s", type=float, default=300.0,
                 help="per width: no new property once HiGHS has used this many seconds")
  p.add_argument("--min_properties", type=int, default=2)
  p.add_argument("--lp_methods", default="highs-ipm,highs-ds",
                 help="scipy linprog methods, each timed; the speed-up is against the "
                      "fastest of them on each property")
  p.add_argument("--train_steps", type=int, default=300)
  args = p.parse_args(argv)
  args.lp_methods = args.lp_methods.split(",")
  return args


def train(args, widths):
  """One MLP 784-w-w-10 per width on mnist5k, through `multirun.train_runs` (resumes)."""
  config = verification_config.get_config(None)
  config.train.total_steps = args.train_steps
  config.train.eval_every = config.train.checkpoint_every = args.train_steps
  config.runs = ml_collections.ConfigDict({
      f"w{w}": {"model": common.model_config(name="mlp", hidden_dims=(w, w))} for w in widths})
  return multirun.train_runs(config, args.root)


def bench_width(res, args) -> dict:
  layers = bounds_lib.network_from_model(res.model, res.variables)
  bounds_fn = jax.jit(functools.partial(nonconvex.relaxation_bounds, clip_min=0.0,
                                        clip_max=1.0))

  @jax.jit
  def solve(b, c):
    return nonconvex.solve_margin(layers, b, c, method="fista", max_iters=args.max_iters,
                                  tol=args.gap, patience=args.patience)

  x = np.asarray(res.test.images[:args.examples]).reshape(args.examples, -1)
  y = np.asarray(res.test.labels[:args.examples])
  mats = [lp.dense_matrix(l) for l in layers]
  methods = args.lp_methods
  rec = {k: [] for k in ("nc_s", "lp_s", "reached", "dual_err", "primal_err", "iters",
                         "unsound", *methods)}
  for xi, yi in zip(x, y):
    b = bounds_fn(layers, jnp.asarray(xi), args.epsilon)
    data = lp.build(layers, b, mats)
    for j in [j for j in range(layers[-1].num_out) if j != yi][:args.properties]:
      if (sum(sum(rec[m]) for m in methods) > args.lp_budget_s and len(rec["lp_s"]) >= args.min_properties):
        break
      c = np.zeros(layers[-1].num_out, np.float32)
      c[yi], c[j] = 1.0, -1.0
      jax.block_until_ready(solve(b, jnp.asarray(c)))             # compile / warm
      start = time.perf_counter()
      out = jax.block_until_ready(solve(b, jnp.asarray(c)))
      rec["nc_s"].append(time.perf_counter() - start)
      opts = {m: lp.solve_margin(data, c, method=m) for m in methods}
      for m in methods:
        rec[m].append(opts[m]["wall_s"])
      rec["lp_s"].append(min(o["wall_s"] for o in opts.values()))
      opt = opts[methods[0]]
      assert all(abs(o["value"] - opt["value"]) < 1e-5 * (1 + abs(opt["value"]))
                 for o in opts.values()), {m: o["value"] for m, o in opts.items()}
      rec["reached"].append(float(out["gap"]) <= args.gap)
      rec["dual_err"].append(abs(float(out["dual"]) - opt["value"]))
      rec["primal_err"].append(abs(float(out["primal"]) - opt["value"]))
      rec["unsound"].append(float(out["dual"]) > opt["value"] + 1e-4)
      rec["iters"].append(int(out["iterations"]))
  nc, lps = np.median(rec["nc_s"]), np.median(rec["lp_s"])
  return {"properties": len(rec["nc_s"]), "fista_median_s": float(nc),
          "highs_median_s": float(lps), "speedup": float(lps / nc),
          "speedup_median_of_ratios": float(np.median(np.divide(rec["lp_s"], rec["nc_s"]))),
          "fista_max_s": float(np.max(rec["nc_s"])),
          "lp_median_s": {m: float(np.median(rec[m])) for m in methods},
          "gap_reached_share": float(np.mean(rec["reached"])),
          "median_iterations": float(np.median(rec["iters"])),
          "max_iterations": int(np.max(rec["iters"])),
          "max_dual_minus_lp": float(np.max(rec["dual_err"])),
          "median_dual_minus_lp": float(np.median(rec["dual_err"])),
          "max_primal_minus_lp": float(np.max(rec["primal_err"])),
          "unsound_duals": int(np.sum(rec["unsound"]))}


def main(argv=None) -> dict:
  args = parse(argv)
  widths = [int(w) for w in args.widths.split(",")]
  results = train(args, widths)
  table = {}
  for w in widths:
    table[w] = bench_width(results[f"w{w}"], args)
    print(w, json.dumps(table[w]), flush=True)
  methods = args.lp_methods
  header = ("| width | properties | nonconvex median / max s | HiGHS median s ("
            + ", ".join(methods) + "; fastest) | speed-up vs fastest "
            f"(medians; median ratio) | gap ≤ {args.gap:g} reached | iters median / max | "
            "abs(dual − LP) median / max | max abs(primal − LP) | dual > LP |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
  lines = [f"| {w} | {r['properties']} | {r['fista_median_s']:.4f} / {r['fista_max_s']:.4f} | "
           + "".join(f"{r['lp_median_s'][m]:.3g}, " for m in methods)
           + f"{r['highs_median_s']:.3g} | {r['speedup']:.0f}×; "
           f"{r['speedup_median_of_ratios']:.0f}× | {r['gap_reached_share']:.2f} | "
           f"{r['median_iterations']:.0f} / {r['max_iterations']} | "
           f"{r['median_dual_minus_lp']:.1e} / {r['max_dual_minus_lp']:.1e} | "
           f"{r['max_primal_minus_lp']:.1e} | {r['unsound_duals']} |"
           for w, r in table.items()]
  md = header + "\n".join(lines) + "\n"
  print(md)
  os.makedirs(args.root, exist_ok=True)
  with open(os.path.join(args.root, "bench_verification.json"), "w") as f:
    json.dump({"args": vars(args), "widths": {str(w): r for w, r in table.items()}}, f,
              indent=1)
  with open(os.path.join(args.root, "bench_verification.md"), "w") as f:
    f.write(md)
  plots.line_plot(os.path.join(args.root, "bench_verification.png"), widths,
                  {"FISTA (nonconvex)": [table[w]["fista_median_s"] for w in widths],
                   "HiGHS (LP)": [table[w]["highs_median_s"] for w in widths]},
                  xlabel="hidden width", ylabel="median seconds per property", logy=True,
                  logx=True, title="Time to solve one property")
  return table


if __name__ == "__main__":
  main()
