"""PNG plots for study reports (matplotlib; saved to files, never shown).

One style for every figure: a title, labelled axes (with units where they
have one), integer ticks on integer axes (`styled_axes`), lines told apart by colour, marker
and line style with hollow markers of decreasing size so overlapping lines stay visible
(`line_styles`), legends outside the axes so they cover no data (`legend_outside`), a dashed
grey chance line wherever accuracy is plotted (`chance_line`), and heat maps with index
ticks, axis labels and a colour bar (`heatmap_grid`). The studies' own figures use the same
helpers.

Importing this module leaves matplotlib's backend alone, so a notebook that imports a study
keeps its inline figures; without a display matplotlib falls back to Agg by itself. Figures
go to local or remote paths (`xsens.paths.savefig`), written by process 0 only.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib import ticker
import numpy as np

from xsens import paths

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
LINESTYLES = ("-", "--", ":", "-.")
ACCURACY = "accuracy (fraction correct)"


# --------------------------------------------------------------------------- style helpers


def line_styles(n: int) -> list[dict]:
  """`n` plot kwargs with distinct (colour, marker, line style); hollow markers shrink and
  lines thin from the first to the last, so lines drawn on top of each other stay visible."""
  out = []
  for i in range(n):
    frac = i / max(n - 1, 1)
    out.append({"color": f"C{i % 10}", "marker": MARKERS[i % len(MARKERS)],
                "linestyle": LINESTYLES[i % len(LINESTYLES)], "markersize": 8.0 - 4.0 * frac,
                "markerfacecolor": "none", "markeredgewidth": 1.3,
                "linewidth": 2.2 - 1.2 * frac})
  return out


def styled_axes(ax, title: str, xlabel: str, ylabel: str, *, integer_x: bool = False,
                integer_y: bool = False, title_size: float = 10) -> None:
  """Sets the title and axis labels; integer-only tick locators on integer axes."""
  ax.set_title(title, fontsize=title_size)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if integer_x:
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  if integer_y:
    ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))


def chance_line(ax, num_classes: int | None):
  """A dashed grey horizontal line at accuracy 1/num_classes, labelled for the legend."""
  if not num_classes:
    return None
  return ax.axhline(1.0 / num_classes, color="grey", linestyle="--", linewidth=1.0,
                    label=f"chance (1/{num_classes})", zorder=0.5)


def legend_outside(ax, handles=None, labels=None, *, fontsize: float = 7,
                   in_layout: bool = False, **kwargs):
  """A legend to the right of the axes (never over the data); None when nothing is labelled.

  By default the legend stays out of `tight_layout` (long labels cannot squeeze the axes)
  and `save_figure` widens the saved image to include it; a grid whose legend has axes to
  its right passes `in_layout=True` so that `tight_layout` makes room for it.
  """
  if handles is None:
    handles, labels = ax.get_legend_handles_labels()
  if not handles:
    return None
  legend = ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                     borderaxespad=0.0, fontsize=fontsize, frameon=False, **kwargs)
  legend.set_in_layout(in_layout)
  return legend


def is_integer_valued(values) -> bool:
  """True when every finite value is a whole number (e.g. severities 1..5, layer indices)."""
  v = np.asarray(values, float)
  v = v[np.isfinite(v)]
  return v.size > 0 and bool(np.all(v == np.round(v)))


def save_figure(fig, path: str, tight: bool = False, dpi: int = 110) -> str:
  """Saves and closes `fig` (process 0 writes; local or remote path); returns the file name
  (what a report links). The bounding box is fitted to the figure's artists, so legends
  placed outside the axes are kept."""
  if tight:
    fig.tight_layout()
  outside = [ax.get_legend() for ax in fig.axes
             if ax.get_legend() is not None and not ax.get_legend().get_in_layout()]
  name = paths.savefig(fig, path, dpi=dpi, bbox_inches="tight",
                       bbox_extra_artists=fig.get_default_bbox_extra_artists() + outside)
  plt.close(fig)
  return name


def _save(fig, path: str, tight: bool = True) -> str:
  return save_figure(fig, path, tight=tight)


# ------------------------------------------------------------------------------- figures


def bar_plot(path: str, labels: Sequence[str], values: Sequence[float], *,
             errors: Sequence[float] | None = None, ylabel: str = "", title: str = "",
             xlabel: str = "", num_classes: int | None = None) -> str:
  """A bar per label with optional ± error bars; a chance line when `num_classes` is given
  (accuracy bars). Returns the file name."""
  fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(labels), 3.2))
  ax.bar(np.arange(len(labels)), values, yerr=errors, capsize=4, color="tab:blue")
  ax.set_xticks(np.arange(len(labels)), labels, rotation=20, ha="right")
  chance_line(ax, num_classes)
  styled_axes(ax, title, xlabel, ylabel)
  legend_outside(ax)
  return _save(fig, path)


def grouped_bar_plot(path: str, groups: Sequence[str], series: Mapping[str, Sequence[float]],
                     *, ylabel: str = "", title: str = "", xlabel: str = "",
                     num_classes: int | None = None) -> str:
  """Bars per group (x axis), one coloured (and hatched) bar per series; legend outside the
  axes; a chance line when `num_classes` is given. Returns the file name."""
  fig, ax = plt.subplots(figsize=(2.5 + 1.3 * len(groups), 3.4))
  width = 0.8 / max(len(series), 1)
  hatches = ("", "//", "..", "xx", "\\\\", "++")
  for i, (name, values) in enumerate(series.items()):
    ax.bar(np.arange(len(groups)) + (i - (len(series) - 1) / 2) * width, values, width,
           label=name, color=f"C{i % 10}", hatch=hatches[i % len(hatches)],
           edgecolor="white", linewidth=0.5)
  ax.set_xticks(np.arange(len(groups)), groups)
  chance_line(ax, num_classes)
  styled_axes(ax, title, xlabel, ylabel)
  legend_outside(ax)
  return _save(fig, path)


def line_plot(path: str, x: Sequence[float], series: Mapping[str, Sequence[float]], *,
              errors: Mapping[str, Sequence[float]] | None = None, xlabel: str = "",
              ylabel: str = "", title: str = "", logx: bool = False,
              logy: bool = False, num_classes: int | None = None) -> str:
  """One line per series (with a ± band when `errors` has it), styled by `line_styles`;
  integer x ticks when every x is a whole number; a chance line when `num_classes` is
  given. Returns the file name."""
  fig, ax = plt.subplots(figsize=(5.6, 3.4))
  for (name, ys), style in zip(series.items(), line_styles(len(series))):
    ys = np.asarray(ys, float)
    ax.plot(x, ys, label=name, **style)
    if errors and name in errors:
      e = np.asarray(errors[name], float)
      ax.fill_between(x, ys - e, ys + e, alpha=0.15, color=style["color"])
  if logx:
    ax.set_xscale("log")
    ax.set_xticks(list(x), [f"{v:g}" for v in x])
    ax.minorticks_off()
  if logy:
    ax.set_yscale("log")
  chance_line(ax, num_classes)
  styled_axes(ax, title, xlabel, ylabel, integer_x=not logx and is_integer_valued(x))
  legend_outside(ax)
  return _save(fig, path)


def heatmap_grid(path: str, maps: Mapping[str, np.ndarray], *, title: str = "",
                 cbar_label: str = "", xlabel: str = "column", ylabel: str = "row",
                 tick_labels: Mapping[str, tuple] | None = None,
                 axis_labels: Mapping[str, tuple] | None = None) -> str:
  """Side-by-side heat maps sharing one colour scale (e.g. per-patch sensitivity, CKA).

  Args:
    maps: {panel title: [rows, cols] array}.
    xlabel, ylabel: what the columns / rows index (e.g. "layer of run b", "patch row").
    tick_labels: {panel title: (column labels, row labels)}; panels without get integer
      index ticks.
    axis_labels: {panel title: (xlabel, ylabel)}, overriding `xlabel` / `ylabel`.
  """
  names = list(maps)
  vmax = max(float(np.max(m)) for m in maps.values()) or 1.0
  fig, axes = plt.subplots(1, len(names), figsize=(2.9 * len(names) + 1.0, 3.3),
                           squeeze=False, layout="constrained")
  for ax, name in zip(axes[0], names):
    im = ax.imshow(maps[name], vmin=0.0, vmax=vmax, cmap="viridis")
    cols, rows = (tick_labels or {}).get(name, (None, None))
    if cols is not None:
      ax.set_xticks(np.arange(len(cols)), cols, rotation=60, ha="right", fontsize=6)
    if rows is not None:
      ax.set_yticks(np.arange(len(rows)), rows, fontsize=6)
    xl, yl = (axis_labels or {}).get(name, (xlabel, ylabel))
    styled_axes(ax, name, xl, yl, integer_x=cols is None, integer_y=rows is None,
                title_size=9)
  fig.colorbar(im, ax=list(axes[0]), label=cbar_label, shrink=0.8)
  fig.suptitle(title)
  return _save(fig, path, tight=False)


def phase_heatmap(path: str, values: np.ndarray, n_values: Sequence[float],
                  snrs: Sequence[float], *, title: str = "", cbar_label: str = "",
                  curves: Mapping[str, tuple] | None = None, cmap: str = "viridis") -> str:
  """An N (y) × SNR (x) heat map, values [nN, nSNR], with optional (x, y) curves overlaid."""
  fig, ax = plt.subplots(figsize=(6.4, 3.8))
  im = ax.pcolormesh(np.asarray(snrs), np.asarray(n_values), np.asarray(values),
                     shading="nearest", cmap=cmap)
  for (label, (x, y)), style in zip((curves or {}).items(), ("r-", "w--", "c:", "m-.")):
    ax.plot(x, y, style, label=label, lw=1.5)
  ax.set_xscale("log")
  ax.set_ylim(min(n_values) - 1, max(n_values) + 1)
  styled_axes(ax, title, "SNR = ‖μ‖ / (σ_p √d)", "N (training samples)",
              integer_y=is_integer_valued(n_values))
  fig.colorbar(im, ax=ax, label=cbar_label)
  if curves:  # Below the x label: the colour bar takes the right-hand side.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.25), borderaxespad=0.0,
              frameon=False, ncol=2)
  return _save(fig, path)


def boundary_overlay(path: str, fits: Mapping[str, tuple], n_values: Sequence[float]) -> str:
  """Crossing SNRs per N and fitted N·SNR^k = c lines; fits: {name: (snrs, cross, k, c)}."""
  fig, ax = plt.subplots(figsize=(6.0, 3.6))
  n_values = np.asarray(n_values, float)
  for (name, (snrs, cross, k, c)), style in zip(fits.items(), line_styles(len(fits))):
    cross = np.asarray(cross, float)
    ax.plot(cross, n_values, linestyle="none", color=style["color"], marker=style["marker"],
            markerfacecolor="none", label=f"{name} crossings")
    if np.isfinite(k):
      s = np.geomspace(np.nanmin(snrs), np.nanmax(snrs), 100)
      ax.plot(s, c / s ** k, linestyle=style["linestyle"], color=style["color"],
              label=f"{name}: N·SNR^{k:.2f} = {c:.3g}")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_ylim(n_values.min() * 0.8, n_values.max() * 1.25)
  styled_axes(ax, "Benign/harmful boundary (test loss = cutoff)", "SNR = ‖μ‖ / (σ_p √d)",
              "N (training samples)")
  legend_outside(ax)
  return _save(fig, path)


def dynamics_plot(path: str, steps: np.ndarray, series: Mapping[str, tuple], *,
                  xlabel: str = "", ylabel: str = "", title: str = "",
                  error_every: int = 50) -> str:
  """Lines of mean with a ± std band; series: {name: (mean [T], std [T])}."""
  fig, ax = plt.subplots(figsize=(6.2, 3.4))
  every = max(1, len(steps) // 10)
  for (name, (mean, std)), style in zip(series.items(), line_styles(len(series))):
    ax.plot(steps, mean, label=name, markevery=every, **{**style, "linewidth": 1.2})
    ax.fill_between(steps, mean - std, mean + std, alpha=0.2, color=style["color"])
    sel = slice(0, None, max(1, error_every))
    ax.errorbar(steps[sel], mean[sel], yerr=std[sel], fmt="none", ecolor=style["color"],
                capsize=2, lw=0.8)
  styled_axes(ax, title, xlabel, ylabel, integer_x=True, title_size=9)
  legend_outside(ax)
  return _save(fig, path)


def panels_plot(path: str, panels: Mapping[str, Mapping[str, tuple]], *, xlabel: str = "",
                ylabels: Sequence[str] | None = None, title: str = "",
                invert_x: bool = False,
                num_classes: Sequence[int | None] | None = None) -> str:
  """Side-by-side panels of lines, each series with its own x: {panel: {name: (x, y) or
  (x, y, err)}}; a ± band where err is given. A series keeps its style in every panel; one
  legend right of the last panel; `num_classes[i]` draws a chance line on panel i (an
  accuracy panel). Returns the file name."""
  names = list(dict.fromkeys(n for series in panels.values() for n in series))
  styles = dict(zip(names, line_styles(len(names))))
  fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1.6, 3.3),
                           squeeze=False)
  for i, (ax, (panel, series)) in enumerate(zip(axes[0], panels.items())):
    for name, xy in series.items():
      x, y = np.asarray(xy[0], float), np.asarray(xy[1], float)
      ax.plot(x, y, label=name, **styles[name])
      if len(xy) > 2 and xy[2] is not None:
        e = np.asarray(xy[2], float)
        ax.fill_between(x, y - e, y + e, alpha=0.15, color=styles[name]["color"])
    if invert_x:
      ax.invert_xaxis()
    if num_classes:
      chance_line(ax, num_classes[i])
    styled_axes(ax, panel, xlabel, ylabels[i] if ylabels else "", title_size=9,
                integer_x=all(is_integer_valued(xy[0]) for xy in series.values()))
  handles = {}
  for ax in axes[0]:
    for h, label in zip(*ax.get_legend_handles_labels()):
      handles.setdefault(label, h)
  legend_outside(axes[0][-1], list(handles.values()), list(handles))
  if title:
    fig.suptitle(title, fontsize=10)
  return _save(fig, path)


def sigma_plot(path: str, measured, nsr) -> str:
  """Sensitivity vs σ per model: token-wise solid, global dashed (same colour), ± s.e.
  bands; the top axis gives σ as noise-to-signal."""
  sigmas = list(nsr)
  fig, ax = plt.subplots(figsize=(6.6, 3.8))
  for (name, m), style in zip(measured.items(), line_styles(len(measured))):
    parts = [("token-wise", "-", m["sigmas"])]
    if "global" in m:
      parts.append(("global", "--", m["global"]))
    for i, (label, linestyle, values) in enumerate(parts):
      y = np.array([values[s][0] for s in sigmas])
      e = np.array([values[s][1] for s in sigmas])
      ax.plot(sigmas, y, **{**style, "linestyle": linestyle if len(parts) > 1
                             else style["linestyle"]},
              label=name if i == 0 else None)
      ax.fill_between(sigmas, y - e, y + e, alpha=0.15, color=style["color"])
  if any("global" in m for m in measured.values()):
    ax.plot([], [], "k-", label="token-wise (one patch)")
    ax.plot([], [], "k--", label="global (all patches)")
  ax.set_xscale("log")
  ax.set_xticks(sigmas, [f"{s:g}" for s in sigmas])
  ax.minorticks_off()
  ratio = nsr[sigmas[0]] / sigmas[0] if sigmas[0] > 0 else None
  if ratio:
    top = ax.secondary_xaxis("top", functions=(lambda s: s * ratio, lambda r: r / ratio))
    top.set_xticks([nsr[s] for s in sigmas], [f"{nsr[s]:.2g}" for s in sigmas])
    top.minorticks_off()
    top.set_xlabel("noise-to-signal σ√D / RMS‖x_i‖", fontsize=8)
  styled_axes(ax, "Sensitivity vs noise scale", "σ (pixel units, log scale)",
                    "train-set sensitivity (flip probability)")
  legend_outside(ax)
  fig.tight_layout()
  return save_figure(fig, path)


def boolean_spectrum_figure(path: str, res: dict) -> str:
  """boolean_spectrum.png: per model, the learned / target coefficient of each component
  and the degree spectrum W^k over training (`res` of the study's Boolean part)."""
  models = list(res["coef"])
  steps = np.asarray(res["steps"])
  fig, axes = plt.subplots(2, len(models), figsize=(6.2 * len(models), 6.6), squeeze=False)
  every = max(1, len(steps) // 10)
  comps = res["components"]
  for j, name in enumerate(models):
    ax = axes[0, j]
    for comp, c, style in zip(comps, range(len(comps)), line_styles(len(comps))):
      ax.plot(steps, res["coef"][name][:, c] / comp["coef"], markevery=every,
              label=f"deg {comp['degree']}: " + "x" + "·x".join(map(str, comp["coords"])),
              **style)
    ax.axhline(1.0, color="gray", lw=0.6, ls="--")
    styled_axes(ax, f"{name}: learned / target coefficient", "training step",
                      "learned / target coefficient", integer_x=True, title_size=9)
    legend_outside(ax, in_layout=True)  # Other models' panels to the right.
    ax = axes[1, j]
    spec = res["spectrum"][name]
    ks = [k for k in range(spec.shape[1]) if k <= 4 or spec[:, k].max() > 0.05]
    for k, style in zip(ks, line_styles(len(ks))):
      ax.plot(steps, spec[:, k], label=f"W^{k}", markevery=every, **style)
    styled_axes(ax, f"{name}: degree spectrum W^k of the learned f", "training step",
                      "W^k (share of ‖f‖²)", integer_x=True, title_size=9)
    legend_outside(ax, in_layout=True)  # Other models' panels to the right.
  fig.suptitle("Boolean task: coefficients and degree spectrum over training")
  return _save(fig, path)


# Series of `training_curves`: label -> the metrics.jsonl key of its loss and accuracy.
TRAINING_SERIES = {
    "training batches (mean over each log window)": ("train/loss", "train/accuracy"),
    "train split (evaluation)": ("eval/train_loss", "eval/train_accuracy"),
    "test split (evaluation)": ("eval/test_loss", "eval/test_accuracy"),
}


def training_curves(path: str, records: Sequence[Mapping], *, loss_label: str = "loss",
                    num_classes: int | None = None, title: str = "") -> str | None:
  """Loss and accuracy against the training step from one run's metrics records
  (`xsens.train.metrics.read_metrics`): the logged training-batch means and the
  evaluations of the train and test splits (`TRAINING_SERIES`); a chance line on the
  accuracy panel. Returns the file name, or None (nothing written) when the records hold
  none of those series."""
  panels = {"loss": {}, "accuracy": {}}
  for label, keys in TRAINING_SERIES.items():
    for panel, key in zip(panels, keys):
      points = [(r["step"], r[key]) for r in records if key in r and "step" in r]
      if points:
        x, y = zip(*sorted(points))
        panels[panel][label] = (x, y)
  panels = {name: series for name, series in panels.items() if series}
  if not panels:
    return None
  ylabels = {"loss": loss_label, "accuracy": ACCURACY}
  return panels_plot(path, panels, xlabel="training step", ylabels=[ylabels[p] for p in panels],
                     title=title, num_classes=[num_classes if p == "accuracy" else None
                                               for p in panels])
