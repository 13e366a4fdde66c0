"""Robustness of the benign-overfitting boundary exponent k (issue 15, item 1).

Runs the `benign_overfitting` study (its normal entry point, `xsens.studies.run`, with config
overrides: ViT only, no dynamics, the reduced-state solver) once per M × {unprojected,
projected noise} at one d > N_max·M, then refits k from each sweep's saved grid
(`grid_vit.npz`) at every cutoff with both estimators: the per-N interpolation + least
squares of the study, and the logistic fit of 1[test loss < cutoff] on (log N, log SNR)
over all runs; 95 % bootstrap-over-trials intervals for both. Prints a markdown table and
writes it with the numbers to <root>/k_robustness.{md,json}.

  python experiments/benign_k_robustness.py --root=workdirs/benign_k_robustness

σ_p = 6.4/√d keeps the SNR(‖μ‖) grid and the noise norms of the default (and the paper's
d = 1024, σ_p = 0.2) grid. Sweeps resume from their workdirs; a rerun only refits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np

from mlcollections_configs import benign_overfitting as bo_config
from xsens import studies
from xsens.lab import phase_boundary


def config_for(m: int, project: bool, d: int, trials: int, bootstrap: int):
  config = bo_config.get_config()
  config.models = ("vit",)
  config.dynamics.enabled = False
  config.data.d = d
  config.data.num_tokens = m
  config.data.sigma_p = 6.4 / math.sqrt(d)
  config.data.project_noise = project
  config.train.solver = "reduced"
  config.sweep.trials = trials
  config.report.bootstrap = bootstrap
  n_max = max(config.sweep.n_values)
  if d <= n_max * m:
    raise SystemExit(f"--d={d} must exceed N_max·M = {n_max * m}")
  return config


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--root", default="workdirs/benign_k_robustness")
  p.add_argument("--d", type=int, default=384)
  p.add_argument("--m", default="2,4,8,16")
  p.add_argument("--cutoffs", default="0.1,0.2,0.3")
  p.add_argument("--project", default="0,1", help="0 = unprojected, 1 = projected noise")
  p.add_argument("--trials", type=int, default=10)
  p.add_argument("--bootstrap", type=int, default=200)
  a = p.parse_args()
  ms = [int(v) for v in a.m.split(",")]
  cutoffs = [float(v) for v in a.cutoffs.split(",")]
  projects = [bool(int(v)) for v in a.project.split(",")]
  rows = []
  for m in ms:
    for project in projects:
      config = config_for(m, project, a.d, a.trials, a.bootstrap)
      wd = os.path.join(a.root, f"m{m}_{'proj' if project else 'noproj'}")
      t0 = time.perf_counter()
      studies.run(config, wd)
      wall = time.perf_counter() - t0
      g = np.load(os.path.join(wd, "grid_vit.npz"))
      ns, snrs, loss = g["n_values"], g["snr"], g["test_loss"]
      for cutoff in cutoffs:
        fi = phase_boundary.fit_boundary(ns, snrs, loss, cutoff, bootstrap=a.bootstrap, seed=0)
        fl = phase_boundary.fit_boundary_logistic(ns, snrs, loss, cutoff,
                                                  bootstrap=a.bootstrap, seed=0)
        cross = np.asarray(fi["crossings"])
        n_snr2 = ns * cross ** 2
        ok = np.isfinite(n_snr2)
        rows.append({"M": m, "projected": project, "cutoff": cutoff, "d": a.d,
                     "k_interp": fi["k"], "k_interp_ci95": fi["k_ci95"],
                     "boundary_points": fi["num_points"],
                     "k_logistic": fl["k"], "k_logistic_ci95": fl["k_ci95"],
                     "n_snr2_first": float(n_snr2[ok][0]) if ok.any() else float("nan"),
                     "n_snr2_last": float(n_snr2[ok][-1]) if ok.any() else float("nan"),
                     "converged_frac": float(np.mean(g["converged"])),
                     "sweep_wall_s": round(wall, 1)})
        r = rows[-1]
        print(f"M={m} proj={int(project)} cutoff={cutoff}: k_interp={r['k_interp']:.2f} "
              f"k_logistic={r['k_logistic']:.2f} ({wall:.0f} s)", flush=True)
  f = lambda v: f"{v:.2f}"
  ci = lambda c: f"{c[0]:.2f}–{c[1]:.2f}"
  lines = ["| M | noise | cutoff | k interp. (95 % CI) | k logistic (95 % CI) | N·SNR*² at "
           "N_min → N_max | converged | sweep s |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['M']} | {'projected' if r['projected'] else 'unprojected'} | "
                 f"{r['cutoff']:g} | {f(r['k_interp'])} ({ci(r['k_interp_ci95'])}) | "
                 f"{f(r['k_logistic'])} ({ci(r['k_logistic_ci95'])}) | "
                 f"{r['n_snr2_first']:.0f} → {r['n_snr2_last']:.0f} | "
                 f"{r['converged_frac']:.2f} | {r['sweep_wall_s']:.0f} |")
  table = "\n".join(lines)
  print(table)
  os.makedirs(a.root, exist_ok=True)
  with open(os.path.join(a.root, "k_robustness.md"), "w") as fh:
    fh.write(table + "\n")
  with open(os.path.join(a.root, "k_robustness.json"), "w") as fh:
    json.dump({"args": vars(a), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
  main()
