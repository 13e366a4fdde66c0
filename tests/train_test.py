"""End-to-end tests of the trainer: smoke runs, exact resume, bad input, divergence."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from mlcollections_configs import train as train_cfg
from tests.helpers import REPO, run_cli, snapshot
from xsens import studies
from xsens.errors import ConfigError
from xsens.train import loop
from xsens.train import workdir as workdir_lib
from xsens.train import trainer
from xsens.train.metrics import read_metrics


def smoke_train(model="vit", **overrides):
  """The `train.py:smoke` training block with `overrides` (dotted keys allowed)."""
  config = train_cfg.get_config(f"model={model},smoke").train
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


@pytest.mark.slow
@pytest.mark.parametrize("model", ["vit", "cnn", "mlp", "resnet18", "densenet", "convmixer"])
def test_every_model_trains_and_writes_checkpoint_and_metrics(tmp_path, model):
  # The smoke block on a quarter of the test split (a large share of the run is the eval
  # forwards, compiled unoptimised); the CLI test below runs the smoke config as it is.
  result = trainer.train_and_evaluate(smoke_train(model, **{"data.test_split": "test[:256]"}),
                                      str(tmp_path))
  assert result.summary["steps"] == 4
  assert result.summary["stop_reason"] == "max_steps"
  assert workdir_lib.Workdir(str(tmp_path)).latest_step() == 4
  records = read_metrics(str(tmp_path))
  assert [r["step"] for r in records if "train/loss" in r] == [2, 4]
  assert [r["step"] for r in records if "eval/test_accuracy" in r] == [2, 4]
  assert all(np.isfinite(r["train/loss"]) for r in records if "train/loss" in r)
  assert os.listdir(tmp_path / "tb")
  assert 0.0 <= result.summary["test_accuracy"] <= 1.0


@pytest.mark.slow
def test_training_learns_mnist5k(tmp_path):
  """A small CNN beats chance by far in 100 steps: the whole path computes something real."""
  config = smoke_train("cnn", total_steps=100, eval_every=0, checkpoint_every=0,
                       **{"data.num_train": None, "optimizer.learning_rate": 3e-3})
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.summary["test_accuracy"] > 0.7


@pytest.mark.slow
def test_stops_at_target_train_accuracy(tmp_path):
  config = smoke_train("mlp", total_steps=200, eval_every=5, target_train_accuracy=0.5,
                       **{"optimizer.learning_rate": 3e-3})
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.summary["stop_reason"] == "target_train_accuracy"
  assert result.summary["steps"] < 200 and result.summary["steps"] % 5 == 0
  assert result.summary["train_accuracy"] >= 0.5
  # Rerunning a finished run trains no more.
  again = trainer.train_and_evaluate(config, str(tmp_path))
  assert again.summary["steps"] == result.summary["steps"]


def test_total_epochs_resolves_to_steps(tmp_path):
  config = smoke_train("mlp", total_steps=None, total_epochs=0.5)
  exp = trainer.build_experiment(config)
  assert exp.total_steps == 4  # 256 examples / 32 per batch = 8 steps per epoch.


_KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import jax
    jax.config.update("jax_disable_most_optimizations", True)
    from tests.train_test import RESUME_OVERRIDES, smoke_train
    from xsens.train import trainer
    from xsens.train.workdir import Workdir
    original = Workdir.save
    def save_then_die(self, step, state):
      original(self, step, state)
      self.manager.wait_until_finished()
      if step == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    Workdir.save = save_then_die
    trainer.train_and_evaluate(smoke_train("resnet18", **RESUME_OVERRIDES), sys.argv[1])
""")
# A quarter of the test split: a large share of the run is the eval forwards, compiled
# unoptimised (fast compiles).
RESUME_OVERRIDES = {"total_steps": 10, "data.test_split": "test[:256]"}


@pytest.mark.slow
def test_resume_after_kill_is_bit_equal(tmp_path):
  """Killed (SIGKILL) right after the step-4 checkpoint, rerun: same params as one run."""
  killed, straight = str(tmp_path / "killed"), str(tmp_path / "straight")
  proc = subprocess.run([sys.executable, "-c", _KILL_SCRIPT, killed], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == -9, proc.stderr[-2000:]
  assert workdir_lib.Workdir(killed).latest_step() == 4
  config = smoke_train("resnet18", **RESUME_OVERRIDES)
  resumed = trainer.train_and_evaluate(config, killed)
  reference = trainer.train_and_evaluate(config, straight)
  assert resumed.summary["steps"] == reference.summary["steps"] == 10
  for a, b in zip(jax.tree.leaves(resumed.variables), jax.tree.leaves(reference.variables)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  steps = [r["step"] for r in read_metrics(killed) if "train/loss" in r]
  assert steps == sorted(set(steps))  # no duplicated records after the resume


BAD_INPUTS = [
    ({"model.name": "transformer9000"}, "model.name"),
    ({"model.patch_size": 5}, "model.patch_size"),
    ({"data.name": "not_a_dataset_xyz"}, "data.name"),
    ({"optimizer.name": "adamax9"}, "optimizer.name"),
    ({"loss": "hinge_of_doom"}, "loss"),
    ({"optimizer.learning_rate": 0.0}, "optimizer.learning_rate"),
    ({"optimizer.learning_rate": -1.0}, "optimizer.learning_rate"),
    ({"total_steps": 0}, "total_steps"),
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 100000}, "batch_size"),
]


@pytest.mark.parametrize("overrides,field", BAD_INPUTS)
def test_bad_input_is_refused_before_writing(tmp_path, overrides, field):
  workdir = tmp_path / "wd"
  config = smoke_train("vit", **overrides)
  with pytest.raises(ConfigError, match=f"config.{field}"):
    trainer.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


def test_batch_not_divisible_by_devices(monkeypatch, tmp_path):
  monkeypatch.setattr(jax, "device_count", lambda: 8)
  with pytest.raises(ConfigError, match="config.batch_size: 36 is not divisible by the "
                     "device count 8"):
    trainer.validate_config(smoke_train("vit", batch_size=36))


@pytest.mark.slow
def test_workdir_of_another_config_is_refused_unless_overwrite(tmp_path):
  workdir = str(tmp_path)
  trainer.train_and_evaluate(smoke_train("mlp"), workdir)
  before = snapshot(workdir)
  other = smoke_train("mlp", **{"optimizer.learning_rate": 0.5})
  with pytest.raises(ConfigError, match=r"config.workdir: .*different config.*"
                     r"optimizer.learning_rate"):
    trainer.train_and_evaluate(other, workdir)
  assert snapshot(workdir) == before
  result = trainer.train_and_evaluate(other, workdir, overwrite=True)
  assert result.summary["steps"] == 4
  with open(os.path.join(workdir, workdir_lib.CONFIG_FILE)) as f:
    assert json.load(f)["optimizer"]["learning_rate"] == 0.5


def test_diverging_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  # Warm-up from lr 0 to 1e30: step 1 is harmless (lr 0), step 2 blows the weights up.
  config = smoke_train("mlp", total_steps=10, checkpoint_every=1, log_every=1, **{
      "optimizer.name": "sgd", "optimizer.learning_rate": 1e30,
      "optimizer.warmup_steps": 10})
  with pytest.raises(loop.TrainingDivergedError, match="last good checkpoint .step 1."):
    trainer.train_and_evaluate(config, str(tmp_path))
  assert workdir_lib.Workdir(str(tmp_path)).latest_step() == 1


@pytest.mark.slow
def test_cli_bad_input_exits_2_with_one_line(tmp_path):
  workdir = tmp_path / "cli"
  proc = run_cli("--config=mlcollections_configs/train.py:smoke",
                 "--config.train.model.patch_size=5", f"--workdir={workdir}")
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "xsens: error: --config.train.model.patch_size: 5 must divide")
  assert not workdir.exists()


@pytest.mark.slow
def test_cli_smoke_run_writes_report(tmp_path):
  proc = run_cli("--config=mlcollections_configs/train.py:model=cnn,smoke",
                 f"--workdir={tmp_path}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Results in" in proc.stdout
  with open(tmp_path / "results.json") as f:
    rows = json.load(f)["rows"]
  assert rows[0]["model"] == "cnn" and rows[0]["steps"] == 4


def test_unknown_study_is_refused(tmp_path):
  config = train_cfg.get_config("smoke")
  config.study = "nope"
  with pytest.raises(ConfigError, match="config.study: unknown study 'nope'"):
    studies.run(config, str(tmp_path))
