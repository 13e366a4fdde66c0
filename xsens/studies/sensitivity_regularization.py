"""Study `sensitivity_regularization`: does lowering sensitivity improve robustness?

§6.1 of "Transformers Learn Low Sensitivity Functions" (ICLR 2025, arXiv 2403.06925):
a ViT trained plainly, with Gaussian noise augmentation, and with the sensitivity
regulariser (1−p)·CE + p·MSE(f(x̃), f(x)) (`xsens.train.interventions`), next to a ResNet.
For each run: clean test accuracy, accuracy under the common corruptions per category
(`xsens.measures.corruption_eval`), and train-set token-wise sensitivity
(`xsens.lab.sensitivity.measure_model`). Writes results.md/json and plots.
"""

from __future__ import annotations

import os

import jax

from mlcollections_configs import sensitivity_regularization as configs
from xsens.lab import corruptions, multirun
from xsens.lab import robustness as lab_robustness
from xsens.lab import sensitivity as lab_sens
from xsens.report import plots, tables
from xsens.train import sharding


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every run, measures corrupted accuracy and sensitivity, writes the report."""
  configs.validate(config)
  experiments = multirun.validate_runs(config)
  lab_sens.validate_against_runs(config, experiments)
  lab_robustness.validate_robustness_config(config.robustness, list(experiments),
                                            config.train.data.normalize)
  results = multirun.train_runs(config, workdir, overwrite=overwrite, experiments=experiments)
  corr = corruptions.corruption_section(results, config.robustness,
                                        config.train.data.normalize)
  key, mesh = jax.random.key(config.sensitivity.seed), sharding.data_mesh()
  sens = {name: lab_sens.measure_model(res, config.sensitivity, jax.random.fold_in(key, j),
                                       mesh)
          for j, (name, res) in enumerate(results.items())}
  main = float(config.sensitivity.main_sigma)
  rows = []
  for name, res in results.items():
    s = corr["summary"][name]
    mean, se = sens[name]["sigmas"][main]
    rows.append({"run": name, "params": res.summary["num_params"],
                 "train_accuracy": res.summary["train_accuracy"], "test_accuracy": s["clean"],
                 "mCA": s["mca"], "mCE": corr["mce"][name]["mce"],
                 **{f"acc_{c}": v for c, v in s["per_category"].items()},
                 f"S(σ={main:g})": mean, f"s.e.(σ={main:g})": se})
  names = list(results)
  categories = list(corr["summary"][names[0]]["per_category"])
  plot_files = [
      plots.grouped_bar_plot(os.path.join(workdir, "corruption_categories.png"),
                             ["clean"] + categories,
                             {n: [corr["summary"][n]["clean"]] +
                                 [corr["summary"][n]["per_category"][c] for c in categories]
                              for n in names},
                             ylabel="test accuracy (fraction correct)",
                             xlabel="test data (clean, corruption category)",
                             title="Clean and corrupted accuracy",
                             num_classes=results[names[0]].train.num_classes),
      plots.bar_plot(os.path.join(workdir, "train_sensitivity.png"), names,
                     [sens[n]["sigmas"][main][0] for n in names],
                     errors=[sens[n]["sigmas"][main][1] for n in names],
                     ylabel="train-set sensitivity (flip probability)", xlabel="run",
                     title=f"Sensitivity, σ={main:g}"),
  ]
  rc, sc = config.robustness, config.sensitivity
  notes = (f"Corrupted accuracy on the first {rc.num_examples} test examples over "
           f"{len(rc.corruptions.names)} corruptions × severities "
           f"{list(rc.corruptions.severities)}; mCE relative to `{rc.baseline_run}`. "
           f"Sensitivity: {sc.patch_size}×{sc.patch_size} patches, {sc.num_draws} draws, "
           f"first {sc.num_examples} training examples, ± = s.e. over examples.")
  md = tables.write_results(
      workdir, f"Sensitivity regularisation and robustness on {config.train.data.name}",
      rows, notes=notes, plots=plot_files,
      extra={"corruption_summary": corr["summary"], "mce": corr["mce"],
             "sensitivity": {n: {str(k): v for k, v in m["sigmas"].items()}
                             for n, m in sens.items()}})
  return {"rows": rows, "markdown": md, "corruptions": corr, "sensitivity": sens}
