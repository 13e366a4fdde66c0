"""Studies: the unit a user runs. `run(config, workdir)` dispatches on `config.study`."""

from __future__ import annotations

import importlib

from xsens.errors import ConfigError, require_finite

# Study name -> module (imported lazily: a study pulls only what it uses).
STUDIES = {
    "train": "xsens.studies.train_one",
    "compare": "xsens.studies.compare",
    "sensitivity_vision": "xsens.studies.sensitivity_vision",
    # `sensitivity_vision.py:setup=imagenet`: pretrained models, nothing trained.
    "sensitivity_imagenet": "xsens.studies.sensitivity_imagenet",
    "robustness": "xsens.studies.robustness",
    "sensitivity_regularization": "xsens.studies.sensitivity_regularization",
    "benign_overfitting": "xsens.studies.benign_overfitting",
    "reuse": "xsens.studies.reuse",
    "distillation": "xsens.studies.distillation",
    "churn": "xsens.studies.churn",
    "sensitivity_language": "xsens.studies.sensitivity_language",
    "grokking": "xsens.studies.grokking",
    "synthetic_sensitivity": "xsens.studies.synthetic_sensitivity",
    "attention_eigen": "xsens.studies.attention_eigen",
    # `attention_eigen.py:setup=imagenet`: pretrained ViT-B/16, nothing trained.
    "attention_eigen_imagenet": "xsens.studies.attention_eigen_imagenet",
    "position_encoding": "xsens.studies.position_encoding",
    "modify_memories": "xsens.studies.modify_memories",
    "verification": "xsens.studies.verification",
    "label_shift": "xsens.studies.label_shift",
}
# (study, config section) -> module: a config of that study holding that section runs the
# module instead (`robustness.py:imagenet` keeps study "robustness" and evaluates
# pretrained checkpoints on streamed ImageNet).
STUDY_SETUPS = {("robustness", "imagenet"): "xsens.studies.robustness_imagenet"}


def module_name(config) -> str:
  """The module that runs `config`: `STUDIES[config.study]`, or its `STUDY_SETUPS` entry."""
  name = config.get("study")
  for (study, section), module in STUDY_SETUPS.items():
    if name == study and section in config:
      return module
  return STUDIES[name]


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Runs the study named by `config.study` in `workdir` and returns its results.

  A NaN or infinite float anywhere in `config` is refused first (ConfigError naming its
  path), whatever the study: no field of any study means anything by one. A workdir
  holding another study's results is refused next (ConfigError naming `workdir`), or with
  `overwrite` emptied of them; `workdir/study.json` records the study
  (`xsens.train.study_record`).
  """
  # pylint: disable=g-import-not-at-top  (JAX loads only once a study runs)
  from xsens.train import sharding, study_record
  name = config.get("study")
  if name not in STUDIES:
    raise ConfigError("study", f"unknown study {name!r}; allowed: {', '.join(sorted(STUDIES))}")
  require_finite(config)
  sharding.maybe_initialize_distributed()  # Before the record asks for the process index.
  claim = study_record.claim(workdir, name, overwrite=overwrite)
  try:
    return importlib.import_module(module_name(config)).run(config, workdir,
                                                            overwrite=overwrite)
  except BaseException:
    claim.release_if_unused()
    raise
