"""Study `label_shift`: DRO over the label prior against its baselines under label shift.

"Coping with label shift via distributionally robust optimisation" (Zhang, Menon, Veit,
Bhojanapalli, Kumar, Sra; ICLR 2021, arXiv 2010.12230; docs/papers/google_papers.md §I). Every
method of `config.runs` (objective terms of `xsens.train.dro`) is trained on a
long-tailed training split through `multirun.train_runs` (`config.num_seeds` seeds each).
Each model's per-class accuracy and loss on the balanced test split give its accuracy
under any test prior π (acc_π = Σ_y π_y acc_y, `xsens.measures.label_shift`), for:
the training prior p_train (in distribution), tilts π ∝ p_train^λ (`label_shift.tilts`:
λ > 1 toward the head, λ < 1 toward the tail, 0 uniform), symmetric Dirichlet samples
(`dirichlet_concentrations`, `num_dirichlet` each, seeded), and the worst case of each
model within the KL ball KL(π‖p_train) ≤ ρ (`radii`, exact: exponential tilting and
bisection over the model's per-class errors). Writes results.md/json (mean ± s.e. over
seeds), accuracy_vs_kl.png, worst_case.png and dro_prior.png (DRO's final π).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from mlcollections_configs import label_shift as configs
from xsens.lab import multirun
from xsens.measures import label_shift
from xsens.report import plots, seed_stats, tables
from xsens.train import evaluators


def validate(config) -> None:
  """Checks `config.label_shift` (the config file's `validate`); the runs are checked
  when they are built (`xsens.lab.multirun.validate_runs`)."""
  configs.validate(config)


def shift_priors(p_train: np.ndarray, ls) -> tuple[list[str], np.ndarray]:
  """(names, priors [M, K]): p_train, the tilts, then the Dirichlet samples."""
  names, priors = ["train prior"], [p_train]
  for lam in ls.tilts:
    names.append(f"tilt λ={lam:g}")
    priors.append(np.asarray(label_shift.tilted_prior(jnp.asarray(p_train), float(lam))))
  rng = np.random.default_rng(ls.seed)
  for c in ls.dirichlet_concentrations:
    for j in range(ls.num_dirichlet):
      names.append(f"dirichlet c={c:g} #{j}")
      priors.append(rng.dirichlet(np.full(len(p_train), float(c))))
  return names, np.asarray(priors, np.float64)


@functools.lru_cache(maxsize=64)  # Jitted functions per model, bounded.
def _class_sums_fn(apply_fn, num_classes: int):
  """`fn(batch, variables)` -> masked per-class sums of one batch: the `subgroup`
  evaluator's {"correct_per_class", "count_per_class"} [K] and the cross-entropy
  "loss_per_class" [K] (`label_shift.class_sums`), from one forward pass."""
  def fn(batch, variables):
    logits = apply_fn(variables, batch["image"])
    same = lambda *_: logits
    sums = evaluators.subgroup_sums(same, num_classes, variables, batch)
    sums["loss_per_class"] = label_shift.class_sums(
        same, variables, batch["image"], batch["label"], batch["mask"],
        num_classes=num_classes)["loss"]
    return sums
  return fn


def per_class_metrics(res, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
  """Per-class accuracy and cross-entropy [K] float32 of a finished run on its test split
  (`evaluators.over_split` over batches of `batch_size`, float32 sums)."""
  sums = evaluators.over_split(_class_sums_fn(res.apply_fn, res.test.num_classes),
                               {"image": res.test.inputs, "label": res.test.labels},
                               args=(res.variables,), reduce="batch_sum",
                               batch_size=batch_size)
  sums = {k: v.astype(np.float32) for k, v in sums.items()}
  count = np.maximum(sums["count_per_class"], np.float32(1.0))
  return sums["correct_per_class"] / count, sums["loss_per_class"] / count


def evaluate_run(res, p_train: np.ndarray, priors: np.ndarray, ls) -> dict:
  """A run's accuracy and loss under every prior [M], and its worst-case accuracy and
  prior for every radius."""
  acc, loss = per_class_metrics(res, ls.eval_batch_size)
  shifted = label_shift.reweighted_metrics(jnp.asarray(acc), jnp.asarray(loss),
                                           jnp.asarray(priors, jnp.float32))
  worst = {}
  for rho in ls.radii:
    w = jax.device_get(label_shift.worst_case_prior(jnp.asarray(1.0 - acc),
                                                    jnp.asarray(p_train, jnp.float32),
                                                    float(rho)))
    worst[float(rho)] = {"accuracy": float(np.clip(1.0 - w["value"], 0.0, 1.0)),
                         "prior": w["prior"].tolist(), "kl": float(w["kl"])}
  return {"per_class_accuracy": acc.tolist(), "per_class_loss": loss.tolist(),
          "accuracy": np.asarray(shifted["accuracy"]).tolist(),
          "loss": np.asarray(shifted["loss"]).tolist(), "worst": worst}


def run_row(run_id: str, ev: dict, names: list[str], ls) -> dict:
  """The table row of one run: accuracy at p_train, each tilt, each Dirichlet
  concentration (mean over its samples) and each worst-case radius."""
  acc = dict(zip(names, ev["accuracy"]))
  row = {"run": run_id, "in-dist.": acc["train prior"]}
  for lam in ls.tilts:
    row[f"λ={lam:g}"] = acc[f"tilt λ={lam:g}"]
  if ls.num_dirichlet:
    for c in ls.dirichlet_concentrations:
      row[f"Dir({c:g})"] = float(np.mean([acc[f"dirichlet c={c:g} #{j}"]
                                          for j in range(ls.num_dirichlet)]))
  for rho in ls.radii:
    row[f"worst ρ={rho:g}"] = ev["worst"][float(rho)]["accuracy"]
  return row


def accuracy_vs_kl_plot(path: str, kl: np.ndarray, acc: dict[str, np.ndarray],
                        worst: dict[str, tuple[list, list]], num_classes: int) -> str:
  """Accuracy (mean over seeds) under each test prior against KL(π_test‖p_train): points
  for the tilts and Dirichlet samples, lines for the worst case at each radius."""
  fig, ax = plt.subplots(figsize=(6.4, 3.8))
  for (name, a), style in zip(acc.items(), plots.line_styles(len(acc))):
    ax.scatter(kl, a, s=12, color=style["color"], marker=style["marker"],
               facecolors="none", alpha=0.6)
    ax.plot(*worst[name], label=f"{name} (points; line: worst case)", **style)
  plots.chance_line(ax, num_classes)
  plots.styled_axes(ax, "Accuracy under label shift", "KL(π_test ‖ p_train) (nats)",
                    plots.ACCURACY)
  plots.legend_outside(ax)
  return plots.save_figure(fig, path, tight=True)


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every method for every seed, evaluates it under label shift, writes the report."""
  validate(config)
  experiments = multirun.validate_runs(config)
  ls = config.label_shift
  results = multirun.train_runs(config, workdir, overwrite=overwrite, experiments=experiments)
  ids = multirun.run_ids(config)
  first = next(iter(results.values()))
  k = first.train.num_classes
  p_train = np.bincount(first.train.labels, minlength=k) / len(first.train.labels)
  names, priors = shift_priors(p_train, ls)
  kl = np.asarray(label_shift.kl_divergence(jnp.asarray(priors), jnp.asarray(p_train)))
  evals = {run_id: evaluate_run(res, p_train, priors, ls) for run_id, res in results.items()}
  rows = [run_row(run_id, ev, names, ls) for run_id, ev in evals.items()]
  columns = [c for c in rows[0] if c != "run"]
  table = seed_stats.seed_rows(rows, ids, columns)
  methods = list(config.runs)
  by_method = {m: [r for r in evals if ids[r][0] == m] for m in methods}
  mean_acc = {m: np.mean([evals[r]["accuracy"] for r in by_method[m]], 0) for m in methods}
  radii = [float(r) for r in ls.radii]
  worst_mean = {m: [np.mean([evals[r]["worst"][rho]["accuracy"] for r in by_method[m]])
                    for rho in radii] for m in methods}
  worst_se = {m: [seed_stats.mean_and_stderr([evals[r]["worst"][rho]["accuracy"]
                                           for r in by_method[m]])[1] for rho in radii]
              for m in methods}
  plot_files = [
      accuracy_vs_kl_plot(os.path.join(workdir, "accuracy_vs_kl.png"), kl, mean_acc,
                          {m: ([0.0] + radii, [mean_acc[m][0]] + worst_mean[m])
                           for m in methods}, k),
      plots.line_plot(os.path.join(workdir, "worst_case.png"), radii, worst_mean,
                      errors={m: np.nan_to_num(worst_se[m]) for m in methods},
                      xlabel="KL radius ρ (nats)", ylabel=plots.ACCURACY,
                      title="Worst-case accuracy in KL(π‖p_train) ≤ ρ", num_classes=k),
  ]
  dro_pi = {}
  for m in methods:
    states = [results[r].objective_state.get("task") for r in by_method[m]]
    if all(s is not None and "pi" in s for s in states):
      dro_pi[m] = np.mean([np.asarray(s["pi"]) for s in states], 0).tolist()
  if dro_pi:
    plot_files.append(plots.grouped_bar_plot(
        os.path.join(workdir, "dro_prior.png"), [str(c) for c in range(k)],
        {"p_train (class frequency)": p_train, **{f"final π of {m}": v
                                                   for m, v in dro_pi.items()}},
        xlabel="class (head → tail)", ylabel="probability",
        title="DRO's adversarial prior π after training (mean over seeds)"))
  headline = f"λ={ls.headline_tilt:g}"
  notes = (f"{len(ids) // len(methods)} seed(s) per method, ± = s.e. over seeds. Columns: "
           "accuracy on the balanced test split re-weighted to the training prior "
           "(in-dist.), to π ∝ p_train^λ (λ=0 uniform, λ<0 toward the tail), mean over "
           f"{ls.num_dirichlet} symmetric Dirichlet(c) priors per c, and the worst prior of "
           f"each model with KL(π‖p_train) ≤ ρ. The oracle trains for {headline}. "
           f"Training prior p_train = {np.round(p_train, 4).tolist()}.")
  md = tables.write_results(
      workdir, f"Label shift on long-tailed {config.train.data.name}", table, notes=notes,
      plots=plot_files,
      extra={"p_train": p_train.tolist(), "priors": dict(zip(names, priors.tolist())),
             "kl": dict(zip(names, kl.tolist())), "runs": evals, "dro_pi": dro_pi,
             "per_seed_rows": rows})
  return {"rows": table, "per_seed_rows": rows, "markdown": md, "evals": evals,
          "p_train": p_train, "dro_pi": dro_pi}
