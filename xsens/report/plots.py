"""PNG plots for study reports (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np


def bar_plot(path: str, labels: Sequence[str], values: Sequence[float], *,
             errors: Sequence[float] | None = None, ylabel: str = "", title: str = "") -> str:
  """A bar per label with optional ± error bars. Returns the file name."""
  fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(labels), 3.2))
  ax.bar(np.arange(len(labels)), values, yerr=errors, capsize=4, color="tab:blue")
  ax.set_xticks(np.arange(len(labels)), labels, rotation=20, ha="right")
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  return _save(fig, path)


def line_plot(path: str, x: Sequence[float], series: Mapping[str, Sequence[float]], *,
              errors: Mapping[str, Sequence[float]] | None = None, xlabel: str = "",
              ylabel: str = "", title: str = "", logx: bool = False) -> str:
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


def _save(fig, path: str, tight: bool = True) -> str:
  if tight:
    fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return os.path.basename(path)
