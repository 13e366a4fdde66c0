"""Study `churn`: how much do retrained models disagree, and what lowers it?

"On the reproducibility of neural network predictions" (Bhojanapalli et al., arXiv
2102.03349; docs/papers/google_papers.md §F). Claims (abstract): two models trained by the same
algorithm disagree on a notable share of predictions (churn) even at equal accuracy; the
sources are initialisation, mini-batch order and augmentation; churn is related to
prediction confidence; a minimum-entropy regulariser and a co-distillation variant reduce
it. λ, β, the variant and all numbers are not known (spec); we use the baseline
co-distillation of Anil et al. 2018 (`xsens.train.codistill`).

For each method (`churn.methods`: overrides of `config.train`) and each source
(`churn.sources`), `num_seeds` runs set that source's seed (`init_seed`, `order_seed` or
`augment_seed`) to base_seed + j and keep the other two at base_seed; j = 0 is one shared
run. Churn (`xsens.measures.churn`) of every pair within a source on the whole test split,
mean ± std over pairs; test accuracy mean ± std over the source's runs; churn per
confidence bin pooled over all pairs of the method. For `codistill`, model a is compared
across runs; the churn between the two jointly trained peers of a run is reported apart.
"""

from __future__ import annotations

import itertools
import os

import ml_collections
import numpy as np

from mlcollections_configs import churn as configs
from xsens.lab import multirun
from xsens.measures import churn as churn_lib
from xsens.report import plots, tables, training
from xsens.train import codistill
from xsens.train import distill as distill_lib
from xsens.train import trainer

SOURCES = {"init": "init_seed", "order": "order_seed", "augment": "augment_seed"}


def run_plan(cc) -> dict[str, dict[str, list[str]]]:
  """{method: {source: [run names, seed j = 0..n-1]}}; j = 0 is the method's shared base."""
  plan = {}
  for m in cc.methods:
    plan[m] = {s: [f"{m}_base" if j == 0 else f"{m}_{s}{j}" for j in range(cc.num_seeds)]
               for s in cc.sources}
  return plan


def _runs(config, plan) -> dict:
  cc = config.churn
  runs = {}
  for m, by_source in plan.items():
    for s, names in by_source.items():
      for j, name in enumerate(names):
        over = cc.methods[m].to_dict()
        over.update({f: cc.base_seed for f in SOURCES.values()})
        over[SOURCES[s]] = cc.base_seed + j
        runs[name] = over
  return runs


def field_path(config, plan):
  """`(run, field) -> full config path` of the plan's runs (see `multirun.validate_runs`): a
  seed is `churn.base_seed`, a field the run's method sets `churn.methods.<method>.<field>`,
  anything else `train.<field>`."""
  method_of = {name: m for m, by_source in plan.items() for names in by_source.values()
               for name in names}
  base = config.train.to_dict()

  def path(name: str, field: str) -> str:
    method = method_of[name]
    if field in SOURCES.values():
      return "churn.base_seed"
    if multirun.overrides_field(base, config.churn.methods[method].to_dict(), field):
      return f"churn.methods.{method}.{field}"
    return f"train.{field}"
  return path


def _is_codistill(exp) -> bool:
  return exp.config.get("codistill") is not None


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every run of the plan, measures churn, writes the report."""
  configs.validate(config)
  cc = config.churn
  plan = run_plan(cc)
  derived = ml_collections.ConfigDict({"num_seeds": 1,  # Each run is one seed of the plan.
                                       "train": config.train.copy_and_resolve_references(),
                                       "runs": _runs(config, plan)})
  paths = field_path(config, plan)
  experiments = multirun.validate_runs(derived, paths)
  co_cfg = {}
  for name, exp in experiments.items():
    if _is_codistill(exp):
      with multirun.run_errors(derived, name, paths):
        co_cfg[name] = codistill.validate_codistill_config(exp.config)
  workdirs = multirun.check_run_workdirs(workdir, experiments, overwrite)

  logits, peer_churn, accuracy = {}, {}, {}
  for name, exp in experiments.items():
    wd = workdirs[name]
    wd.prepare(exp.config, overwrite=overwrite)
    with multirun.run_errors(derived, name, paths):
      if name in co_cfg:
        out = codistill.run_experiment(exp, co_cfg[name], wd)
        res = out.a
      else:
        res, out = trainer.run_experiment(exp, wd), None
    peer = None if out is None else distill_lib.predict_logits(out.b.model, out.b.variables,
                                                                 exp.test.images)
    logits[name] = distill_lib.predict_logits(res.model, res.variables, exp.test.images)
    accuracy[name] = res.summary["test_accuracy"]
    if peer is not None:
      peer_churn[name] = float(churn_lib.churn(logits[name], peer))

  edges = np.asarray(cc.confidence_edges, np.float32)
  rows, by_conf, pair_values = [], {}, {}
  for m, by_source in plan.items():
    hist_churn, hist_count = np.zeros(len(edges) - 1), np.zeros(len(edges) - 1)
    for s, names in by_source.items():
      values = []
      for a, b in itertools.combinations(names, 2):
        values.append(float(churn_lib.churn(logits[a], logits[b])))
        rate, count = churn_lib.churn_by_confidence(logits[a], logits[b], edges)
        rate, count = np.asarray(rate), np.asarray(count)
        hist_churn += np.nan_to_num(rate) * count
        hist_count += count
      accs = [accuracy[n] for n in names]
      pair_values[f"{m}/{s}"] = values
      row = {"method": m, "source": s, "pairs": len(values),
             "churn": float(np.mean(values)), "churn_std": float(np.std(values)),
             "test_accuracy": float(np.mean(accs)), "test_accuracy_std": float(np.std(accs))}
      peers = [peer_churn[n] for n in names if n in peer_churn]
      row["peer_churn"] = float(np.mean(peers)) if peers else float("nan")
      rows.append(row)
    by_conf[m] = {"churn": np.where(hist_count > 0, hist_churn / np.maximum(hist_count, 1),
                                    np.nan).tolist(),
                  "share": (hist_count / max(hist_count.sum(), 1)).tolist()}

  methods, sources = list(plan), list(cc.sources)
  bins = [f"[{a:g},{b:g}" + ("]" if i == len(edges) - 2 else ")")
          for i, (a, b) in enumerate(zip(edges[:-1], edges[1:]))]
  plot_files = [
      plots.grouped_bar_plot(
          os.path.join(workdir, "churn_by_source.png"), sources,
          {m: [next(r["churn"] for r in rows if r["method"] == m and r["source"] == s)
               for s in sources] for m in methods},
          ylabel="churn (fraction of test predictions that differ)",
          xlabel="source of randomness", title="Churn per source of randomness"),
      _confidence_plot(os.path.join(workdir, "churn_by_confidence.png"), bins, by_conf),
  ]
  conf_rows = [{"method": m, **{f"churn {b}": by_conf[m]["churn"][i] for i, b in
                                enumerate(bins)},
                **{f"share {b}": by_conf[m]["share"][i] for i, b in enumerate(bins)}}
               for m in methods]
  notes = _notes(config, conf_rows, rows, methods)
  columns = ["method", "source", "pairs", "churn", "churn_std", "test_accuracy",
             "test_accuracy_std", "peer_churn"]
  md = tables.write_results(
      workdir, f"Prediction churn on {config.train.data.name}", rows, columns=columns,
      notes=notes, plots=plot_files,
      extra={"pair_churn": pair_values, "churn_by_confidence": by_conf, "bins": bins,
             "test_accuracy": accuracy, "peer_churn": peer_churn})
  return {"rows": rows, "markdown": md, "pair_churn": pair_values,
          "churn_by_confidence": by_conf, "test_accuracy": accuracy, "peer_churn": peer_churn}


def _confidence_plot(path, bins, by_conf) -> str:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6.4, 3.4))
  x = np.arange(len(bins))
  for (m, v), style in zip(by_conf.items(), plots.line_styles(len(by_conf))):
    ax.plot(x, v["churn"], label=m, **style)
  ax.set_xticks(x, bins, fontsize=8)
  plots.styled_axes(ax, "Churn by confidence",
                    "confidence bin (mean top-class probability of the pair)",
                    "churn (fraction of predictions that differ)")
  plots.legend_outside(ax)
  fig.tight_layout()
  return plots.save_figure(fig, path)


def _notes(config, conf_rows, rows, methods) -> str:
  cc, t = config.churn, config.train
  lines = [
      f"Model `{t.model.name}`, {training.length(t)}, batch {t.batch_size}, augmentation "
      f"σ = {t.augment.gaussian_std} on {t.augment.gaussian_prob:.0%} of the images. "
      f"{cc.num_seeds} runs per source (seeds {cc.base_seed}..{cc.base_seed + cc.num_seeds - 1}"
      f" of that source, the others at {cc.base_seed}); churn over all pairs (mean ± std). "
      "peer_churn: churn between the two models of one co-distillation run.",
      "",
      "Mean churn over sources: " + ", ".join(
          f"{m} {np.mean([r['churn'] for r in rows if r['method'] == m]):.4f}"
          for m in methods) + ".",
      "",
      "Churn by confidence (mean of the two models' top softmax probability), pooled over "
      "every pair of the method; share = fraction of test examples in the bin:",
      "",
      tables.markdown_table(conf_rows),
  ]
  return "\n".join(lines)
