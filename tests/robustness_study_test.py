"""The robustness and sensitivity-regularisation studies end to end, and their bad inputs."""

import json
import os

import numpy as np
import pytest

from mlcollections_configs import robustness as rob_cfg
from mlcollections_configs import sensitivity_regularization as sr_cfg
from xsens import studies
from xsens.errors import ConfigError
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
