"""The sensitivity_vision study (main job) end to end, its bad inputs, and its set-ups."""

import json
import math
import os

import types

import flax.linen as nn
import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from mlcollections_configs import sensitivity_vision as sv_cfg
from tests.helpers import snapshot
from xsens import measures, studies
from xsens.data import batching, pipeline
from xsens.errors import ConfigError
from xsens.lab import multirun
from xsens.lab import sensitivity as lab_sens
from xsens.report import seed_stats
from xsens.studies import sensitivity_vision as sv
from xsens.train import sharding


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
    assert os.path.isdir(os.path.join(multirun.run_workdir(workdir, run), "checkpoints"))


@pytest.mark.slow
def test_smoke_study_reports_global_noise_sharpness_and_noise_to_signal(smoke_run):
  workdir, out = smoke_run
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  for row in results["rows"]:
    for sigma in (1.0, 4.0):
      s, se = row[f"S_global(σ={sigma:g})"], row[f"s.e._global(σ={sigma:g})"]
      assert 0.0 <= s <= 1.0 and se >= 0.0 and math.isfinite(se)
    for name in ("sharpness_l1", "sharpness_flip"):
      assert row[name] >= 0.0 and math.isfinite(row[f"s.e._{name}"])
  # One noise-to-signal number per σ, from the evaluated examples' patches (7x7x1 = 49).
  images = np.asarray(studies_images(), np.float64)
  rms = float(np.sqrt(49 * np.mean(images ** 2)))
  ns = results["noise_to_signal"]
  assert ns["token_dim"] == 49 and ns["num_examples"] == 40
  assert ns["token_rms"] == pytest.approx(rms, rel=1e-12)
  assert ns["by_sigma"] == pytest.approx({"1": 7 / rms, "4": 28 / rms}, rel=1e-12)
  link = results["sharpness_vs_sensitivity"]
  s4 = [r["S(σ=4)"] for r in results["rows"]]
  assert (link["spearman_sharpness_l1"], link["p_sharpness_l1"]) == pytest.approx(
      sv.spearman([r["sharpness_l1"] for r in results["rows"]], s4), nan_ok=True)
  assert link["num_models"] == 5 and link["sigma"] == 4.0
  assert os.path.getsize(os.path.join(workdir, "sharpness_vs_sensitivity.png")) > 1000
  md = open(os.path.join(workdir, "results.md")).read()
  assert "S_global(σ=4)" in md and "s.e._sharpness_l1" in md and "noise-to-signal" in md


def studies_images():
  """The smoke study's evaluated examples (the first 40 training images of mnist5k)."""
  config = sv_cfg.get_config("smoke")
  exp = multirun.validate_runs(config)["vit"]
  return exp.train.images[:config.sensitivity.num_examples]


@pytest.mark.slow
def test_more_noise_flips_more(smoke_run):
  """Averaged over models, sensitivity grows with σ (same draws: common random numbers)."""
  _, out = smoke_run
  low = sum(m["sigmas"][1.0][0] for m in out["measured"].values())
  high = sum(m["sigmas"][4.0][0] for m in out["measured"].values())
  assert high > low


@pytest.mark.slow
def test_rerun_resumes_without_training(smoke_run):
  """A re-run with other `sensitivity.*` fields (global noise and sharpness off) resumes
  every run without training, and the token-wise numbers are those measured with them on:
  they use their own keys."""
  workdir, out = smoke_run
  config = sv_cfg.get_config("smoke")
  config.sensitivity.global_noise.enabled = False
  config.sensitivity.sharpness = None
  ckpts = lambda: {r: snapshot(os.path.join(multirun.run_workdir(workdir, r), "checkpoints"))
                   for r in ("vit", "cnn")}
  before = ckpts()
  again = studies.run(config, workdir)
  assert [r["steps"] for r in again["rows"]] == [r["steps"] for r in out["rows"]]
  assert ckpts() == before and before["vit"]
  timing = ("wall_s", "measure_s")
  new = ("S_global", "s.e._global", "sharpness", "s.e._sharpness")
  assert ([{k: v for k, v in r.items() if k not in timing} for r in again["rows"]] ==
          [{k: v for k, v in r.items() if k not in timing and not k.startswith(new)}
           for r in out["rows"]])
  assert "sharpness_vs_sensitivity" not in json.load(
      open(os.path.join(workdir, "results.json")))


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


@pytest.mark.parametrize("field,value,message", [
    ("global_noise.num_draws", 0, "must be an int > 0 (noise draws per example and σ), got 0"),
    ("sharpness.sigma", -0.1, "must be a finite σ >= 0 (absolute weight noise), got -0.1"),
    ("sharpness.num_draws", 1, "must be an int > 1 (the standard error is over the draws), "
                               "got 1"),
])
def test_bad_global_and_sharpness_settings(field, value, message):
  sc = sv_cfg.get_config("smoke").sensitivity
  block, name = field.split(".")
  sc[block][name] = value
  with pytest.raises(ConfigError) as e:
    sv_cfg.validate_sensitivity(sc)
  assert str(e.value) == f"config.sensitivity.{field}: {message}"


def test_configs_without_the_optional_blocks_validate():
  sc = sv_cfg.get_config("smoke").sensitivity
  del sc["global_noise"], sc["sharpness"]
  sc.global_noise = sc.sharpness = None  # Not measured.
  sv_cfg.validate_sensitivity(sc)
  assert not lab_sens.enabled(sc, "global_noise") and not lab_sens.enabled(sc, "sharpness")


def test_token_rms_and_noise_to_signal():
  images = np.full((3, 4, 4, 3), 0.5, np.float32)
  images[0] = -0.5
  rms = lab_sens.token_rms(images, 2)
  assert rms == pytest.approx(np.sqrt(12 * 0.25), rel=1e-12)
  assert lab_sens.noise_to_signal(1.0, 2, 3, rms) == pytest.approx(2.0, rel=1e-12)
  assert lab_sens.noise_to_signal(0.25, 2, 3, rms) == pytest.approx(0.5, rel=1e-12)


def test_spearman_exact_values():
  assert sv.spearman([1, 2, 3, 4, 5], [2, 4, 6, 8, 10]) == pytest.approx((1.0, 2 / 120))
  assert sv.spearman([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]) == pytest.approx((-1.0, 2 / 120))
  # x ranks (1, 2.5, 2.5, 4): ρ = 4.5 / sqrt(4.5 * 5).
  rho, p = sv.spearman([0.1, 0.2, 0.2, 0.7], [1, 2, 3, 4])
  assert rho == pytest.approx(4.5 / np.sqrt(22.5), rel=1e-12)
  assert 0 < p < 1
  assert np.isnan(sv.spearman([1, 1, 1], [1, 2, 3])[0])
  rho, p = sv.spearman(list(range(9)), list(range(9)))
  assert rho == 1.0 and np.isnan(p)


class _Linear(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    return nn.Dense(3)(x.reshape(x.shape[0], -1))


def _fake_result(num=10):
  images = np.asarray(jax.random.normal(jax.random.key(1), (num, 4, 4, 1)), np.float32)
  model = _Linear()
  variables = model.init(jax.random.key(0), images[:1])
  return types.SimpleNamespace(model=model, variables=variables,
                               train=types.SimpleNamespace(images=images))


def _small_sc():
  sc = sv_cfg.get_config("smoke").sensitivity
  sc.num_examples, sc.batch_size, sc.patch_size = 10, 4, 2
  sc.sigmas, sc.main_sigma = (0.0, 3.0), 3.0
  sc.sharpness.num_draws = 3
  return sc


def test_measure_sharpness_pools_batches_per_draw():
  """Each draw's value over padded batches equals `measures.sharpness` on all examples at
  once with that draw's key; mean and s.e. are over the draws."""
  res, sc = _fake_result(), _small_sc()
  key = jax.random.key(7)
  out = lab_sens.measure_sharpness(res, sc, key, sharding.data_mesh())
  draw_key = jax.random.fold_in(key, len(sc.sigmas) + 2)
  per_draw = np.array([[float(v) for v in (d["sharpness_l1"], d["sharpness_flip"])] for d in (
      measures.sharpness(res.model.apply, res.variables, res.train.images,
                         key=jax.random.fold_in(draw_key, r), sigma=0.05, num_draws=1)
      for r in range(3))])
  for j, name in enumerate(("sharpness_l1", "sharpness_flip")):
    mean, se = out[name]
    assert mean == pytest.approx(per_draw[:, j].mean(), rel=1e-5, abs=1e-7)
    assert se == pytest.approx(per_draw[:, j].std(ddof=1) / np.sqrt(3), rel=1e-4, abs=1e-7)
  assert out["sharpness_l1"][0] > 0


@pytest.mark.slow
def test_measure_global_keys_and_zero_noise():
  """σ = 0 flips nothing; batch i at σ index s uses the key fold_in(fold_in(fold_in(key,
  len(σ) + 1), s), i) (a stream apart from the token-wise keys) on the padded batch."""
  res, sc = _fake_result(), _small_sc()
  key = jax.random.key(3)
  out = lab_sens.measure_global(res, sc, key, sharding.data_mesh())
  assert out[0.0] == (0.0, 0.0)
  per_example = []
  for i, (idx, mask) in enumerate(batching.padded_index_batches(10, 4)):
    k = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, 3), 1), i)
    d = measures.global_sensitivity(res.model.apply, res.variables, res.train.images[idx],
                                    key=k, mask=mask, sigma=3.0, patch_size=2,
                                    num_draws=sc.global_noise.num_draws)
    per_example.append(np.asarray(d["per_example"])[mask > 0])
  pe = np.concatenate(per_example)
  assert 0 < pe.mean() < 1
  assert out[3.0] == pytest.approx((pe.mean(), pe.std(ddof=1) / np.sqrt(10)), rel=1e-6)


def test_streams_measure_the_same_numbers():
  """Batches measured at once (`sensitivity.streams`) give the one-stream numbers exactly,
  and the per-patch map over all examples; a bad value is refused with its flag."""
  res, sc = _fake_result(), _small_sc()
  key, mesh = jax.random.key(11), sharding.data_mesh()
  sc.streams = 1
  want = lab_sens.measure_model(res, sc, key, mesh), lab_sens.measure_global(res, sc, key, mesh)
  sc.streams = 3  # 10 examples in batches of 4: three batches at once.
  got = lab_sens.measure_model(res, sc, key, mesh), lab_sens.measure_global(res, sc, key, mesh)
  assert got[0]["sigmas"] == want[0]["sigmas"] and got[1] == want[1]
  np.testing.assert_array_equal(got[0]["per_patch_map"], want[0]["per_patch_map"])
  assert got[0]["per_patch_map"].shape == (2, 2) and 0 < want[0]["sigmas"][3.0][0] < 1
  sc.streams = 0
  with pytest.raises(ConfigError, match="config.sensitivity.streams: must be None"):
    sv_cfg.validate_sensitivity(sc)


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
      experiments = multirun.validate_runs(config)
  finally:
    pipeline.clear_cache()
  expected = {"cifar10": {"resnet18", "densenet", "convmixer", "vit", "simple_vit",
                          "vit_spt_lsa"},
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


def test_run_ids_and_seeded_run_configs():
  """num_seeds = 3: each run three times, index 0 as configured (its workdir name), i > 0
  with init/order/augment seeds shifted by i and the data seed kept."""
  config = sv_cfg.get_config("smoke,seeds=3")
  config.runs.cnn.init_seed = 10
  ids = multirun.run_ids(config)
  assert len(ids) == 15 and list(ids)[-3:] == ["vit", "vit_seed1", "vit_seed2"]
  assert ids["cnn_seed2"] == ("cnn", 2)
  base = multirun.seeded_run_config(config, "vit", ids)
  assert base.to_dict() == sv_cfg.get_config("smoke").train.to_dict() | {
      "model": base.model.to_dict()}
  assert base.init_seed is None and base.order_seed is None
  s2 = multirun.seeded_run_config(config, "vit_seed2", ids)
  assert (s2.seed, s2.init_seed, s2.order_seed, s2.augment_seed) == (0, 2, 2, 2)
  c1 = multirun.seeded_run_config(config, "cnn_seed1", ids)
  assert (c1.init_seed, c1.order_seed) == (11, 1)
  assert multirun.run_field(config, "cnn_seed1", "model.features") == "runs.cnn.model.features"


@pytest.mark.parametrize("value", [0, -2])
def test_bad_num_seeds_refused_before_training(tmp_path, value):
  config = sv_cfg.get_config("smoke")
  config.num_seeds = value
  with pytest.raises(ConfigError, match=r"config.num_seeds: must be an int >= 1"):
    studies.run(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


def test_seed_run_clashing_with_a_run_name_is_refused():
  config = sv_cfg.get_config("smoke,seeds=2")
  config.runs.vit_seed1 = config.runs.cnn
  with pytest.raises(ConfigError, match=r"config.num_seeds: run 'vit_seed1'"):
    multirun.run_ids(config)


def test_seed_rows_mean_and_standard_error():
  ids = {"a": ("a", 0), "a_seed1": ("a", 1), "a_seed2": ("a", 2), "b": ("b", 0)}
  rows = [{"run": "a", "x": 1.0}, {"run": "a_seed1", "x": 2.0}, {"run": "a_seed2", "x": 6.0},
          {"run": "b", "x": 5.0}]
  out = seed_stats.seed_rows(rows, ids, ["x"])
  assert out[0] == {"run": "a", "seeds": 3, "x": 3.0,
                    "x s.e.": pytest.approx(np.std([1, 2, 6], ddof=1) / np.sqrt(3))}
  assert out[1]["x"] == 5.0 and math.isnan(out[1]["x s.e."])
  assert seed_stats.mean_and_stderr([1.0, float("nan"), 3.0]) == pytest.approx(
      (2.0, np.sqrt(2) / np.sqrt(2)))


def test_token_rms_noise_scale_measures_sigma_times_the_rms_pixel():
  """noise_scale=token_rms at σ is the absolute measurement at σ·RMS pixel, same keys."""
  res, sc = _fake_result(), _small_sc()
  key, mesh = jax.random.key(5), sharding.data_mesh()
  rms_pixel = lab_sens.token_rms(res.train.images, 2) / 2
  scaled = lab_sens.measure_model(res, sc, key, mesh, rms_pixel)
  sc.sigmas, sc.main_sigma = (0.0, 3.0 * rms_pixel), 3.0 * rms_pixel
  absolute = lab_sens.measure_model(res, sc, key, mesh)
  assert scaled["sigmas"][3.0] == absolute["sigmas"][3.0 * rms_pixel]
  sc.noise_scale = "relative"
  with pytest.raises(ConfigError, match="config.sensitivity.noise_scale: unknown value"):
    sv_cfg.validate_sensitivity(sc)


@pytest.mark.slow
def test_seeds_add_runs_and_a_seed_table_keeping_seed_zero(smoke_run, tmp_path):
  """Two seeds in a copy of the smoke workdir: seed-0 runs resume untrained with the
  single-seed numbers; the seed-1 runs train in runs/<name>_seed1; the seed table is the
  mean over the two."""
  import shutil
  workdir, out = smoke_run
  copy = str(tmp_path / "wd")
  shutil.copytree(workdir, copy)
  config = sv_cfg.get_config("smoke,seeds=2")
  for name in ("cnn", "mlp_tanh", "resnet18"):
    del config.runs[name]
  config.sensitivity.global_noise.enabled = False
  config.sensitivity.scattered.enabled = False
  config.sensitivity.sharpness = None
  config.num_seeds = 1
  single = {r["run"]: r for r in studies.run(config, copy)["rows"]}   # Resumes; measures.
  config.num_seeds = 2
  seeded = studies.run(config, copy)
  rows = {r["run"]: r for r in seeded["rows"]}
  assert set(rows) == {"vit", "vit_seed1", "mlp_relu", "mlp_relu_seed1"}
  for name in ("vit", "mlp_relu"):
    assert rows[name]["S(σ=4)"] == single[name]["S(σ=4)"]
    assert rows[name]["steps"] == {r["run"]: r for r in out["rows"]}[name]["steps"]
    assert os.path.isdir(os.path.join(multirun.run_workdir(copy, f"{name}_seed1"),
                                      "checkpoints"))
  summary = {r["run"]: r for r in seeded["seed_summary"]}
  vit = summary["vit"]
  assert vit["seeds"] == 2
  pair = [rows["vit"]["S(σ=4)"], rows["vit_seed1"]["S(σ=4)"]]
  assert vit["S(σ=4)"] == pytest.approx(np.mean(pair))
  assert vit["S(σ=4) s.e."] == pytest.approx(np.std(pair, ddof=1) / np.sqrt(2))
  md = open(os.path.join(copy, "results.md")).read()
  assert "Mean ± standard error over the training seeds" in md and "| vit_seed1 |" in md
