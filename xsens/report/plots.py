"""PNG plots for study reports (matplotlib; saved to files, never shown).

Importing this module leaves matplotlib's backend alone, so a notebook that imports a study
keeps its inline figures; without a display matplotlib falls back to Agg by itself. Figures
go to local or remote paths (`xsens.paths.savefig`), written by process 0 only.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

from xsens import paths


def bar_plot(path: str, labels: Sequence[str], values: Sequence[float], *,
             errors: Sequence[float] | None = None, ylabel: str = "", title: str = "") -> str:
  """A bar per label with optional ± error bars. Returns the file name."""
  fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(labels), 3.2))
  ax.bar(np.arange(len(labels)), values, yerr=errors, capsize=4, color="tab:blue")
  ax.set_xticks(np.arange(len(labels)), labels, rotation=20, ha="right")
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  return _save(fig, path)


def grouped_bar_plot(path: str, groups: Sequence[str], series: Mapping[str, Sequence[float]],
                     *, ylabel: str = "", title: str = "") -> str:
  """Bars per group (x axis), one coloured bar per series. Returns the file name."""
  fig, ax = plt.subplots(figsize=(1.5 + 1.3 * len(groups), 3.4))
  width = 0.8 / max(len(series), 1)
  for i, (name, values) in enumerate(series.items()):
    ax.bar(np.arange(len(groups)) + (i - (len(series) - 1) / 2) * width, values, width,
           label=name)
  ax.set_xticks(np.arange(len(groups)), groups)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.legend(fontsize=8)
  return _save(fig, path)


def line_plot(path: str, x: Sequence[float], series: Mapping[str, Sequence[float]], *,
              errors: Mapping[str, Sequence[float]] | None = None, xlabel: str = "",
              ylabel: str = "", title: str = "", logx: bool = False,
              logy: bool = False) -> str:
  """One line per series (with a ± band when `errors` has it). Returns the file name."""
  fig, ax = plt.subplots(figsize=(4.8, 3.4))
  for name, ys in series.items():
    ys = np.asarray(ys, float)
    ax.plot(x, ys, marker="o", label=name)
    if errors and name in errors:
      e = np.asarray(errors[name], float)
      ax.fill_between(x, ys - e, ys + e, alpha=0.2)
  if logx:
    ax.set_xscale("log")
    ax.set_xticks(list(x), [f"{v:g}" for v in x])
    ax.minorticks_off()
  if logy:
    ax.set_yscale("log")
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.legend(fontsize=8)
  return _save(fig, path)


def heatmap_grid(path: str, maps: Mapping[str, np.ndarray], *, title: str = "",
                 cbar_label: str = "") -> str:
  """Side-by-side heat maps sharing one colour scale (e.g. per-patch sensitivity)."""
  names = list(maps)
  vmax = max(float(np.max(m)) for m in maps.values()) or 1.0
  fig, axes = plt.subplots(1, len(names), figsize=(2.4 * len(names) + 0.8, 2.6), squeeze=False)
  for ax, name in zip(axes[0], names):
    im = ax.imshow(maps[name], vmin=0.0, vmax=vmax, cmap="viridis")
    ax.set_title(name, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
  fig.colorbar(im, ax=list(axes[0]), label=cbar_label, shrink=0.8)
  fig.suptitle(title)
  return _save(fig, path, tight=False)


def save_figure(fig, path: str, tight: bool = False, dpi: int = 110) -> str:
  """Saves and closes `fig` (process 0 writes; local or remote path); returns the file name
  (what a report links)."""
  if tight:
    fig.tight_layout()
  name = paths.savefig(fig, path, dpi=dpi)
  plt.close(fig)
  return name


def _save(fig, path: str, tight: bool = True) -> str:
  return save_figure(fig, path, tight=tight)


def phase_heatmap(path: str, values: np.ndarray, n_values: Sequence[float],
                  snrs: Sequence[float], *, title: str = "", cbar_label: str = "",
                  curves: Mapping[str, tuple] | None = None, cmap: str = "viridis") -> str:
  """An N (y) × SNR (x) heat map, values [nN, nSNR], with optional (x, y) curves overlaid."""
  fig, ax = plt.subplots(figsize=(5.6, 3.8))
  im = ax.pcolormesh(np.asarray(snrs), np.asarray(n_values), np.asarray(values),
                     shading="nearest", cmap=cmap)
  for (label, (x, y)), style in zip((curves or {}).items(), ("r-", "w--", "c:", "m-.")):
    ax.plot(x, y, style, label=label, lw=1.5)
  ax.set_xscale("log")
  ax.set_ylim(min(n_values) - 1, max(n_values) + 1)
  ax.set_xlabel("SNR = ‖μ‖ / (σ_p √d)")
  ax.set_ylabel("N (training samples)")
  ax.set_title(title)
  fig.colorbar(im, ax=ax, label=cbar_label)
  if curves:
    ax.legend(fontsize=7, loc="upper right")
  return _save(fig, path)


def boundary_overlay(path: str, fits: Mapping[str, tuple], n_values: Sequence[float]) -> str:
  """Crossing SNRs per N and fitted N·SNR^k = c lines; fits: {name: (snrs, cross, k, c)}."""
  fig, ax = plt.subplots(figsize=(4.8, 3.6))
  n_values = np.asarray(n_values, float)
  for (name, (snrs, cross, k, c)), color in zip(fits.items(), ("tab:blue", "tab:orange",
                                                               "tab:green")):
    cross = np.asarray(cross, float)
    ax.plot(cross, n_values, "o", color=color, label=f"{name} crossings")
    if np.isfinite(k):
      s = np.geomspace(np.nanmin(snrs), np.nanmax(snrs), 100)
      ax.plot(s, c / s ** k, "-", color=color, label=f"{name}: N·SNR^{k:.2f} = {c:.3g}")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_ylim(n_values.min() * 0.8, n_values.max() * 1.25)
  ax.set_xlabel("SNR")
  ax.set_ylabel("N")
  ax.set_title("Benign/harmful boundary (test loss = cutoff)")
  ax.legend(fontsize=7)
  return _save(fig, path)


def dynamics_plot(path: str, steps: np.ndarray, series: Mapping[str, tuple], *,
                  xlabel: str = "", title: str = "", error_every: int = 50) -> str:
  """Lines of mean with a ± std band; series: {name: (mean [T], std [T])}."""
  fig, ax = plt.subplots(figsize=(5.2, 3.4))
  for name, (mean, std) in series.items():
    line, = ax.plot(steps, mean, label=name, lw=1.2)
    ax.fill_between(steps, mean - std, mean + std, alpha=0.2, color=line.get_color())
    sel = slice(0, None, max(1, error_every))
    ax.errorbar(steps[sel], mean[sel], yerr=std[sel], fmt="none", ecolor=line.get_color(),
                capsize=2, lw=0.8)
  ax.set_xlabel(xlabel)
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=7)
  return _save(fig, path)


def panels_plot(path: str, panels: Mapping[str, Mapping[str, tuple]], *, xlabel: str = "",
                ylabels: Sequence[str] | None = None, title: str = "",
                invert_x: bool = False) -> str:
  """Side-by-side panels of lines, each series with its own x: {panel: {name: (x, y) or
  (x, y, err)}}; a ± band where err is given. Returns the file name."""
  fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.3), squeeze=False)
  for i, (ax, (panel, series)) in enumerate(zip(axes[0], panels.items())):
    for name, xy in series.items():
      x, y = np.asarray(xy[0], float), np.asarray(xy[1], float)
      line, = ax.plot(x, y, marker=".", lw=1.2, label=name)
      if len(xy) > 2 and xy[2] is not None:
        e = np.asarray(xy[2], float)
        ax.fill_between(x, y - e, y + e, alpha=0.2, color=line.get_color())
    if invert_x:
      ax.invert_xaxis()
    ax.set_xlabel(xlabel)
    if ylabels:
      ax.set_ylabel(ylabels[i])
    ax.set_title(panel, fontsize=9)
    ax.legend(fontsize=7)
  if title:
    fig.suptitle(title, fontsize=10)
  return _save(fig, path)
