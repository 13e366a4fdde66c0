"""The sensitivity_vision study (main job) end to end, its bad inputs, and its set-ups."""

import json
import math
import os

import pytest
import tensorflow_datasets as tfds

from mlcollections_configs import sensitivity_vision as sv_cfg
from tests.helpers import snapshot
from xsens import studies
from xsens.data import pipeline
from xsens.errors import ConfigError
from xsens.studies import compare


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("sv"))
  out = studies.run(sv_cfg.get_config("smoke"), workdir)
  return workdir, out


@pytest.mark.slow
def test_smoke_study_writes_table_and_plots(smoke_run):
  workdir, out = smoke_run
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  runs = [r["run"] for r in results["rows"]]
  assert sorted(runs) == ["cnn", "mlp_relu", "mlp_tanh", "resnet18", "vit"]
  for row in results["rows"]:
    for sigma in (1.0, 4.0):
      s, se = row[f"S(σ={sigma:g})"], row[f"s.e.(σ={sigma:g})"]
      assert 0.0 <= s <= 1.0 and se >= 0.0 and math.isfinite(se)
    assert 0.0 <= row["S_scattered"] <= 1.0
    # 28x28 images, 7x7 patches: a 4x4 map of flip probabilities.
    patch_map = results["per_patch_maps"][row["run"]]
    assert len(patch_map) == 4 and len(patch_map[0]) == 4
    assert abs(sum(map(sum, patch_map)) / 16 - row["S(σ=4)"]) < 1e-5
  for plot in ("sensitivity_bar.png", "sensitivity_vs_sigma.png", "sensitivity_patches.png"):
    assert os.path.getsize(os.path.join(workdir, plot)) > 1000
  md = open(os.path.join(workdir, "results.md")).read()
  assert "Ordering at σ=4" in md and "| vit |" in md
  for run in runs:
    assert os.path.isdir(os.path.join(compare.run_workdir(workdir, run), "checkpoints"))


@pytest.mark.slow
def test_more_noise_flips_more(smoke_run):
  """Averaged over models, sensitivity grows with σ (same draws: common random numbers)."""
  _, out = smoke_run
  low = sum(m["sigmas"][1.0][0] for m in out["measured"].values())
  high = sum(m["sigmas"][4.0][0] for m in out["measured"].values())
  assert high > low


@pytest.mark.slow
def test_rerun_resumes_without_training(smoke_run):
  workdir, out = smoke_run
  again = studies.run(sv_cfg.get_config("smoke"), workdir)
  assert [r["steps"] for r in again["rows"]] == [r["steps"] for r in out["rows"]]
  # Same trained weights and same keys: the same measurements.
  timing = ("wall_s", "measure_s")
  assert ([{k: v for k, v in r.items() if k not in timing} for r in again["rows"]] ==
          [{k: v for k, v in r.items() if k not in timing} for r in out["rows"]])


@pytest.mark.parametrize("field,value", [
    ("patch_size", 5), ("main_sigma", 0.3), ("num_draws", 0), ("sigmas", [-1.0]),
    ("num_examples", 0)])
def test_bad_sensitivity_settings_refused_before_training(tmp_path, field, value):
  config = sv_cfg.get_config("smoke")
  config.sensitivity[field] = value
  if field == "sigmas":
    config.sensitivity.main_sigma = -1.0
  with pytest.raises(ConfigError, match=f"config.sensitivity.{field}"):
    studies.run(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


def test_bad_run_model_names_the_run(tmp_path):
  config = sv_cfg.get_config("smoke")
  config.runs.vit.model.patch_size = 5
  with pytest.raises(ConfigError, match=r"config.runs.vit.model.patch_size: 5 must divide"):
    studies.run(config, str(tmp_path / "wd"))
  assert snapshot(str(tmp_path)) == {}


@pytest.mark.parametrize("setup", ["cifar10", "svhn", "fashion_mnist", "mnist_binary"])
def test_paper_setups_build_on_their_tfds_datasets(setup):
  """The paper-sized set-ups validate against (mock) TFDS data of the right shapes."""
  config = sv_cfg.get_config(f"setup={setup}")
  config.train.batch_size = 32  # Mock splits are small (and binary MNIST keeps ~1/5).
  pipeline.clear_cache()
  try:
    with tfds.testing.mock_data(num_examples=300, policy=tfds.testing.MockPolicy.USE_CODE):
      experiments = compare.validate_runs(config)
  finally:
    pipeline.clear_cache()
  expected = {"cifar10": {"resnet18", "densenet", "convmixer", "vit", "simple_vit"},
              "svhn": {"resnet18", "vit"}, "fashion_mnist": {"vit", "cnn", "mlp_relu",
                                                             "mlp_tanh"},
              "mnist_binary": {"vit", "mlp_relu"}}[setup]
  assert set(experiments) == expected
  exp = next(iter(experiments.values()))
  assert exp.train.image_shape == ((32, 32, 3) if setup in ("cifar10", "svhn") else
                                   (28, 28, 1))
  assert exp.train.num_classes == (2 if setup == "mnist_binary" else 10)


def test_paper_setup_without_data_is_a_clear_error(tmp_path):
  config = sv_cfg.get_config("setup=cifar10")
  config.train.data.data_dir = str(tmp_path)
  with pytest.raises(ConfigError, match=r"config.train.data.name: .*cifar10.*not found"):
    studies.run(config, str(tmp_path / "wd"))
