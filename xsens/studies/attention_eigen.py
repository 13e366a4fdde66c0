"""Study `attention_eigen`: is attention low-dimensional, and can it be computed in part?

Bhojanapalli, Chakrabarti, Jain, Kumar, Lukasik, Veit (2021), "Eigen Analysis of
Self-Attention and its Reconstruction from Partial Computation", arXiv 2106.08823
(docs/papers/google_papers.md §C). Trains the runs of `config.runs` with the one trainer
(`xsens.lab.multirun`, `config.num_seeds` seeds each), then analyses the `eigen.analysed_run`
transformer (every seed) and the same architecture at random init with
`xsens.lab.eigen_analysis.analyse_runs` (eigen statistics of the score rows and matrices, overlaps,
partial-reconstruction errors, the frozen model's accuracy vs (m, k)), and adds the runs that train
an `eigen_vit` (layers >= 1 attend from m keys with a learned basis) against the analysed ViT: test
accuracy ± s.e., forward and attention FLOPs (XLA cost analysis), peak temp memory and time of one
training step (`xsens.lab.model_cost`).

Writes results.md/json, explained_variance.png, overlap.png, reconstruction.png and
accuracy_vs_keys.png.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from mlcollections_configs import attention_eigen as configs
from xsens.lab import eigen_analysis, model_cost, multirun
from xsens.models import eigen_vit
from xsens.report import seed_stats
from xsens.train.metrics import read_metrics


def _tokens_of(exp) -> int:
  """T of a run: ViT tokens from the image shape, or the text length."""
  shape = tuple(exp.train.input_shape)
  if hasattr(exp.model, "patch_size"):
    return eigen_vit.num_tokens(exp.model, shape)
  return shape[0]


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains the runs, analyses the attention of `eigen.analysed_run`, writes the report.
  (Set-up `imagenet`, pretrained checkpoints and no training, is the study
  `attention_eigen_imagenet`.)"""
  ec = config.eigen
  configs.validate(config)
  probe = multirun.validate_runs(config)
  ids = multirun.run_ids(config)
  num_tokens = _tokens_of(probe[ec.analysed_run])
  configs.validate_eigen(ec, num_tokens)
  results = multirun.train_runs(config, workdir, overwrite=overwrite, experiments=probe)
  seeds = [rid for rid, (name, _) in ids.items() if name == ec.analysed_run]
  return eigen_analysis.analyse_runs(
      [results[r] for r in seeds], ec, workdir, num_tokens=num_tokens,
      title=f"Eigen-analysis of attention on {config.train.data.name}",
      data=f"{ec.num_examples} training examples of {config.train.data.name}",
      unit="seed", cost_rows=lambda: _cost_rows(config, workdir, results, ids, ec))


def accuracy_curve(run_workdirs: list[str]) -> list[dict]:
  """Test accuracy ± s.e. over seeds at every evaluation step that each of `run_workdirs`
  (the seeds of one run) reached: `[{"step", "test_accuracy", "test_accuracy s.e."}]`
  from the runs' metrics logs, steps ascending."""
  per_seed = [{r["step"]: r["eval/test_accuracy"] for r in read_metrics(path)
               if "eval/test_accuracy" in r} for path in run_workdirs]
  steps = sorted(set.intersection(*(set(p) for p in per_seed)))
  rows = []
  for step in steps:
    mean, se = seed_stats.mean_and_stderr([p[step] for p in per_seed])
    rows.append({"step": step, "test_accuracy": mean, "test_accuracy s.e.": se})
  return rows


def _cost_rows(config, workdir, results, ids, ec) -> list[dict]:
  """Per run: test accuracy at its stop ± s.e. over seeds, the steps it trained (and how
  many seeds reached `train.target_train_accuracy`), its test-accuracy curve, and FLOPs,
  memory and step time (seed 0)."""
  rows = []
  for name in config.runs:
    rids = [r for r, (n, _) in ids.items() if n == name]
    res = results[rids[0]]
    steps = [results[r].summary["steps"] for r in rids]
    x = jnp.asarray(res.test.images[:ec.cost_batch_size])
    y = jnp.asarray(res.test.labels[:ec.cost_batch_size])
    total = model_cost.forward_flops(res.model, res.variables, x)
    attn = model_cost.attention_flops(res.model, res.variables, x)
    cost = model_cost.train_step_cost(res.model, res.variables, x, y,
                                      repeats=ec.timing_repeats)
    acc, se = seed_stats.mean_and_stderr([results[r].summary["test_accuracy"] for r in rids])
    rows.append({"run": name, "keys_kept": getattr(res.model, "keys_kept", 0),
                 "basis_rank": getattr(res.model, "basis_rank", 0), "seeds": len(rids),
                 "test_accuracy": acc, "test_accuracy s.e.": se,
                 "test_accuracy_per_seed": [results[r].summary["test_accuracy"]
                                            for r in rids],
                 "steps": float(np.mean(steps)), "steps_per_seed": steps,
                 "reached_target": sum(results[r].summary["stop_reason"]
                                       == "target_train_accuracy" for r in rids),
                 "curve": accuracy_curve([multirun.run_workdir(workdir, r)
                                               for r in rids]),
                 "fwd_gflops": total / 1e9, "attn_gflops": attn / 1e9, **cost})
  base = next(r for r in rows if r["run"] == ec.analysed_run)
  for r in rows:
    r["flops_vs_base"] = r["fwd_gflops"] / base["fwd_gflops"]
    r["attn_flops_vs_base"] = r["attn_gflops"] / base["attn_gflops"]
    r["mem_vs_base"] = r["peak_temp_mb"] / base["peak_temp_mb"]
    r["step_time_vs_base"] = r["step_ms"] / base["step_ms"]
  return rows
