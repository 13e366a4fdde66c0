"""Figures of an N × SNR phase diagram of GD runs and of its training dynamics.

Heat maps of the test loss over the grid with the fitted boundary curves (`heatmaps`,
`boundary_curves`), the GD steps to a train-loss threshold (`steps_figure`) and the
dynamics of one setting (`dynamics_figures`); Jiang et al., NeurIPS 2024
(arXiv 2409.19345), Fig. 1. Every figure is a PNG under the study's workdir
(`xsens.report.plots`).
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from xsens.report import plots

PAPER_N_SNR2 = 1000.0  # Jiang et al. Fig. 1's red curve N·SNR² = 1000.


def boundary_curves(snrs, ns, fit, theory_k, *, paper_curve: bool = False) -> dict:
  """Overlays (SNR, N): the interpolation fit, the theory slope through its crossings, the
  logistic decision line and (ViT) the paper's fixed N·SNR² = 1000 (at most four styles)."""
  s = np.geomspace(snrs.min(), snrs.max(), 100)
  out = {}
  if np.isfinite(fit["k"]):
    out[f"fit N·SNR^{fit['k']:.2f}={fit['c']:.3g}"] = (s, fit["c"] / s ** fit["k"])
    # Theory slope through the geometric mean of the crossings.
    cr = np.asarray(fit["crossings"])
    ok = np.isfinite(cr)
    c_th = float(np.exp(np.mean(np.log(ns[ok]) + theory_k * np.log(cr[ok]))))
    out[f"N·SNR^{theory_k:g}={c_th:.3g}"] = (s, c_th / s ** theory_k)
  lg = fit.get("logistic") or {}
  if np.isfinite(lg.get("k", np.nan)):
    out[f"logistic N·SNR^{lg['k']:.2f}={lg['c']:.3g}"] = (s, lg["c"] / s ** lg["k"])
  if paper_curve:
    out[f"paper N·SNR²={PAPER_N_SNR2:g}"] = (s, PAPER_N_SNR2 / s ** 2)
  return out


def heatmaps(workdir: str, model: str, test_loss, ns, snrs, cutoff: float,
             curves: dict) -> list[str]:
  """heatmap_<model>_all_runs.png (every run as its own row, N repeated once per trial,
  like the authors' heat map), heatmap_<model>.png (trial-mean test loss) and
  cutoff_<model>.png (mean test loss < `cutoff`); `test_loss` [nN, nS, T], `curves` drawn
  over each (`boundary_curves`)."""
  mean = np.nanmean(test_loss, -1)
  trials = test_loss.shape[-1]
  all_rows = np.transpose(test_loss, (0, 2, 1)).reshape(-1, len(snrs))
  spread = np.min(np.diff(ns)) if len(ns) > 1 else 1.0
  rows_n = np.repeat(ns, trials) + np.tile(np.linspace(-0.45, 0.45, trials), len(ns)) * spread
  path = lambda name: os.path.join(workdir, f"{name}.png")
  return [
      plots.phase_heatmap(path(f"heatmap_{model}_all_runs"), all_rows, rows_n, snrs,
                          title=f"{model}: test loss of every run ({trials} per N)",
                          cbar_label="test loss", curves=curves),
      plots.phase_heatmap(path(f"heatmap_{model}"), mean, ns, snrs,
                          title=f"{model}: mean test loss", cbar_label="test loss",
                          curves=curves),
      plots.phase_heatmap(path(f"cutoff_{model}"), (mean < cutoff).astype(float), ns, snrs,
                          title=f"{model}: mean test loss < {cutoff}",
                          cbar_label=f"loss < {cutoff}", curves=curves, cmap="gray")]


def steps_figure(workdir: str, model: str, res: dict, ns, snrs, *, loss_threshold: float,
                 eta_label: str) -> str:
  """steps_<model>.png: mean GD steps to train loss < `loss_threshold` (converged runs)
  against SNR, for three N; `res`: {"steps", "converged"} [nN, nS, T]; `eta_label`: the
  GD step in words."""
  steps = np.where(res["converged"] > 0.5, res["steps"], np.nan)
  picks = sorted({0, len(ns) // 2, len(ns) - 1})
  with warnings.catch_warnings():  # A (N, ‖μ‖) with no converged run is NaN (no point).
    warnings.simplefilter("ignore", RuntimeWarning)
    series = {f"N={ns[i]}": np.nanmean(steps[i], -1) for i in picks}
  return plots.line_plot(
      os.path.join(workdir, f"steps_{model}.png"), snrs, series,
      xlabel="SNR = ‖μ‖ / (σ_p √d), log scale", logx=True,
      ylabel=f"GD steps to train loss < {loss_threshold}",
      title=f"{model}: convergence time ({eta_label})", logy=True)


def dynamics_figures(workdir: str, name: str, logs: dict) -> list[str]:
  """dynamics_<name>_<group>.png: mean ± std over trials of the metrics `logs`
  ({metric: [trials, steps + 1]}) by group (loss, attention, value, margin, qk, rank)."""
  steps = np.arange(next(iter(logs.values())).shape[-1])
  stat = lambda k: (np.mean(logs[k], 0), np.std(logs[k], 0))
  groups = {
      "loss": ["train_loss", "test_loss"],
      "attention": ["attn_signal_s0", "attn_xi2_s0", "attn_other_s0", "attn_signal_mean",
                    "attn_xi2_mean", "attn_other_mean"],
      "value": ["gamma_plus", "gamma_minus", "rho_xi2_s0", "rho_xi2_mean", "rho_weak_mean"],
      "margin": ["margin_signal_mean", "margin_noise_mean"],
      "qk": ["qk_mu_mu", "qk_mu_xi2", "qk_xi3_mu", "qk_xi3_xi2"],
      "rank": ["stable_rank_wv"],
  }
  ylabels = {"loss": "loss (logistic, nats)", "attention": "attention probability",
             "value": "value-projection coefficient", "margin": "margin (logit units)",
             "qk": "query–key inner product", "rank": "stable rank of W_V"}
  files = []
  for g, keys in groups.items():
    series = {k: stat(k) for k in keys if k in logs}
    files.append(plots.dynamics_plot(
        os.path.join(workdir, f"dynamics_{name}_{g}.png"), steps, series,
        xlabel="GD step", ylabel=ylabels[g],
        title=f"{name}: {g} (mean ± std over {logs['train_loss'].shape[0]})"))
  return files
