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
    assert r["steps"] == config.train.total_steps and r["reached_target"] == 0
    assert r["curve"][-1]["step"] == r["steps"]
    assert r["curve"][-1]["test_accuracy"] == pytest.approx(r["test_accuracy"])
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


def _write_evals(path, accuracies: dict) -> str:
  path.mkdir()
  lines = [{"step": s, "train/loss": 0.1} for s in accuracies]
  lines += [{"step": s, "eval/train_accuracy": 1.0, "eval/test_accuracy": a}
            for s, a in accuracies.items()]
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
  return str(path)


def test_accuracy_curve_is_over_the_steps_every_seed_reached(tmp_path):
  from xsens.studies.attention_eigen import accuracy_curve
  seeds = [_write_evals(tmp_path / "s0", {100: 0.5, 200: 0.7, 300: 0.9}),
           _write_evals(tmp_path / "s1", {100: 0.7, 200: 0.9})]   # stopped at 200
  curve = accuracy_curve(seeds)
  assert [c["step"] for c in curve] == [100, 200]
  np.testing.assert_allclose([c["test_accuracy"] for c in curve], [0.6, 0.8])
  np.testing.assert_allclose([c["test_accuracy s.e."] for c in curve], [0.1, 0.1])


def test_equal_step_rows_compare_runs_where_both_trained():
  from xsens.report.eigen_report import equal_step_rows
  curve = lambda accs: [{"step": s, "test_accuracy": a, "test_accuracy s.e.": 0.01}
                        for s, a in accs.items()]
  rows = equal_step_rows([{"run": "vit", "curve": curve({100: 0.3, 200: 0.5, 300: 0.8})},
                          {"run": "eigen", "curve": curve({100: 0.6, 200: 0.9})}])
  assert [r["step"] for r in rows] == [100, 200]
  assert rows[1]["vit test_accuracy"] == 0.5 and rows[1]["eigen test_accuracy"] == 0.9


def test_target_variant_trains_every_run_to_one_rule():
  config = ae_config.get_config("target=0.99")
  c = config.train
  assert c.target_train_accuracy == 0.99 and c.total_steps == ae_config.TARGET_MAX_STEPS
  assert c.eval_every == ae_config.TARGET_EVAL_EVERY
  assert c.eval_train_examples == ae_config.TARGET_EVAL_TRAIN_EXAMPLES
  assert set(config.runs) == {"vit", "eigen_m10"}    # no run overrides the rule
  assert all("target_train_accuracy" not in r and "total_steps" not in r
             for r in config.runs.values())
  assert ae_config.get_config("target=0.9,steps=500").train.total_steps == 500
  assert ae_config.get_config(None).train.target_train_accuracy is None
  with pytest.raises(ValueError, match="target=1.5"):
    ae_config.get_config("target=1.5")
  control = ae_config.get_config("random_basis").runs
  assert set(control) == {"vit", "eigen_m10", "eigen_m10_random_basis"}
  assert control.eigen_m10_random_basis.model.basis_init == "random"
  assert control.eigen_m10.model.to_dict() == {
      **control.eigen_m10_random_basis.model.to_dict(), "basis_init": "dct"}
