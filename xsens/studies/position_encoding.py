"""Study `position_encoding`: DIET (Chen et al., EMNLP 2021, arXiv 2104.08698).

Trains the text encoder once per (task, position mode) and training seed
(`multirun.train_runs`, `config.num_seeds`), then reports:
- test accuracy mean ± s.e. over the seeds per task and mode;
- per mode, measured identically: parameters, forward FLOPs (XLA cost analysis,
  `xsens.lab.model_cost`) and best-of-n train-step time (loss + grads,
  `model_cost.train_step_cost`) on one batch, with ratios to `baseline_mode` (input PE);
- Theorem 1 as a measurement: the numerical rank of every head's attention logits
  (`xsens.measures.logit_rank`) on test examples, per mode (first seed of each run);
- heat maps of the learned position-to-position maps per head: DIET-ABS P_Q P_Kᵀ and
  DIET-REL's Toeplitz R_{i−j} (layer 0), shown minus their minimum (softmax ignores a
  constant added to every logit).
Writes results.md/json, accuracy.png, diet_abs_maps.png, diet_rel_maps.png.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np

from mlcollections_configs import position_encoding as configs
from xsens.config_utils import run_config
from xsens.errors import ConfigError
from xsens.lab import model_cost, multirun
from xsens.measures import logit_rank as logit_rank_lib
from xsens.models import position
from xsens.models.text import RoBERTa, padding_mask
from xsens.report import plots, seed_stats, tables


def run_mode(config, run_name: str) -> str:
  """The position mode of run `run_name` (its model's `position`)."""
  return run_config(config, run_name).model.position


def run_task(config, run_name: str) -> str:
  """The dataset of run `run_name` (its `data.name`, else the shared one)."""
  return run_config(config, run_name).data.name


def validate(config, experiments) -> None:
  """ConfigError naming `position_encoding.<field>` (the config file's `validate`) or the
  run that is not a RoBERTa on the einsum path."""
  configs.validate(config)
  for run_id, exp in experiments.items():
    if not isinstance(exp.model, RoBERTa):
      raise ConfigError(multirun.run_field(config, run_id, "model.name"), "the position "
                        "study needs the text encoder 'roberta'")
    if exp.model.attention_impl != "einsum":
      raise ConfigError(multirun.run_field(config, run_id, "model.attention_impl"),
                        "the logit-rank check reads the logits of the 'einsum' path; "
                        "use 'einsum'")


def mode_costs(results, config) -> dict[str, dict]:
  """{mode: params, forward FLOPs, step ms} on the first run of each mode, one batch of
  `timing_batch` training examples, measured identically for every mode."""
  pc, out = config.position_encoding, {}
  for run_id, res in results.items():
    mode = run_mode(config, multirun.run_ids(config)[run_id][0])
    if mode in out:
      continue
    ids = jnp.asarray(res.train.inputs[:pc.timing_batch])
    labels = jnp.asarray(res.train.labels[:pc.timing_batch])
    cost = model_cost.train_step_cost(res.model, res.variables, ids, labels,
                                 repeats=pc.timing_repeats)
    out[mode] = {"params": res.summary["num_params"],
                 "flops": model_cost.forward_flops(res.model, res.variables, ids),
                 "step_ms": cost["step_ms"]}
  return out


def rank_of_run(res, pc) -> dict:
  """Logit ranks of one run on its first `rank_examples` test examples."""
  ids = jnp.asarray(res.test.inputs[:pc.rank_examples])
  out = logit_rank_lib.attention_logit_rank(res.apply_fn, res.variables, ids,
                                  token_mask=padding_mask(ids), rtol=pc.rank_rtol)
  return {"mean_rank": float(out["mean_rank"].mean()),
          "max_rank": int(out["max_rank"].max())}


def position_maps(res, mode: str) -> dict[str, np.ndarray]:
  """{panel: [L, L]} learned position-to-position logit maps per head (minus the min),
  over the run's sequence length L."""
  p = res.variables["params"]
  length = res.train.inputs.shape[1]
  if mode == "diet_abs":
    b = p["position_bias"]
    maps = np.einsum("hid,hjd->hij", np.asarray(b["p_query"])[:, :length],
                     np.asarray(b["p_key"])[:, :length])
  elif mode == "diet_rel":
    maps = np.asarray(position.toeplitz_bias(p["layers_0"]["position_bias"]["relative"],
                                             length))
  else:
    return {}
  return {f"head {h}": m - m.min() for h, m in enumerate(maps)}


def _ratio(value, base) -> float:
  return float(value) / float(base) if base else float("nan")


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every (task, mode) run over the seeds, measures them, writes the report."""
  experiments = multirun.validate_runs(config)
  validate(config, experiments)
  results = multirun.train_runs(config, workdir, overwrite=overwrite, experiments=experiments)
  pc, ids = config.position_encoding, multirun.run_ids(config)
  per_seed = [{"run": rid, "test_accuracy": r.summary["test_accuracy"],
               "train_accuracy": r.summary["train_accuracy"]} for rid, r in results.items()]
  acc = {row["run"]: row for row in seed_stats.seed_rows(per_seed, ids,
                                                      ("test_accuracy", "train_accuracy"))}
  costs = mode_costs(results, config)
  base = costs[pc.baseline_mode]
  ranks = {name: rank_of_run(results[name], pc) for name in config.runs}
  rows = []
  for name in config.runs:
    mode, a = run_mode(config, name), acc[name]
    rows.append({"run": name, "task": run_task(config, name), "mode": mode,
                 "seeds": a["seeds"], "test_accuracy": a["test_accuracy"],
                 "test_accuracy s.e.": a["test_accuracy s.e."],
                 "train_accuracy": a["train_accuracy"],
                 "logit_rank_mean": ranks[name]["mean_rank"],
                 "logit_rank_max": ranks[name]["max_rank"]})
  cost_rows = [{"mode": m, "params": c["params"], "params_ratio": _ratio(c["params"],
                                                                       base["params"]),
                "forward_flops": c["flops"], "flops_ratio": _ratio(c["flops"], base["flops"]),
                "step_ms": c["step_ms"], "step_time_ratio": _ratio(c["step_ms"],
                                                                   base["step_ms"])}
               for m, c in costs.items()]
  tasks = list(dict.fromkeys(r["task"] for r in rows))
  modes = list(dict.fromkeys(r["mode"] for r in rows))
  by = {(r["task"], r["mode"]): r["test_accuracy"] for r in rows}
  plot_files = [plots.grouped_bar_plot(
      os.path.join(workdir, "accuracy.png"), tasks,
      {m: [by.get((t, m), np.nan) for t in tasks] for m in modes},
      ylabel=plots.ACCURACY, xlabel="task", title="Test accuracy per position mode",
      num_classes=2)]
  for mode in ("diet_abs", "diet_rel"):
    name = next((n for n in config.runs if run_mode(config, n) == mode), None)
    if name is not None:
      plot_files.append(plots.heatmap_grid(
          os.path.join(workdir, f"{mode}_maps.png"), position_maps(results[name], mode),
          title=f"{mode}: learned position-to-position logits ({name})",
          cbar_label="logit bias − min", xlabel="key position j",
          ylabel="query position i"))
  d_h = {m: experiments[n].model.width // experiments[n].model.num_heads
         for n, m in ((n, run_mode(config, n)) for n in config.runs)}
  notes = (f"Accuracy: mean ± s.e. over {multirun.num_seeds(config)} training seeds. Costs: "
           f"batch {pc.timing_batch}, best of {pc.timing_repeats} train steps, ratios to "
           f"`{pc.baseline_mode}`. Logit rank: singular values > {pc.rank_rtol:g} · the "
           f"largest, on {pc.rank_examples} test examples, mean over layers, heads and "
           f"examples (first seed); Theorem 1 bounds input-PE modes by d_h = "
           f"{sorted(set(d_h.values()))}.")
  notes += "\n\n## Cost per position mode\n\n" + tables.markdown_table(cost_rows)
  md = tables.write_results(workdir, "DIET position encodings", rows, notes=notes,
                            plots=plot_files, extra={"costs": cost_rows, "ranks": ranks})
  return {"rows": rows, "costs": cost_rows, "ranks": ranks, "markdown": md}
