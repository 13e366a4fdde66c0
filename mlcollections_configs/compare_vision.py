"""Train ViT, the small CNN and an MLP on one dataset and tabulate train/test accuracy.

  xsens --config=mlcollections_configs/compare_vision.py --workdir=workdirs/compare
  xsens --config=mlcollections_configs/compare_vision.py:smoke --workdir=/tmp/compare_smoke

Variants: `smoke` (a few steps of tiny models; what the tests run), `dataset=NAME`.
Each model trains until `target_train_accuracy` or `total_steps`, so the comparison is at
matched train accuracy where the budget allows. Shows: results.md (model, params, steps,
train/test accuracy and loss) in the workdir; on mnist5k all three reach ~0.99 train
accuracy, with test accuracy around 0.95-0.97.
"""

import ml_collections

from mlcollections_configs import common
from mlcollections_configs import train as train_configs
from xsens.config_utils import parse_arg

RUNS = ("vit", "cnn", "mlp")


def get_config(arg=None):
  arg = parse_arg(arg, smoke=False, dataset="mnist5k")
  config = ml_collections.ConfigDict()
  config.study = "compare"
  config.train = common.train_config()
  config.train.data.name = arg.dataset
  config.train.total_steps = 1500
  config.train.target_train_accuracy = 0.99
  config.train.eval_every = 100
  config.train.model = ml_collections.ConfigDict()  # Each run names its model.
  config.num_seeds = 1   # Training seeds per run (xsens.lab.multirun.run_ids).
  config.runs = ml_collections.ConfigDict()
  for name in RUNS:
    config.runs[name] = {"model": common.model_config(**train_configs.MODEL_PRESETS[name])}
  if arg.smoke:
    train_configs.smoke(config.train)
    for name in RUNS:
      config.runs[name].model.update(train_configs.SMOKE_PRESETS[name])
  return config


def validate(config) -> None:
  """Nothing beyond the runs: every field is one of `config.train` or `config.runs`, checked
  with their data and models where the runs are built (`xsens.lab.multirun.validate_runs`)."""
  del config
