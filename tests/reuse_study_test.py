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
  assert set(rows) == {"vit", "reuse_p1_k1", "reuse_p2_k1", "vit_random_labels"}
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
  assert set(layer_sim) == {"trained", "random init", "random labels",
                            "reuse_p2_k1 (trained)"}
  # The random-label control is the baseline architecture, trained on seeded random labels.
  assert rows["vit_random_labels"]["params"] == rows["vit"]["params"]
  assert not np.allclose(layer_sim["random labels"], layer_sim["trained"])
  for m in layer_sim.values():
    assert m.shape == (2, 2)
    np.testing.assert_allclose(np.diag(m), 1.0, rtol=1e-5)
  # Full reuse of layer 0 in layer 1: identical maps.
  np.testing.assert_allclose(layer_sim["reuse_p2_k1 (trained)"][1, 0], 1.0, rtol=1e-5)

  md = (tmp_path / "results.md").read_text()
  assert "Reuse attention on mnist5k" in md and "attn_gflops" in md
  assert "trained as run `vit_random_labels`" in md
  for plot in ("accuracy_vs_flops.png", "similarity_layers.png", "similarity_kth_best.png"):
    assert (tmp_path / plot).exists() and plot in md
  payload = json.loads((tmp_path / "results.json").read_text())
  assert "trained" in payload["layer_similarity"]
  # The reuse run is chosen on `val` (seed 0) and reported on the disjoint `eval` split at
  # `reuse.num_seeds` seeds, with the similarity controls per seed.
  candidates = [r for r in out["rows"] if r["run"] in ("reuse_p1_k1", "reuse_p2_k1")]
  assert out["chosen"] == max(candidates, key=lambda r: r["val_accuracy"])["run"]
  assert not set(out["val"].tolist()) & set(out["eval"].tolist())
  n = config.reuse.num_seeds
  for name in ("vit", out["chosen"], "vit_random_labels"):
    assert len(out["seeds"][name]["eval_accuracy"]) == n
    assert out["seeds"][name]["eval_accuracy"][0] == pytest.approx(rows[name]["eval_accuracy"])
  assert workdir_lib.Workdir(os.path.join(tmp_path, "runs", "vit_seed1")).latest_step() is not None
  for key in ("trained", "random init", "random labels"):
    assert len(out["similarity_seeds"][key]["per_seed"]) == n
  assert out["similarity_seeds"]["trained"]["per_seed"][0] == pytest.approx(
      payload["adjacent_layer_similarity"]["trained"])


def test_num_seeds_other_than_one_is_refused_before_training(tmp_path):
  config = reuse_config.get_config("smoke")
  config.num_seeds = 2
  with pytest.raises(ConfigError, match=r"config\.num_seeds: must be 1 here.*reuse\.num_seeds"):
    studies.run(config, str(tmp_path))
  assert not (tmp_path / "runs").exists()


def test_bad_baseline_is_refused_before_training(tmp_path):
  config = reuse_config.get_config("smoke")
  config.reuse.baseline = "nope"
  with pytest.raises(ConfigError, match=r"reuse\.baseline"):
    studies.run(config, str(tmp_path))
  assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("run, match", [
    ("nope", "'nope' is not a run"),
    ("vit", "run 'vit' trains on true labels"),
])
def test_bad_random_labels_control_is_refused_before_training(tmp_path, run, match):
  config = reuse_config.get_config("smoke")
  config.reuse.random_labels_run = run
  with pytest.raises(ConfigError, match=f"config.reuse.random_labels_run: {match}"):
    studies.run(config, str(tmp_path))
  assert not (tmp_path / "runs").exists()


def test_random_labels_are_seeded_and_train_only():
  """`data.random_labels`: a seeded share of the train labels redrawn uniformly; the
  images, the test split and configs without the field are unchanged."""
  from xsens.data import config as data_config  # pylint: disable=g-import-not-at-top
  from xsens.data import pipeline  # pylint: disable=g-import-not-at-top
  true = data_config.default_data_config()
  true.num_train = 400
  noisy = data_config.default_data_config()
  noisy.update(num_train=400, random_labels=1.0)
  a, b = pipeline.load_split(true, "train"), pipeline.load_split(noisy, "train")
  np.testing.assert_array_equal(a.images, b.images)
  assert 0.03 < np.mean(a.labels == b.labels) < 0.2  # About 1/10 agree by chance.
  np.testing.assert_array_equal(b.labels, pipeline.load_split(noisy, "train").labels)
  np.testing.assert_array_equal(pipeline.load_split(true, "test").labels,
                                pipeline.load_split(noisy, "test").labels)
  noisy.random_labels = 0.3
  c = pipeline.load_split(noisy, "train")
  assert 0.6 < np.mean(a.labels == c.labels) < 0.8  # 70 % kept + 3 % agreeing by chance.
  noisy.random_labels = 1.5
  with pytest.raises(ConfigError, match="config.data.random_labels: must be None"):
    pipeline.validate_data_config(noisy)
  del true["random_labels"]  # An older config without the field: true labels.
  np.testing.assert_array_equal(pipeline.load_split(true, "train").labels, a.labels)
