"""Loads any dataset into host memory, preprocessed, and batches it as a pure function of the step.

Datasets (`data.name`):
  * embedded: "mnist5k", "digits" (TFDS builders in `xsens.data.builders`, prepared into
    `data_dir` on first use, offline; by process 0 of a multi-process run, `_prepare_embedded`);
  * "synthetic/<kind>" (`xsens.data.synthetic.SYNTHETIC`);
  * any TFDS dataset already prepared in `data_dir` in the array_record format. xsens never
    downloads: a missing dataset raises `ConfigError` saying how to prepare it elsewhere.

Preprocessing, in this order (seeded by `load_split(..., seed=)`):
  1. `classes`: keep those original class ids, relabelled 0..k-1 in the given order (both splits).
  2. `class_fractions` (train split only): per original class c with fraction f, keep the first
     round_half_up(f * n_c) examples of a permutation drawn from `default_rng([seed, 1, c])`.
  3. `num_train` (train split only): keep the first `num_train` of a permutation drawn from
     `default_rng([seed, 2])` (so for one seed smaller subsets are nested in larger ones).
  Kept examples stay in their stored order.
  3b. `random_labels` (train split only; optional field, absent or None = true labels): a
     fraction f in (0, 1] of the kept train examples, the first round_half_up(f * n) of a
     permutation drawn from `default_rng([seed, 3])`, get labels drawn uniformly from the k
     classes by the same generator (f = 1: every label random, Zhang et al. 2017, "Understanding
     deep learning requires rethinking generalization", arXiv 1611.03530). The test split keeps
     its true labels.
  4. `normalize`: "zero_one" x/255; "half" (x/255 - 0.5)/0.5; "standardize" x/255 then per-channel
     (x - mean)/std with mean and std of the (preprocessed) train split, for both splits.
     Synthetic sources are already on a model scale: for them "zero_one" and "half" are the
     identity and "standardize" skips the /255.
  5. `image_size`: bilinear `jax.image.resize` to (H, W) on the host CPU.

TF-free reading goes through `DatasetBuilder.as_data_source` (ArrayRecord + NumPy decoding).

Text datasets ("text/..." and "glue/...", `is_text`) are validated and loaded by
`xsens.data.text`, to which `validate_data_config` and `load_split` dispatch. `Split` and the
split helpers both loaders share live in `xsens.data.splits` (re-exported here).
"""

from collections.abc import Mapping, Sequence
import functools
import inspect
import numbers
import os
from typing import Any

import jax
import numpy as np
import tensorflow_datasets as tfds

from xsens.data import builders
from xsens.data import splits
from xsens.data import synthetic
from xsens.data import text
from xsens.errors import ConfigError

# Shared with the text datasets; re-exported so callers keep one entry point.
Split = splits.Split
ROLES = splits.ROLES
default_data_dir = splits.default_data_dir
split_role = splits.split_role
subset_indices = splits.subset_indices

EMBEDDED = ("mnist5k", "digits")
NORMALIZE = ("zero_one", "half", "standardize")
SYNTHETIC_PREFIX = "synthetic/"
TEXT_PREFIXES = ("text/", "glue/")  # Token-id datasets, loaded by xsens.data.text.
FIELDS = ("name", "data_dir", "train_split", "test_split", "image_key", "label_key", "classes",
          "class_fractions", "num_train", "normalize", "image_size", "synthetic")

_EMBEDDED_SPLITS = ("train", "test")
_EMBEDDED_NUM_CLASSES = 10
_FILE_FORMAT = "array_record"
_READ_BATCH = 1024
_RESIZE_CHUNK = 4096


def is_text(data_config) -> bool:
  """True for the text datasets of `xsens.data.text` (names "text/..." and "glue/...")."""
  name = data_config.get("name") if hasattr(data_config, "get") else None
  return isinstance(name, str) and name.startswith(TEXT_PREFIXES)


# ------------------------------------------------------------------------------------------------
# Batching: a pure function of the step.


def num_steps_per_epoch(num_examples: int, global_batch_size: int) -> int:
  """Full global batches per epoch (the remainder is dropped)."""
  if isinstance(global_batch_size, bool) or not isinstance(
      global_batch_size, (int, np.integer)) or global_batch_size < 1:
    raise ConfigError("batch_size", f"must be a positive int, got {global_batch_size!r}")
  if global_batch_size > num_examples:
    raise ConfigError("batch_size", f"global batch size {global_batch_size} exceeds the "
                      f"{num_examples} training examples; allowed: 1..{num_examples}")
  return int(num_examples) // int(global_batch_size)


def batch_indices(num_examples: int, global_batch_size: int, step: int, seed: int,
                  process_index: int = 0, process_count: int = 1) -> np.ndarray:
  """Indices of this process's share of the global batch at `step`.

  Epoch e = step // steps_per_epoch reads a permutation of range(num_examples) drawn from
  `np.random.default_rng([seed, e])` in consecutive chunks of `global_batch_size`; process p
  takes the p-th contiguous slice of its chunk. Being a pure function of the step, resuming at a
  step reproduces the data exactly.

  Returns:
    [global_batch_size // process_count] int64 indices into the split.
  """
  steps = num_steps_per_epoch(num_examples, global_batch_size)
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"need 0 <= process_index < process_count, got {process_index}, "
                     f"{process_count}")
  if global_batch_size % process_count:
    raise ConfigError("batch_size", f"global batch size {global_batch_size} must be divisible "
                      f"by the process count {process_count}")
  if step < 0:
    raise ValueError(f"step must be >= 0, got {step}")
  epoch, within = divmod(int(step), steps)
  perm = np.random.default_rng([seed, epoch]).permutation(num_examples)
  local = global_batch_size // process_count
  start = within * global_batch_size + process_index * local
  return perm[start:start + local]


# ------------------------------------------------------------------------------------------------
# Config validation.


def _get(data_config, field: str) -> Any:
  if field not in data_config:
    raise ConfigError(f"data.{field}", "missing; start from "
                      "xsens.data.config.default_data_config(), which has every field")
  return data_config[field]


def _is_int(value) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _role_field(role: str) -> str:
  return f"data.{role}_split"


def _synthetic_kind(name: str) -> str:
  kind = name[len(SYNTHETIC_PREFIX):]
  if kind not in synthetic.SYNTHETIC:
    allowed = ", ".join(SYNTHETIC_PREFIX + k for k in synthetic.SYNTHETIC)
    raise ConfigError("data.name", f"unknown synthetic kind {kind!r}; allowed: {allowed}")
  return kind


def _kind_params(fn) -> list[str]:
  params = inspect.signature(fn).parameters
  return [p for p in params if p not in ("num_examples", "seed", "stream")]


def _synthetic_kwargs(data_config, kind: str) -> tuple[int, int, dict[str, Any]]:
  """(num_train, num_test, kwargs of the kind) from `data.synthetic`."""
  cfg = _get(data_config, "synthetic")
  cfg = dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg or {})
  known = {"num_train", "num_test"}
  for fn in synthetic.SYNTHETIC.values():
    known.update(_kind_params(fn))
  for key in cfg:
    if key not in known:
      raise ConfigError(f"data.synthetic.{key}",
                        f"unknown field; allowed: {', '.join(sorted(known))}")
  sizes = []
  for key in ("num_train", "num_test"):
    if key not in cfg:
      raise ConfigError(f"data.synthetic.{key}", "missing; a positive int")
    if not _is_int(cfg[key]) or cfg[key] < 1:
      raise ConfigError(f"data.synthetic.{key}", f"must be a positive int, got {cfg[key]!r}")
    sizes.append(int(cfg[key]))
  fn_params = _kind_params(synthetic.SYNTHETIC[kind])
  return sizes[0], sizes[1], {k: v for k, v in cfg.items() if k in fn_params}


def _class_fractions(data_config) -> dict[int, float] | None:
  """`data.class_fractions` with int keys, validated."""
  fractions = _get(data_config, "class_fractions")
  if fractions is None:
    return None
  if not isinstance(fractions, Mapping) and not hasattr(fractions, "items"):
    raise ConfigError("data.class_fractions", "must be None or a dict {class id: fraction in "
                      f"(0, 1]}}, got {fractions!r}")
  try:
    items = list(fractions.items())
  except TypeError:  # A ConfigDict sorts its keys: mixed int and str keys fail.
    raise ConfigError("data.class_fractions", "keys must be all int or all str class ids "
                      "(a ConfigDict cannot hold both)") from None
  out = {}
  for key, value in items:
    try:
      cls = int(key)
    except (TypeError, ValueError):
      raise ConfigError("data.class_fractions", f"keys must be class ids (int or str of an "
                        f"int), got {key!r}") from None
    if cls in out:
      raise ConfigError("data.class_fractions", f"class {cls} is given twice ({key!r})")
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
      raise ConfigError("data.class_fractions", f"fraction of class {cls} must be in (0, 1], "
                        f"got {value!r}")
    out[cls] = float(value)
  return out


def _check_classes(data_config, num_classes: int | None) -> None:
  classes = _get(data_config, "classes")
  if classes is not None:
    if isinstance(classes, (str, bytes)) or not isinstance(classes, Sequence) or not classes:
      raise ConfigError("data.classes", f"must be None or a non-empty sequence of class ids, "
                        f"got {classes!r}")
    if not all(_is_int(c) for c in classes) or len(set(classes)) != len(classes):
      raise ConfigError("data.classes", f"must hold distinct int class ids, got {classes!r}")
    if num_classes is not None and not all(0 <= c < num_classes for c in classes):
      raise ConfigError("data.classes", f"class ids must be in 0..{num_classes - 1}, "
                        f"got {tuple(classes)}")
  fractions = _class_fractions(data_config)
  if fractions:
    allowed = (list(classes) if classes is not None
               else list(range(num_classes)) if num_classes is not None else None)
    bad = [c for c in fractions if allowed is not None and c not in allowed]
    if bad:
      raise ConfigError("data.class_fractions", f"class {bad[0]} is not a kept class; allowed "
                        f"keys: {allowed}")


def _check_common(data_config) -> None:
  """Checks of fields that do not depend on the dataset."""
  for field in FIELDS:
    _get(data_config, field)
  normalize = data_config["normalize"]
  if normalize not in NORMALIZE:
    raise ConfigError("data.normalize", f"got {normalize!r}; allowed: {', '.join(NORMALIZE)}")
  num_train = data_config["num_train"]
  if num_train is not None and (not _is_int(num_train) or num_train < 1):
    raise ConfigError("data.num_train", f"must be None or a positive int, got {num_train!r}")
  random_labels = data_config.get("random_labels")
  if random_labels is not None and not (
      isinstance(random_labels, numbers.Real) and not isinstance(random_labels, bool)
      and 0 < random_labels <= 1):
    raise ConfigError("data.random_labels", "must be None (true labels) or the fraction in "
                      f"(0, 1] of train labels replaced by random ones, got {random_labels!r}")
  size = data_config["image_size"]
  if size is not None and (isinstance(size, str) or not isinstance(size, Sequence) or
                           len(size) != 2 or not all(_is_int(s) and s > 0 for s in size)):
    raise ConfigError("data.image_size", f"must be None or (H, W) positive ints, got {size!r}")
  data_dir = data_config["data_dir"]
  if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
    raise ConfigError("data.data_dir", f"must be None, a local path or gs://..., got {data_dir!r}")
  for field in ("image_key", "label_key"):
    if not isinstance(data_config[field], str) or not data_config[field]:
      raise ConfigError(f"data.{field}", f"must be a feature name, got {data_config[field]!r}")
  name = data_config["name"]
  if not isinstance(name, str) or not name:
    raise ConfigError("data.name", f"must be one of {', '.join(EMBEDDED)}, synthetic/<kind> or a "
                      f"TFDS name, got {name!r}")


def _check_keys(features, data_config, name: str) -> int | None:
  """Checks image/label keys against TFDS features; returns the number of classes if known."""
  keys = list(features.keys())
  for field in ("image_key", "label_key"):
    if data_config[field] not in keys:
      raise ConfigError(f"data.{field}", f"dataset {name!r} has no feature "
                        f"{data_config[field]!r}; allowed: {', '.join(map(repr, keys))}")
  image = features[data_config["image_key"]]
  shape = tuple(image.shape)
  if len(shape) not in (2, 3) or any(s is None for s in shape):
    raise ConfigError("data.image_key", f"feature {data_config['image_key']!r} of {name!r} has "
                      f"shape {shape}; need a fixed [H, W] or [H, W, C] image")
  return getattr(features[data_config["label_key"]], "num_classes", None)


def validate_data_config(data_config) -> None:
  """Raises `ConfigError` for any bad `data.*` field.

  Reads no examples: embedded datasets are not prepared; a TFDS dataset is opened (its metadata
  and file indexes), which reports a missing dataset, a bad split or a missing feature key.
  Text datasets (`is_text`) are checked by `xsens.data.text`. A `data.stream` block is
  refused: `xsens.data.streaming.validate_data_config` checks any `data` block.
  """
  if data_config.get("stream") is not None:
    raise ConfigError("data.stream", "a streamed dataset is read by xsens.data.streaming "
                      "(`streaming.validate_data_config` checks it), not loaded in memory; "
                      "remove data.stream to load it here")
  if is_text(data_config):
    text.validate_text_data_config(data_config)
    return
  _check_common(data_config)
  if data_config["train_split"] == data_config["test_split"]:
    raise ConfigError("data.test_split", f"must differ from data.train_split, both are "
                      f"{data_config['test_split']!r}; e.g. 'train[:90%]' and 'train[90%:]'")
  name = data_config["name"]
  if name.startswith(SYNTHETIC_PREFIX):
    kind = _synthetic_kind(name)
    _, _, kwargs = _synthetic_kwargs(data_config, kind)
    try:  # Cheap: a one-example draw checks every kind-specific field.
      num_classes = synthetic.SYNTHETIC[kind](1, 0, **kwargs)[2]
    except TypeError as e:
      raise ConfigError("data.synthetic", f"bad fields for {name!r}: {e}") from e
    _check_classes(data_config, num_classes)
    return
  if name in EMBEDDED:
    for role in ROLES:
      splits.check_split_names(data_config[f"{role}_split"], _role_field(role), _EMBEDDED_SPLITS)
    for field in ("image_key", "label_key"):
      if data_config[field] != field.split("_")[0]:
        raise ConfigError(f"data.{field}", f"embedded dataset {name!r} has features 'image' and "
                          f"'label', got {data_config[field]!r}")
    _check_classes(data_config, _EMBEDDED_NUM_CLASSES)
    return
  data_dir = splits.resolve_data_dir(data_config)
  for role in ROLES:
    _, features = _open_tfds(name, data_dir, data_config[f"{role}_split"], _role_field(role))
  num_classes = _check_keys(features, data_config, name)
  _check_classes(data_config, num_classes)


# ------------------------------------------------------------------------------------------------
# Raw sources.


def _open_tfds(name: str, data_dir: str, split: str, field: str):
  """Opens one split of a prepared TFDS dataset without reading examples.

  Returns:
    (random-access source with __len__/__getitem__, FeaturesDict).
  """
  splits.split_names(split, field)  # Syntax.
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ConfigError("data.name", f"unknown dataset {name!r}; allowed: {', '.join(EMBEDDED)}, "
                      f"{', '.join(SYNTHETIC_PREFIX + k for k in synthetic.SYNTHETIC)} or a TFDS "
                      "name (tfds.list_builders(with_community_datasets=False))") from None
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError("data.name", f"cannot open TFDS dataset {name!r} in data_dir "
                      f"{data_dir!r}: {type(e).__name__}: {e}") from e
  if builder.is_prepared():
    splits.check_split_names(split, field, list(builder.info.splits.keys()))
  try:
    source = builder.as_data_source(split=split)
  except Exception as e:  # pylint: disable=broad-except
    # The order matters: `tfds.testing.mock_data` serves sources of unprepared builders.
    if not builder.is_prepared():
      raise splits.not_found(name, data_dir) from e
    file_format = getattr(builder.info.file_format, "value", builder.info.file_format)
    if str(file_format) != _FILE_FORMAT:
      raise ConfigError(
          "data.name", f"dataset {name!r} in {data_dir!r} is stored as {file_format}, which "
          "needs TensorFlow to read; re-prepare it as array_record: `tfds build "
          f"{name} --data_dir={data_dir} --file_format=array_record`") from e
    raise
  return source, builder.info.features


def _prepare_embedded(name: str, data_dir: str):
  """Prepares the embedded dataset `name` under data_dir if it is not; returns its builder.

  With several JAX processes every process calls this (data loading is the same on every
  process): process 0 prepares, all wait at a barrier (`sync_global_devices`), then a
  process that still finds no prepared copy (a data_dir on a disk its host does not share
  with process 0) prepares its own, under a lock file when data_dir is local so that the
  processes of one host (of this run or of others) do not prepare it at once.
  """
  def make():
    return builders.BUILDERS[name](data_dir=data_dir, file_format=_FILE_FORMAT)

  builder = make()
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    if jax.process_index() == 0 and not builder.is_prepared():
      builder.download_and_prepare(file_format=_FILE_FORMAT)
    multihost_utils.sync_global_devices(f"xsens_prepare_{name}")
    builder = make()  # Re-reads the dataset info process 0 wrote.
  if builder.is_prepared():
    return builder
  if "://" in data_dir:
    builder.download_and_prepare(file_format=_FILE_FORMAT)
    return builder
  # A local data_dir may be shared by processes that are not one JAX run either (e.g. the
  # test suite's workers): they too must not prepare it at once (TFDS then fails to
  # rename its incomplete directory onto the one another process finished).
  import fcntl  # pylint: disable=g-import-not-at-top
  os.makedirs(data_dir, exist_ok=True)
  with open(os.path.join(data_dir, f".{name}.prepare.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    builder = make()
    if not builder.is_prepared():
      builder.download_and_prepare(file_format=_FILE_FORMAT)
  return builder


def _open_embedded(name: str, data_dir: str, split: str, field: str):
  """Prepares the embedded dataset under data_dir if needed, then opens one split."""
  splits.check_split_names(split, field, _EMBEDDED_SPLITS)
  builder = _prepare_embedded(name, data_dir)
  return builder.as_data_source(split=split), builder.info.features


@functools.lru_cache(maxsize=8)
def _read_raw(name: str, data_dir: str, split: str, field: str, image_key: str,
              label_key: str) -> tuple[np.ndarray, np.ndarray, int | None]:
  """Reads a whole TFDS split (embedded or not) into read-only arrays.

  Returns:
    images [N, H, W, C] as stored (uint8 for images), labels [N] int64, num_classes (None if the
    label feature is not a ClassLabel).
  """
  opener = _open_embedded if name in EMBEDDED else _open_tfds
  source, features = opener(name, data_dir, split, field)
  num_classes = getattr(features[label_key], "num_classes", None)
  image_feature = features[image_key]
  shape = tuple(image_feature.shape)
  n = len(source)
  images = np.empty((n,) + shape, dtype=image_feature.np_dtype)
  labels = np.empty((n,), dtype=np.int64)
  for start in range(0, n, _READ_BATCH):
    examples = splits.get_items(source, list(range(start, min(n, start + _READ_BATCH))))
    images[start:start + len(examples)] = np.stack([e[image_key] for e in examples])
    labels[start:start + len(examples)] = [e[label_key] for e in examples]
  if images.ndim == 3:
    images = images[..., None]
  images.setflags(write=False)
  labels.setflags(write=False)
  return images, labels, num_classes


def clear_cache() -> None:
  """Forgets the memoised raw splits (e.g. after re-preparing a dataset)."""
  _read_raw.cache_clear()


def _raw_split(data_config, role: str, seed: int) -> tuple[np.ndarray, np.ndarray, int, bool]:
  """(images, labels, num_classes, is_pixels) of one split before any preprocessing."""
  name = data_config["name"]
  if name.startswith(SYNTHETIC_PREFIX):
    kind = _synthetic_kind(name)
    num_train, num_test, kwargs = _synthetic_kwargs(data_config, kind)
    n = num_train if role == "train" else num_test
    images, labels, num_classes = synthetic.SYNTHETIC[kind](
        n, seed, stream=ROLES.index(role), **kwargs)
    return images, labels.astype(np.int64), num_classes, False
  images, labels, num_classes = _read_raw(
      name, splits.resolve_data_dir(data_config), data_config[f"{role}_split"],
      _role_field(role), data_config["image_key"], data_config["label_key"])
  if num_classes is None:
    num_classes = int(labels.max()) + 1 if len(labels) else 0
  return images, labels, int(num_classes), True


# ------------------------------------------------------------------------------------------------
# Preprocessing: small pure functions.


def class_indices(labels: np.ndarray, classes: Sequence[int] | None) -> np.ndarray:
  """Indices of the examples whose label is in `classes` (all if None), in order. [N] -> [M]."""
  if classes is None:
    return np.arange(len(labels))
  return np.flatnonzero(np.isin(labels, np.asarray(classes)))


def relabel(labels: np.ndarray, classes: Sequence[int] | None) -> np.ndarray:
  """Maps classes[i] -> i (identity if None). [N] -> [N] int32."""
  if classes is None:
    return labels.astype(np.int32)
  classes = np.asarray(classes, np.int64)
  lookup = np.full(max(int(classes.max()), int(labels.max(initial=0))) + 1, -1, np.int32)
  lookup[classes] = np.arange(len(classes), dtype=np.int32)
  out = lookup[labels]
  if (out < 0).any():
    raise ValueError(f"labels outside classes {tuple(classes)}")
  return out


def class_fraction_indices(labels: np.ndarray, fractions: Mapping[int, float],
                           seed: int) -> np.ndarray:
  """Per class c in `fractions`, keeps round_half_up(f * n_c) examples; others keep all.

  The kept examples of class c are the first of `default_rng([seed, 1, c]).permutation(n_c)`.

  Args:
    labels: [N] original class ids.
    fractions: {class id: fraction in (0, 1]}.
    seed: subsampling seed.

  Returns:
    [M] sorted indices into `labels`.
  """
  keep = np.ones(len(labels), bool)
  for c, f in fractions.items():
    idx = np.flatnonzero(labels == c)
    n_keep = int(np.floor(f * len(idx) + 0.5))
    perm = np.random.default_rng([seed, 1, int(c)]).permutation(len(idx))
    keep[idx[perm[n_keep:]]] = False
  return np.flatnonzero(keep)


def scale_pixels(images: np.ndarray, normalize: str, is_pixels: bool) -> np.ndarray:
  """Pixel scaling of one `normalize` mode, before any standardisation. -> float32."""
  x = images.astype(np.float32)
  if not is_pixels:
    return x
  x = x / np.float32(255.0)
  if normalize == "half":
    x = (x - np.float32(0.5)) / np.float32(0.5)
  return x


def channel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-channel mean and std over [N, H, W]. [N, H, W, C] -> ([C], [C]) float32."""
  x = images.astype(np.float64)
  mean = x.mean(axis=(0, 1, 2))
  std = x.std(axis=(0, 1, 2))
  return mean.astype(np.float32), np.maximum(std, 1e-6).astype(np.float32)


def resize(images: np.ndarray, image_size: Sequence[int]) -> np.ndarray:
  """Bilinear resize on the host CPU. [N, H, W, C] -> [N, image_size[0], image_size[1], C]."""
  n, h, w, c = images.shape
  if (h, w) == tuple(image_size):
    return images
  cpu = jax.devices("cpu")[0]
  out = []
  with jax.default_device(cpu):
    for start in range(0, n, _RESIZE_CHUNK):
      chunk = jax.device_put(images[start:start + _RESIZE_CHUNK], cpu)
      shape = (chunk.shape[0], int(image_size[0]), int(image_size[1]), c)
      out.append(np.asarray(jax.image.resize(chunk, shape, "bilinear")))
  if not out:
    return np.zeros((0, int(image_size[0]), int(image_size[1]), c), np.float32)
  return np.concatenate(out).astype(np.float32)


def _selected(data_config, role: str, seed: int) -> tuple[np.ndarray, np.ndarray, int, bool]:
  """Steps 1-3 (class filter, class fractions, num_train); labels relabelled 0..k-1."""
  images, labels, num_classes, is_pixels = _raw_split(data_config, role, seed)
  classes = data_config["classes"]
  if classes is not None:
    bad = [c for c in classes if not 0 <= c < num_classes]
    if bad:
      raise ConfigError("data.classes", f"class ids must be in 0..{num_classes - 1}, "
                        f"got {tuple(classes)}")
  idx = class_indices(labels, classes)
  if role == "train":
    fractions = _class_fractions(data_config)
    if fractions:
      idx = idx[class_fraction_indices(labels[idx], fractions, seed)]
    num_train = data_config["num_train"]
    if num_train is not None:
      if num_train > len(idx):
        raise ConfigError("data.num_train", f"asks for {num_train} examples but the train split "
                          f"has {len(idx)} after class selection; allowed: 1..{len(idx)}")
      idx = idx[subset_indices(len(idx), num_train, seed)]
  num_out = len(classes) if classes is not None else num_classes
  out_labels = relabel(labels[idx], classes)
  if role == "train" and data_config.get("random_labels") is not None:
    out_labels = randomize_labels(out_labels, int(num_out), data_config["random_labels"], seed)
  return images[idx], out_labels, int(num_out), is_pixels


def randomize_labels(labels: np.ndarray, num_classes: int, fraction: float,
                     seed: int) -> np.ndarray:
  """Step 3b: the first round_half_up(fraction * n) examples of a permutation drawn from
  `default_rng([seed, 3])` get labels drawn uniformly from 0..num_classes-1 (same generator).
  [n] int -> [n], a new array."""
  rng = np.random.default_rng([seed, 3])
  n = len(labels)
  chosen = rng.permutation(n)[:int(np.floor(fraction * n + 0.5))]
  out = np.array(labels, copy=True)
  out[chosen] = rng.integers(0, num_classes, size=len(chosen)).astype(out.dtype)
  return out


def load_split(data_config, split: str, *, seed: int = 0) -> Split:
  """Loads and preprocesses one split (see the module docstring for the steps).

  Args:
    data_config: the `data` ConfigDict (`xsens.data.config.default_data_config()`).
    split: which split: `data.train_split` or `data.test_split` (the TFDS split strings as
      configured) or the role names "train" / "test" (see `split_role`). Train-only steps
      (class_fractions, num_train) and standardisation statistics follow the role.
    seed: seeds the subsampling and synthetic sources.

  Returns:
    The split, images [N, H, W, C] float32 and labels [N] int32, in a random order fixed
    by `seed` and the role: stored datasets are often sorted by class (mnist5k is), and
    measures evaluate "the first n examples", which must be a random sample.
  """
  if is_text(data_config):
    return text.load_text_split(data_config, split, seed=seed)
  validate_data_config(data_config)
  role = split_role(data_config, split)
  normalize = data_config["normalize"]
  images, labels, num_classes, is_pixels = _selected(data_config, role, seed)
  x = scale_pixels(images, normalize, is_pixels)
  if normalize == "standardize":
    train = x if role == "train" else scale_pixels(
        _selected(data_config, "train", seed)[0], normalize, is_pixels)
    mean, std = channel_stats(train)
    x = (x - mean) / std
  if data_config["image_size"] is not None:
    x = resize(x, data_config["image_size"])
  order = np.random.default_rng([seed, _ROLE_STREAM[role], len(labels)]).permutation(
      len(labels))
  return Split(inputs=np.ascontiguousarray(x[order], dtype=np.float32),
               labels=np.asarray(labels)[order], num_classes=num_classes)


_ROLE_STREAM = {"train": 0, "test": 1}
