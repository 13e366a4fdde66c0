"""Benchmark of hard instances: how close the nonconvex reformulation's primal and dual get
to HiGHS's optimum of the same triangle relaxation, per iteration budget, plain FISTA vs the
kink-aware step (`xsens.verify.nonconvex`, `smoothing=KINK_SMOOTHING`), and the time per
property against HiGHS.

  python -m experiments.bench_verification_hard --root=workdirs/bench_verification_hard
  python -m experiments.bench_verification_hard --root=/tmp/tiny --sets=r20x1_0.1 \
      --budgets=100 --nets=1

Instance sets (`--sets`, comma-separated names):
  r20x1_<ε>, r20x2_<ε>: random 20-20-10 / 20-20-20-10 ReLU nets (weights N(0, 1/fan_in),
    biases N(0, 0.01)), input uniform in [0, 1]^20, --nets nets each;
  r256_<ε>: random 20-256-256-10 nets (width 256), --nets nets;
  mlp_small_<ε>, mlp_large_<ε>: the study's MNIST MLPs (784-100-100-10, 784-256-256-256-10;
    `mlcollections_configs/verification.py`, trained through the one trainer for
    --train_steps steps, resumed if already there), the first --examples test images.
A property is (input, wrong class j): min f_y − f_j over the relaxation (input box cut to
[0, 1], triangle intermediate bounds). Per budget B and step: `nonconvex.solve_margin` with
max_iters = B, tol = --tol (the duality-gap stop), the dual polish on; the 9 properties of
one input vmapped in one jitted call (compiled beforehand), the fastest of --repeats calls
/ 9 the time per property. HiGHS: `scipy.optimize.linprog(method="highs")` per property (the LP built
once per input, not timed). Reported: the share of properties whose primal (and dual) is
within 1e-4 and 1e-3 of the HiGHS optimum, absolute, and within 1e-4 max(1, |opt|)
("rel."; float32 resolves |opt| ≈ 20 to ~2e-6; the median |opt| is printed),
the largest primal error, the count of unsound certificates (dual > opt + 1e-5 or
primal < opt − 1e-5: must be 0), and the median time per property vs HiGHS's.
Writes bench_verification_hard.json / .md under --root.
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

from mlcollections_configs import verification as verification_config
from xsens.lab import multirun
from xsens.verify import bounds as bounds_lib
from xsens.verify import lp, nonconvex

STEPS = {"fista": (), "kink": nonconvex.KINK_SMOOTHING}


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--root", required=True)
  p.add_argument("--sets", default="r20x1_0.02,r20x1_0.1,r20x2_0.02,r20x2_0.1,r256_0.05,"
                                   "mlp_small_0.05,mlp_small_0.1,mlp_large_0.05,mlp_large_0.1")
  p.add_argument("--budgets", default="100,300,1000,3000")
  p.add_argument("--nets", type=int, default=3, help="random nets per random set")
  p.add_argument("--examples", type=int, default=3, help="test images per MNIST set")
  p.add_argument("--tol", type=float, default=1e-6, help="duality-gap stop")
  p.add_argument("--train_steps", type=int, default=600)
  p.add_argument("--repeats", type=int, default=3, help="timed calls; the fastest counts")
  args = p.parse_args(argv)
  args.sets = args.sets.split(",")
  args.budgets = [int(b) for b in args.budgets.split(",")]
  return args


def random_mlp(dims, seed) -> tuple[bounds_lib.Affine, ...]:
  keys = jax.random.split(jax.random.key(seed), 2 * len(dims))
  return tuple(bounds_lib.Affine(
      jax.random.normal(keys[2 * i], (dims[i], dims[i + 1])) / np.sqrt(dims[i]),
      0.1 * jax.random.normal(keys[2 * i + 1], (dims[i + 1],))) for i in range(len(dims) - 1))


def trained_mlps(args) -> dict:
  """{run name: (layers, test images [N, 784], labels [N])} of the study's two MLPs."""
  config = verification_config.get_config(None)
  config.train.total_steps = args.train_steps
  config.train.eval_every = config.train.checkpoint_every = args.train_steps
  config.runs = ml_collections.ConfigDict(
      {name: config.runs[name].to_dict() for name in ("mlp_small", "mlp_large")})
  out = {}
  for name, res in multirun.train_runs(config, os.path.join(args.root, "train")).items():
    images = np.asarray(res.test.images[:args.examples]).reshape(args.examples, -1)
    out[name] = (bounds_lib.network_from_model(res.model, res.variables), images,
                 np.asarray(res.test.labels[:args.examples]))
  return out


def instances(name: str, args, trained) -> tuple[float, list]:
  """(ε, [(layers, x [n_0], label)]) of one set."""
  kind, eps = name.rsplit("_", 1)
  if kind in trained:
    layers, xs, ys = trained[kind]
    return float(eps), [(layers, x, int(y)) for x, y in zip(xs, ys)]
  dims = {"r20x1": [20, 20, 10], "r20x2": [20, 20, 20, 10], "r256": [20, 256, 256, 10]}[kind]
  out = []
  for seed in range(args.nets):
    layers = random_mlp(dims, seed)
    x = np.asarray(jax.random.uniform(jax.random.key(100 + seed), (dims[0],)))
    out.append((layers, x, int(jnp.argmax(bounds_lib.forward(layers, jnp.asarray(x))))))
  return float(eps), out


@functools.partial(jax.jit, static_argnames=("smoothing", "tol"))   # max_iters traced
def _solve_all(layers, bounds, cs, *, max_iters, smoothing, tol):
  return jax.vmap(lambda c: nonconvex.solve_margin(layers, bounds, c, max_iters=max_iters,
                                                   tol=tol, smoothing=smoothing))(cs)


def bench_set(name, args, trained) -> dict:
  eps, items = instances(name, args, trained)
  opts, lp_s = [], []
  runs = {(step, b): {"primal": [], "dual": [], "s": [], "iters": []}
          for step in STEPS for b in args.budgets}
  for layers, x, label in items:
    bounds = nonconvex.relaxation_bounds(layers, jnp.asarray(x), eps, clip_min=0.0,
                                         clip_max=1.0)
    data = lp.build(layers, bounds)
    k = layers[-1].num_out
    cs = np.asarray(bounds_lib.margin_matrix(label, k, jnp.float32))
    others = [j for j in range(k) if j != label]
    for j in others:
      res = lp.solve_margin(data, cs[j])
      if res["status"] != 0:  # No optimum to compare against: stop rather than count a miss.
        raise SystemExit(f"HiGHS status {res['status']} on a property of --sets: no optimum")
      opts.append(res["value"])
      lp_s.append(res["wall_s"])
    for step, smoothing in STEPS.items():
      for b in args.budgets:
        solve = functools.partial(_solve_all, layers, bounds, jnp.asarray(cs),
                                  max_iters=jnp.asarray(b, jnp.int32),
                                  smoothing=smoothing, tol=args.tol)
        # Compile (once per architecture and step: max_iters is traced) / warm.
        jax.block_until_ready(_solve_all(layers, bounds, jnp.asarray(cs),
                                         max_iters=jnp.asarray(1, jnp.int32),
                                         smoothing=smoothing, tol=args.tol))
        walls = []
        for _ in range(args.repeats):
          start = time.perf_counter()
          out = jax.block_until_ready(solve())
          walls.append(time.perf_counter() - start)
        wall = min(walls)
        r = runs[(step, b)]
        r["primal"] += np.asarray(out["primal"])[others].tolist()
        r["dual"] += np.asarray(out["dual"])[others].tolist()
        r["iters"] += np.asarray(out["iterations"])[others].tolist()
        r["s"].append(wall / len(others))
  opt = np.asarray(opts)
  rows = {}
  for (step, b), r in runs.items():
    pe, de = np.asarray(r["primal"]) - opt, opt - np.asarray(r["dual"])
    scale = np.maximum(1.0, np.abs(opt))
    rows[f"{step}@{b}"] = {
        "primal_1e-4": float(np.mean(pe <= 1e-4)), "primal_1e-3": float(np.mean(pe <= 1e-3)),
        "primal_rel_1e-4": float(np.mean(pe <= 1e-4 * scale)),
        "dual_rel_1e-4": float(np.mean(de <= 1e-4 * scale)),
        "primal_err": pe.tolist(), "dual_err": de.tolist(),
        "dual_1e-4": float(np.mean(de <= 1e-4)), "dual_1e-3": float(np.mean(de <= 1e-3)),
        "max_primal_err": float(pe.max()), "unsound": int(np.sum((pe < -1e-5) | (de < -1e-5))),
        "median_iters": float(np.median(r["iters"])),
        "s_per_property": float(np.median(r["s"])),
        "speedup_vs_highs": float(np.median(lp_s) / np.median(r["s"]))}
  return {"epsilon": eps, "properties": int(opt.size), "median_abs_opt":
          float(np.median(np.abs(opt))), "highs_median_s": float(np.median(lp_s)),
          "rows": rows}


def table(results, budgets) -> str:
  head = ("| set | props | median abs(opt) | HiGHS s/prop | step | budget | primal ≤1e-4 / ≤1e-3 | "
          "dual ≤1e-4 / ≤1e-3 | primal / dual ≤1e-4 rel. | max primal err | median iters | "
          "s/prop | × vs HiGHS | unsound |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
          "---|---|\n")
  lines = []
  for name, r in results.items():
    for step in STEPS:
      for b in budgets:
        x = r["rows"][f"{step}@{b}"]
        lines.append(
            f"| {name} | {r['properties']} | {r['median_abs_opt']:.2g} | "
            f"{r['highs_median_s']:.3g} | {step} | {b} | {x['primal_1e-4']:.2f} / "
            f"{x['primal_1e-3']:.2f} | {x['dual_1e-4']:.2f} / {x['dual_1e-3']:.2f} | "
            f"{x['primal_rel_1e-4']:.2f} / {x['dual_rel_1e-4']:.2f} | "
            f"{x['max_primal_err']:.1e} | {x['median_iters']:.0f} | {x['s_per_property']:.2g} | "
            f"{x['speedup_vs_highs']:.1f} | {x['unsound']} |")
  return head + "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  args = parse(argv)
  needs = {s.rsplit("_", 1)[0] for s in args.sets} & {"mlp_small", "mlp_large"}
  trained = trained_mlps(args) if needs else {}
  results = {}
  for name in args.sets:
    start = time.perf_counter()
    results[name] = bench_set(name, args, trained)
    print(name, f"{time.perf_counter() - start:.0f}s", json.dumps(results[name]), flush=True)
  md = table(results, args.budgets)
  print(md)
  os.makedirs(args.root, exist_ok=True)
  with open(os.path.join(args.root, "bench_verification_hard.json"), "w") as f:
    json.dump({"args": vars(args), "sets": results}, f, indent=1)
  with open(os.path.join(args.root, "bench_verification_hard.md"), "w") as f:
    f.write(md)
  return results


if __name__ == "__main__":
  main()
