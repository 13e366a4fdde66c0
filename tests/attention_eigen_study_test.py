"""Smoke runs of the `attention_eigen` study (mlcollections_configs/attention_eigen.py);
set-up `imagenet` on `tfds.testing.mock_data` ImageNet with tiny vit_jax-layout `.npz`
checkpoints (tests/pretrained_test.py), no network, no real weights."""

import json

import numpy as np
import pytest
import tensorflow_datasets as tfds

from mlcollections_configs import attention_eigen as ae_config
from tests.pretrained_test import fake_vit_checkpoint
from xsens import studies
from xsens.errors import ConfigError
from xsens.lab import pretrained_runs
from xsens.studies import attention_eigen_imagenet as ae_imagenet


@pytest.mark.slow
def test_smoke_study_writes_report(tmp_path):
  config = ae_config.get_config("smoke")
  out = studies.run(config, str(tmp_path))
  t = out["num_tokens"]
  assert t == 17                                  # 28×28 with patch 7: 16 patches + CLS
  rows = out["rows"]
  assert [r["layer"] for r in rows] == [0, 1]
  for r in rows:
    assert 1 <= r["row_dim"] <= t and 1 <= r["matrix_dim"] <= t * t
    for key in ("overlap_heads", "overlap_random_init", "overlap_random_subspace"):
      assert 0.0 <= r[key] <= 1.0 + 1e-6, key
  over = out["overlap"]
  assert over["init_layers"].shape == (2, 2) and over["seed_layers"] is None   # 1 seed
  np.testing.assert_allclose(np.diag(over["layers"]), 1.0, atol=1e-5)
  k = config.eigen.overlap_rank
  assert abs(np.mean([r["overlap_random_subspace"] for r in rows]) - k / t) < 0.08
  # All T keys computed: the reconstruction is exact and the frozen model unchanged.
  for r in out["reconstruction"]:
    if r["m"] == t:
      assert r["score_mse"] < 1e-8 and r["tv"] < 1e-6, r
  full = [r for r in out["frozen_accuracy"] if r["m"] == t]
  assert full and all(abs(r["accuracy"] - r["full_accuracy"]) < 0.01 for r in full)
  trained = {r["run"]: r for r in out["trained"]}
  assert set(trained) == {"vit", "eigen_m6"}
  for name, r in trained.items():
    for key in ("fwd_gflops", "attn_gflops", "peak_temp_mb", "step_ms", "test_accuracy"):
      assert np.isfinite(r[key]) and r[key] >= 0, (name, key)
  md = (tmp_path / "results.md").read_text()
  assert "Eigen-analysis of attention on mnist5k" in md and "Trained with the approx" in md
  for plot in ("explained_variance.png", "overlap.png", "reconstruction.png",
               "accuracy_vs_keys.png"):
    assert (tmp_path / plot).exists() and plot in md
  payload = json.loads((tmp_path / "results.json").read_text())
  assert len(payload["explained_variance_rows"]) == 2


@pytest.mark.slow
def test_language_smoke_runs_the_text_encoder(tmp_path):
  out = studies.run(ae_config.get_config("setup=language,smoke"), str(tmp_path))
  assert out["frozen_accuracy"] == [] and out["trained"] == []
  assert len(out["rows"]) == 1 and out["reconstruction"]
  assert (tmp_path / "explained_variance.png").exists()


@pytest.mark.parametrize("field, value, path", [
    ("key_counts", (4, 18), "eigen.key_counts"),       # m > T = 17
    ("ranks", (5,), "eigen.ranks"),                   # k > m = 4
    ("subset_rules", ("every_other",), "eigen.subset_rules"),
    ("levels", (), "eigen.levels"),                   # max() of none, after training
    ("levels", ("high",), "eigen.levels"),
])
def test_bad_eigen_config_is_refused_before_training(tmp_path, field, value, path):
  config = ae_config.get_config("smoke")
  config.eigen[field] = value
  with pytest.raises(ConfigError) as e:
    studies.run(config, str(tmp_path))
  assert e.value.field == path
  assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("arg", ["", "setup=cifar10", "setup=language", "setup=imagenet"])
def test_configs_validate(arg):
  config = ae_config.get_config(arg)
  assert config.eigen.analysed_run in config.runs
  assert max(config.eigen.ranks) <= min(config.eigen.key_counts)


def _imagenet_config(tmp_path, compare: bool):
  """Smoke imagenet config on fake checkpoints (patch 4: T = 8² + 1 = 65 at 32²)."""
  config = ae_config.get_config("setup=imagenet,smoke")
  config.imagenet.data_dir = str(tmp_path / "tfds")
  for seed, run in enumerate(("vit_b16", "vit_b16_compare")[:1 + compare]):
    np.savez(tmp_path / f"{run}.npz", **fake_vit_checkpoint(seed=seed, num_classes=1000))
    config.runs[run].pretrained.path = str(tmp_path / f"{run}.npz")
  config.eigen.key_counts = (4, 65)
  config.eigen.matrix_tokens = 8    # 64-dim matrices (T² = 4225 would need large eighs)
  return config


@pytest.mark.slow
def test_imagenet_setup_on_mock_data_and_fake_checkpoints(tmp_path):
  config = _imagenet_config(tmp_path, compare=True)
  with tfds.testing.mock_data(num_examples=8, policy=tfds.testing.MockPolicy.USE_CODE):
    out = studies.run(config, str(tmp_path / "wd"))
    images, labels, _ = ae_imagenet.read_images(config.imagenet, 8, 4)
  assert out["num_tokens"] == 65 and out["models"] == ["vit_b16", "vit_b16_compare"]
  # Top-1 of the plain checkpoint on the second half of the streamed images (the first
  # half gives the statistics).
  loaded = pretrained_runs.load_run(
      "vit_b16", config.runs.vit_b16, (32, 32, 3), 1000)
  pred = np.asarray(loaded.model.apply(loaded.variables, images[4:8], train=False)).argmax(-1)
  assert out["top1"]["vit_b16"] == pytest.approx(float((pred == labels[4:8]).mean()))
  over = out["overlap"]
  assert over["seeds"].shape == (1, 2)                  # across the two models, per layer
  assert over["init_layers"].shape == (2, 2)
  for r in out["reconstruction"]:
    if r["m"] == 65:                                    # all keys: exact
      assert r["score_mse"] < 1e-8 and r["tv"] < 1e-6, r
  full = [r for r in out["frozen_accuracy"] if r["m"] == 65]
  assert full and all(abs(r["accuracy"] - r["full_accuracy"]) < 1e-6 for r in full)
  assert out["trained"] == []
  md = (tmp_path / "wd" / "results.md").read_text()
  assert "pretrained vit_b16, vit_b16_compare on imagenet2012" in md
  assert "overlap_seeds" in md


def test_imagenet_missing_checkpoint_or_data_is_one_line(tmp_path):
  config = ae_config.get_config("setup=imagenet,smoke")
  with pytest.raises(ConfigError) as e:
    studies.run(config, str(tmp_path))
  assert e.value.flag == "--config.runs.vit_b16.pretrained.path"
  assert "\n" not in str(e.value)
  config.runs.vit_b16.pretrained.path = str(tmp_path / "nope.npz")
  with pytest.raises(ConfigError, match="no checkpoint file"):
    studies.run(config, str(tmp_path))
  # The unset `vit_b16_compare` is skipped; no ImageNet in the data_dir is the next error.
  config = _imagenet_config(tmp_path, compare=False)
  with pytest.raises(ConfigError) as e:
    studies.run(config, str(tmp_path / "wd"))
  assert e.value.flag == "--config.imagenet.data_dir" and "\n" not in str(e.value)
