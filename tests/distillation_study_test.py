"""Smoke runs of the `distillation` and `churn` studies, and their bad-input errors."""

import json
import os

import numpy as np
import pytest

from mlcollections_configs import churn as churn_config
from mlcollections_configs import distillation as distill_config
from xsens import studies
from xsens.errors import ConfigError
from xsens.train import workdir as workdir_lib


@pytest.mark.slow
def test_distillation_smoke_study_writes_report(tmp_path):
  config = distill_config.get_config("smoke")
  # Plain `kd` runs in tests/colab_distillation_test.py (the same smoke study).
  config.distillation.variants = ["onehot", "kd_class_alpha", "kd_margin"]
  out = studies.run(config, str(tmp_path))
  rows = {r["run"]: r for r in out["rows"]}
  assert set(rows) == {"teacher", "onehot", "kd_class_alpha", "kd_margin"}
  for name in ("teacher_s0", "onehot_s0", "kd_class_alpha_s0", "kd_margin_s0",
               "select_cnn_a0p5_t4", "select_mlp_a0p9_t4", "select_margin_m2"):
    assert workdir_lib.Workdir(os.path.join(tmp_path, "runs", name)).latest_step() is not None
  for row in rows.values():
    for key in ("accuracy", "worst_class", "worst_k_mean", "head_accuracy", "tail_accuracy"):
      assert 0.0 <= row[key] <= 1.0, (row["run"], key)
    assert row["worst_class"] <= row["worst_k_mean"] <= row["balanced_accuracy"] + 1e-9
  assert rows["onehot"]["d_accuracy"] == 0.0
  # Long-tailed train split: 400 examples of class 0 down to 20 of class 9.
  counts = out["train_counts"]
  assert counts[0] == 400 and counts[9] == 20 and list(counts) == sorted(counts, reverse=True)
  np.testing.assert_array_equal(np.flatnonzero(out["head"]), [0, 1, 2, 3, 4])
  mit = out["mitigation"]
  # The choices were made on `val` only: the chosen candidates have the best val scores.
  sel = out["selection"]
  best_kd = max(sel["kd"], key=lambda r: r["val_accuracy"])
  assert sel["chosen"]["student"] == best_kd["student"]
  assert sel["chosen"]["alpha"] == best_kd["alpha"]
  best_margin = max(sel["margin"], key=lambda r: r["val_worst_class"])
  assert sel["chosen"]["margin_scale"] == best_margin["margin_scale"]
  assert not set(out["val"].tolist()) & set(out["eval"].tolist())
  assert rows["onehot"]["model"] == sel["chosen"]["student"]
  assert np.all((mit["alpha"] >= 0) & (mit["alpha"] <= sel["chosen"]["alpha"]))
  assert np.all((mit["margin"] >= 0) & (mit["margin"] <= sel["chosen"]["margin_scale"]))
  # The mitigations reached the students' configs.
  with open(tmp_path / "runs" / "kd_class_alpha_s0" / "config.json") as f:
    saved = json.load(f)["distill"]
  np.testing.assert_allclose(saved["per_class_alpha"], mit["alpha"])
  with open(tmp_path / "runs" / "kd_margin_s0" / "config.json") as f:
    np.testing.assert_allclose(json.load(f)["distill"]["margin"], mit["margin"])
  assert saved["teacher_workdir"].endswith(os.path.join("runs", "teacher_s0"))
  md = (tmp_path / "results.md").read_text()
  assert "mnist5k-LT" in md and "kd_margin" in md and "train_count" in md
  for plot in ("per_class_accuracy.png", "gain_vs_teacher.png", "subgroup_summary.png"):
    assert (tmp_path / plot).exists() and plot in md
  # A rerun resumes every finished run (no training) and reports the same numbers.
  again = studies.run(config, str(tmp_path))
  for new, old in zip(again["rows"], out["rows"]):
    assert new.keys() == old.keys()
    for key, value in new.items():
      assert value == old[key] or (value != value and old[key] != old[key]), key


@pytest.mark.slow
def test_churn_smoke_study_writes_report(tmp_path):
  config = churn_config.get_config("smoke")
  out = studies.run(config, str(tmp_path))
  rows = out["rows"]
  methods = {"baseline", "min_entropy", "min_entropy_l0p5", "codistill"}
  assert {r["method"] for r in rows} == methods
  assert {(r["method"], r["source"]) for r in rows} == {
      (m, s) for m in methods for s in config.churn.sources}
  for r in rows:
    assert r["pairs"] == 1 and 0.0 <= r["churn"] <= 1.0 and 0.0 <= r["eval_accuracy"] <= 1.0
    assert np.isnan(r["peer_churn"]) == (r["method"] != "codistill")
  assert os.path.exists(tmp_path / "runs" / "codistill_init1" / "checkpoints")
  # The min-entropy setting is the group member with the lowest val churn.
  val_churn = out["val_churn"]
  group = config.churn.select.min_entropy
  assert out["chosen"]["min_entropy"] == min(group, key=lambda m: val_churn[m])
  assert [r["method"] for r in out["reductions"]] == [out["chosen"]["min_entropy"]]
  assert not set(out["val"].tolist()) & set(out["eval"].tolist())
  for m in methods:
    share = out["churn_by_confidence"][m]["share"]
    assert sum(share) == pytest.approx(1.0)
  md = (tmp_path / "results.md").read_text()
  assert "Prediction churn on mnist5k" in md
  for plot in ("churn_by_source.png", "churn_by_confidence.png"):
    assert (tmp_path / plot).exists()


@pytest.mark.parametrize("module,field,value", [
    (distill_config, "distillation.variants", ["kd"]),
    (distill_config, "distillation.seeds", [0, 0]),
    (distill_config, "distillation.val_fraction", 1.0),
    (distill_config, "distillation.alphas", (-0.5,)),
    (distill_config, "distillation.teacher_mode", "live"),
    (churn_config, "churn.sources", ["init", "weather"]),
    (churn_config, "churn.num_seeds", 1),
    (churn_config, "churn.confidence_edges", [0.0, 0.9, 0.5]),
    (churn_config, "churn.confidence_edges", [0.5, 0.9, 1.0]),
])
def test_bad_study_config_is_refused_before_training(tmp_path, module, field, value):
  config = module.get_config("smoke")
  node, leaf = config, field.split(".")
  for part in leaf[:-1]:
    node = node[part]
  node[leaf[-1]] = value
  with pytest.raises(ConfigError, match=f"config.{field}"):
    studies.run(config, str(tmp_path))
  assert not (tmp_path / "runs").exists()


def test_bad_student_and_codistill_fields_name_the_field_and_the_run(tmp_path):
  """The runs are derived (no `runs` block to set): errors name the block the user sets."""
  config = distill_config.get_config("smoke")
  config.students.cnn.model.features = [0]
  with pytest.raises(ConfigError, match=r"^config.students.cnn.model.features: "
                                        r".*\(run select_cnn_a0p5_t4\)$"):
    studies.run(config, str(tmp_path))
  config = churn_config.get_config("smoke")
  config.churn.methods.codistill.codistill.beta = -1.0
  with pytest.raises(ConfigError, match=r"^config.churn.methods.codistill.codistill.beta: "
                                        r".*\(run codistill_base\)$"):
    studies.run(config, str(tmp_path))
  assert not (tmp_path / "runs").exists()
