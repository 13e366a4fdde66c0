"""Study `train`: one model, one dataset (`config.train`), results table in the workdir."""

from __future__ import annotations

from xsens.errors import prefixed
from xsens.lab.multirun import TABLE_COLUMNS
from xsens.report import tables
from xsens.train import sharding, trainer


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
  md = tables.write_results(workdir, f"{s['model']} on {config.train.data.name}", [row],
                            columns=TABLE_COLUMNS)
  return {"rows": [row], "markdown": md, "result": result}
