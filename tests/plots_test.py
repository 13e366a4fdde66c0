"""The one plotting style (xsens/report/plots.py) on every study's figures, built from tiny
fake results: titles, axis labels, integer ticks, distinguishable lines, legends off the
data, chance lines on accuracy plots; results.md embeds the PNGs; the rel_mCE warning."""

import os
import warnings

import matplotlib

matplotlib.use("Agg")

import ml_collections  # pylint: disable=g-import-not-at-top
import numpy as np
import pytest
from matplotlib import colors as mcolors
from matplotlib.patches import Rectangle

from xsens.measures import corruption_eval
from xsens.report import plots, tables
from xsens.studies import benign_overfitting  # pylint: disable=unused-import
from xsens.studies import churn, distillation, grokking, reuse, robustness
from xsens.studies import sensitivity_language, sensitivity_vision


@pytest.fixture
def figures(monkeypatch):
  """Figures saved through `plots.save_figure`, checked before they are closed: {file: fig}."""
  checked = {}
  save = plots.save_figure

  def capture(fig, path, tight=False, dpi=110):
    if tight:
      fig.tight_layout()
    fig.canvas.draw()
    checked[os.path.basename(path)] = _inspect(fig)
    return save(fig, path, tight=False, dpi=dpi)

  monkeypatch.setattr(plots, "save_figure", capture)
  return checked


def _is_colorbar(ax) -> bool:
  return ax.get_label() == "<colorbar>"


def _is_chance(line) -> bool:
  return str(line.get_label()).startswith("chance")


def _data_lines(ax):
  return [l for l in ax.get_lines() if not _is_chance(l) and len(l.get_xdata()) > 0
          and not str(l.get_label()).startswith("_")]


def _inspect(fig) -> list[dict]:
  """What the style requires, per data axes, read off the drawn figure."""
  renderer = fig.canvas.get_renderer()
  out = []
  for ax in fig.axes:
    if _is_colorbar(ax):
      continue
    lines = _data_lines(ax)
    legend = ax.get_legend()
    overlaps = 0
    if legend is not None:
      box = legend.get_window_extent(renderer)
      for line in ax.get_lines():
        xy = np.column_stack([np.asarray(line.get_xdata(), float),
                              np.asarray(line.get_ydata(), float)])
        xy = ax.transData.transform(xy[np.all(np.isfinite(xy), axis=1)])
        overlaps += int(sum(box.contains(x, y) for x, y in xy))
      for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_height() != 0:
          overlaps += int(box.overlaps(patch.get_window_extent(renderer)))
      for image in ax.images:
        overlaps += int(box.overlaps(image.get_window_extent(renderer)))
      for other in fig.axes:  # Nor over a neighbouring panel.
        if other is not ax and not _is_colorbar(other):
          overlaps += int(box.overlaps(other.get_window_extent(renderer)))
    x0, x1 = sorted(ax.get_xlim())
    y0, y1 = sorted(ax.get_ylim())
    out.append({
        "title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
        "styles": [(mcolors.to_hex(l.get_color()), l.get_marker(), l.get_linestyle())
                   for l in lines if l.get_linestyle() not in ("None", "none", "")
                   or l.get_marker() not in ("None", "none", "")],
        "labels": [l.get_label() for l in lines],
        "chance": [l.get_ydata()[0] for l in ax.get_lines() if _is_chance(l)],
        "legend_overlaps": overlaps, "has_legend": legend is not None,
        "xticks": [t for t in ax.get_xticks() if x0 <= t <= x1],
        "yticks": [t for t in ax.get_yticks() if y0 <= t <= y1],
        "xticklabels": [t.get_text() for t in ax.get_xticklabels()],
        "images": len(ax.images)})
  return out


def _check_style(axes: list[dict], *, chance=None, integer_x=False, integer_y=False):
  """Every axes: title, x and y label; distinct (colour, marker, line style) per line;
  a legend that covers no data; optional chance line and integer ticks."""
  for a in axes:
    assert a["title"] and a["xlabel"] and a["ylabel"], a
    assert len(set(a["styles"])) == len(a["styles"]), a["styles"]
    assert a["legend_overlaps"] == 0, a
    if chance is not None:
      assert a["chance"] and a["chance"][0] == pytest.approx(chance), a
    if integer_x:
      assert a["xticks"] and all(float(t).is_integer() for t in a["xticks"]), a["xticks"]
    if integer_y:
      assert a["yticks"] and all(float(t).is_integer() for t in a["yticks"]), a["yticks"]


def _robustness_inputs(names=("vit", "resnet"), layers=3):
  rc = ml_collections.ConfigDict({
      "corruptions": {"severities": [1, 2, 3, 4, 5], "source": "auto", "tfds_name": None},
      "adversarial": {"epsilons": [0.0, 1 / 255, 2 / 255, 4 / 255], "norm": "linf",
                      "main_epsilon": 2 / 255},
      "patch_size": 4})
  # Identical FGSM and PGD curves: the overlapping lines of the issue.
  same = [0.5, 0.1, 0.1, 0.1]
  corr = {"summary": {n: {} for n in names},
          "by_severity": {n: [0.6, 0.5, 0.4, 0.3, 0.2] for n in names}}
  advs = {"fgsm": {n: same for n in names}, "pgd": {n: same for n in names},
          "patch_energy": {n: np.full((8, 8), 1 / 64) for n in names}}
  perts = {"layer_removal": {n: {"accuracy": {(f"block_{i}", "mlp"): 0.1 * i
                                              for i in range(layers)}, "baseline": 0.6}
                             for n in names}}
  lnames = [f"block_{i}" for i in range(layers)]
  reps = {"cka": {n: np.eye(layers) for n in names},
          "cross_cka": {f"{names[1]} vs {names[0]}": np.ones((layers, layers)) * 0.5},
          "probes": {n: {l: 0.95 for l in lnames} for n in names},  # Data up to the top.
          "layers": {n: lnames for n in names}}
  return rc, corr, advs, perts, reps


def test_robustness_figures(tmp_path, figures):
  rc, corr, advs, perts, reps = _robustness_inputs()
  files = robustness._plots(str(tmp_path), rc, corr, advs, perts, reps, num_classes=10)
  files.append(robustness._scale_plot(str(tmp_path), {
      n: {"train_examples": [100, 1000], "test_accuracy": [0.3, 0.5], "mCA": [0.2, 0.4],
          "PGD": [0.1, 0.2]} for n in ("vit", "resnet")}, num_classes=10))
  assert set(figures) == set(files)
  for f in files:
    assert os.path.exists(tmp_path / f)
  _check_style(figures["corruption_severity.png"], chance=0.1, integer_x=True)
  _check_style(figures["adversarial_epsilon.png"], chance=0.1)
  assert len(figures["adversarial_epsilon.png"][0]["styles"]) == 4  # All four visible.
  _check_style(figures["linear_probes.png"], chance=0.1, integer_x=True)
  _check_style(figures["layer_removal_vit.png"], chance=0.1)
  _check_style(figures["data_scale.png"], chance=0.1)
  cka = figures["cka_layers.png"]
  _check_style(cka)
  assert len(cka) == 3 and all(a["images"] == 1 for a in cka)
  assert cka[0]["xticklabels"] == ["block_0", "block_1", "block_2"]  # Layer ticks.
  _check_style(figures["perturbation_patch_energy.png"], integer_x=True, integer_y=True)


def test_distillation_figures(tmp_path, figures):
  k = 10
  per_class = list(np.linspace(0.95, 0.9, k))  # Class 9's bars reach the top right.
  agg = {v: {"per_class": [per_class], "accuracy": [0.9], "worst_class": [0.8],
             "worst_k_mean": [0.85], "head_accuracy": [0.95], "tail_accuracy": [0.9]}
         for v in ("one_hot", "distilled")}
  gains = {"distilled": list(np.linspace(-0.02, 0.03, k))}
  files = distillation._plots(str(tmp_path), list(agg), agg, per_class,
                              np.linspace(1, 3, k), gains, k)
  assert set(files) == {"per_class_accuracy.png", "gain_vs_teacher.png",
                        "subgroup_summary.png"}
  _check_style(figures["per_class_accuracy.png"], chance=0.1)
  assert figures["per_class_accuracy.png"][0]["has_legend"]
  _check_style(figures["subgroup_summary.png"], chance=0.1)
  _check_style(figures["gain_vs_teacher.png"])


def test_churn_reuse_sensitivity_figures(tmp_path, figures):
  churn._confidence_plot(str(tmp_path / "churn_by_confidence.png"), ["[0,0.5)", "[0.5,1]"],
                         {m: {"churn": [0.2, 0.05]} for m in ("plain", "distilled", "ema")})
  _check_style(figures["churn_by_confidence.png"])
  rows = [{"run": r, "gflops": g, "test_accuracy": 0.5} for r, g in (("a", 1), ("b", 2))]
  reuse._scatter(str(tmp_path / "accuracy_vs_flops.png"), rows, "gflops", "test_accuracy",
                 xlabel="GFLOPs", ylabel="test accuracy", title="t", num_classes=10)
  _check_style(figures["accuracy_vs_flops.png"], chance=0.1)
  sigmas = [0.01, 0.1]
  measured = {n: {"sigmas": {s: (0.1, 0.01) for s in sigmas},
                  "global": {s: (0.1, 0.01) for s in sigmas},
                  "sharpness": {"sharpness_l1": (1.0, 0.1)}} for n in ("vit", "resnet")}
  plots.sigma_plot(str(tmp_path / "sensitivity_vs_sigma.png"), measured,
                      {s: 2 * s for s in sigmas})
  _check_style(figures["sensitivity_vs_sigma.png"])
  sensitivity_vision._sharpness_plot(str(tmp_path / "sensitivity_vs_sharpness.png"),
                                     measured, 0.1,
                                     {"spearman_sharpness_l1": 1.0, "num_models": 2})
  _check_style(figures["sensitivity_vs_sharpness.png"])
  plots.heatmap_grid(str(tmp_path / "sensitivity_patches.png"),
                     {n: np.random.default_rng(0).random((4, 4)) for n in measured},
                     title="t", cbar_label="flip probability", xlabel="patch column",
                     ylabel="patch row")
  _check_style(figures["sensitivity_patches.png"], integer_x=True, integer_y=True)
  plots.bar_plot(str(tmp_path / "sensitivity_bar.png"), ["vit", "resnet"], [0.1, 0.2],
                 errors=[0.01, 0.01], title="t", xlabel="model", ylabel="sensitivity")
  _check_style(figures["sensitivity_bar.png"])


@pytest.mark.slow
def test_language_grokking_synthetic_benign_figures(tmp_path, figures):
  hist = {n: {k: np.linspace(0.1, 0.2, 4) for k in (
      "token_pooled", "global", "clean_accuracy", "token_signal_pooled",
      "token_other_pooled")} | {"examples": np.array([64, 128, 192, 256])}
          for n in ("transformer", "lstm")}
  sc = ml_collections.ConfigDict({"sigma": 0.5, "global_sigma": 0.1,
                                  "include_special_tokens": False})
  sensitivity_language._plot_history(str(tmp_path), hist, sc, 2)
  axes = figures["sensitivity_vs_examples.png"]
  _check_style(axes, integer_x=True)
  assert axes[2]["chance"] == [0.5] and not axes[0]["chance"]
  logs = {k: np.random.default_rng(0).random((2, 30)) + 0.01 for k in (
      "train_loss", "test_loss", "train_accuracy", "test_accuracy", "sensitivity",
      "weight_norm")}
  config = ml_collections.ConfigDict({
      "report": {"window": 3, "grok_thresholds": [0.9], "fall_fraction": 0.5,
                 "markers": [10]},
      "data": {"modulus": 7}, "seed": 42, "train": {"test_every": 5, "num_seeds": 2}})
  grokking._figure(str(tmp_path / "grokking.png"), logs,
                   [{"grok_epoch": 12, "sens_fall_epoch": 15}] * 2, config)
  axes = figures["grokking.png"]
  _check_style(axes, integer_x=True)
  assert "sensitivity (seed 43)" in axes[2]["labels"]
  assert axes[1]["chance"] == [pytest.approx(1 / 7)]
  steps = np.arange(0, 50, 10)
  plots.boolean_spectrum_figure(str(tmp_path / "boolean_spectrum.png"), {
      "coef": {"attn": np.ones((5, 2))}, "steps": steps,
      "components": [{"degree": 1, "coords": [0], "coef": 1.0},
                     {"degree": 2, "coords": [1, 2], "coef": 1.0}],
      "spectrum": {"attn": np.full((5, 4), 0.25)}})
  _check_style(figures["boolean_spectrum.png"], integer_x=True)
  plots.dynamics_plot(str(tmp_path / "dynamics_vit_loss.png"), steps,
                      {k: (np.ones(5), np.zeros(5)) for k in ("train_loss", "test_loss")},
                      xlabel="GD step", ylabel="loss", title="t")
  _check_style(figures["dynamics_vit_loss.png"], integer_x=True)
  ns, snrs = [10, 20, 30], [0.1, 1.0, 10.0]
  plots.phase_heatmap(str(tmp_path / "heatmap_vit.png"), np.ones((3, 3)), ns, snrs,
                      title="t", cbar_label="test loss",
                      curves={"fit": (np.array(snrs), np.array([30, 20, 10]))})
  _check_style(figures["heatmap_vit.png"], integer_y=True)
  plots.boundary_overlay(str(tmp_path / "boundary_overlay.png"),
                         {m: (snrs, [1.0, 0.5, 0.3], 2.0, 10.0) for m in ("vit", "cnn")}, ns)
  _check_style(figures["boundary_overlay.png"])


def test_line_styles_are_distinct_and_results_md_embeds_the_pngs(tmp_path):
  styles = plots.line_styles(12)
  assert len({(s["color"], s["marker"], s["linestyle"]) for s in styles}) == 12
  md = tables.write_results(str(tmp_path), "T", [{"a": 1}],
                            plots=["corruption_severity.png", "cka_layers.png"])
  assert "![corruption_severity](corruption_severity.png)" in md
  assert "![cka_layers](cka_layers.png)" in md
  assert (tmp_path / "results.md").read_text() == md


def test_rel_mce_warning_when_the_baseline_barely_degrades():
  errs = {("noise", s): 0.30 + 0.001 * s for s in (1, 2, 3)}
  errs.update({("blur", s): 0.3 + 0.1 * s for s in (1, 2, 3)})
  warning = corruption_eval.relative_mce_warning(errs, clean_error_baseline=0.3)
  assert warning and "noise +0.006" in warning and "blur" not in warning
  assert "1 of 2" in warning
  ok = {k: v for k, v in errs.items() if k[0] == "blur"}
  assert corruption_eval.relative_mce_warning(ok, clean_error_baseline=0.3) is None
  rc = _robustness_inputs()[0]
  rc.update({"num_examples": 8, "baseline_run": "resnet", "patch_size": 4, "seed": 0})
  rc.corruptions.names = ["noise", "blur"]
  rc.adversarial.update({"pgd_steps": 2, "step_size_fraction": 0.25, "low_freq_cutoff": 0.5})
  rc.skip_sections = ["perturbations"]
  notes = robustness._notes(rc, {"transfer": {}}, None,
                            {"rel_mce_warning": warning, "source": "synthesize"},
                            ml_collections.ConfigDict({"name": "cifar10"}))
  assert notes.startswith(f"**Warning:** {warning}")


def test_long_legend_labels_neither_squeeze_the_axes_nor_get_cut(tmp_path, figures):
  long = {f"a rather long run name number {i} under PGD attack": [0.5, 0.2, 0.1]
          for i in range(4)}
  with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)  # E.g. "Tight layout not applied".
    plots.line_plot(str(tmp_path / "long.png"), [1, 2, 3], long, xlabel="severity",
                    ylabel="accuracy", title="t", num_classes=10)
  _check_style(figures["long.png"], chance=0.1, integer_x=True)
  from PIL import Image  # pylint: disable=g-import-not-at-top
  with Image.open(tmp_path / "long.png") as image:
    assert image.size[0] > 5.6 * 110  # Widened to hold the legend right of the axes.
