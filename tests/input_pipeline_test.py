"""The streaming training input (`xsens.data.train_stream`, `xsens.data.image_prep`) and the
trainer on it.

No network, no TensorFlow: `tfds.testing.mock_data` serves random decoded imagenet2012
examples for the in-process tests, and a dozen JPEGs prepared as a real ArrayRecord
imagenet2012 (TFDS's own builder, its generator replaced) serve the worker-process test.
"""

import io
import json
import os

from etils import epath
import jax
import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.datasets.imagenet2012 import imagenet2012_dataset_builder as in_lib

from mlcollections_configs import train as train_cfg
from xsens.data import image_prep, pipeline, streaming, train_stream
from xsens.data.config import default_data_config, stream_config
from xsens.errors import ConfigError
from xsens.train import sharding, trainer
from xsens.train import workdir as workdir_lib


def _mock(n=20):
  return tfds.testing.mock_data(num_examples=n, policy=tfds.testing.MockPolicy.USE_CODE)


def _data_config(tmp_path, **stream):
  cfg = default_data_config()
  cfg.update(name="imagenet2012", data_dir=str(tmp_path / "none"), train_split="train",
             test_split="validation", image_size=(16, 16))
  cfg.stream = stream_config(**stream)
  return cfg


# ------------------------------------------------------------------------- augmentations


def _reference_box(height, width, seed, area_range, aspect_range):
  """The inception crop box written out independently: same draws, same arithmetic."""
  rng = np.random.default_rng(seed)
  for _ in range(10):
    a = rng.uniform(*area_range)
    log_r = rng.uniform(np.log(aspect_range[0]), np.log(aspect_range[1]))
    w = int(np.round(np.sqrt(a * height * width * np.exp(log_r))))
    h = int(np.round(np.sqrt(a * height * width / np.exp(log_r))))
    if 1 <= h <= height and 1 <= w <= width:
      return int(rng.integers(height - h + 1)), int(rng.integers(width - w + 1)), h, w
  return 0, 0, height, width


@pytest.mark.parametrize("shape", [(48, 64), (100, 30), (7, 9), (224, 224)])
def test_inception_crop_box_matches_a_numpy_reference(shape):
  h_img, w_img = shape
  for seed in range(200):
    box = image_prep.inception_crop_box(h_img, w_img, np.random.default_rng(seed),
                                        (0.08, 1.0), (3 / 4, 4 / 3))
    assert box == _reference_box(h_img, w_img, seed, (0.08, 1.0), (3 / 4, 4 / 3))
    top, left, h, w = box
    assert 0 <= top <= h_img - h and 0 <= left <= w_img - w and h >= 1 and w >= 1
  # A box that cannot fit falls back to the whole image.
  assert image_prep.inception_crop_box(3, 200, np.random.default_rng(0), (0.9, 1.0),
                                       (1.0, 1.0)) == (0, 0, 3, 200)


def test_inception_crop_areas_and_ratios_follow_the_ranges():
  rng = np.random.default_rng(1)
  boxes = [image_prep.inception_crop_box(400, 400, rng, (0.08, 1.0), (3 / 4, 4 / 3))
           for _ in range(2000)]
  area = np.array([h * w / 400 ** 2 for _, _, h, w in boxes])
  ratio = np.array([w / h for _, _, h, w in boxes])
  assert area.min() > 0.075 and area.max() <= 1.0
  assert ratio.min() > 0.74 and ratio.max() < 1.34
  # Square boxes always fit, so their area fraction is U(0.08, 1) up to rounding.
  square = [image_prep.inception_crop_box(400, 400, rng, (0.08, 1.0), (1.0, 1.0))
            for _ in range(2000)]
  assert abs(np.mean([h * w / 400 ** 2 for _, _, h, w in square]) - 0.54) < 0.02


def test_pad_crop_and_flip_are_exact_pixel_shifts():
  img = np.arange(8 * 8 * 3, dtype=np.int64).reshape(8, 8, 3).astype(np.uint8)
  aug = image_prep.Augment(crop="pad_crop", pad=2, flip=True)
  for seed in range(20):
    out = image_prep.augment_image(img, (8, 8), np.random.default_rng(seed), aug)
    rng = np.random.default_rng(seed)
    top, left = rng.integers(0, 5), rng.integers(0, 5)
    want = np.pad(img, ((2, 2), (2, 2), (0, 0)))[top:top + 8, left:left + 8]
    if rng.random() < 0.5:
      want = want[:, ::-1]
    np.testing.assert_array_equal(out, want)
  no_flip = image_prep.Augment(crop="resize", flip=False)
  np.testing.assert_array_equal(
      image_prep.augment_image(img, (8, 8), np.random.default_rng(0), no_flip), img)


def test_inception_crop_output_is_the_resized_box():
  img = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
  aug = image_prep.Augment(crop="inception", flip=False, resample="nearest")
  out = image_prep.augment_image(img, (12, 12), np.random.default_rng(5), aug)
  top, left, h, w = image_prep.inception_crop_box(30, 40, np.random.default_rng(5))
  want = np.asarray(Image.fromarray(img[top:top + h, left:left + w]).resize((12, 12),
                                                                             Image.NEAREST))
  np.testing.assert_array_equal(out, want)


# ----------------------------------------------------------------------------- the stream


def _reference_batch(stream, step):
  """This process's batch at `step` recomputed example by example from the sampler."""
  sampler = stream.sampler()
  images, labels = [], []
  for row in range(stream.local_batch_size):
    index = stream.global_index(step, row)
    example = stream.source[sampler[index].record_key]
    img = image_prep.augment_image(image_prep.decode_image(example["image"]), stream.image_size,
                                   train_stream.example_rng(stream.order_seed,
                                                            stream.augment_seed, index),
                                   stream.augment)
    images.append(image_prep.normalize_pixels(img, stream.normalize))
    labels.append(int(example["label"]))
  return np.stack(images), np.asarray(labels, np.int32)


def test_batches_are_a_pure_function_of_seeds_step_and_example(tmp_path):
  with _mock():
    stream = train_stream.open_training_stream(_data_config(tmp_path), batch_size=4,
                                               order_seed=1, augment_seed=2)
    it = iter(stream.loader())
    batches = [next(it) for _ in range(7)]  # 28 examples: crosses an epoch of 20.
    for step, batch in enumerate(batches):
      assert batch["image"].shape == (4, 16, 16, 3) and batch["image"].dtype == np.float32
      images, labels = _reference_batch(stream, step)
      np.testing.assert_array_equal(batch["image"], images)
      np.testing.assert_array_equal(batch["label"], labels)
    again = iter(stream.loader())
    np.testing.assert_array_equal(next(again)["image"], batches[0]["image"])
    other = train_stream.open_training_stream(_data_config(tmp_path), batch_size=4,
                                              order_seed=1, augment_seed=3)
    first = next(iter(other.loader()))
    np.testing.assert_array_equal(first["label"], batches[0]["label"])  # Same order ...
    assert not np.array_equal(first["image"], batches[0]["image"])     # ... new crops.


def test_epochs_are_reshuffled_and_cover_the_split(tmp_path):
  with _mock():
    stream = train_stream.open_training_stream(_data_config(tmp_path), batch_size=4,
                                               order_seed=0, augment_seed=0)
  sampler = stream.sampler()
  keys = [sampler[stream.global_index(0, k)].record_key for k in range(40)]
  assert sorted(keys[:20]) == sorted(keys[20:]) == list(range(20))
  assert keys[:20] != keys[20:]


def test_process_shards_are_disjoint(tmp_path, monkeypatch):
  with _mock():
    stream = train_stream.open_training_stream(_data_config(tmp_path), batch_size=4,
                                               order_seed=0, augment_seed=0)
    shards = []
    for pi in range(2):
      monkeypatch.setattr(jax, "process_index", lambda pi=pi: pi)
      monkeypatch.setattr(jax, "process_count", lambda: 2)
      assert stream.local_batch_size == 2
      sampler = stream.sampler()
      shards.append({sampler[stream.global_index(s, r)].record_key
                     for s in range(5) for r in range(2)})  # One epoch of 10 each.
      batch = next(iter(stream.loader()))
      np.testing.assert_array_equal(batch["image"], _reference_batch(stream, 0)[0])
  assert len(shards[0]) == len(shards[1]) == 10 and not shards[0] & shards[1]


def test_iterator_state_resumes_the_same_batches(tmp_path):
  with _mock():
    stream = train_stream.open_training_stream(_data_config(tmp_path), batch_size=4,
                                               order_seed=3, augment_seed=4)
    feed = train_stream.TrainFeed(stream)
    for _ in range(3):
      feed.next()
    state = feed.get_state()
    want = [feed.next() for _ in range(6)]
    fresh = train_stream.TrainFeed(stream)
    fresh.set_state(state)
    for w in want:
      got = fresh.next()
      np.testing.assert_array_equal(got["image"], w["image"])
      np.testing.assert_array_equal(got["label"], w["label"])
  assert json.loads(state)["last_seen_indices"] == {"0": 11}  # 3 batches of 4 read.


# ----------------------------------------------------------------- bad fields (no data read)


BAD_STREAM = [
    ({"stream.crop": "random"}, "data.stream.crop"),
    ({"stream.area_range": (0.5, 0.1)}, "data.stream.area_range"),
    ({"stream.aspect_range": (0.0, 1.0)}, "data.stream.aspect_range"),
    ({"stream.num_workers": -1}, "data.stream.num_workers"),
    ({"stream.pad": -1}, "data.stream.pad"),
    ({"stream.eval_crop": "inception"}, "data.stream.eval_crop"),
    ({"stream.eval_crop_fraction": 1.5}, "data.stream.eval_crop_fraction"),
    ({"stream.resample": "lanczos9"}, "data.stream.resample"),
    ({"classes": (1, 2)}, "data.classes"),
    ({"num_train": 10}, "data.num_train"),
    ({"image_size": None}, "data.image_size"),
    ({"normalize": "standardize"}, "data.normalize"),
    ({"name": "synthetic/gaussian_patches"}, "data.name"),
    ({"test_split": "train"}, "data.test_split"),
    ({"label_key": "y"}, "data.label_key"),
]


@pytest.mark.parametrize("overrides,field", BAD_STREAM, ids=[f for _, f in BAD_STREAM])
def test_bad_fields_are_one_line_config_errors(tmp_path, overrides, field):
  cfg = _data_config(tmp_path)
  for key, value in overrides.items():
    node, *path = key.split(".")
    if path:
      cfg[node][path[0]] = value
    else:
      cfg[node] = value
  with _mock(), pytest.raises(ConfigError) as e:
    streaming.validate_data_config(cfg)
  assert e.value.field == field and "\n" not in str(e.value)


def test_unknown_stream_field_is_refused(tmp_path):
  cfg = _data_config(tmp_path)
  cfg.stream.unlock()
  cfg.stream.crop_size = 3
  with _mock(), pytest.raises(ConfigError) as e:
    streaming.validate_data_config(cfg)
  assert e.value.field == "data.stream.crop_size"
  with pytest.raises(ValueError, match="unknown data.stream field"):
    stream_config(crop_size=3)


# ----------------------------------------------------------------------------- the trainer


def smoke_stream_config(tmp_path, **overrides):
  """A tiny ViT trained from the streamed mock imagenet2012 (16², batch 4)."""
  c = train_cfg.get_config("model=vit,smoke").train
  c.data.update(name="imagenet2012", data_dir=str(tmp_path / "none"), train_split="train",
                test_split="validation", num_train=None, image_size=(16, 16))
  c.data.stream = stream_config()
  c.model.patch_size = 8
  c.update(batch_size=4, total_steps=6, checkpoint_every=2, eval_every=3, log_every=2,
           eval_batch_size=8, eval_train_examples=8)
  c.update(overrides)
  return c


def _crash_at(step):
  def hook(at, variables):
    del variables
    if at == step:
      raise KeyboardInterrupt(f"simulated crash at step {at}")
  return hook


def _interrupted_run(config, workdir):
  """Trains until a crash at step 3 (after the step-2 checkpoint)."""
  exp = trainer.build_experiment(config)
  wd = trainer.open_workdir(workdir, config)
  with pytest.raises(KeyboardInterrupt):
    trainer.run_experiment(exp, wd, hooks=[_crash_at(3)])


@pytest.mark.slow
def test_trainer_streams_and_resumes_bit_for_bit(tmp_path, monkeypatch):
  config = smoke_stream_config(tmp_path)
  with _mock():
    straight = trainer.train_and_evaluate(config, str(tmp_path / "straight"))
    _interrupted_run(config, str(tmp_path / "resumed"))
    ckpt = tmp_path / "resumed" / workdir_lib.CHECKPOINT_DIR / "2"
    saved = json.loads((ckpt / workdir_lib.DATA_ITEM / "process_0-of-1.json").read_text())
    assert saved["last_seen_indices"] == {"0": 7}  # 2 steps of 4 examples.
    resumed = trainer.train_and_evaluate(config, str(tmp_path / "resumed"))
    assert resumed.summary["steps"] == straight.summary["steps"] == 6
    for a, b in zip(jax.tree.leaves(resumed.variables), jax.tree.leaves(straight.variables)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for key in ("train_accuracy", "test_accuracy", "test_loss"):
      assert resumed.summary[key] == straight.summary[key]
    # Control: a resume that ignored the saved position would train on other batches.
    _interrupted_run(config, str(tmp_path / "naive"))
    monkeypatch.setattr(train_stream.TrainFeed, "set_state", lambda self, state: None)
    naive = trainer.train_and_evaluate(config, str(tmp_path / "naive"))
  assert not all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
      jax.tree.leaves(naive.variables), jax.tree.leaves(straight.variables)))
  metrics = [json.loads(line) for line in open(tmp_path / "straight" / "metrics.jsonl")]
  assert any("eval/test_accuracy" in r for r in metrics)
  assert straight.summary["test_accuracy"] >= 0


def test_streamed_evaluation_matches_the_eval_stream(tmp_path):
  """The trainer's test evaluation reads the whole streamed split with the eval crop."""
  config = smoke_stream_config(tmp_path)
  with _mock(n=10):
    exp = trainer.build_experiment(config)
    assert isinstance(exp.train, train_stream.TrainStream) and len(exp.test) == 10
    assert exp.test.crop == "resize" and exp.test.batch_size == 8
    batches = list(trainer.eval_batches(exp.test, 8, sharding.data_mesh()))
  assert len(batches) == 2 and float(sum(np.asarray(b["mask"]).sum() for b in batches)) == 10


def test_checkpoint_without_data_state_is_refused(tmp_path):
  wd = workdir_lib.Workdir(str(tmp_path / "w"))
  assert wd.restore_data_state(3) is None
  with pytest.raises(ConfigError) as e:
    trainer._set_feed_state(None, wd, None)  # pylint: disable=protected-access
  assert e.value.field == "workdir"


# --------------------------------------------------------------- worker processes, real files


class FakeImagenet(in_lib.Builder, skip_registration=True):
  """imagenet2012 5.1.0 with train and validation splits of a few JPEGs."""
  name = "imagenet2012"
  EXAMPLES = []
  code_path = epath.Path(__file__)  # TFDS derives it via importlib_resources, absent here.

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(), "validation": self._generate_examples()}

  def _generate_examples(self):  # pylint: disable=arguments-differ
    for i, (data, label) in enumerate(self.EXAMPLES):
      name = f"ILSVRC2012_val_{i + 1:08d}.JPEG"
      yield name, {"image": data, "label": int(label), "file_name": name}


def _jpeg(rng, h, w) -> bytes:
  img = Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)).resize((w, h))
  buf = io.BytesIO()
  img.save(buf, format="JPEG", quality=95)
  return buf.getvalue()


@pytest.mark.slow
def test_worker_processes_on_real_array_record_files(tmp_path):
  rng = np.random.default_rng(0)
  FakeImagenet.EXAMPLES = [(_jpeg(rng, 20 + 3 * i, 30 - i), i) for i in range(8)]
  FakeImagenet(data_dir=str(tmp_path), file_format="array_record").download_and_prepare(
      file_format="array_record")
  cfg = _data_config(tmp_path)
  cfg.data_dir = str(tmp_path)
  streaming.validate_data_config(cfg)
  out = {}
  for workers in (0, 2):
    cfg.stream.num_workers = workers
    stream = train_stream.open_training_stream(cfg, batch_size=4, order_seed=0, augment_seed=0)
    feed = train_stream.TrainFeed(stream)
    out[workers] = [feed.next() for _ in range(3)]
    if workers:
      state = feed.get_state()
      nxt = feed.next()
      again = train_stream.TrainFeed(stream)
      again.set_state(state)
      np.testing.assert_array_equal(again.next()["image"], nxt["image"])
      again.close()
    feed.close()
    for step, batch in enumerate(out[workers]):  # Workers change which rows share a batch.
      images, labels = _reference_batch(stream, step)
      np.testing.assert_array_equal(batch["image"], images)
      np.testing.assert_array_equal(batch["label"], labels)
  assert not np.array_equal(out[0][1]["label"], out[2][1]["label"])
  assert os.path.isdir(tmp_path / "imagenet2012")


def test_in_memory_validation_refuses_a_stream_block(tmp_path):
  """`pipeline` (in memory) does not read streams; `streaming.validate_data_config` checks
  both kinds of `data` block."""
  cfg = _data_config(tmp_path)
  with pytest.raises(ConfigError) as e:
    pipeline.validate_data_config(cfg)
  assert e.value.field == "data.stream" and "\n" not in str(e.value)
  streaming.validate_data_config(default_data_config())   # mnist5k: in memory, valid


# -------------------------------------------------------------------- the command line


def test_stream_variant_streams_an_embedded_dataset():
  """`train.py:...,stream` sets `data.stream` (its fields then overridable from the
  command line); mnist5k is read as a prepared TFDS dataset at its own 28² size."""
  from tests.cli_test import TRAIN, _parse  # pylint: disable=g-import-not-at-top
  config = _parse(f"{TRAIN}:model=cnn,smoke,stream", "--config.train.data.stream.flip=true").train
  assert streaming.is_streaming(config.data) and config.data.stream.flip is True
  assert config.data.image_size == (28, 28) and config.data.num_train is None
  assert config.eval_train_examples == 256
  streaming.validate_data_config(config.data)
  assert not streaming.is_streaming(train_cfg.get_config("model=cnn,smoke").train.data)


@pytest.mark.slow
def test_cli_trains_from_a_stream(tmp_path):
  """The CLI trains the smoke CNN from streamed mnist5k: every checkpoint holds the grain
  iterator's position (4 steps of 32 examples)."""
  from tests.cli_test import TRAIN  # pylint: disable=g-import-not-at-top
  from tests.helpers import run_cli  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "wd"
  proc = run_cli(f"{TRAIN}:model=cnn,smoke,stream", "--config.train.data.stream.crop=pad_crop",
                 f"--workdir={workdir}", timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  ckpt = workdir / workdir_lib.CHECKPOINT_DIR / "4" / workdir_lib.DATA_ITEM
  saved = json.loads((ckpt / "process_0-of-1.json").read_text())
  assert saved["last_seen_indices"] == {"0": 4 * 32 - 1}
  losses = [json.loads(line).get("train/loss") for line in open(workdir / "metrics.jsonl")]
  assert [x for x in losses if x is not None] and all(
      np.isfinite(x) for x in losses if x is not None)
