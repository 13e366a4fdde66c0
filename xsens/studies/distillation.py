"""Study `distillation`: distillation bias per class, and two mitigations.

"Teacher's pet: understanding and mitigating biases in distillation" (Lukasik, Bhojanapalli,
Menon, Kumar; TMLR 2022, arXiv 2106.10494; docs/papers/google_papers.md §B). The paper's claims:
distillation raises overall accuracy but can harm subgroups, e.g. "classes with few
associated samples"; teacher errors are "transferred to and amplified by the student";
softening the teacher where it is less reliable mitigates this. Its datasets, formulas,
α, τ and numbers are not known (spec).

Stages (every config field is validated before anything is trained or written):
1. Train the teacher (`config.teacher` over `config.train`) with the one trainer.
2. Cut the test split in two by a seeded permutation: `val` (`val_fraction`) and `eval`.
   On `val` the teacher's per-class accuracy acc_T(c) and mean probability margin γ_T(c)
   set the mitigations (our design; the paper's formulas are not known):
     per-class α:      α_c = α·clip(acc_T(c) / acc_T, 0, 1)   (acc_T: overall val accuracy)
     per-class margin: m_c = margin_scale·clip(1 − γ_T(c) / mean_c γ_T, 0, 1)
   (`xsens.train.distill` for the loss and the margin's sign convention). Held-out data
   from the test split keep the training set untouched; the classes are balanced there,
   which the long-tailed train split could not offer for the tail classes. Nothing is tuned
   on `eval`: every reported number is on `eval` only.
3. Train the students per seed: `onehot` (CE), `kd`, `kd_class_alpha`, `kd_margin`
   (precomputed teacher logits, or in the step with `teacher_mode = "in_step"`).
4. Report per variant (mean ± std over seeds): overall, balanced, worst-class, mean of the
   worst-k classes, head and tail accuracy (`xsens.measures.subgroups`); per class: train
   count, teacher accuracy and margin, α_c, m_c and each variant's accuracy; plots.
"""

from __future__ import annotations

import os

import ml_collections
import numpy as np

from mlcollections_configs import distillation as configs
from xsens import paths as path_lib  # (`paths` names config paths here)
from xsens.config_utils import run_config
from xsens.lab import multirun
from xsens.measures import subgroups
from xsens.report import plots, tables
from xsens.train import distill as distill_lib
from xsens.train import trainer

TEACHER = "teacher"
SUMMARY_KEYS = ("accuracy", "balanced_accuracy", "worst_class", "worst_k_mean",
                "head_accuracy", "tail_accuracy")


# ----------------------------------------------------------------------------- mitigations


def class_alpha(alpha: float, per_class_acc, overall_acc: float) -> np.ndarray:
  """α_c = α·clip(acc_T(c)/acc_T, 0, 1) (docs/papers/google_papers.md §B candidate; our design).
  [K] -> [K].

  A class without held-out examples (NaN) keeps α.
  """
  acc = np.asarray(per_class_acc, np.float64)
  ratio = np.where(np.isnan(acc), 1.0, acc / max(overall_acc, 1e-12))
  return alpha * np.clip(ratio, 0.0, 1.0)


def class_margin(scale: float, per_class_margin) -> np.ndarray:
  """m_c = scale·clip(1 − γ_T(c)/mean_c γ_T, 0, 1) (our design). [K] -> [K] (logit units).

  0 for classes where the teacher's held-out margin is at least its average; up to `scale`
  where it is 0 or negative (teacher wrong on average). If the mean margin is <= 0, every
  class gets `scale`. A class without held-out examples gets 0.
  """
  gamma = np.asarray(per_class_margin, np.float64)
  mean = np.nanmean(gamma)
  if not mean > 0:
    return np.where(np.isnan(gamma), 0.0, scale)
  return np.where(np.isnan(gamma), 0.0, scale * np.clip(1.0 - gamma / mean, 0.0, 1.0))


def split_val_eval(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Disjoint index sets (val, eval) of range(n), from `default_rng([seed, 7])`."""
  perm = np.random.default_rng([seed, 7]).permutation(n)
  n_val = int(round(val_fraction * n))
  return np.sort(perm[:n_val]), np.sort(perm[n_val:])


# ----------------------------------------------------------------------------- configs


def run_name(variant: str, seed: int) -> str:
  return f"{variant}_s{seed}"


def student_overrides(config, variant: str, seed: int, teacher_workdir: str | None = None,
                      mitigation: dict | None = None) -> dict:
  """The run overrides of one student (its model, seeds and distill block)."""
  dc = config.distillation
  out = config.student.to_dict()
  out.update(init_seed=seed, order_seed=seed, augment_seed=seed)
  if variant != "onehot":
    block = {"alpha": float(dc.alpha), "temperature": float(dc.temperature),
             "teacher_workdir": teacher_workdir, "teacher_logits": None,
             "teacher_mode": dc.teacher_mode, "per_class_alpha": None, "margin": None}
    if variant == "kd_class_alpha" and mitigation is not None:
      block["per_class_alpha"] = [float(a) for a in mitigation["alpha"]]
    if variant == "kd_margin" and mitigation is not None:
      block["margin"] = [float(m) for m in mitigation["margin"]]
    out["distill"] = block
  return out


# A student's `distill.<field>` -> the `config.distillation` field it comes from (the
# per-class α and margins are derived from the teacher with `alpha` and `margin_scale`; the
# teacher's workdir is the teacher run's).
_DISTILL_SOURCES = {"alpha": "distillation.alpha", "temperature": "distillation.temperature",
                    "teacher_mode": "distillation.teacher_mode",
                    "per_class_alpha": "distillation.alpha",
                    "margin": "distillation.margin_scale"}


def field_path(config):
  """`(run, field) -> full config path` of the teacher and student runs (see
  `multirun.validate_runs`): a field the run's block sets is `teacher.<field>` /
  `student.<field>`, a seed `distillation.seeds`, the distill block's fields come from
  `config.distillation` (`_DISTILL_SOURCES`; the rest from the teacher), anything else
  `train.<field>`."""
  base = config.train.to_dict()

  def path(name: str, field: str) -> str:
    block = TEACHER if name == TEACHER else "student"
    if block == "student":
      if field in ("init_seed", "order_seed", "augment_seed"):
        return "distillation.seeds"
      if field.split(".")[0] == "distill":
        return _DISTILL_SOURCES.get(field.partition(".")[2], TEACHER)
    if multirun.overrides_field(base, config[block].to_dict(), field):
      return f"{block}.{field}"
    return f"train.{field}"
  return path


def _with_runs(config, runs: dict) -> ml_collections.ConfigDict:
  derived = ml_collections.ConfigDict({"num_seeds": 1,  # Each run is one seed of the plan.
                                       "train": config.train.copy_and_resolve_references(),
                                       "runs": runs})
  return derived


# ----------------------------------------------------------------------------- the study


def _logits(res: trainer.TrainResult, images: np.ndarray) -> np.ndarray:
  return distill_lib.predict_logits(res.model, res.variables, images)


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains the teacher, derives the mitigations, trains the students, writes the report."""
  configs.validate(config)
  dc = config.distillation
  variants, seeds = list(dc.variants), [int(s) for s in dc.seeds]
  teacher_cfg = _with_runs(config, {TEACHER: config.teacher.to_dict()})
  paths = field_path(config)
  # Validate every run before training anything (students without their teacher's files).
  teacher_exp = multirun.validate_runs(teacher_cfg, paths)
  probe = {run_name(v, s): student_overrides(config, v, s, "<teacher>") for v in variants
           for s in seeds}
  probe_cfg = _with_runs(config, probe)
  for name in probe:
    with multirun.run_errors(probe_cfg, name, paths):
      trainer.build_experiment(run_config(probe_cfg, name), check_teacher=False)

  teacher = multirun.train_runs(teacher_cfg, workdir, overwrite=overwrite,
                               experiments=teacher_exp, field_path=paths)[TEACHER]
  teacher_dir = path_lib.absolute(multirun.run_workdir(workdir, TEACHER))
  num_classes = teacher.train.num_classes
  val, ev = split_val_eval(len(teacher.test), dc.val_fraction, dc.split_seed)
  test_x, test_y = teacher.test.images, teacher.test.labels
  t_logits = _logits(teacher, test_x)
  t_val_acc = np.asarray(subgroups.per_class_accuracy(t_logits[val], test_y[val], num_classes))
  t_val_margin = np.asarray(subgroups.per_class_margin(t_logits[val], test_y[val],
                                                       num_classes))
  t_val_overall = float(np.mean(np.argmax(t_logits[val], -1) == test_y[val]))
  mitigation = {"alpha": class_alpha(dc.alpha, t_val_acc, t_val_overall),
                "margin": class_margin(dc.margin_scale, t_val_margin)}

  students_cfg = _with_runs(config, {
      run_name(v, s): student_overrides(config, v, s, teacher_dir, mitigation)
      for v in variants for s in seeds})
  students = multirun.train_runs(students_cfg, workdir, overwrite=overwrite, field_path=paths)

  train_counts = np.asarray(subgroups.class_counts(teacher.train.labels, num_classes))
  head = subgroups.head_mask(train_counts, dc.head_fraction)
  report = lambda logits: subgroups.subgroup_report(
      logits[ev], test_y[ev], num_classes, head, worst_k=dc.worst_k)
  teacher_eval = report(t_logits)
  per_run = {name: report(_logits(res, test_x)) for name, res in students.items()}
  t_eval_margin = np.asarray(subgroups.per_class_margin(t_logits[ev], test_y[ev],
                                                        num_classes))
  agg = {v: _aggregate([per_run[run_name(v, s)] for s in seeds]) for v in variants}

  rows = [_row(TEACHER, teacher, {k: (teacher_eval[k], 0.0) for k in SUMMARY_KEYS}, None)]
  ref = agg["onehot"]
  for v in variants:
    rows.append(_row(v, students[run_name(v, seeds[0])], agg[v], ref))
  per_class = _per_class_rows(train_counts, teacher_eval, t_eval_margin, mitigation, agg,
                              variants)
  gains = {v: (np.asarray(agg[v]["per_class"][0]) - np.asarray(ref["per_class"][0])).tolist()
           for v in variants if v != "onehot"}
  plot_files = _plots(workdir, variants, agg, teacher_eval, t_eval_margin, gains,
                      num_classes)
  notes = _notes(config, teacher, len(val), len(ev), head, train_counts, per_class, agg,
                 variants, t_val_overall)
  columns = ["run", "model", "params", "seeds", "accuracy", "accuracy_std",
             "balanced_accuracy", "worst_class", "worst_class_std", "worst_k_mean",
             "head_accuracy", "tail_accuracy", "d_accuracy", "d_worst_class",
             "d_worst_k_mean", "d_tail_accuracy"]
  md = tables.write_results(
      workdir, f"Distillation per class on {_data_name(config)}", rows, columns=columns,
      notes=notes, plots=plot_files,
      extra={"per_class": per_class, "per_run": per_run, "teacher": teacher_eval,
             "teacher_val": {"per_class_accuracy": t_val_acc.tolist(),
                             "per_class_margin": t_val_margin.tolist(),
                             "accuracy": t_val_overall},
             "mitigation": {k: v.tolist() for k, v in mitigation.items()},
             "gains_vs_onehot": gains, "head_classes": np.flatnonzero(head).tolist(),
             "train_counts": train_counts.tolist(),
             "num_val": int(len(val)), "num_eval": int(len(ev))})
  return {"rows": rows, "markdown": md, "per_class": per_class, "per_run": per_run,
          "aggregate": agg, "teacher": teacher_eval, "mitigation": mitigation,
          "gains": gains, "head": head, "train_counts": train_counts}


def _data_name(config) -> str:
  name = config.train.data.name
  return name + ("-LT" if config.train.data.class_fractions else "")


def _aggregate(reports: list[dict]) -> dict:
  """{key: (mean, std over seeds)}; "per_class": ([K] mean, [K] std)."""
  out = {}
  for k in SUMMARY_KEYS:
    vals = np.array([r[k] for r in reports])
    out[k] = (float(vals.mean()), float(vals.std()))
  pc = np.array([r["per_class"] for r in reports])
  out["per_class"] = (pc.mean(0).tolist(), pc.std(0).tolist())
  out["num_seeds"] = len(reports)
  return out


def _row(name, res, agg, ref) -> dict:
  s = res.summary
  row = {"run": name, "model": s["model"], "params": s["num_params"],
         "seeds": agg.get("num_seeds", 1) if isinstance(agg, dict) else 1}
  for k in SUMMARY_KEYS:
    row[k] = agg[k][0]
  row["accuracy_std"] = agg["accuracy"][1]
  row["worst_class_std"] = agg["worst_class"][1]
  for k in ("accuracy", "worst_class", "worst_k_mean", "tail_accuracy"):
    row[f"d_{k}"] = agg[k][0] - ref[k][0] if ref is not None else float("nan")
  return row


def _per_class_rows(counts, teacher_eval, t_margin, mitigation, agg, variants) -> list[dict]:
  rows = []
  for c in range(len(counts)):
    row = {"class": c, "train_count": int(counts[c]),
           "teacher_acc": teacher_eval["per_class"][c], "teacher_margin": float(t_margin[c]),
           "alpha_c": float(mitigation["alpha"][c]), "margin_c": float(mitigation["margin"][c])}
    for v in variants:
      row[v] = agg[v]["per_class"][0][c]
    rows.append(row)
  return rows


def _plots(workdir, variants, agg, teacher_eval, t_margin, gains, num_classes) -> list[str]:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  classes = [str(c) for c in range(num_classes)]
  series = {"teacher": teacher_eval["per_class"]}
  series.update({v: agg[v]["per_class"][0] for v in variants})
  files = [plots.grouped_bar_plot(os.path.join(workdir, "per_class_accuracy.png"), classes,
                                  series, ylabel="eval accuracy (fraction correct)",
                                  xlabel="class (0 = head)",
                                  title="Per-class accuracy (class 0 = head)",
                                  num_classes=num_classes)]
  if gains:
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.6))
    styles = plots.line_styles(len(gains))
    for ax, x, xlabel, title in (
        (axes[0], teacher_eval["per_class"], "teacher per-class accuracy (fraction correct)",
         "gain vs teacher accuracy"),
        (axes[1], t_margin, "teacher per-class margin (logit units)",
         "gain vs teacher margin")):
      for (v, g), style in zip(gains.items(), styles):
        ax.plot(x, g, linestyle="none", marker=style["marker"], color=style["color"],
                markerfacecolor="none", markersize=style["markersize"], label=v)
      for c in range(num_classes):
        ax.annotate(str(c), (x[c], gains[next(iter(gains))][c]), fontsize=7,
                    xytext=(3, 2), textcoords="offset points")
      ax.axhline(0.0, color="grey", lw=0.8)
      plots.styled_axes(ax, title, xlabel, "student gain over one-hot (accuracy)")
    plots.legend_outside(axes[-1])
    fig.suptitle("Per-class gain of the students vs the teacher (eval split)")
    fig.tight_layout()
    path = os.path.join(workdir, "gain_vs_teacher.png")
    files.append(plots.save_figure(fig, path))
  keys = ("accuracy", "worst_class", "worst_k_mean", "head_accuracy", "tail_accuracy")
  files.append(plots.grouped_bar_plot(
      os.path.join(workdir, "subgroup_summary.png"), list(keys),
      {v: [agg[v][k][0] for k in keys] for v in variants},
      ylabel="eval accuracy (fraction correct)", xlabel="subgroup",
      title="Overall and subgroup accuracy (mean over seeds)", num_classes=num_classes))
  return files


def _notes(config, teacher, n_val, n_eval, head, counts, per_class, agg, variants,
           t_val_overall) -> str:
  dc = config.distillation
  fmt = lambda x: f"{x:.3f}"
  lines = [
      f"Teacher `{config.teacher.model.name}` (eval accuracy in the first row), students "
      f"`{config.student.model.name}`; {len(list(dc.seeds))} seeds per student "
      f"(init/order/step seed; the data subset is fixed), mean over seeds (std in the "
      f"`_std` columns). α = {dc.alpha}, τ = {dc.temperature}, teacher logits "
      f"{dc.teacher_mode}. d_* = difference to the one-hot student.",
      "",
      f"Held-out data: the test split is cut into `val` ({n_val} examples; sets α_c and "
      f"m_c from the teacher, val accuracy {t_val_overall:.3f}) and `eval` ({n_eval} "
      "examples; every number here). Head classes (most frequent in train): "
      f"{np.flatnonzero(head).tolist()}; train counts per class: {counts.astype(int).tolist()}.",
      "",
      "Per class (eval accuracy; teacher margin = mean p_y − max_{k≠y} p_k):",
      "",
      tables.markdown_table(per_class),
  ]
  if "kd" in variants:
    worst = int(np.argmin(agg["onehot"]["per_class"][0]))
    lines.append(
        f"Worst class of the one-hot student: {worst} ({fmt(agg['onehot']['per_class'][0][worst])}"
        f"); under kd: {fmt(agg['kd']['per_class'][0][worst])}.")
  return "\n".join(lines)
