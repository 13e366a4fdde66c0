"""Set-up `imagenet` of sensitivity_vision (xsens/studies/sensitivity_imagenet.py) on
`tfds.testing.mock_data` ImageNet and fake checkpoint files: a tiny vit_jax-layout `.npz`
(tests/pretrained_test.py) and a tiny timm ConvNeXt `.safetensors` (tests/convnext_test.py),
both with 1000-way heads. No network, no real ImageNet, no real weights."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file
import tensorflow_datasets as tfds

from mlcollections_configs import sensitivity_vision as sv_cfg
from tests.convnext_test import _timm_checkpoint
from tests.pretrained_test import fake_vit_checkpoint
from xsens import studies
from xsens.errors import ConfigError
from xsens.lab import sensitivity as lab_sens
from xsens.models import pretrained
from xsens.studies import sensitivity_imagenet as si

jax.config.update("jax_disable_most_optimizations", True)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("sv_imagenet")
  # The fake ViT has 4² patches (its position embedding is resized to the 8 x 8 grid of the
  # smoke 32² images); the ConvNeXt a 4² stem and two stages.
  np.savez(root / "vit.npz", **fake_vit_checkpoint(num_classes=1000))
  save_file(_timm_checkpoint((1, 1), (4, 8), 4, classes=1000), str(root / "cnx.safetensors"))
  return root


def _config(files, tmp_path):
  config = sv_cfg.get_config("setup=imagenet,smoke")
  config.imagenet.data_dir = str(tmp_path / "tfds")
  config.sensitivity.patch_size = 4  # The fake ViT's patch size (its tokens are measured).
  config.runs.convnext_t.pretrained.path = str(files / "cnx.safetensors")
  config.runs.vit_b16.pretrained.path = str(files / "vit.npz")
  config.sensitivity.sigmas, config.sensitivity.global_noise.num_draws = (0.1, 1.0), 1
  return config


@pytest.mark.slow
def test_imagenet_setup_runs_on_mock_data_and_matches_a_direct_measurement(files, tmp_path):
  config = _config(files, tmp_path)
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    out = studies.run(config, str(tmp_path / "wd"))
    stream = si._open(config.imagenet, config.sensitivity, 4)
    batches = list(stream.batches())
  rows = {r["run"]: r for r in out["rows"]}
  assert set(rows) == {"convnext_t", "vit_b16"}
  assert rows["convnext_t"]["model"] == "ConvNeXt" and rows["vit_b16"]["model"] == "ViT"
  assert rows["convnext_t"]["paper_S"] == 0.0342 and rows["vit_b16"]["paper_S"] == 0.0191
  for r in rows.values():
    for s in (0.1, 1.0):
      assert 0 <= r[f"S(σ={s:g})"] <= 1 and 0 <= r[f"S_global(σ={s:g})"] <= 1
  assert os.path.exists(tmp_path / "wd" / "results.md")
  assert os.path.exists(tmp_path / "wd" / "sensitivity_vs_sigma.png")
  # The ViT's token-wise flips at σ = 1 on the same batches with the same keys (run 1, σ
  # index 1, batch i): the study's mean over the examples.
  runs = si.load_runs(config, (32, 32, 3), 1000)
  model, variables, _, _ = runs["vit_b16"]
  flips = []
  for i, b in enumerate(batches):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(
        jax.random.key(config.sensitivity.seed), 1), 1), i)
    per_example, _ = lab_sens.patch_batch(
        variables, jnp.asarray(b["image"]), jnp.asarray(b["mask"], jnp.float32), key,
        jnp.float32(1.0), model=model, patch_size=4, num_draws=config.sensitivity.num_draws,
        chunk_size=config.sensitivity.chunk_size)
    flips.append(np.asarray(per_example)[b["mask"] > 0])
  assert out["measured"]["vit_b16"]["sigmas"][1.0][0] == pytest.approx(
      float(np.concatenate(flips).mean()), abs=1e-6)
  # The wrapper feeds the ViT its release's [-1, 1] inputs, ConvNeXt ImageNet mean / std.
  x = jnp.asarray(batches[0]["image"])
  vit_plain = pretrained.load_vit(files / "vit.npz", model.model, (32, 32, 3))
  np.testing.assert_allclose(model.apply(variables, x),
                             model.model.apply(vit_plain, (x - 0.5) / 0.5), rtol=1e-5,
                             atol=1e-5)
  assert runs["convnext_t"][0].normalization == "imagenet"


def test_missing_weights_or_data_name_the_flag(files, tmp_path):
  config = sv_cfg.get_config("setup=imagenet,smoke")
  with pytest.raises(ConfigError) as e:
    studies.run(config, str(tmp_path))
  assert e.value.flag == "--config.runs.convnext_t.pretrained.path"
  assert "convnext_tiny" in e.value.message and "\n" not in str(e.value)
  config = _config(files, tmp_path)
  config.runs.vit_b16.pretrained.path = str(files / "nope.npz")
  with pytest.raises(ConfigError, match="no checkpoint file") as e:
    studies.run(config, str(tmp_path))
  assert e.value.flag == "--config.runs.vit_b16.pretrained.path"
  config = _config(files, tmp_path)  # No ImageNet in the data_dir (and no mock).
  with pytest.raises(ConfigError) as e:
    studies.run(config, str(tmp_path / "wd"))
  assert e.value.flag == "--config.imagenet.data_dir" and "\n" not in str(e.value)
  config = _config(files, tmp_path)  # A file of the wrong release.
  config.runs.convnext_t.pretrained.path = str(files / "vit.npz")
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    with pytest.raises(ConfigError) as e:
      studies.run(config, str(tmp_path / "wd"))
  assert e.value.flag == "--config.runs.convnext_t.pretrained.path"
  assert "\n" not in str(e.value)
  config = _config(files, tmp_path)
  config.sensitivity.patch_size = 8  # Not the ViT's tokens.
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    with pytest.raises(ConfigError) as e:
      studies.run(config, str(tmp_path / "wd"))
  assert e.value.flag == "--config.sensitivity.patch_size"
