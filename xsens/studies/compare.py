"""Train several models under one training block and tabulate them.

The base of every multi-model study: `config.train` is shared, `config.runs[name]`
overrides it per run (usually just the model). Each run gets `workdir/runs/<name>` and
resumes there independently, so an interrupted study picks up where it stopped.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator

from xsens.config_utils import run_config
from xsens.errors import NOT_CONFIG_FIELDS, ConfigError
from xsens.models.vit import ViT
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
    out[name] = trainer.make_workdir(run_workdir(workdir, name), exp.config)
    out[name].check(exp.config, overwrite=overwrite)
  return out


def overrides_field(base: dict, overrides: dict, field: str) -> bool:
  """Whether a run's `overrides` set `field` (a dotted path) of its training config, as
  `run_config` merges them over `base` (`config.train`): the run sets the field or a value
  above it that replaces the base's whole (a leaf, a block the base lacks, a model block
  that names a model); blocks both hold are merged key by key."""
  if field.split(".")[0] == "model" and "name" in (overrides.get("model") or {}):
    return True
  for part in field.split("."):
    if part not in overrides:
      return False
    overrides = overrides[part]
    base = base.get(part) if isinstance(base, dict) else None
    if not (isinstance(overrides, dict) and isinstance(base, dict)):
      return True
  return True


def run_field(config, name: str, field: str) -> str:
  """The full config path of `field` of run `name`'s training config: `runs.<name>.<field>`
  where the run sets it, else `train.<field>` (shared by every run)."""
  if overrides_field(config.train.to_dict(), config.runs[name].to_dict(), field):
    return f"runs.{name}.{field}"
  return f"train.{field}"


# `(run name, field of its merged training config) -> full config path`.
FieldPath = Callable[[str, str], str]


@contextlib.contextmanager
def run_errors(config, name: str, field_path: FieldPath | None = None) -> Iterator[None]:
  """Context: a ConfigError about run `name`'s merged training config is re-raised naming
  the field's full path (`field_path`, default `run_field`), and the run where that path
  does not name it. Errors on the workdir pass through."""
  try:
    yield
  except ConfigError as e:
    if e.field in NOT_CONFIG_FIELDS:
      raise
    full = (field_path or functools.partial(run_field, config))(name, e.field)
    note = "" if full.startswith((f"runs.{name}.", f"{name}.")) else f" (run {name})"
    raise ConfigError(full, e.message + note) from None


def validate_runs(config, field_path: FieldPath | None = None
                  ) -> dict[str, trainer.Experiment]:
  """Builds (validates, loads data for) every run; errors name the field's full path.

  `field_path(run, field)` maps a field of a run's merged training config to the path the
  user sets (default `run_field`: `runs.<run>.<field>` or `train.<field>`).
  """
  experiments = {}
  for name in config.runs:
    with run_errors(config, name, field_path):
      experiments[name] = trainer.build_experiment(run_config(config, name))
  return experiments


def require_vit_patch_size(config, experiments: dict[str, trainer.Experiment], field: str,
                           patch_size) -> None:
  """Refuses `field` (a measure's patch size) unless it is the patch size of every ViT run,
  so the patches measured are the ViT's tokens."""
  for name, exp in experiments.items():
    if isinstance(exp.model, ViT) and exp.model.patch_size != patch_size:
      raise ConfigError(field, f"{patch_size} differs from the patch size of the ViT of run "
                        f"{name!r} ({run_field(config, name, 'model.patch_size')}="
                        f"{exp.model.patch_size}); the measured patches must be the ViT's "
                        f"tokens: use {exp.model.patch_size}")


def train_runs(config, workdir: str, *, overwrite: bool = False,
               experiments: dict[str, trainer.Experiment] | None = None,
               field_path: FieldPath | None = None) -> dict[str, trainer.TrainResult]:
  """Validates every run first (nothing compiled or written on bad input), then trains each.

  `experiments` are the already-validated runs (from `validate_runs`), if the caller has them.
  `field_path` as in `validate_runs` (a run can still refuse a field while it starts, e.g. a
  pretrained checkpoint that does not fit its model).
  """
  experiments = validate_runs(config, field_path) if experiments is None else experiments
  workdirs = check_run_workdirs(workdir, experiments, overwrite)
  results = {}
  for name, exp in experiments.items():
    workdirs[name].prepare(exp.config, overwrite=overwrite)
    with run_errors(config, name, field_path):
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
