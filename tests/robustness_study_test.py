"""The robustness and sensitivity-regularisation studies end to end, and their bad inputs."""

import json
import os

import numpy as np
import pytest

import types

import jax.numpy as jnp
import tensorflow_datasets as tfds

from mlcollections_configs import robustness as rob_cfg
from mlcollections_configs import sensitivity_regularization as sr_cfg
from xsens import studies
from xsens.data import corrupted
from xsens.data import pipeline
from xsens.errors import ConfigError
from xsens.lab import corruptions as lab_corruptions
from xsens.lab import robustness as lab_robustness
from xsens.studies import robustness
from xsens.train.metrics import read_metrics


@pytest.fixture(scope="module")
def robustness_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("rob"))
  return workdir, studies.run(rob_cfg.get_config("smoke"), workdir)


@pytest.mark.slow
def test_robustness_report(robustness_run):
  workdir, out = robustness_run
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  rows = {r["run"]: r for r in results["rows"]}
  assert set(rows) == {"vit", "resnet18"}
  assert rows["resnet18"]["mCE"] == pytest.approx(1.0)  # The baseline's own mCE.
  for row in rows.values():
    for key in ("test_accuracy", "mCA", "acc_noise", "acc_blur", "acc_weather",
                "acc_digital", "FGSM@0.05", "PGD@0.05", "low_freq_share",
                "worst_removal_acc", "sharpness_flip"):
      assert 0.0 <= row[key] <= 1.0, key
    assert row["PGD@0.05"] <= row["test_accuracy"] + 1e-9
  for name, energy in results["patch_energy"].items():
    assert np.asarray(energy).shape == (4, 4)  # 28x28 on the 7-pixel grid.
    assert np.sum(energy) == pytest.approx(1.0, abs=1e-4)
  removal = results["layer_removal"]["vit"]["accuracy"]
  assert set(removal) == {f"{l}:{p}" for l in range(2) for p in ("block", "attention", "mlp")}
  assert len(results["layer_removal"]["resnet18"]["accuracy"]) >= 1
  cka = np.asarray(results["cka"]["vit"])
  np.testing.assert_allclose(np.diag(cka), 1.0, atol=1e-4)
  assert results["layers"]["vit"] == ["encoderblock_0", "encoderblock_1"]
  assert set(results["adversarial"]["transfer"]) == {"vit->resnet18", "resnet18->vit"}
  for plot in ("corruption_severity.png", "adversarial_epsilon.png", "cka_layers.png",
               "perturbation_patch_energy.png", "layer_removal_vit.png", "linear_probes.png"):
    assert os.path.getsize(os.path.join(workdir, plot)) > 1000
  # mnist5k has no pre-computed corruptions: synthesised, and the report says so.
  assert results["corruption_source"] == "synthesize"
  assert "synthesised from the clean test images" in out["markdown"]
  assert results["data_scale"] == {}  # One training-set size per model.


@pytest.mark.slow
def test_data_scale_sweep_smoke(robustness_run, tmp_path):
  """`:scale,smoke` with two training seeds: the ResNet from scratch on 10 and 100 % of the
  (smoke) training split, the measures reported per training-set size as seed means; the
  ViT at one size is measured but not a data-scale group. Runs after `robustness_run`
  (same models and shapes: its compiled programs are cached)."""
  config = rob_cfg.get_config("scale,smoke,seeds=2")
  assert {r for r in config.runs if r.endswith("_30pct")} == {"vit_30pct", "resnet18_30pct"}
  for run in ("vit_30pct", "resnet18_30pct", "vit_10pct"):   # Test time.
    del config.runs[run]
  out = studies.run(config, str(tmp_path))
  sizes = [round(f * rob_cfg.SMOKE_TRAIN) for f in rob_cfg.SCALE_FRACTIONS if f != 0.3]
  rows = {r["run"]: r for r in out["rows"]}
  assert set(rows) == {f"{r}{s}" for r in ("resnet18_10pct", "resnet18_100pct", "vit_100pct")
                       for s in ("", "_seed1")}
  assert [rows[f"resnet18_{p}pct"]["train_examples"] for p in (10, 100)] == sizes
  scale = out["data_scale"]
  assert set(scale) == {"resnet18"}  # The ViT was trained on one size only.
  entry = scale["resnet18"]
  assert entry["train_examples"] == sizes and entry["seeds"] == [2, 2]
  assert entry["runs"] == ["resnet18_10pct", "resnet18_100pct"]
  for i, p in enumerate((10, 100)):
    pair = [rows[f"resnet18_{p}pct{s}"]["PGD@0.05"] for s in ("", "_seed1")]
    assert entry["PGD"][i] == pytest.approx(np.mean(pair))
    assert entry["PGD s.e."][i] == pytest.approx(abs(pair[0] - pair[1]) / 2)
  assert rows["resnet18_100pct"]["mCE"] == pytest.approx(1.0)
  summary = {r["run"]: r for r in out["seed_summary"]}
  assert set(summary) == {"resnet18_10pct", "resnet18_100pct", "vit_100pct"}
  assert summary["vit_100pct"]["seeds"] == 2
  assert summary["vit_100pct"]["mCA"] == pytest.approx(
      np.mean([rows[f"vit_100pct{s}"]["mCA"] for s in ("", "_seed1")]))
  assert "Mean ± standard error over the training seeds" in out["markdown"]
  assert "Data scale (runs grouped by model" in out["markdown"]
  assert os.path.getsize(tmp_path / "data_scale.png") > 1000
  assert out["perturbations"] is None and "cka" not in json.loads(
      (tmp_path / "results.json").read_text())


@pytest.mark.slow
def test_pgd_is_at_least_as_strong_as_fgsm(robustness_run):
  _, out = robustness_run
  for name in out["adversarial"]["pgd"]:
    pgd, fgsm = out["adversarial"]["pgd"][name], out["adversarial"]["fgsm"][name]
    assert all(p <= f + 0.05 for p, f in zip(pgd, fgsm))


@pytest.mark.parametrize("field,value,match", [
    ("robustness.baseline_run", "alexnet", "'alexnet' is not a run"),
    ("robustness.corruptions.names", ["rain"], "unknown \\['rain'\\]"),
    ("robustness.corruptions.severities", [0], "within 1..5"),
    ("robustness.adversarial.epsilons", [0.0], "ε > 0"),
    ("robustness.adversarial.main_epsilon", 0.3, "must be one of"),
    ("train.data.normalize", "standardize", "pixel-range"),
])
def test_bad_robustness_settings_refused_before_training(tmp_path, field, value, match):
  config = rob_cfg.get_config("smoke")
  node = config
  *parents, leaf = field.split(".")
  for p in parents:
    node = node[p]
  node[leaf] = value
  with pytest.raises(ConfigError, match=f"config.{field}: .*{match}"):
    studies.run(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


@pytest.mark.slow
def test_sensitivity_regularization_study(tmp_path):
  out = studies.run(sr_cfg.get_config("smoke"), str(tmp_path))
  rows = {r["run"]: r for r in out["rows"]}
  assert set(rows) == {"vit", "vit_gaussian_aug", "vit_sensitivity_reg", "resnet18"}
  assert rows["vit"]["mCE"] == pytest.approx(1.0)
  for row in rows.values():
    assert 0.0 <= row["S(σ=4)"] <= 1.0 and 0.0 <= row["acc_noise"] <= 1.0
  reg_metrics = read_metrics(str(tmp_path / "runs" / "vit_sensitivity_reg"))
  assert any("train/penalty" in r for r in reg_metrics)
  plain_metrics = read_metrics(str(tmp_path / "runs" / "vit"))
  assert not any("train/penalty" in r for r in plain_metrics)
  for plot in ("corruption_categories.png", "train_sensitivity.png"):
    assert os.path.getsize(tmp_path / plot) > 1000


# ------------------------------------------------------------------ CIFAR-10-C from TFDS


def _linear_result(split):
  """A TrainResult stand-in: a fixed linear classifier on the flattened images."""
  w = np.random.default_rng(0).normal(size=(int(np.prod(split.images.shape[1:])), 10))
  return types.SimpleNamespace(
      test=split, variables={"w": jnp.asarray(w, jnp.float32)},
      apply_fn=lambda v, x: x.reshape(len(x), -1) @ v["w"])


def test_cifar10_c_read_from_tfds_when_present_else_synthesised(tmp_path, monkeypatch):
  """`setup=cifar10`: the CIFAR-10-C sets (TFDS cifar10_corrupted `<corruption>_<severity>`)
  are read when the data_dir serves them (`tfds.testing.mock_data`), else synthesised."""
  config = rob_cfg.get_config("setup=cifar10,smoke")
  rc, dc = config.robustness, config.train.data
  assert rc.corruptions.tfds_name == "cifar10_corrupted" and rc.corruptions.source == "auto"
  assert set(rc.corruptions.names) <= set(corrupted.BENCHMARK)
  rc.num_examples, rc.batch_size = 20, 8
  rc.corruptions.names, rc.corruptions.severities = ("defocus_blur", "glass_blur"), (1, 5)
  dc.data_dir = str(tmp_path / "empty")
  assert lab_corruptions.corruption_source(rc, dc) == "synthesize"  # Nothing prepared.
  rc.corruptions.source = "tfds"
  with pytest.raises(ConfigError, match="config.robustness.corruptions.source: 4 of the 4 "
                     "cifar10_corrupted sets are not prepared"):
    lab_corruptions.corruption_source(rc, dc)
  rc.corruptions.source = "auto"
  names = []
  load = corrupted.load_cifar10_corrupted
  monkeypatch.setattr(corrupted, "load_cifar10_corrupted",
                      lambda d, c, s, **kw: names.append((c, s)) or load(d, c, s, **kw))
  synthesise = lab_corruptions.host_corruption_accuracy
  monkeypatch.setattr(lab_corruptions, "host_corruption_accuracy",
                      lambda *a, **kw: pytest.fail("synthesised although TFDS serves the sets"))
  try:
    with tfds.testing.mock_data(num_examples=24, policy=tfds.testing.MockPolicy.USE_CODE):
      assert lab_corruptions.corruption_source(rc, dc) == "tfds"
      res = _linear_result(pipeline.load_split(dc, "test"))
      corr = lab_corruptions.corruption_section({"resnet18": res, "vit": res}, rc,
                                                dc.normalize, source="tfds",
                                                data_configs={"resnet18": dc, "vit": dc})
      expected = {}
      for c, s in [(c, s) for c in rc.corruptions.names for s in rc.corruptions.severities]:
        split = load(dc, c, s)
        expected[(c, s)] = lab_robustness.split_accuracy(res.apply_fn, res.variables,
                                                         split.images[:20],
                                                         split.labels[:20], 8)
  finally:
    pipeline.clear_cache()
  # Each set read once (shared by the two runs), as TFDS spells it.
  assert names == [(c, s) for c in rc.corruptions.names for s in rc.corruptions.severities]
  assert corrupted.tfds_name("glass_blur", 5) == "cifar10_corrupted/frosted_glass_blur_5"
  assert corr["source"] == "tfds" and corr["accuracy"]["vit"] == expected
  assert "read from TFDS `cifar10_corrupted`" in robustness._source_note(corr, rc, dc)
  monkeypatch.setattr(lab_corruptions, "host_corruption_accuracy", synthesise)
  synth = lab_corruptions.corruption_section({"resnet18": res}, rc, dc.normalize)
  assert synth["source"] == "synthesize"
  note = robustness._source_note(synth, rc, dc)
  assert "synthesised" in note and "`cifar10_corrupted` is not (fully) prepared" in note


def test_official_corruption_list():
  """The 15 benchmark corruptions of Hendrycks & Dietterich (2019) (TFDS
  BENCHMARK_CORRUPTIONS): defocus blur is one of them, Gaussian blur an extra one."""
  from xsens.measures import corruptions  # pylint: disable=g-import-not-at-top
  assert corruptions.NAMES == corrupted.BENCHMARK
  assert "defocus_blur" in corrupted.BENCHMARK and "gaussian_blur" in corrupted.EXTRA
  assert tuple(rob_cfg.get_config().robustness.corruptions.names) == corrupted.BENCHMARK


def test_data_scale_section_averages_training_seeds():
  """Two seeds of each (model, size): the section reports their mean and standard error
  per size, names the run (not the seed id) and counts the seeds."""
  ids = {"vit_10pct": ("vit_10pct", 0), "vit_10pct_seed1": ("vit_10pct", 1),
         "vit_100pct": ("vit_100pct", 0), "vit_100pct_seed1": ("vit_100pct", 1),
         "cnn": ("cnn", 0)}
  sizes = {"vit_10pct": 40, "vit_10pct_seed1": 40, "vit_100pct": 400,
           "vit_100pct_seed1": 400, "cnn": 400}
  pgd = {"vit_10pct": 0.1, "vit_10pct_seed1": 0.3, "vit_100pct": 0.5,
         "vit_100pct_seed1": 0.5, "cnn": 0.9}
  results = {r: types.SimpleNamespace(summary={"model": "cnn" if r == "cnn" else "vit"})
             for r in ids}
  rows = [{"run": r, "train_examples": sizes[r], "test_accuracy": 2 * pgd[r], "mCA": pgd[r],
           "PGD@0.05": pgd[r]} for r in ids]
  scale = robustness.data_scale_section(results, rows, ids)
  assert set(scale) == {"vit"}  # The cnn has one size only.
  vit = scale["vit"]
  assert vit["runs"] == ["vit_10pct", "vit_100pct"]
  assert vit["train_examples"] == [40, 400] and vit["seeds"] == [2, 2]
  np.testing.assert_allclose(vit["PGD"], [0.2, 0.5])
  np.testing.assert_allclose(vit["PGD s.e."], [0.1, 0.0], atol=1e-12)  # std/√2 of ±0.1.
  np.testing.assert_allclose(vit["test_accuracy"], [0.4, 1.0])
  assert "FGSM" not in vit  # Not measured: left out, not invented.
  note = robustness._scale_note(scale)  # pylint: disable=protected-access
  assert "n=40: clean 0.400 ± 0.200 / mCA 0.200 ± 0.100 / PGD 0.200 ± 0.100" in note
  assert "mean ± s.e. over 2 seeds" in note


def test_seeds_variant_and_imagenet_refusal():
  config = rob_cfg.get_config("scale,seeds=3")
  assert config.num_seeds == 3 and len(config.runs) == 6
  assert rob_cfg.get_config(None).num_seeds == 1
  with pytest.raises(ValueError, match="trains nothing"):
    rob_cfg.get_config("imagenet,seeds=2")
