"""The `verification` study: smoke run end to end, and its bad-input errors."""

import numpy as np
import pytest

from mlcollections_configs import verification as verification_config
from xsens import studies
from xsens.errors import ConfigError
from xsens.lab import multirun
from xsens.studies import verification as study


@pytest.mark.slow
def test_smoke_study_classifies_every_property_and_writes_the_report(tmp_path):
  config = verification_config.get_config("smoke,seeds=2")
  out = studies.run(config, str(tmp_path))
  rows = out["rows"]
  methods = {r["method"] for r in rows}
  assert methods == {"ibp", "triangle", "pgd", "fista", "lp"}
  # One row per (run, method, ε): the mean over the 2 training seeds (LP: seed 0 only).
  assert {(r["method"], r["seeds"]) for r in rows} == {(m, 1 if m == "lp" else 2)
                                                      for m in methods}
  per_seed = [r for r in out["per_seed"] if r["method"] == "fista" and r["epsilon"] == 0.05]
  assert sorted(r["run"] for r in per_seed) == ["cnn_adv", "cnn_adv_seed1"]
  row = next(r for r in rows if r["method"] == "fista" and r["epsilon"] == 0.05)
  assert row["verified"] == pytest.approx(np.mean([r["verified"] for r in per_seed]))
  for r in rows:
    assert 0.0 <= r["verified"] <= 1.0
    if r["method"] != "lp":
      np.testing.assert_allclose(r["verified"] + r["falsified"] + r["open"], 1.0, atol=1e-6)
  # Every certified lower bound is below the attack's upper bound.
  for per_eps in out["verified"]["cnn_adv"].values():
    for r in per_eps.values():
      assert np.all(np.asarray(r["lower"]) <= np.asarray(r["upper"]) + 1e-5)
  # The LP optimum lies between the nonconvex dual and primal medians (gaps >= 0).
  trace = out["traces"]["cnn_adv"]
  for m in ("pgd", "fista"):
    assert np.all(np.asarray(trace[m]["gap_median"]) >= -1e-6)
    assert np.all(np.asarray(trace[m]["lp_minus_dual_median"]) >= -1e-5)
    assert np.all(np.asarray(trace[m]["primal_minus_lp_median"]) >= -1e-5)
  md = (tmp_path / "results.md").read_text()
  for plot in ("verified_cnn_adv.png", "gap_iterations_cnn_adv.png", "gap_time_cnn_adv.png"):
    assert (tmp_path / plot).exists() and plot in md


@pytest.mark.parametrize("field,value,message", [
    ("epsilons", (-0.1,), "finite number >= 0"),
    ("methods", ("ibp", "simplex"), "allowed"),
    ("lp_runs", ("nope",), "unknown runs"),
    ("smoothing", (1.0, 2.0), r"numbers in \[0, 1\]"),
])
def test_bad_verification_fields_are_one_line_errors(field, value, message):
  config = verification_config.get_config("smoke")
  config.verification[field] = value
  with pytest.raises(ConfigError, match=message) as e:
    study.validate(config, multirun.validate_runs(config))
  assert e.value.field == f"verification.{field}" and "\n" not in str(e.value)


def test_a_max_pool_cnn_run_is_refused_naming_its_field():
  config = verification_config.get_config("smoke")
  config.runs.cnn_adv.model.features = (2, 2)
  with pytest.raises(ConfigError, match="max-pool") as e:
    study.validate(config, multirun.validate_runs(config))
  assert e.value.field == "runs.cnn_adv.model.features"


def test_cifar10_setup_builds_and_validates_on_mock_tfds_data():
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  from xsens.data import pipeline  # pylint: disable=import-outside-toplevel
  config = verification_config.get_config("setup=cifar10")
  config.train.batch_size = 32
  pipeline.clear_cache()
  try:
    with tfds.testing.mock_data(num_examples=100, policy=tfds.testing.MockPolicy.USE_CODE):
      experiments = multirun.validate_runs(config)
  finally:
    pipeline.clear_cache()
  study.validate(config, experiments)
  assert experiments["cnn"].train.images.shape[1:] == (32, 32, 3)
  assert max(config.verification.epsilons) == pytest.approx(8 / 255)


def test_a_run_with_other_pixels_is_refused_naming_its_field():
  """The boxes are cut to [0, 1]; a run's own `data.normalize` override is checked too."""
  config = verification_config.get_config("smoke")
  config.runs.cnn_adv.data = {"normalize": "half"}
  with pytest.raises(ConfigError) as e:
    studies.run(config, "/nonexistent/never_written")
  assert e.value.field == "runs.cnn_adv.data.normalize" and "\n" not in str(e.value)
