"""Smoke run of the `reuse` study (mlcollections_configs/reuse.py:smoke)."""

import json
import os

import numpy as np
import pytest

from mlcollections_configs import reuse as reuse_config
from xsens import studies
from xsens.errors import ConfigError
from xsens.train import workdir as workdir_lib


@pytest.mark.slow
def test_smoke_study_writes_report(tmp_path):
  config = reuse_config.get_config("smoke")
  out = studies.run(config, str(tmp_path))
  rows = {r["run"]: r for r in out["rows"]}
  assert set(rows) == {"vit", "reuse_p1_k1", "reuse_p2_k1"}
  for name, row in rows.items():
    assert workdir_lib.Workdir(os.path.join(tmp_path, "runs", name)).latest_step() == config.train.total_steps
    for key in ("fwd_gflops", "attn_gflops", "peak_temp_mb", "step_ms", "test_accuracy"):
      assert np.isfinite(row[key]) and row[key] >= 0, (name, key)
  # Reuse removes Q/K parameters and attention FLOPs; full reuse more than partial.
  assert rows["reuse_p2_k1"]["params"] < rows["reuse_p1_k1"]["params"] < rows["vit"]["params"]
  assert (rows["reuse_p2_k1"]["attn_gflops"] < rows["reuse_p1_k1"]["attn_gflops"]
          < rows["vit"]["attn_gflops"])
  assert rows["vit"]["reuse_heads"] == 0 and rows["reuse_p2_k1"]["reuse_heads"] == 2

  layer_sim = out["layer_similarity"]
  assert set(layer_sim) == {"trained", "random init", "reuse_p2_k1 (trained)"}
  for m in layer_sim.values():
    assert m.shape == (2, 2)
    np.testing.assert_allclose(np.diag(m), 1.0, rtol=1e-5)
  # Full reuse of layer 0 in layer 1: identical maps.
  np.testing.assert_allclose(layer_sim["reuse_p2_k1 (trained)"][1, 0], 1.0, rtol=1e-5)

  md = (tmp_path / "results.md").read_text()
  assert "Reuse attention on mnist5k" in md and "attn_gflops" in md
  for plot in ("accuracy_vs_flops.png", "similarity_layers.png", "similarity_kth_best.png"):
    assert (tmp_path / plot).exists() and plot in md
  payload = json.loads((tmp_path / "results.json").read_text())
  assert "trained" in payload["layer_similarity"]


def test_bad_baseline_is_refused_before_training(tmp_path):
  config = reuse_config.get_config("smoke")
  config.reuse.baseline = "nope"
  with pytest.raises(ConfigError, match=r"reuse\.baseline"):
    studies.run(config, str(tmp_path))
  assert not (tmp_path / "runs").exists()
