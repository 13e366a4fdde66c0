"""The multi-run kit: train several models under one training block.

`config.train` is shared and `config.runs[name]` overrides it per run (usually just the
model); `config.num_seeds` trains every run once per training seed (`run_ids`). Each run
gets `workdir/runs/<run id>` and resumes there on its own, so an interrupted study picks
up where it stopped. Errors on a run's merged training config name the field the user
sets (`run_field`: `runs.<run>.<field>` or `train.<field>`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator

from xsens.config_utils import run_config
from xsens.errors import NOT_CONFIG_FIELDS, ConfigError, is_int
from xsens.models.vit import ViT
from xsens.train import trainer
from xsens.train.workdir import Workdir

TABLE_COLUMNS = ("run", "model", "params", "steps", "stop_reason", "train_accuracy",
                 "test_accuracy", "train_loss", "test_loss", "wall_s")


def run_workdir(workdir: str, name: str) -> str:
  """`workdir/runs/<name>`: the workdir of run (id) `name` of a study in `workdir`."""
  return os.path.join(workdir, "runs", name)


# The training seeds that `config.num_seeds` adds: init, mini-batch order and step key.
TRAINING_SEED_FIELDS = ("init_seed", "order_seed", "augment_seed")


def num_seeds(config) -> int:
  """`config.num_seeds`, refused unless an int >= 1 (ConfigError)."""
  n = config.num_seeds
  if not (is_int(n) and n >= 1):
    raise ConfigError("num_seeds", f"must be an int >= 1 (training seeds per run), got {n!r}")
  return int(n)


def run_ids(config) -> dict[str, tuple[str, int]]:
  """`{run id: (run name, seed index)}`: every run of `config.runs` once per training seed.

  Seed index 0 is the run as configured (id = its name, workdir `runs/<name>`, so
  single-seed workdirs keep working); index i > 0 is `<name>_seed<i>`, the same run with
  every training seed (`TRAINING_SEED_FIELDS`; None means `seed`) shifted by i. `seed`
  itself, which fixes the data, is kept, so every seed trains and is measured on the same
  examples.
  """
  n = num_seeds(config)
  ids = {}
  for name in config.runs:
    for i in range(n):
      run_id = name if i == 0 else f"{name}_seed{i}"
      if run_id in ids or (i and run_id in config.runs):
        raise ConfigError("num_seeds", f"run {run_id!r} of {n} seeds clashes with the run "
                          f"named {run_id!r}; rename that run")
      ids[run_id] = (name, i)
  return ids


def seeded_run_config(config, run_id: str, ids: dict[str, tuple[str, int]]):
  """The training config of run `run_id` (see `run_ids`): `run_config` of its run with
  the training seeds shifted by its seed index."""
  name, i = ids[run_id]
  cfg = run_config(config, name)
  if i:
    for field in TRAINING_SEED_FIELDS:
      cfg[field] = (cfg.seed if cfg[field] is None else cfg[field]) + i
  return cfg


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
  where the run sets it, else `train.<field>` (shared by every run). `name` may be a run
  id of `run_ids` (`<name>_seed<i>`): the path is that of its run."""
  if name not in config.runs:
    name = run_ids(config)[name][0]
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
  Runs are trained once per seed (`config.num_seeds`, see `run_ids`): the result is keyed
  by run id.
  """
  experiments = {}
  ids = run_ids(config)
  for run_id, (name, _) in ids.items():
    with run_errors(config, name, field_path):
      experiments[run_id] = trainer.build_experiment(seeded_run_config(config, run_id, ids))
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
  for i, (name, exp) in enumerate(experiments.items(), 1):
    logging.getLogger("xsens.studies").info("Run %d/%d: %s (%s)", i, len(experiments), name,
                                            workdirs[name].path)
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
