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
run. The test split is cut into `val` and `eval` (`xsens.lab.selection`). Churn
(`xsens.measures.churn`) of the pairs of a source (`churn.pairing`: `disjoint` pairs 0-1,
2-3, ... are independent; `all` pairs share runs), mean ± s.e. over pairs, and accuracy,
mean ± s.e. over runs, on `eval`; churn per confidence bin pooled over the method's pairs.
Settings of a churn-reduction method (`churn.select`: groups of methods) are chosen by the
lowest mean `val` churn; the chosen method's `eval` churn reduction vs `churn.baseline` is
reported paired by pair (same seeds), mean ± s.e. For `codistill`, model a is compared
across runs; the churn between the two jointly trained peers of a run is reported apart.
"""

from __future__ import annotations

import itertools
import os

import ml_collections
import numpy as np

from mlcollections_configs import churn as configs
from xsens.lab import multirun
from xsens.lab import selection
from xsens.measures import churn as churn_lib
from xsens.report import plots, seed_stats, tables, training
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


def pairs(names: list[str], pairing: str) -> list[tuple[str, str]]:
  """The run pairs churn is measured on: `disjoint` (runs 0-1, 2-3, ...: no run in two
  pairs, so the pairs' churns are independent) or `all` (every pair; they share runs)."""
  if pairing == "disjoint":
    return [(names[i], names[i + 1]) for i in range(0, len(names) - 1, 2)]
  return list(itertools.combinations(names, 2))


def choose_methods(val_churn: dict[str, float], groups: dict) -> dict[str, str]:
  """{group: the member of `groups[group]` with the lowest validation churn}
  (`xsens.lab.selection.pick_on_val`; only `val_churn` is read)."""
  return {g: selection.pick_on_val([{"method": m, "val_churn": val_churn[m]} for m in members],
                                   "val_churn", higher_is_better=False)["method"]
          for g, members in groups.items()}


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

  logits, peers, accuracy = {}, {}, {}
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
      peers[name] = peer

  first = next(iter(experiments.values()))
  val, ev = selection.split_val_eval(len(first.test), cc.val_fraction, cc.split_seed)
  peer_churn = {name: float(churn_lib.churn(logits[name][ev], peer[ev]))
                for name, peer in peers.items()}
  labels = np.asarray(first.test.labels)
  edges = np.asarray(cc.confidence_edges, np.float32)
  rows, by_conf, pair_values, val_values = [], {}, {}, {}
  for m, by_source in plan.items():
    hist_churn, hist_count = np.zeros(len(edges) - 1), np.zeros(len(edges) - 1)
    for s, names in by_source.items():
      values, vals = [], []
      for a, b in pairs(names, cc.pairing):
        values.append(float(churn_lib.churn(logits[a][ev], logits[b][ev])))
        vals.append(float(churn_lib.churn(logits[a][val], logits[b][val])))
        rate, count = churn_lib.churn_by_confidence(logits[a][ev], logits[b][ev], edges)
        rate, count = np.asarray(rate), np.asarray(count)
        hist_churn += np.nan_to_num(rate) * count
        hist_count += count
      accs = [float(np.mean(np.argmax(logits[n][ev], -1) == labels[ev])) for n in names]
      pair_values[f"{m}/{s}"] = values
      val_values[f"{m}/{s}"] = vals
      churn_mean, churn_se = seed_stats.mean_and_stderr(values)
      acc_mean, acc_se = seed_stats.mean_and_stderr(accs)
      row = {"method": m, "source": s, "pairs": len(values),
             "churn": churn_mean, "churn_se": churn_se, "val_churn": float(np.mean(vals)),
             "eval_accuracy": acc_mean, "eval_accuracy_se": acc_se}
      peers = [peer_churn[n] for n in names if n in peer_churn]
      row["peer_churn"] = float(np.mean(peers)) if peers else float("nan")
      rows.append(row)
    by_conf[m] = {"churn": np.where(hist_count > 0, hist_churn / np.maximum(hist_count, 1),
                                    np.nan).tolist(),
                  "share": (hist_count / max(hist_count.sum(), 1)).tolist()}
  val_churn = {m: float(np.mean([r["val_churn"] for r in rows if r["method"] == m]))
               for m in plan}
  chosen = choose_methods(val_churn, {g: list(v) for g, v in cc.select.items()})
  reductions = _reductions(cc, plan, pair_values, chosen)

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
  notes = _notes(config, conf_rows, rows, methods, len(val), len(ev), val_churn, chosen,
                 reductions)
  columns = ["method", "source", "pairs", "churn", "churn_se", "val_churn", "eval_accuracy",
             "eval_accuracy_se", "peer_churn"]
  md = tables.write_results(
      workdir, f"Prediction churn on {config.train.data.name}", rows, columns=columns,
      notes=notes, plots=plot_files,
      extra={"pair_churn": pair_values, "val_pair_churn": val_values,
             "churn_by_confidence": by_conf, "bins": bins, "full_test_accuracy": accuracy,
             "peer_churn": peer_churn, "val_churn": val_churn, "chosen": chosen,
             "reductions": reductions, "val_indices": val.tolist(),
             "eval_indices": ev.tolist()})
  return {"rows": rows, "markdown": md, "pair_churn": pair_values,
          "churn_by_confidence": by_conf, "full_test_accuracy": accuracy,
          "peer_churn": peer_churn,
          "val_churn": val_churn, "chosen": chosen, "reductions": reductions, "val": val,
          "eval": ev}


def _reductions(cc, plan, pair_values, chosen) -> list[dict]:
  """Per chosen method and source: eval churn reduction vs `churn.baseline`, paired by pair
  (pair i of both methods has the same seeds): mean ± s.e. over pairs and mean / s.e."""
  out = []
  if cc.baseline not in plan:
    return out
  for group, m in chosen.items():
    for s in cc.sources:
      diff = np.subtract(pair_values[f"{cc.baseline}/{s}"], pair_values[f"{m}/{s}"])
      mean, se = seed_stats.mean_and_stderr(diff)
      out.append({"group": group, "method": m, "source": s, "pairs": len(diff),
                  "reduction": mean, "reduction_se": se,
                  "reduction_in_se": mean / se if se > 0 else float("nan")})
  return out


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


def _notes(config, conf_rows, rows, methods, n_val, n_eval, val_churn, chosen,
           reductions) -> str:
  cc, t = config.churn, config.train
  lines = [
      f"Model `{t.model.name}`, {training.length(t)}, batch {t.batch_size}, augmentation "
      f"σ = {t.augment.gaussian_std} on {t.augment.gaussian_prob:.0%} of the images. "
      f"{cc.num_seeds} runs per source (seeds {cc.base_seed}..{cc.base_seed + cc.num_seeds - 1}"
      f" of that source, the others at {cc.base_seed}); churn over "
      + ("disjoint pairs (runs 0-1, 2-3, ...; independent)" if cc.pairing == "disjoint"
         else "all pairs (they share runs)") + ", mean ± s.e. over pairs. "
      "peer_churn: churn between the two models of one co-distillation run (on `eval`).",
      "",
      f"Held-out data: the test split is cut into `val` ({n_val} examples) and `eval` "
      f"({n_eval}; every churn and accuracy in the tables). Mean val churn per method: "
      + ", ".join(f"{m} {v:.4f}" for m, v in val_churn.items()) + ". Chosen on val (lowest "
      "val churn per group): " + (", ".join(f"{g}: {m}" for g, m in chosen.items()) or
                                  "nothing to choose") + ".",
      "",
      f"Eval churn reduction vs `{cc.baseline}` (paired by pair, mean ± s.e.; in units of "
      "the s.e.):",
      "",
      tables.markdown_table(reductions) if reductions else "(no baseline)",
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
