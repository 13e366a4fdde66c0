"""The `label_shift` study end to end (smoke), and its CIFAR-100-LT set-up on mock TFDS data."""

import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from mlcollections_configs import label_shift as ls_cfg
from xsens import studies
from xsens.data import pipeline
from xsens.errors import ConfigError
from xsens.lab import multirun
from xsens.measures import label_shift
from xsens.studies import label_shift as ls_study
from xsens.train import trainer

METHODS = ("erm", "balanced", "agnostic", "fixed", "logit_adjust", "oracle", "dro")


@pytest.mark.slow
def test_smoke_study_end_to_end(tmp_path):
  config = ls_cfg.get_config("smoke")
  out = studies.run(config, str(tmp_path))
  assert sorted(r["run"] for r in out["rows"]) == sorted(METHODS)
  for name in ("results.md", "results.json", "accuracy_vs_kl.png", "worst_case.png",
               "dro_prior.png"):
    assert os.path.exists(tmp_path / name), name
  saved = json.loads((tmp_path / "results.json").read_text())
  p = np.asarray(saved["p_train"])
  assert p.sum() == pytest.approx(1.0) and (np.diff(p) <= 0).all()   # Long-tailed, head 0.
  for name, ev in out["evals"].items():
    acc = np.asarray(ev["per_class_accuracy"])
    # Accuracy under a prior is its average of the per-class accuracies.
    assert ev["accuracy"][0] == pytest.approx(float(p @ acc), abs=1e-5)
    worst = [ev["worst"][float(r)]["accuracy"] for r in config.label_shift.radii]
    assert all(a >= b - 1e-6 for a, b in zip(worst, worst[1:]))   # Larger ball, worse case.
    assert worst[-1] >= acc.min() - 1e-6
  for name in ("dro", "agnostic"):   # The DRO runs' final π: in the simplex and the ball.
    pi = np.asarray(out["dro_pi"][name])
    assert pi.sum() == pytest.approx(1.0, abs=1e-5)
  kl = float(label_shift.kl_divergence(np.asarray(out["dro_pi"]["dro"], np.float32),
                                       np.asarray(p, np.float32)))
  assert kl <= 0.1 + 1e-3   # Mean of in-ball π (the ball is convex); p moved a little.


def test_cifar100_lt_reads_a_data_dir_or_says_it_is_missing(tmp_path):
  config = ls_cfg.get_config("setup=cifar100_lt,smoke")
  dc = config.train.data
  dc.data_dir = str(tmp_path / "empty")
  with pytest.raises(ConfigError) as e:
    ls_study.validate(config) or trainer.build_experiment(
        multirun.seeded_run_config(config, "dro", multirun.run_ids(config)))
  assert e.value.field.startswith("data") and "\n" not in str(e.value)
  try:
    with tfds.testing.mock_data(num_examples=200, policy=tfds.testing.MockPolicy.USE_CODE):
      ids = multirun.run_ids(config)
      exp = trainer.build_experiment(multirun.seeded_run_config(config, "erm", ids))
      with pytest.raises(ConfigError) as e:   # 200 mock examples leave tail classes empty.
        trainer.build_experiment(multirun.seeded_run_config(config, "dro", ids))
  finally:
    pipeline.clear_cache()
  assert exp.train.num_classes == 100 and exp.train.input_shape == (32, 32, 3)
  assert len(exp.train) < 200   # The long tail subsampled the mock training split.
  assert e.value.field == "objective.task.kind" and "have no example" in e.value.message
  assert "\n" not in str(e.value)


def test_headline_tilt_must_be_the_oracle_s_tilt():
  config = ls_cfg.get_config("smoke")
  ls_study.validate(config)
  config.label_shift.headline_tilt = -0.5        # the oracle still trains for λ = −1
  with pytest.raises(ConfigError) as e:
    ls_study.validate(config)
  assert e.value.field == "label_shift.headline_tilt" and "\n" not in str(e.value)
  config.runs.oracle.objective.task.tilt = -0.5
  ls_study.validate(config)
