"""Streaming a prepared TFDS image-classification split (e.g. ImageNet) batch by batch: the
TFDS opening (`open_source`: TF-free `as_data_source`), the evaluation `Stream`, and the
`data.stream` block the trainer reads (checks, the evaluation streams). The training stream
is `xsens.data.train_stream`; per-image decoding, crops and normalisation are
`xsens.data.image_prep`.

`xsens.data.pipeline.load_split` holds a whole split in host memory as one fixed-shape float32
array. That cannot hold imagenet2012 (variable-size JPEGs; 50k validation images are ~30 GB
as float32 at 224²). `open_stream` instead opens a prepared TFDS dataset (ArrayRecord, TF-free,
via `DatasetBuilder.as_data_source`) and reads examples by index, batch by batch:

  1. order: a permutation of the split drawn from `np.random.default_rng([seed, 3])`, cut to
     the first `limit` (all if None). So the first k examples of a stream are a uniform random
     sample, nested in the stream of any larger `limit` with the same seed; `shuffle=False`
     keeps the stored order instead.
  2. decode: the image feature is read with `tfds.decode.SkipDecoding()` (the encoded bytes)
     and decoded with PIL (`image_prep.decode_image`) in a thread pool of `num_workers` (PIL
     releases the GIL while decoding).
  3. geometry (`crop`), per image on the uint8 pixels with PIL (`image_prep.preprocess_image`):
     "center" (the crop box of ImageNet-C) or "resize" (the whole image).
  4. `normalize` (`image_prep.normalize_pixels`): "zero_one", "half" ([-1, 1]) or "uint8".
  5. batches of exactly `batch_size` rows {"image", "label", "mask", "index"} like
     `xsens.train.trainer.eval_batches`: the last batch is padded by repeating its last real
     example, with mask 0 on the padding; "index" is the position in the split. With several
     JAX processes each yields its contiguous slice of every global batch.

Host memory is O(batch_size x image_size²) plus one batch read ahead, whatever the split size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import concurrent.futures
import dataclasses
import os
from typing import Any

import jax
import numpy as np
import tensorflow_datasets as tfds

from xsens.data import image_prep
from xsens.data import pipeline
from xsens.data import splits as data_splits
from xsens.errors import ConfigError

_ORDER_STREAM = 3  # default_rng([seed, 3]); pipeline uses streams 0-2.


# ------------------------------------------------------------------------------------------------
# Opening a dataset.


def _resolve_data_dir(data_dir) -> str:
  if data_dir is None:
    return pipeline.default_data_dir()
  data_dir = os.fspath(data_dir)
  return data_dir if "://" in data_dir else os.path.expanduser(data_dir)


def open_source(name: str, split: str, data_dir: str, image_key: str, label_key: str,
                field: str, split_field: str):
  """(random-access source with encoded images, num_classes). ConfigErrors name the fields.

  An embedded dataset (`pipeline.EMBEDDED`, e.g. "mnist5k") is prepared in data_dir first.
  """
  if not isinstance(name, str) or not name:
    raise ConfigError(field, f"must be a TFDS dataset name, got {name!r}")
  data_splits.split_names(split, split_field)
  try:
    if name in pipeline.EMBEDDED:
      builder = pipeline._prepare_embedded(name, data_dir)  # pylint: disable=protected-access
    else:
      builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ConfigError(field, f"unknown TFDS dataset {name!r} (see "
                      "tfds.list_builders(with_community_datasets=False))") from None
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError(field, f"cannot open TFDS dataset {name!r} in data_dir {data_dir!r}: "
                      f"{type(e).__name__}: {e}") from e
  prepared = builder.is_prepared()
  if prepared:
    splits = list(builder.info.splits.keys())
    data_splits.check_split_names(split, split_field, splits)
  features = builder.info.features
  keys = list(features.keys())
  prefix = field.rsplit(".", 1)[0] + "." if "." in field else ""
  for key, key_field in ((image_key, "image_key"), (label_key, "label_key")):
    if key not in keys:
      raise ConfigError(f"{prefix}{key_field}", f"dataset {name!r} has no feature {key!r}; "
                        f"allowed: {', '.join(map(repr, keys))}")
  # Encoded bytes, decoded by us with PIL. Not under `tfds.testing.mock_data` (an unprepared
  # builder serving random arrays), whose decoders path would need TensorFlow.
  decoders = None
  if prepared and isinstance(features[image_key], tfds.features.Image):
    decoders = {image_key: tfds.decode.SkipDecoding()}
  try:
    source = builder.as_data_source(split=split, decoders=decoders)
  except Exception as e:  # pylint: disable=broad-except
    if not prepared:
      not_found = data_splits.not_found(name, data_dir)
      raise ConfigError(field, not_found.message) from e
    file_format = getattr(builder.info.file_format, "value", builder.info.file_format)
    if str(file_format) != "array_record":
      raise ConfigError(
          field, f"dataset {name!r} in {data_dir!r} is stored as {file_format}, which needs "
          f"TensorFlow to read; re-prepare it as array_record: `tfds build {name} "
          f"--data_dir={data_dir} --file_format=array_record`") from e
    raise
  num_classes = getattr(features[label_key], "num_classes", None)
  return source, num_classes


def is_prepared(name: str, data_dir=None) -> bool:
  """Whether TFDS dataset `name` (e.g. "imagenet2012_corrupted/fog_3") is prepared in data_dir."""
  try:
    return tfds.builder(name, data_dir=_resolve_data_dir(data_dir)).is_prepared()
  except Exception:  # pylint: disable=broad-except
    return False


def stream_order(num_examples: int, limit: int | None, seed: int, shuffle: bool = True
                 ) -> np.ndarray:
  """Positions read by a stream: the first `limit` of `default_rng([seed, 3]).permutation(n)`
  (of `arange(n)` without shuffle). [min(limit, n)] int64."""
  n_keep = num_examples if limit is None else min(int(limit), num_examples)
  if not shuffle:
    return np.arange(n_keep, dtype=np.int64)
  perm = np.random.default_rng([seed, _ORDER_STREAM]).permutation(num_examples)
  return perm[:n_keep].astype(np.int64)


@dataclasses.dataclass(frozen=True, eq=False)
class Stream:
  """Fixed-size evaluation batches of one TFDS split, read lazily (see `open_stream`)."""
  name: str
  split: str
  data_dir: str
  indices: np.ndarray          # [n] positions in the split, in read order.
  num_classes: int | None
  image_size: tuple[int, int]
  crop: str
  crop_fraction: float
  resample: str
  normalize: str
  batch_size: int
  num_workers: int
  image_key: str
  label_key: str
  source: Any = dataclasses.field(repr=False)

  def __len__(self) -> int:
    return len(self.indices)

  @property
  def num_batches(self) -> int:
    return -(-len(self.indices) // self.batch_size)

  @property
  def image_shape(self) -> tuple[int, int, int]:
    return (*self.image_size, 3)

  def _prepare(self, example) -> tuple[np.ndarray, int]:
    image = image_prep.decode_image(example[self.image_key])
    image = image_prep.preprocess_image(image, self.image_size, crop=self.crop,
                             crop_fraction=self.crop_fraction, resample=self.resample)
    return image, int(example[self.label_key])

  def read(self, positions: Sequence[int], pool=None) -> tuple[np.ndarray, np.ndarray]:
    """Reads, decodes and crops split positions. -> (uint8 [k, h, w, 3], int32 [k])."""
    positions = [int(p) for p in positions]
    if not positions:
      return (np.zeros((0, *self.image_shape), np.uint8), np.zeros((0,), np.int32))
    examples = data_splits.get_items(self.source, positions)
    mapper = pool.map if pool is not None else map
    out = list(mapper(self._prepare, examples))
    return (np.stack([o[0] for o in out]), np.asarray([o[1] for o in out], np.int32))

  def _batch_positions(self, start: int) -> tuple[np.ndarray, np.ndarray, slice]:
    n = len(self.indices)
    pos = np.arange(start, start + self.batch_size)
    mask = (pos < n).astype(np.float32)
    pc, pi = jax.process_count(), jax.process_index()
    local = slice(pi * self.batch_size // pc, (pi + 1) * self.batch_size // pc)
    return pos[local], mask[local], local

  def _assemble(self, pos, mask, read) -> dict[str, np.ndarray]:
    images, labels = read
    real = len(labels)
    n_pad = len(pos) - real
    if n_pad:
      images = np.concatenate([images, np.repeat(images[-1:], n_pad, axis=0)])
      labels = np.concatenate([labels, np.repeat(labels[-1:], n_pad)])
    index = self.indices[np.minimum(pos, len(self.indices) - 1)]
    return {"image": image_prep.normalize_pixels(images, self.normalize), "label": labels,
            "mask": mask, "index": index}

  def batches(self) -> Iterator[dict[str, np.ndarray]]:
    """Yields {"image" [B, h, w, 3] (normalised), "label" [B] int32, "mask" [B] float32,
    "index" [B] int64} of this process's share of each global batch, in stream order; one batch
    is read ahead in the background."""
    if not len(self.indices):
      return
    n = len(self.indices)
    starts = list(range(0, n, self.batch_size))

    def job(start, pool):
      pos, mask, _ = self._batch_positions(start)
      real = pos[pos < n]
      if not len(real):  # This process's slice is all padding: reuse the last example.
        real = np.asarray([n - 1])
        mask = np.zeros_like(mask)
      return pos, mask, self.read(self.indices[real], pool)

    workers = max(1, int(self.num_workers))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool, \
        concurrent.futures.ThreadPoolExecutor(1) as ahead:
      future = ahead.submit(job, starts[0], pool)
      for k in range(len(starts)):
        pos, mask, read = future.result()
        if k + 1 < len(starts):
          future = ahead.submit(job, starts[k + 1], pool)
        yield self._assemble(pos, mask, read)

  def materialize(self, limit: int | None = None) -> pipeline.Split:
    """The first `limit` (default all) examples as an in-memory `pipeline.Split` (no padding).

    Memory: limit x h x w x 3 x (1 byte for normalize="uint8", else 4 bytes).
    """
    n = len(self.indices) if limit is None else min(int(limit), len(self.indices))
    images, labels = [], []
    sub = dataclasses.replace(self, indices=self.indices[:n])
    for batch in sub.batches():
      keep = batch["mask"] > 0
      images.append(batch["image"][keep])
      labels.append(batch["label"][keep])
    if not images:
      raise ValueError("cannot materialise an empty stream")
    return pipeline.Split(inputs=np.concatenate(images), labels=np.concatenate(labels),
                          num_classes=int(self.num_classes or 0))


def open_stream(name: str | None = None, *, split: str = "validation", data_dir=None,
                data_config=None, image_size: int | Sequence[int] = 224, crop: str = "center",
                crop_fraction: float = image_prep.IMAGENET_C_CROP, resample: str = "bicubic",
                normalize: str = "half", limit: int | None = None, seed: int = 0,
                shuffle: bool = True, batch_size: int = 256, num_workers: int = 4,
                image_key: str = "image", label_key: str = "label",
                field: str = "data.name", split_field: str = "data.test_split") -> Stream:
  """Opens one split of a prepared TFDS image-classification dataset as a `Stream`.

  Works for any dataset whose image feature is a `tfds.features.Image` (any size, encoded)
  or a uint8 tensor, e.g. "imagenet2012" (split "validation") or
  "imagenet2012_corrupted/gaussian_noise_3" (split "validation"). Nothing is read until the
  stream is iterated, but the dataset's metadata is opened, so a missing dataset, split or
  feature raises `ConfigError` here.

  Args:
    name: TFDS name (with config, e.g. "imagenet2012_corrupted/fog_5"); or None with
      `data_config`.
    split: TFDS split string ("validation", "validation[:1000]", ...).
    data_dir: TFDS data dir (None: $TFDS_DATA_DIR or ~/tensorflow_datasets). xsens never
      downloads.
    data_config: a `data` ConfigDict (`xsens.data.config.default_data_config()`): its name,
      data_dir, test_split, image_key, label_key (and image_size if set) are used unless
      given explicitly; ConfigErrors then name `data.*`.
    image_size: output side (int) or (H, W).
    crop: "center" or "resize" (module docstring, step 3).
    crop_fraction: side of the "center" crop relative to the shorter image side.
    resample: "bicubic", "bilinear" or "nearest".
    normalize: "half" ([-1, 1]), "zero_one" or "uint8".
    limit: read only this many examples (None: the whole split).
    seed: seeds the order (module docstring, step 1).
    shuffle: False reads the first `limit` examples in stored order.
    batch_size: global batch size (rows per batch, padding included).
    num_workers: decoding threads.
    image_key, label_key: feature names.
    field, split_field: config field names used in ConfigError messages.

  Returns:
    A `Stream`; iterate `stream.batches()`.

  Raises:
    ConfigError: naming `field` (or `split_field`) for a missing/unknown dataset, a bad
      split or feature key, or a bad setting.
  """
  if data_config is not None:
    name = data_config["name"] if name is None else name
    data_dir = data_config["data_dir"] if data_dir is None else data_dir
    split = data_config["test_split"]
    image_key, label_key = data_config["image_key"], data_config["label_key"]
    if data_config.get("image_size") is not None:
      image_size = tuple(data_config["image_size"])
    field, split_field = "data.name", "data.test_split"
  prefix = field.rsplit(".", 1)[0] + "." if "." in field else ""
  size = (image_size, image_size) if isinstance(image_size, (int, np.integer)) else image_size
  if (isinstance(size, str) or len(tuple(size)) != 2 or
      not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s > 0
              for s in size)):
    raise ConfigError(f"{prefix}image_size", f"must be a positive int or (H, W), got "
                      f"{image_size!r}")
  if crop not in image_prep.CROPS:
    raise ConfigError(f"{prefix}crop", f"got {crop!r}; allowed: {', '.join(image_prep.CROPS)}")
  if not 0 < crop_fraction <= 1:
    raise ConfigError(f"{prefix}crop_fraction", f"must be in (0, 1], got {crop_fraction!r}")
  if resample not in image_prep.RESAMPLE:
    raise ConfigError(f"{prefix}resample", f"got {resample!r}; allowed: "
                      f"{', '.join(image_prep.RESAMPLE)}")
  if normalize not in image_prep.NORMALIZE:
    raise ConfigError(f"{prefix}normalize", f"got {normalize!r}; allowed: "
                      f"{', '.join(image_prep.NORMALIZE)}")
  if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer))
                            or limit < 1):
    raise ConfigError(f"{prefix}limit", f"must be None or a positive int, got {limit!r}")
  for value, what in ((batch_size, "batch_size"), (num_workers, "num_workers")):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise ConfigError(f"{prefix}{what}", f"must be a positive int, got {value!r}")
  if batch_size % jax.process_count():
    raise ConfigError(f"{prefix}batch_size", f"{batch_size} must be divisible by the process "
                      f"count {jax.process_count()}")
  data_dir = _resolve_data_dir(data_dir)
  source, num_classes = open_source(name, split, data_dir, image_key, label_key, field, split_field)
  return Stream(name=name, split=split, data_dir=data_dir,
                indices=stream_order(len(source), limit, seed, shuffle),
                num_classes=None if num_classes is None else int(num_classes),
                image_size=(int(size[0]), int(size[1])), crop=crop,
                crop_fraction=float(crop_fraction), resample=resample, normalize=normalize,
                batch_size=int(batch_size), num_workers=int(num_workers), image_key=image_key,
                label_key=label_key, source=source)


# ------------------------------------------------------------------------------------------------
# The trainer's side: the `data.stream` block (`xsens.data.config.stream_config`).


def is_streaming(data_config) -> bool:
  """Whether `data_config` asks to stream (a `data.stream` block is set)."""
  return data_config.get("stream") is not None


_NOT_WHEN_STREAMING = ("classes", "class_fractions", "num_train", "random_labels")


def _is_int(value, low: int) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= low


def _check_range(value, field: str, upper: float | None) -> tuple[float, float]:
  ok = (not isinstance(value, str) and hasattr(value, "__len__") and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        and 0 < value[0] <= value[1] and (upper is None or value[1] <= upper))
  if not ok:
    bound = f" <= {upper}" if upper is not None else ""
    raise ConfigError(field, f"must be (low, high) with 0 < low <= high{bound}, got {value!r}")
  return float(value[0]), float(value[1])


def augment_from_config(block) -> image_prep.Augment:
  """The `image_prep.Augment` of a `data.stream` block; ConfigError naming `data.stream.<field>`."""
  from xsens.data import config as data_config_lib  # pylint: disable=g-import-not-at-top
  allowed = data_config_lib.stream_config()
  unknown = sorted(set(block) - set(allowed))
  if unknown:
    raise ConfigError(f"data.stream.{unknown[0]}", f"unknown field; allowed: "
                      f"{', '.join(sorted(allowed))}")
  b = {**allowed.to_dict(), **dict(block)}
  f = "data.stream."
  if b["crop"] not in image_prep.TRAIN_CROPS:
    raise ConfigError(f + "crop", f"got {b['crop']!r}; allowed: "
                      f"{', '.join(image_prep.TRAIN_CROPS)}")
  area = _check_range(b["area_range"], f + "area_range", 1.0)
  aspect = _check_range(b["aspect_range"], f + "aspect_range", None)
  for field, low in (("pad", 0), ("num_workers", 0), ("worker_buffer_size", 1),
                     ("eval_threads", 1)):
    if not _is_int(b[field], low):
      raise ConfigError(f + field, f"must be an int >= {low}, got {b[field]!r}")
  if not isinstance(b["flip"], bool):
    raise ConfigError(f + "flip", f"must be True or False, got {b['flip']!r}")
  for field in ("resample", "eval_resample"):
    if b[field] not in image_prep.RESAMPLE:
      raise ConfigError(f + field, f"got {b[field]!r}; allowed: {', '.join(image_prep.RESAMPLE)}")
  if b["eval_crop"] not in image_prep.CROPS:
    raise ConfigError(f + "eval_crop", f"got {b['eval_crop']!r}; allowed: "
                      f"{', '.join(image_prep.CROPS)}")
  frac = b["eval_crop_fraction"]
  if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
    raise ConfigError(f + "eval_crop_fraction", f"must be in (0, 1], got {frac!r}")
  return image_prep.Augment(crop=b["crop"], area_range=area, aspect_range=aspect, pad=int(b["pad"]),
                 flip=b["flip"], resample=b["resample"])


def validate_data_config(data_config) -> None:
  """Raises `ConfigError` for any bad `data.*` field: a block with `stream` set is checked
  here (`validate_stream_data_config`), any other by `pipeline.validate_data_config`."""
  if is_streaming(data_config):
    validate_stream_data_config(data_config)
  else:
    pipeline.validate_data_config(data_config)


def validate_stream_data_config(data_config) -> None:
  """Checks a `data` block with `stream` set: the block's fields, the fields that streaming
  does not offer, and the dataset, splits and feature keys (metadata only)."""
  augment_from_config(data_config["stream"])
  name = data_config["name"]
  if (not isinstance(name, str) or pipeline.is_text(data_config)
      or name.startswith(pipeline.SYNTHETIC_PREFIX)):
    raise ConfigError("data.name", f"streaming (data.stream) reads a TFDS image dataset "
                      f"(prepared, or embedded: {', '.join(pipeline.EMBEDDED)}), not {name!r}; "
                      "remove data.stream to load it in memory")
  pipeline._check_common(data_config)  # pylint: disable=protected-access
  for field in _NOT_WHEN_STREAMING:
    if data_config.get(field) is not None:
      raise ConfigError(f"data.{field}", f"is not available when streaming (data.stream is "
                        f"set); got {data_config[field]!r}, use None")
  image_size_field(data_config)
  if data_config["normalize"] not in ("half", "zero_one"):
    raise ConfigError("data.normalize", f"{data_config['normalize']!r} is not available "
                      "when streaming; allowed: half, zero_one")
  if data_config["train_split"] == data_config["test_split"]:
    raise ConfigError("data.test_split", f"must differ from data.train_split, both are "
                      f"{data_config['test_split']!r}")
  data_dir = _resolve_data_dir(data_config["data_dir"])
  for role in ("train", "test"):
    open_source(name, data_config[f"{role}_split"], data_dir, data_config["image_key"],
          data_config["label_key"], "data.name", f"data.{role}_split")


def open_eval_stream(data_config, role: str, *, batch_size: int,
                     limit: int | None = None) -> Stream:
  """The `role` ("train" / "test") split with the `data.stream` block's evaluation crop, as a
  `Stream` of fixed `batch_size` (global) batches in stored order."""
  block = {**stream_defaults(), **dict(data_config["stream"])}
  return open_stream(
      data_config["name"], split=data_config[f"{role}_split"],
      data_dir=data_config["data_dir"], image_size=image_size_field(data_config),
      crop=block["eval_crop"], crop_fraction=block["eval_crop_fraction"],
      resample=block["eval_resample"], normalize=data_config["normalize"], limit=limit,
      shuffle=False, batch_size=batch_size, num_workers=block["eval_threads"],
      image_key=data_config["image_key"], label_key=data_config["label_key"],
      field="data.name", split_field=f"data.{role}_split")


def stream_defaults() -> dict:
  from xsens.data import config as data_config_lib  # pylint: disable=g-import-not-at-top
  return data_config_lib.stream_config().to_dict()


def image_size_field(data_config) -> tuple[int, int]:
  size = data_config.get("image_size")
  if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
    size = (size, size)
  if (size is None or isinstance(size, str) or len(tuple(size)) != 2 or
      not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s > 0
              for s in size)):
    raise ConfigError("data.image_size", f"must be (H, W) when streaming (every image is "
                      f"cropped to it), got {size!r}")
  return int(size[0]), int(size[1])
