"""Sensitivity regularisation and robustness: ViT plain / Gaussian-augmented / regularised,
and a ResNet ("Transformers Learn Low Sensitivity Functions", ICLR 2025, §6.1).

  xsens --config=mlcollections_configs/sensitivity_regularization.py --workdir=workdirs/sens_reg
  xsens --config=mlcollections_configs/sensitivity_regularization.py:smoke --workdir=/tmp/sr
  xsens --config=mlcollections_configs/sensitivity_regularization.py:setup=cifar10 \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/sr_c10

The regulariser is the official code's (docs/papers/sensitivity.md §3): (1−p)·CE + p·MSE(f(x̃),
f(x)), x̃ with N(0, s²) noise on one random 4×4 window, p = 0.5, s = 1 (the paper's values are not
known). The augmentation adds N(0, 0.5²) pixel noise to every training image (σ and rate not known).
Shows: clean and corrupted accuracy per category (noise, blur, weather, digital), mCE vs
the plain ViT, and train-set sensitivity per run. The paper's claim: the regulariser or the
augmentation lowers sensitivity and improves the ViT's robustness on CIFAR-10-C.
"""

import ml_collections

from mlcollections_configs import common
from mlcollections_configs import robustness as robustness_configs
from mlcollections_configs import sensitivity_vision as sensitivity_configs
from mlcollections_configs import train as train_configs
from xsens.config_utils import parse_arg

SETUPS = ("mnist5k", "cifar10")


def get_config(arg=None):
  arg = parse_arg(arg, setup="mnist5k", smoke=False)
  if arg.setup not in SETUPS:
    raise ValueError(f"unknown setup {arg.setup!r}; allowed: {', '.join(SETUPS)}")
  base = sensitivity_configs.get_config(f"setup={arg.setup}")
  config = ml_collections.ConfigDict()
  config.study = "sensitivity_regularization"
  config.train = base.train
  config.sensitivity = base.sensitivity
  config.sensitivity.scattered.enabled = False
  config.robustness = robustness_configs.robustness_config()
  config.robustness.baseline_run = "vit"
  if arg.setup == "mnist5k":
    vit = common.model_config(**train_configs.MODEL_PRESETS["vit"])
    resnet = common.model_config(name="resnet18", width_multiplier=0.125)
  else:
    vit = base.runs.vit.model
    resnet = base.runs.resnet18.model
    config.robustness.num_examples = 5000
  config.num_seeds = 1   # Training seeds per run (xsens.lab.multirun.run_ids).
  config.runs = ml_collections.ConfigDict({
      "vit": {"model": vit},
      "vit_gaussian_aug": {"model": vit, "augment": {"gaussian_std": 0.5}},
      "vit_sensitivity_reg": {"model": vit, "objective": {
          "ce": {"kind": "cross_entropy", "weight": 0.5},
          "penalty": {"kind": "sensitivity", "weight": 0.5, "sigma": 1.0, "patch_size": 4}}},
      "resnet18": {"model": resnet},
  })
  if arg.smoke:
    train_configs.smoke(config.train)
    config.train.target_train_accuracy = None
    config.train.eval_train_examples = None
    for run in config.runs.values():
      run.model.update(train_configs.SMOKE_PRESETS[run.model.name])
    sc = config.sensitivity
    sc.sigmas, sc.main_sigma, sc.num_draws = (4.0,), 4.0, 1
    sc.num_examples, sc.batch_size, sc.patch_size = 32, 32, 7
    rc = config.robustness
    rc.num_examples, rc.batch_size = 64, 32
    rc.corruptions.names = ("gaussian_noise", "defocus_blur", "fog", "contrast")
    rc.corruptions.severities = (1, 5)
  return config


def validate(config) -> None:
  """ConfigError for a bad field of `config.robustness` or `config.sensitivity` (their
  config files' block checks); the runs, the patch sizes against them and
  `robustness.baseline_run` are checked by the study."""
  robustness_configs.validate_robustness(config.robustness)
  sensitivity_configs.validate_sensitivity(config.sensitivity)
