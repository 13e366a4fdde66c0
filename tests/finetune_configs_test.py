"""The streaming configs `vit_finetune_imagenet` and `vit_cifar10`: their recipes, and their
smoke variants trained end to end on `tfds.testing.mock_data` of the real TFDS layouts
(`imagenet2012`, `cifar10`), the fine-tune from a tiny fake vit_jax checkpoint."""

import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from mlcollections_configs import vit_cifar10, vit_finetune_imagenet
from tests.helpers import run_cli
from tests.pretrained_test import fake_vit_checkpoint
from xsens import studies
from xsens.data import streaming
from xsens.train import trainer


def _mock():
  return tfds.testing.mock_data(num_examples=24, policy=tfds.testing.MockPolicy.USE_CODE)


def test_finetune_recipe_is_vit_jax_s_fine_tuning_recipe():
  c = vit_finetune_imagenet.get_config().train
  assert (c.model.patch_size, c.model.width, c.model.depth, c.model.num_heads,
          c.model.mlp_dim) == (16, 768, 12, 12, 3072)
  assert c.batch_size == 512 and c.total_steps == 20_000 and c.data.image_size == (224, 224)
  o = c.optimizer
  assert (o.name, o.learning_rate, o.momentum, o.schedule, o.warmup_steps, o.grad_clip_norm,
          o.weight_decay) == ("momentum", 0.03, 0.9, "cosine", 500, 1.0, 0.0)
  assert c.loss == "cross_entropy" and c.pretrained.reinit_head
  assert c.data.stream.crop == "inception" and tuple(c.data.stream.area_range) == (0.05, 1.0)
  assert streaming.is_streaming(c.data)


def test_cifar10_recipe():
  c = vit_cifar10.get_config().train
  assert (c.model.patch_size, c.model.width, c.model.depth, c.model.num_heads) == (4, 384, 12, 6)
  assert c.data.image_size == (32, 32) and c.data.stream.crop == "pad_crop"
  assert c.optimizer.name == "adamw" and c.optimizer.schedule == "cosine"


@pytest.mark.slow
def test_finetune_smoke_trains_from_a_vit_jax_checkpoint_on_mock_imagenet(tmp_path):
  config = vit_finetune_imagenet.get_config("smoke")
  ckpt = tmp_path / "ViT-B_16.npz"
  np.savez(ckpt, **fake_vit_checkpoint(grid=4, representation_size=8, num_classes=21843))
  config.train.pretrained.path = str(ckpt)
  config.train.data.data_dir = str(tmp_path / "tfds")
  with _mock():
    out = studies.run(config, str(tmp_path / "run"))
  row = out["rows"][0]
  assert row["steps"] == 4 and np.isfinite(row["test_loss"])
  assert os.path.exists(tmp_path / "run" / "results.md")
  steps = sorted(int(s) for s in os.listdir(tmp_path / "run" / "checkpoints"))
  assert steps[-1] == 4
  assert os.listdir(tmp_path / "run" / "checkpoints" / "4" / "data_iterator")
  variables = out["result"].variables["params"]
  assert variables["head"]["kernel"].shape == (8, 1000)  # New 1000-way head.
  assert "pre_logits" not in variables                  # Dropped, as vit_jax fine-tunes.


@pytest.mark.slow
def test_cifar10_smoke_trains_on_mock_cifar10(tmp_path):
  config = vit_cifar10.get_config("smoke")
  config.train.data.data_dir = str(tmp_path / "tfds")
  with _mock():
    out = studies.run(config, str(tmp_path / "run"))
  assert out["rows"][0]["steps"] == 4
  metrics = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  assert any("eval/test_accuracy" in r for r in metrics)


def test_smoke_configs_validate_on_mock_data(tmp_path):
  for module in (vit_cifar10, vit_finetune_imagenet):
    config = module.get_config("smoke").train
    config.data.data_dir = str(tmp_path)
    with _mock():
      trainer.validate_config(config)


def test_cli_bad_stream_field_is_one_line_exit_2(tmp_path):
  proc = run_cli("--config=mlcollections_configs/vit_cifar10.py:smoke",
                 "--config.train.data.stream.crop=bogus", f"--workdir={tmp_path / 'w'}")
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "train.data.stream.crop" in lines[0], proc.stderr[-2000:]
  assert not os.path.exists(tmp_path / "w")
