"""Every config file: a docstring with its run command, and a CPU `smoke` variant that runs."""

import glob
import importlib
import os

import pytest

from tests.helpers import REPO
from xsens import studies
from xsens.train import workdir as workdir_lib
from xsens.train.metrics import read_metrics

CONFIG_DIR = os.path.join(REPO, "mlcollections_configs")
HELPERS = {"__init__", "common"}
# Config name -> workdirs (relative to the study workdir) whose smoke run must hold a
# checkpoint and metrics. sensitivity_vision's smoke run is tested in its own file.
SMOKE_RUNS = {
    "train": ["."],
    "compare_vision": ["runs/vit", "runs/cnn", "runs/mlp"],
}
TESTED_ELSEWHERE = {"sensitivity_vision": "tests/sensitivity_vision_test.py",
                    "benign_overfitting": "tests/benign_overfitting_test.py",
                    "robustness": "tests/robustness_study_test.py",
                    "sensitivity_regularization": "tests/robustness_study_test.py",
                    "reuse": "tests/reuse_study_test.py",
                    "distillation": "tests/distillation_study_test.py",
                    "churn": "tests/distillation_study_test.py",
                    "sensitivity_language": "tests/sensitivity_language_test.py",
                    "grokking": "tests/grokking_test.py",
                    "synthetic_sensitivity": "tests/synthetic_sensitivity_test.py",
                    "vit_finetune_imagenet": "tests/finetune_configs_test.py",
                    "vit_cifar10": "tests/finetune_configs_test.py",
                    "attention_eigen": "tests/attention_eigen_study_test.py",
                    "position_encoding": "tests/position_encoding_study_test.py",
                    "modify_memories": "tests/modify_memories_study_test.py",
                    "verification": "tests/verification_study_test.py",
                    "label_shift": "tests/label_shift_study_test.py"}


def config_names():
  names = [os.path.splitext(os.path.basename(p))[0] for p in glob.glob(f"{CONFIG_DIR}/*.py")]
  return sorted(n for n in names if n not in HELPERS)


def test_every_config_is_tested():
  assert set(config_names()) == set(SMOKE_RUNS) | set(TESTED_ELSEWHERE)


@pytest.mark.parametrize("name", config_names())
def test_docstring_has_run_command_and_smoke_variant(name):
  module = importlib.import_module(f"mlcollections_configs.{name}")
  assert f"--config=mlcollections_configs/{name}.py" in module.__doc__
  config = module.get_config("smoke")
  assert config.study in studies.STUDIES
  with pytest.raises(ValueError, match="unknown config variant 'bogus'"):
    module.get_config("bogus")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMOKE_RUNS))
def test_smoke_variant_trains_and_writes_checkpoint_and_metrics(tmp_path, name):
  config = importlib.import_module(f"mlcollections_configs.{name}").get_config("smoke")
  out = studies.run(config, str(tmp_path))
  assert out["rows"] and all(r["steps"] > 0 for r in out["rows"])
  assert os.path.exists(tmp_path / "results.md")
  if name == "train":  # The plots the CLI's last line announces.
    assert (tmp_path / "training_curves.png").exists()
    assert "![training_curves](training_curves.png)" in (tmp_path / "results.md").read_text()
  for sub in SMOKE_RUNS[name]:
    workdir = os.path.join(tmp_path, sub)
    assert workdir_lib.Workdir(workdir).latest_step() == config.train.total_steps
    assert any("train/loss" in r for r in read_metrics(workdir))
