"""Study `train`: one model, one dataset (`config.train`); in the workdir a results table
and training_curves.png (loss and accuracy against the step, from metrics.jsonl)."""

from __future__ import annotations

import os

from xsens.errors import prefixed
from xsens.lab.multirun import TABLE_COLUMNS
from xsens.report import plots, tables
from xsens.train import sharding, trainer
from xsens.train.metrics import read_metrics


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """`trainer.train_and_evaluate` on `config.train`; its errors name `train.<field>`."""
  sharding.maybe_initialize_distributed()
  mesh = sharding.data_mesh()
  with prefixed("train"):
    exp = trainer.build_experiment(config.train, mesh.size)
  wd = trainer.open_workdir(workdir, config.train, overwrite)
  with prefixed("train"):  # A field refused while the run starts (e.g. pretrained.path).
    result = trainer.run_experiment(exp, wd, mesh)
  s = result.summary
  row = {"run": s["model"], "model": s["model"], "params": s["num_params"], "steps": s["steps"],
         "stop_reason": s["stop_reason"], "train_accuracy": s["train_accuracy"],
         "test_accuracy": s["test_accuracy"], "train_loss": s["train_loss"],
         "test_loss": s["test_loss"], "wall_s": round(s["wall_s"], 1)}
  title = f"{s['model']} on {config.train.data.name}"
  curves = plots.training_curves(
      os.path.join(workdir, "training_curves.png"), read_metrics(workdir),
      loss_label=f"{config.train.loss.replace('_', '-')} loss",
      num_classes=result.train.num_classes, title=title)
  md = tables.write_results(workdir, title, [row], columns=TABLE_COLUMNS,
                            plots=[curves] if curves else [])
  return {"rows": [row], "markdown": md, "result": result}
