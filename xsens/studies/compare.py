"""Train several models under one training block and tabulate them.

The base of every multi-model study: `config.train` is shared, `config.runs[name]`
overrides it per run (usually just the model). Each run gets `workdir/runs/<name>` and
resumes there independently, so an interrupted study picks up where it stopped.
"""

from __future__ import annotations

import os

from xsens.config_utils import run_config
from xsens.errors import ConfigError
from xsens.report import tables
from xsens.train import trainer
from xsens.train.workdir import Workdir

TABLE_COLUMNS = ("run", "model", "params", "steps", "stop_reason", "train_accuracy",
                 "test_accuracy", "train_loss", "test_loss", "wall_s")


def run_workdir(workdir: str, name: str) -> str:
  return os.path.join(workdir, "runs", name)


def check_run_workdirs(workdir: str, experiments: dict[str, trainer.Experiment],
                       overwrite: bool = False) -> dict[str, Workdir]:
  """Each run's `Workdir`, checked against its config (ConfigError; nothing written).

  Call `.prepare(exp.config, overwrite=...)` on each just before training it.
  """
  out = {}
  for name, exp in experiments.items():
    out[name] = Workdir(run_workdir(workdir, name), keep_checkpoints=exp.config.keep_checkpoints)
    out[name].check(exp.config, overwrite=overwrite)
  return out


def validate_runs(config) -> dict[str, trainer.Experiment]:
  """Builds (validates, loads data for) every run; errors name `runs.<run>.<field>`."""
  experiments = {}
  for name in config.runs:
    try:
      experiments[name] = trainer.build_experiment(run_config(config, name))
    except ConfigError as e:
      raise ConfigError(f"runs.{name}.{e.field}", e.message) from None
  return experiments


def train_runs(config, workdir: str, *, overwrite: bool = False,
               experiments: dict[str, trainer.Experiment] | None = None
               ) -> dict[str, trainer.TrainResult]:
  """Validates every run first (nothing compiled or written on bad input), then trains each.

  `experiments` are the already-validated runs (from `validate_runs`), if the caller has them.
  """
  experiments = validate_runs(config) if experiments is None else experiments
  workdirs = check_run_workdirs(workdir, experiments, overwrite)
  results = {}
  for name, exp in experiments.items():
    workdirs[name].prepare(exp.config, overwrite=overwrite)
    results[name] = trainer.run_experiment(exp, workdirs[name])
  return results


def summary_rows(results: dict[str, trainer.TrainResult]) -> list[dict]:
  """One table row per run: size, steps, why it stopped, accuracies and losses."""
  rows = []
  for name, res in results.items():
    s = res.summary
    rows.append({"run": name, "model": s["model"], "params": s["num_params"],
                 "steps": s["steps"], "stop_reason": s["stop_reason"],
                 "train_accuracy": s["train_accuracy"], "test_accuracy": s["test_accuracy"],
                 "train_loss": s["train_loss"], "test_loss": s["test_loss"],
                 "wall_s": round(s["wall_s"], 1)})
  return rows


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every run of `config.runs` and writes results.md / results.json."""
  results = train_runs(config, workdir, overwrite=overwrite)
  rows = summary_rows(results)
  title = f"Model comparison on {config.train.data.name}"
  md = tables.write_results(workdir, title, rows, columns=TABLE_COLUMNS)
  return {"rows": rows, "markdown": md}
