"""Convergence time of the benign-overfitting ViT against η, ε and ‖μ‖ (issue 15, item 1).

Jiang et al. (NeurIPS 2024; rebuttal, docs/papers/benign_overfitting.md §3): GD reaches training
loss ε at t = η⁻¹ · poly(ε⁻¹, ‖μ‖, ‖w_O‖). This runs the `benign_overfitting` study (its normal
entry point, `xsens.studies.run`, one workdir per (η, ε), ViT only, no dynamics) on a small
N × ‖μ‖ grid for every η × ε, reads the recorded steps to train loss < ε of each run
(`grid_vit.npz`), and fits over all converged runs

  log t = a + b_η log η + b_ε log(1/ε) + b_N log N + b_μ log ‖μ‖   (`power_law_fit`).

The claim predicts b_η = −1 (η·t does not depend on η) and a finite b_ε (polynomial in
1/ε). It prints the fit, a table of the median η·t per (η, ε), writes them to
<root>/convergence_time.{md,json} and plots η·t against 1/ε, one line per η
(<root>/convergence_time.png): the lines coincide when t ∝ 1/η.

  python experiments/benign_convergence_time.py --root=workdirs/benign_convergence_time

Sweeps resume from their workdirs; a rerun only refits.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from mlcollections_configs import benign_overfitting as bo_config
from xsens import studies
from xsens.lab import phase_boundary
from xsens.report import plots


def config_for(eta: float, eps: float, a):
  """The `a.variant` config's data and ViT (default: the CPU default's), on `a`'s N × ‖μ‖
  grid, at (η, ε)."""
  config = bo_config.get_config(a.variant or None)
  config.models = ("vit",)
  config.dynamics.enabled = False
  config.train.learning_rate = eta
  config.train.loss_threshold = eps
  config.train.max_steps = a.max_steps
  config.sweep.n_values = tuple(int(v) for v in a.n.split(","))
  config.sweep.mu_norms = tuple(float(v) for v in a.mu.split(","))
  config.sweep.trials = a.trials
  config.sweep.chunk_size = len(config.sweep.n_values) * len(config.sweep.mu_norms) * a.trials
  config.report.bootstrap = 0
  return config


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--root", default="workdirs/benign_convergence_time")
  p.add_argument("--variant", default="", help="config variant of the data and model")
  p.add_argument("--eta", default="0.05,0.1,0.2")
  p.add_argument("--eps", default="0.1,0.03,0.01,0.003")
  p.add_argument("--n", default="4,10,20")
  p.add_argument("--mu", default="1,8,32,128")
  p.add_argument("--trials", type=int, default=5)
  p.add_argument("--max_steps", type=int, default=3000)
  a = p.parse_args(argv)
  etas = [float(v) for v in a.eta.split(",")]
  epss = [float(v) for v in a.eps.split(",")]
  ns = np.asarray([int(v) for v in a.n.split(",")], float)
  mus = np.asarray([float(v) for v in a.mu.split(",")], float)
  # t[η, ε, N, ‖μ‖, trial]; NaN where the run did not reach ε within max_steps.
  t = np.full((len(etas), len(epss), len(ns), len(mus), a.trials), np.nan)
  converged = np.zeros(t.shape, bool)
  wall = 0.0
  for i, eta in enumerate(etas):
    for j, eps in enumerate(epss):
      wd = os.path.join(a.root, f"eta{eta:g}_eps{eps:g}")
      t0 = time.perf_counter()
      studies.run(config_for(eta, eps, a), wd)
      wall += time.perf_counter() - t0
      g = np.load(os.path.join(wd, "grid_vit.npz"))
      converged[i, j] = g["converged"] > 0.5
      t[i, j] = np.where(converged[i, j], g["steps"], np.nan)
      print(f"η={eta:g} ε={eps:g}: median steps {np.nanmedian(t[i, j]):.0f}, "
            f"converged {converged[i, j].mean():.2f}", flush=True)
  shape = t.shape
  fit = phase_boundary.power_law_fit(t, {
      "eta": np.reshape(etas, (-1, 1, 1, 1, 1)),
      "inv_eps": np.reshape(1.0 / np.asarray(epss), (1, -1, 1, 1, 1)),
      "n": np.reshape(ns, (1, 1, -1, 1, 1)), "mu": np.reshape(mus, (1, 1, 1, -1, 1))})
  eta_t = np.reshape(etas, (-1, 1, 1, 1, 1)) * t
  median_eta_t = np.nanmedian(eta_t.reshape(len(etas), len(epss), -1), -1)  # [η, ε]
  lines = [f"Fit over {fit['runs']} converged runs of {int(np.prod(shape))} (η × ε × N × ‖μ‖ "
           f"× trial = {' × '.join(map(str, shape))}): log t = {fit['a']:.2f} "
           f"{fit['b_eta']:+.3f} log η {fit['b_inv_eps']:+.3f} log(1/ε) {fit['b_n']:+.3f} "
           f"log N {fit['b_mu']:+.3f} log ‖μ‖ (R² {fit['r2']:.3f}); converged "
           f"{converged.mean():.3f}; sweeps {wall:.0f} s.", "",
           "| η \\ ε | " + " | ".join(f"{e:g}" for e in epss) + " |",
           "|---|" + "---|" * len(epss)]
  for i, eta in enumerate(etas):
    lines.append(f"| {eta:g} | " + " | ".join(f"{v:.3g}" for v in median_eta_t[i]) + " |")
  lines.append("")
  lines.append("(cells: median η·t over N × ‖μ‖ × trials; constant down a column iff t ∝ 1/η)")
  table = "\n".join(lines)
  print(table)
  os.makedirs(a.root, exist_ok=True)
  plots.line_plot(os.path.join(a.root, "convergence_time.png"), 1.0 / np.asarray(epss),
                  {f"η={eta:g}": median_eta_t[i] for i, eta in enumerate(etas)},
                  xlabel="1/ε", ylabel="median η · steps to train loss < ε", logx=True,
                  logy=True, title="ViT: η·t against 1/ε")
  with open(os.path.join(a.root, "convergence_time.md"), "w") as fh:
    fh.write(table + "\n")
  with open(os.path.join(a.root, "convergence_time.json"), "w") as fh:
    json.dump({"args": vars(a), "fit": fit, "median_eta_t": median_eta_t.tolist(),
               "converged_frac": float(converged.mean()), "sweeps_wall_s": wall}, fh,
              indent=1)
  return fit, median_eta_t


if __name__ == "__main__":
  main()
