"""Study `distillation`: distillation bias per class, and two mitigations.

"Teacher's pet: understanding and mitigating biases in distillation" (Lukasik, Bhojanapalli,
Menon, Kumar; TMLR 2022, arXiv 2106.10494; docs/papers/google_papers.md §B). The paper's claims:
distillation raises overall accuracy but can harm subgroups, e.g. "classes with few
associated samples"; teacher errors are "transferred to and amplified by the student";
softening the teacher where it is less reliable mitigates this. Its datasets, formulas,
α, τ and numbers are not known (spec).

Stages (every config field is validated before anything is trained or written):
1. Train one teacher per seed (`config.teacher` over `config.train`, seed s) with the one
   trainer.
2. Cut the test split in two by a seeded permutation (`xsens.lab.selection`): `val`
   (`val_fraction`) and `eval`. On `val` each teacher's per-class accuracy acc_T(c) and mean
   probability margin γ_T(c) set the mitigations (our design; the paper's are not known):
     per-class α:      α_c = α·clip(acc_T(c) / acc_T, 0, 1)   (acc_T: overall val accuracy)
     per-class margin: m_c = scale·clip(1 − γ_T(c) / mean_c γ_T, 0, 1)
   (`xsens.train.distill` for the loss and the margin's sign convention).
3. Choose on `val` only, at `select_seed` (not a reported seed), distilling from the first
   seed's teacher: the student model (`config.students`), α and τ by the `kd` student's val
   accuracy; then the margin scale by `kd_margin`'s val worst-class accuracy.
4. Train the students per seed with the chosen settings: `onehot` (CE), `kd`,
   `kd_class_alpha`, `kd_margin` (precomputed teacher logits, or `teacher_mode = "in_step"`).
5. Report on `eval` only, per variant (mean ± s.e. over seeds): overall, balanced,
   worst-class, mean of the worst-k classes, head and tail accuracy
   (`xsens.measures.subgroups`); per class: train count, teacher accuracy and margin, α_c,
   m_c and each variant's accuracy; the selection tables; plots.
"""

from __future__ import annotations

import os

import ml_collections
import numpy as np

from mlcollections_configs import distillation as configs
from xsens import paths as path_lib  # (`paths` names config paths here)
from xsens.config_utils import run_config
from xsens.lab import multirun
from xsens.lab import selection
from xsens.measures import subgroups
from xsens.report import plots, seed_stats, tables
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


# ----------------------------------------------------------------------------- configs


def run_name(variant: str, seed: int) -> str:
  return f"{variant}_s{seed}"


def teacher_name(seed: int) -> str:
  """The teacher of the students of seed `seed` (trained with that seed)."""
  return f"{TEACHER}_s{seed}"


def _num(x: float) -> str:
  return f"{x:g}".replace(".", "p").replace("-", "m")


def select_name(student: str, alpha: float, temperature: float) -> str:
  """The `kd` selection run of one (student, α, τ) candidate."""
  return f"select_{student}_a{_num(alpha)}_t{_num(temperature)}"


def select_margin_name(scale: float) -> str:
  """The `kd_margin` selection run of one margin scale (chosen student, α, τ)."""
  return f"select_margin_m{_num(scale)}"


def seeded(overrides: dict, seed: int) -> dict:
  """`overrides` with the init, batch-order and step seeds set to `seed`."""
  return {**overrides, "init_seed": seed, "order_seed": seed, "augment_seed": seed}


def student_overrides(config, variant: str, seed: int, teacher_workdir: str | None = None,
                      mitigation: dict | None = None, *, student: str, alpha: float,
                      temperature: float) -> dict:
  """The run overrides of one student: candidate `student`'s block, the seeds, and (not
  `onehot`) the distill block with α, τ and the variant's per-class α or margins."""
  out = seeded(config.students[student].to_dict(), seed)
  if variant != "onehot":
    block = {"alpha": float(alpha), "temperature": float(temperature),
             "teacher_workdir": teacher_workdir, "teacher_logits": None,
             "teacher_mode": config.distillation.teacher_mode, "per_class_alpha": None,
             "margin": None}
    if variant == "kd_class_alpha" and mitigation is not None:
      block["per_class_alpha"] = [float(a) for a in mitigation["alpha"]]
    if variant == "kd_margin" and mitigation is not None:
      block["margin"] = [float(m) for m in mitigation["margin"]]
    out["distill"] = block
  return out


# A student's `distill.<field>` -> the `config.distillation` field it comes from (the
# per-class α and margins are derived from the teacher with α and the margin scale; the
# teacher's workdir is the teacher run's).
_DISTILL_SOURCES = {"alpha": "distillation.alphas", "temperature": "distillation.temperatures",
                    "teacher_mode": "distillation.teacher_mode",
                    "per_class_alpha": "distillation.alphas",
                    "margin": "distillation.margin_scales"}


def field_path(config, student_of: dict[str, str]):
  """`(run, field) -> full config path` of the runs (see `multirun.validate_runs`);
  `student_of` maps each student run to its candidate in `config.students`. A field the
  run's block sets is `teacher.<field>` / `students.<name>.<field>`, a seed
  `distillation.seeds` (`distillation.select_seed` for the selection runs), the distill
  block's fields come from `config.distillation` (`_DISTILL_SOURCES`; the rest from the
  teacher), anything else `train.<field>`."""
  base = config.train.to_dict()

  def path(name: str, field: str) -> str:
    if field in multirun.TRAINING_SEED_FIELDS:
      return "distillation.select_seed" if name.startswith("select_") else "distillation.seeds"
    if name in student_of:
      if field.split(".")[0] == "distill":
        return _DISTILL_SOURCES.get(field.partition(".")[2], TEACHER)
      block = f"students.{student_of[name]}"
      if multirun.overrides_field(base, config.students[student_of[name]].to_dict(), field):
        return f"{block}.{field}"
    elif multirun.overrides_field(base, config.teacher.to_dict(), field):
      return f"{TEACHER}.{field}"
    return f"train.{field}"
  return path


def _with_runs(config, runs: dict) -> ml_collections.ConfigDict:
  derived = ml_collections.ConfigDict({"num_seeds": 1,  # Each run is one seed of the plan.
                                       "train": config.train.copy_and_resolve_references(),
                                       "runs": runs})
  return derived


def kd_candidates(config) -> list[dict]:
  """Every (student, α, τ) candidate of the `kd` selection, in config order."""
  dc = config.distillation
  return [{"run": select_name(st, a, t), "student": st, "alpha": float(a),
           "temperature": float(t)}
          for st in config.students for a in dc.alphas for t in dc.temperatures]


def choose(candidates: list[dict], val_scores: dict[str, float]) -> dict:
  """The candidate whose run has the best validation score (`xsens.lab.selection`)."""
  rows = [{**c, "val_score": val_scores[c["run"]]} for c in candidates]
  return selection.pick_on_val(rows, "val_score")


# ----------------------------------------------------------------------------- the study


def _logits(res: trainer.TrainResult, images: np.ndarray) -> np.ndarray:
  return distill_lib.predict_logits(res.model, res.variables, images)


def _mitigation(t_logits, labels, val, num_classes, alpha: float, scale: float) -> dict:
  """α_c [K] and m_c [K] from one teacher's logits on the `val` indices."""
  acc = np.asarray(subgroups.per_class_accuracy(t_logits[val], labels[val], num_classes))
  margin = np.asarray(subgroups.per_class_margin(t_logits[val], labels[val], num_classes))
  overall = float(np.mean(np.argmax(t_logits[val], -1) == labels[val]))
  return {"alpha": class_alpha(alpha, acc, overall), "margin": class_margin(scale, margin),
          "val_accuracy": overall}


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains one teacher per seed, chooses the student, α, τ and the margin scale on `val`,
  trains the students, writes the report (every number on `eval`)."""
  configs.validate(config)
  dc = config.distillation
  variants, seeds = list(dc.variants), [int(s) for s in dc.seeds]
  kd_cands = kd_candidates(config)
  margin_cands = [{"run": select_margin_name(m), "margin_scale": float(m)}
                  for m in dc.margin_scales]
  select_kd = len(kd_cands) > 1
  select_margin = len(margin_cands) > 1 and "kd_margin" in variants
  first = kd_cands[0]
  teacher_runs = {teacher_name(s): seeded(config.teacher.to_dict(), s) for s in seeds}
  # Validate every run before training anything (students without their teacher's files).
  probe = {c["run"]: student_overrides(config, "kd", dc.select_seed, "<teacher>",
                                       student=c["student"], alpha=c["alpha"],
                                       temperature=c["temperature"]) for c in kd_cands}
  probe.update({c["run"]: student_overrides(config, "kd_margin", dc.select_seed, "<teacher>",
                                            student=first["student"], alpha=first["alpha"],
                                            temperature=first["temperature"])
                for c in margin_cands})
  probe.update({run_name(v, s): student_overrides(
      config, v, s, "<teacher>", student=first["student"], alpha=first["alpha"],
      temperature=first["temperature"]) for v in variants for s in seeds})
  student_of = {name: first["student"] for name in probe}
  student_of.update({c["run"]: c["student"] for c in kd_cands})
  paths = field_path(config, student_of)
  teacher_cfg = _with_runs(config, teacher_runs)
  teacher_exp = multirun.validate_runs(teacher_cfg, paths)
  probe_cfg = _with_runs(config, probe)
  for name in probe:
    with multirun.run_errors(probe_cfg, name, paths):
      trainer.build_experiment(run_config(probe_cfg, name), check_teacher=False)

  teachers = multirun.train_runs(teacher_cfg, workdir, overwrite=overwrite,
                                experiments=teacher_exp, field_path=paths)
  teacher_dir = {s: path_lib.absolute(multirun.run_workdir(workdir, teacher_name(s)))
                 for s in seeds}
  t0 = teachers[teacher_name(seeds[0])]
  num_classes = t0.train.num_classes
  val, ev = selection.split_val_eval(len(t0.test), dc.val_fraction, dc.split_seed)
  test_x, test_y = t0.test.images, t0.test.labels
  t_logits = {s: _logits(teachers[teacher_name(s)], test_x) for s in seeds}
  train_counts = np.asarray(subgroups.class_counts(t0.train.labels, num_classes))
  head = subgroups.head_mask(train_counts, dc.head_fraction)
  report = lambda logits, idx: subgroups.subgroup_report(
      logits[idx], test_y[idx], num_classes, head, worst_k=dc.worst_k)

  # Selection on `val` at `select_seed`, distilling from the first seed's teacher.
  def train_select(runs: dict) -> dict:
    cfg = _with_runs(config, runs)
    return multirun.train_runs(cfg, workdir, overwrite=overwrite, field_path=paths)

  kd_table, margin_table = [], []
  chosen = first
  if select_kd:
    res = train_select({c["run"]: student_overrides(
        config, "kd", dc.select_seed, teacher_dir[seeds[0]], student=c["student"],
        alpha=c["alpha"], temperature=c["temperature"]) for c in kd_cands})
    for c in kd_cands:
      logits = _logits(res[c["run"]], test_x)
      kd_table.append({**c, "val_accuracy": report(logits, val)["accuracy"],
                       "eval_accuracy": report(logits, ev)["accuracy"]})
    chosen = choose(kd_cands, {r["run"]: r["val_accuracy"] for r in kd_table})
  scale = float(dc.margin_scales[0])
  student, alpha, temperature = chosen["student"], chosen["alpha"], chosen["temperature"]
  if select_margin:
    runs = {}
    for c in margin_cands:
      mit = _mitigation(t_logits[seeds[0]], test_y, val, num_classes, alpha,
                        c["margin_scale"])
      runs[c["run"]] = student_overrides(config, "kd_margin", dc.select_seed,
                                         teacher_dir[seeds[0]], mit, student=student,
                                         alpha=alpha, temperature=temperature)
    student_of.update({name: student for name in runs})
    res = train_select(runs)
    for c in margin_cands:
      logits = _logits(res[c["run"]], test_x)
      v, e = report(logits, val), report(logits, ev)
      margin_table.append({**c, "val_worst_class": v["worst_class"],
                           "val_accuracy": v["accuracy"], "eval_worst_class": e["worst_class"],
                           "eval_accuracy": e["accuracy"]})
    scale = selection.pick_on_val(margin_table, "val_worst_class")["margin_scale"]

  mitigations = {s: _mitigation(t_logits[s], test_y, val, num_classes, alpha, scale)
                 for s in seeds}
  runs = {run_name(v, s): student_overrides(config, v, s, teacher_dir[s], mitigations[s],
                                            student=student, alpha=alpha,
                                            temperature=temperature)
          for v in variants for s in seeds}
  student_of.update({name: student for name in runs})
  students = multirun.train_runs(_with_runs(config, runs), workdir, overwrite=overwrite,
                                 field_path=paths)

  teacher_reports = [report(t_logits[s], ev) for s in seeds]
  teacher_eval = _aggregate(teacher_reports)
  per_run = {name: report(_logits(res, test_x), ev) for name, res in students.items()}
  t_eval_margin = np.mean([np.asarray(subgroups.per_class_margin(
      t_logits[s][ev], test_y[ev], num_classes)) for s in seeds], axis=0)
  agg = {v: _aggregate([per_run[run_name(v, s)] for s in seeds]) for v in variants}
  mitigation = {k: np.mean([mitigations[s][k] for s in seeds], axis=0)
                for k in ("alpha", "margin")}

  rows = [_row(TEACHER, t0, teacher_eval, None)]
  ref = agg["onehot"]
  for v in variants:
    rows.append(_row(v, students[run_name(v, seeds[0])], agg[v], ref))
  teacher_pc = teacher_eval["per_class"][0]
  per_class = _per_class_rows(train_counts, teacher_pc, t_eval_margin, mitigation, agg,
                              variants)
  gains = {v: (np.asarray(agg[v]["per_class"][0]) - np.asarray(ref["per_class"][0])).tolist()
           for v in variants if v != "onehot"}
  plot_files = _plots(workdir, variants, agg, teacher_pc, t_eval_margin, gains, num_classes)
  chosen_settings = {"student": student, "alpha": alpha, "temperature": temperature,
                     "margin_scale": scale}
  notes = _notes(config, len(val), len(ev), head, train_counts, per_class, agg, variants,
                 [mitigations[s]["val_accuracy"] for s in seeds], chosen_settings, kd_table,
                 margin_table)
  columns = ["run", "model", "params", "seeds", "accuracy", "accuracy_se",
             "balanced_accuracy", "worst_class", "worst_class_se", "worst_k_mean",
             "head_accuracy", "tail_accuracy", "tail_accuracy_se", "d_accuracy",
             "d_worst_class", "d_worst_k_mean", "d_tail_accuracy"]
  selection_out = {"chosen": chosen_settings, "kd": kd_table, "margin": margin_table,
                   "criterion": {"kd": "val accuracy of the kd student",
                                 "margin": "val worst-class accuracy of kd_margin"}}
  md = tables.write_results(
      workdir, f"Distillation per class on {_data_name(config)}", rows, columns=columns,
      notes=notes, plots=plot_files,
      extra={"per_class": per_class, "per_run": per_run, "teacher": teacher_eval,
             "teacher_per_seed": dict(zip(map(str, seeds), teacher_reports)),
             "teacher_val_accuracy": [mitigations[s]["val_accuracy"] for s in seeds],
             "mitigation": {str(s): {k: mitigations[s][k].tolist()
                                     for k in ("alpha", "margin")} for s in seeds},
             "selection": selection_out,
             "gains_vs_onehot": gains, "head_classes": np.flatnonzero(head).tolist(),
             "train_counts": train_counts.tolist(),
             "val_indices": val.tolist(), "eval_indices": ev.tolist()})
  return {"rows": rows, "markdown": md, "per_class": per_class, "per_run": per_run,
          "aggregate": agg, "teacher": teacher_eval, "mitigation": mitigation,
          "mitigations": mitigations, "selection": selection_out, "gains": gains,
          "head": head, "train_counts": train_counts, "val": val, "eval": ev}


def _data_name(config) -> str:
  name = config.train.data.name
  return name + ("-LT" if config.train.data.class_fractions else "")


def _aggregate(reports: list[dict]) -> dict:
  """{key: (mean, s.e. over seeds)}; "per_class": ([K] mean, [K] s.e.); "num_seeds"."""
  out = {k: seed_stats.mean_and_stderr([r[k] for r in reports]) for k in SUMMARY_KEYS}
  per_class = [seed_stats.mean_and_stderr(c) for c in zip(*(r["per_class"] for r in reports))]
  out["per_class"] = ([m for m, _ in per_class], [se for _, se in per_class])
  out["num_seeds"] = len(reports)
  return out


def _row(name, res, agg, ref) -> dict:
  s = res.summary
  row = {"run": name, "model": s["model"], "params": s["num_params"],
         "seeds": agg.get("num_seeds", 1) if isinstance(agg, dict) else 1}
  for k in SUMMARY_KEYS:
    row[k] = agg[k][0]
  row["accuracy_se"] = agg["accuracy"][1]
  row["worst_class_se"] = agg["worst_class"][1]
  row["tail_accuracy_se"] = agg["tail_accuracy"][1]
  for k in ("accuracy", "worst_class", "worst_k_mean", "tail_accuracy"):
    row[f"d_{k}"] = agg[k][0] - ref[k][0] if ref is not None else float("nan")
  return row


def _per_class_rows(counts, teacher_pc, t_margin, mitigation, agg, variants) -> list[dict]:
  rows = []
  for c in range(len(counts)):
    row = {"class": c, "train_count": int(counts[c]),
           "teacher_acc": teacher_pc[c], "teacher_margin": float(t_margin[c]),
           "alpha_c": float(mitigation["alpha"][c]), "margin_c": float(mitigation["margin"][c])}
    for v in variants:
      row[v] = agg[v]["per_class"][0][c]
    rows.append(row)
  return rows


def _plots(workdir, variants, agg, teacher_pc, t_margin, gains, num_classes) -> list[str]:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  classes = [str(c) for c in range(num_classes)]
  series = {"teacher": teacher_pc}
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
        (axes[0], teacher_pc, "teacher per-class accuracy (fraction correct)",
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


def _notes(config, n_val, n_eval, head, counts, per_class, agg, variants, t_val_acc,
           chosen, kd_table, margin_table) -> str:
  dc = config.distillation
  fmt = lambda x: f"{x:.3f}"
  seeds = list(dc.seeds)
  lines = [
      f"Teacher `{config.teacher.model.name}`, one per seed (seeds {seeds}; row 1: mean ± "
      f"s.e. over them), students `{chosen['student']}`; {len(seeds)} seeds per student "
      "(init/order/step seed; the student of seed s distils the teacher of seed s; the data "
      "subset is fixed), mean over seeds (s.e. in the `_se` columns). "
      f"α = {chosen['alpha']:g}, τ = {chosen['temperature']:g}, margin scale "
      f"{chosen['margin_scale']:g}, teacher logits {dc.teacher_mode}. d_* = difference to "
      "the one-hot student.",
      "",
      f"Held-out data: the test split is cut into `val` ({n_val} examples; chooses the "
      "settings and sets α_c and m_c from each teacher, teacher val accuracy "
      + ", ".join(fmt(a) for a in t_val_acc) + f") and `eval` ({n_eval} examples; every "
      "number here). Head classes (most frequent in train): "
      f"{np.flatnonzero(head).tolist()}; train counts per class: {counts.astype(int).tolist()}.",
  ]
  if kd_table:
    lines += ["", f"Choice of student, α and τ: the best `val` accuracy of the `kd` student "
              f"(seed {dc.select_seed}, teacher of seed {seeds[0]}); eval accuracy shown, "
              "not used:", "", tables.markdown_table(kd_table)]
  if margin_table:
    lines += ["", "Choice of the margin scale: the best `val` worst-class accuracy of "
              "`kd_margin` (eval shown, not used):", "", tables.markdown_table(margin_table)]
  lines += ["", "Per class (eval accuracy; teacher margin = mean p_y − max_{k≠y} p_k; "
            "teacher columns and α_c, m_c: mean over teacher seeds):", "",
            tables.markdown_table(per_class)]
  if "kd" in variants:
    worst = int(np.argmin(agg["onehot"]["per_class"][0]))
    lines.append(
        f"Worst class of the one-hot student: {worst} ({fmt(agg['onehot']['per_class'][0][worst])}"
        f"); under kd: {fmt(agg['kd']['per_class'][0][worst])}.")
  return "\n".join(lines)
