"""Study `verification`: certifying ReLU networks by the nonconvex reformulation.

Bunel, Hinder, Bhojanapalli, Dvijotham, "An efficient nonconvex reformulation of stagewise
convex optimization problems" (NeurIPS 2020, arXiv 2010.14322). Trains every run of
`config.runs` (MLPs and a one-conv CNN, plainly and with PGD adversarial training, through
the one trainer), then on the first `verification.num_examples` test examples and every
ε of `verification.epsilons`:
  - verified accuracy (lower margin bound > 0) for each method of `verification.methods`:
    "ibp", "triangle" (backward bounds), "pgd" / "fista" (the nonconvex reformulation of
    the triangle relaxation, `xsens.measures.verified_accuracy`) and "lp" (the same
    relaxation solved by HiGHS, `xsens.verify.lp`, on the runs `verification.lp_runs` and
    the first `verification.lp_num_examples` examples);
  - falsified (PGD attack) and open rates, so every property is classified;
  - the duality gap vs iterations and vs wall time of PGD and FISTA
    (`verification.trace_*`), against the LP optimum.
Writes results.md/json and plots.
"""

from __future__ import annotations

import functools
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from mlcollections_configs import verification as configs
from xsens.errors import require
from xsens.lab import multirun
from xsens.measures import verification as verification_measures
from xsens.report import plots, tables
from xsens.report import seed_stats
from xsens.verify import bounds as bounds_lib
from xsens.verify import lp, nonconvex


def validate(config, experiments) -> None:
  """ConfigErrors for the `verification` block (the config file's `validate`, then the
  ε values, `xsens.verify.bounds.check_epsilon`) and for runs it cannot verify."""
  configs.validate(config)
  bounds_lib.check_epsilon(tuple(config.verification.epsilons), "verification.epsilons")
  for name, exp in experiments.items():
    with multirun.run_errors(config, multirun.run_ids(config)[name][0]):
      # The input boxes are cut to [0, 1]: the run's own pixels must be in [0, 1].
      require(exp.config.data.normalize == "zero_one", "data.normalize",
              f"verification needs pixels in [0, 1] ('zero_one'), got "
              f"{exp.config.data.normalize!r}")
      bounds_lib.check_model(exp.model)


@functools.lru_cache(maxsize=None)
def _measure_fn(apply_fn, method, bounds_method, max_iters, tol, attack_steps,
                smoothing=()):
  """One jitted verified_accuracy per (model, method): ε and the key are traced;
  smoothing (a tuple) is the nonconvex methods' kink-aware continuation."""
  extra = dict(smoothing=smoothing) if method in nonconvex.METHODS else {}

  def fn(variables, x, y, key, eps):
    return verification_measures.verified_accuracy(
        apply_fn, variables, x, labels=y, key=key, epsilon=eps, method=method,
        bounds_method=bounds_method, max_iters=max_iters, tol=tol, stop_on_sign=True,
        attack_steps=attack_steps, **extra)
  return jax.jit(fn)


def verify_run(res, vc, key) -> dict:
  """{method: {ε: {verified, falsified, open, wall_s, ...}}} for one trained run."""
  x = jnp.asarray(res.test.images[:vc.num_examples])
  y = jnp.asarray(res.test.labels[:vc.num_examples])
  out = {}
  for method in [m for m in vc.methods if m != "lp"]:
    fn = _measure_fn(res.apply_fn, method, vc.bounds_method, vc.max_iters, vc.tol,
                     vc.attack_steps, tuple(float(t) for t in vc.smoothing))
    out[method] = {}
    for i, eps in enumerate(vc.epsilons):
      start = time.perf_counter()
      r = jax.device_get(fn(res.variables, x, y, jax.random.fold_in(key, i),
                            jnp.float32(eps)))
      out[method][float(eps)] = {
          "verified": float(r["verified_accuracy"]), "falsified": float(r["falsified_rate"]),
          "open": float(r["open_rate"]), "wall_s": time.perf_counter() - start,
          "mean_iterations": float(np.mean(r["iterations"])) if "iterations" in r else None,
          "lower": r["lower"].tolist(), "upper": r["upper"].tolist()}
  return out


_bounds_fn = jax.jit(nonconvex.relaxation_bounds,
                     static_argnames=("clip_min", "clip_max", "bounds_method"))


def lp_run(res, vc) -> dict:
  """HiGHS on the first `lp_num_examples` examples: {ε: {verified, lower, wall_s}}, and the
  nonconvex FISTA lower bounds of the same examples for comparison."""
  layers = bounds_lib.network_from_model(res.model, res.variables)
  n = vc.lp_num_examples
  x = np.asarray(res.test.images[:n]).reshape(n, -1)
  y = np.asarray(res.test.labels[:n])
  out = {}
  for eps in vc.epsilons:
    start, lows = time.perf_counter(), []
    for xi, yi in zip(x, y):
      b = _bounds_fn(layers, jnp.asarray(xi), float(eps), clip_min=0.0,
                                      clip_max=1.0, bounds_method=vc.bounds_method)
      lows.append(float(np.min(lp.margin_values(layers, b, int(yi)))))
    correct = np.argmax(np.asarray(res.predict_fn()(jnp.asarray(res.test.images[:n]))),
                        -1) == y
    lows = np.where(correct, lows, -np.inf)
    out[float(eps)] = {"verified": float(np.mean(np.asarray(lows) > 0)),
                       "lower": lows.tolist(), "wall_s": time.perf_counter() - start}
  return out


def trace_run(res, vc) -> dict:
  """Duality gap vs iterations (and wall time) of PGD and FISTA on `trace_examples`
  examples at ε = trace_epsilon, with the LP optimum of each property."""
  n = vc.trace_examples
  x = jnp.asarray(res.test.images[:n])
  y = jnp.asarray(res.test.labels[:n])
  layers = bounds_lib.network_from_model(res.model, res.variables)
  lp_opt = []
  for xi, yi in zip(np.asarray(x).reshape(n, -1), np.asarray(y)):
    b = _bounds_fn(layers, jnp.asarray(xi), vc.trace_epsilon, clip_min=0.0,
                                    clip_max=1.0, bounds_method=vc.bounds_method)
    v = lp.margin_values(layers, b, int(yi))
    lp_opt.append(v[np.arange(v.size) != yi])
  lp_opt = np.stack(lp_opt)                                   # [n, K-1]
  out = {"iterations": list(range(1, vc.trace_iters + 1))}
  for method in ("pgd", "fista"):
    fn = jax.jit(functools.partial(
        verification_measures.duality_gap_trace, res.apply_fn, method=method,
        bounds_method=vc.bounds_method, max_iters=vc.trace_iters,
        smoothing=tuple(float(t) for t in vc.smoothing)))
    jax.block_until_ready(fn(res.variables, x, labels=y, epsilon=vc.trace_epsilon))
    start = time.perf_counter()
    t = jax.device_get(fn(res.variables, x, labels=y, epsilon=vc.trace_epsilon))
    wall = time.perf_counter() - start
    gap = np.asarray(t["primal"] - t["dual"])                 # [n, K-1, T]
    primal_err = np.asarray(t["primal"]) - lp_opt[..., None]
    dual_err = lp_opt[..., None] - np.asarray(t["dual"])
    out[method] = {"gap_median": np.median(gap, axis=(0, 1)).tolist(),
                   "primal_minus_lp_median": np.median(primal_err, axis=(0, 1)).tolist(),
                   "lp_minus_dual_median": np.median(dual_err, axis=(0, 1)).tolist(),
                   "wall_s": wall,
                   "seconds": (np.arange(1, vc.trace_iters + 1) * wall
                               / vc.trace_iters).tolist()}
  return out


def _rows(name, verified, lp_results, vc) -> list[dict]:
  rows = []
  for method, per_eps in verified.items():
    for eps, r in per_eps.items():
      rows.append({"run": name, "method": method, "epsilon": eps,
                   "verified": r["verified"], "falsified": r["falsified"], "open": r["open"],
                   "examples": vc.num_examples, "wall_s": round(r["wall_s"], 2)})
  for eps, r in (lp_results or {}).items():
    rows.append({"run": name, "method": "lp", "epsilon": eps, "verified": r["verified"],
                 "falsified": None, "open": None, "examples": vc.lp_num_examples,
                 "wall_s": round(r["wall_s"], 2)})
  return rows


def seed_table(rows: list[dict], ids: dict[str, tuple[str, int]]) -> list[dict]:
  """One row per (run, method, ε) of the per-seed `rows` (key "run": a run id): verified,
  falsified and open rates, their mean and `<rate> s.e.` over the seeds; `seeds` = n."""
  return seed_stats.seed_rows(rows, ids, ("verified", "falsified", "open"),
                           group_by=("method", "epsilon"))


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every run, verifies it with every method at every ε, writes the report."""
  experiments = multirun.validate_runs(config)
  validate(config, experiments)
  results = multirun.train_runs(config, workdir, overwrite=overwrite, experiments=experiments)
  vc = config.verification
  ids = multirun.run_ids(config)
  key = jax.random.key(vc.seed)
  rows, verified, lps, traces = [], {}, {}, {}
  log = logging.getLogger("xsens.studies")
  for j, (rid, res) in enumerate(results.items()):
    name, seed = ids[rid]
    log.info("Verifying run %s (%s)", rid, ", ".join(vc.methods))
    verified[rid] = verify_run(res, vc, jax.random.fold_in(key, j))
    if seed == 0 and "lp" in vc.methods and name in vc.lp_runs:   # LP, trace: seed 0
      lps[name] = lp_run(res, vc)
    if seed == 0 and name in vc.trace_runs:
      traces[name] = trace_run(res, vc)
    rows += _rows(rid, verified[rid], lps.get(name) if seed == 0 else None, vc)
  table = seed_table(rows, ids)
  eps = [float(e) for e in vc.epsilons]
  plot_files = []
  for name in config.runs:
    mean = {(r["method"], r["epsilon"]): r["verified"] for r in table if r["run"] == name}
    series = {m: [mean[(m, e)] for e in eps] for m in vc.methods if m != "lp"}
    if name in lps:
      series[f"lp (first {vc.lp_num_examples})"] = [lps[name][e]["verified"] for e in eps]
    plot_files.append(plots.line_plot(
        os.path.join(workdir, f"verified_{name}.png"), eps, series, xlabel="ε (L∞)",
        ylabel="verified accuracy" + (f" (mean of {len(ids) // len(config.runs)} seeds)"
                                      if len(ids) > len(config.runs) else ""),
        title=f"Verified accuracy: {name}", logx=True))
  for name, t in traces.items():
    gaps = {m: np.maximum(t[m]["gap_median"], 1e-8) for m in ("pgd", "fista")}
    plot_files.append(plots.line_plot(
        os.path.join(workdir, f"gap_iterations_{name}.png"), t["iterations"], gaps,
        xlabel="iteration", ylabel="median duality gap", logy=True,
        title=f"Duality gap vs iterations: {name}, ε={vc.trace_epsilon:g}"))
    plot_files.append(_gap_time_plot(os.path.join(workdir, f"gap_time_{name}.png"), t,
                                     f"Duality gap vs wall time: {name}"))
  notes = (f"First {vc.num_examples} test examples of {config.train.data.name}; L∞ balls "
           f"cut to [0, 1]; intermediate bounds: {vc.bounds_method}; nonconvex solvers stop "
           f"at gap ≤ {vc.tol:g}, at a known sign, or after {vc.max_iters} iterations "
           f"(kink-aware smoothing: {tuple(vc.smoothing) or 'none, plain steps'}); "
           f"falsified = clean error or a {vc.attack_steps}-step PGD attack succeeds. "
           f"LP (HiGHS) on runs {list(vc.lp_runs)}, first {vc.lp_num_examples} examples "
           f"(training seed 0 only). Rates are means over the {len(ids) // len(config.runs)} "
           "training seed(s) of each run, s.e. over seeds (NaN for one seed).")
  md = tables.write_results(workdir, f"Verification on {config.train.data.name}", table,
                            notes=notes, plots=plot_files,
                            extra={"per_seed": rows,
                                   "training": multirun.summary_rows(results),
                                   "traces": traces,
                                   "lp": {n: {str(e): r for e, r in v.items()}
                                          for n, v in lps.items()}})
  return {"rows": table, "per_seed": rows, "markdown": md, "verified": verified, "lp": lps, "traces": traces,
          "training": multirun.summary_rows(results)}


def _gap_time_plot(path: str, trace: dict, title: str) -> str:
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(5.6, 3.4))
  for (m, style) in zip(("pgd", "fista"), plots.line_styles(2)):
    ax.plot(trace[m]["seconds"], np.maximum(trace[m]["gap_median"], 1e-8), label=m, **style)
  ax.set_yscale("log")
  plots.styled_axes(ax, title, "wall time (s, all properties in one batch)",
                    "median duality gap")
  plots.legend_outside(ax)
  return plots.save_figure(fig, path, tight=True)
