"""Streaming batches from large TFDS image-classification splits (e.g. ImageNet): one module,
two modes sharing the TFDS opening (`_open`: TF-free `as_data_source`), the decoding
(`decode_image`), PIL resizing and `normalize_pixels`:

- evaluation (`open_stream` -> `Stream`, described below): a fixed, padded pass over a split;
- training (`open_train_stream` -> `TrainStream`, at the end of this module): an endless,
  per-process-sharded grain stream with random crops and flips, whose iterator state the
  trainer checkpoints (`data.stream`, `xsens.data.config.stream_config`).

Evaluation mode:

`xsens.data.pipeline.load_split` holds a whole split in host memory as one fixed-shape float32
array. That cannot hold imagenet2012 (variable-size JPEGs; 50k validation images are ~30 GB
as float32 at 224²). `open_stream` instead opens a prepared TFDS dataset (ArrayRecord, TF-free,
via `DatasetBuilder.as_data_source`) and reads examples by index, batch by batch:

  1. order: a permutation of the split drawn from `np.random.default_rng([seed, 3])`, cut to
     the first `limit` (all if None). So the first k examples of a stream are a uniform random
     sample, nested in the stream of any larger `limit` with the same seed; `shuffle=False`
     keeps the stored order instead.
  2. decode: the image feature is read with `tfds.decode.SkipDecoding()` (the encoded bytes)
     and decoded with PIL to RGB uint8 (grayscale repeated to 3 channels, CMYK converted, alpha
     dropped) in a thread pool of `num_workers` (PIL releases the GIL while decoding). Already
     decoded arrays (e.g. `tensor` features or `tfds.testing.mock_data` without decoders) pass
     through unchanged. TFDS 4.9.10 itself would decode with OpenCV if installed, else PIL
     (`tfds.features.Image.decode_example_np`); decoding here ourselves also makes CMYK and
     grayscale JPEGs come out as 3-channel RGB.
  3. geometry (`crop`), per image on the uint8 pixels with PIL:
       "center": the central square of side int(crop_fraction * min(H, W)), offsets
         ((H - s + 1) // 2, (W - s + 1) // 2), then resized to `image_size` with `resample`.
         With crop_fraction 224/256 = 0.875 and "bicubic" this is the crop box TFDS's
         `imagenet2012_corrupted` builder used to make ImageNet-C (`_decode_and_center_crop`:
         224 / (224 + 32) of the shorter side, bicubic to 224 x 224), so clean and
         pre-corrupted images show the same region. The resampling differs: PIL's bicubic
         antialiases when shrinking, TensorFlow's does not, so clean images here are a
         little smoother than ImageNet-C's stored ones.
       "resize": the whole image resized to `image_size` (aspect ratio not kept). This is the
         eval preprocessing (up to PIL's antialiasing) of both public checkpoint releases: vit_jax
         `input_pipeline.get_data` (`tf.image.resize(im, [crop, crop])`, bilinear) and
         big_transfer `bit_pytorch/train.py` (`Resize((crop, crop))`).
  4. `normalize` as in `pipeline.scale_pixels`: "zero_one" x / 255, "half" (x / 255 - .5) / .5
     ([-1, 1], what vit_jax and big_transfer feed their models: `(im - 127.5) / 127.5` and
     `Normalize((.5, .5, .5), (.5, .5, .5))`), or "uint8" (raw pixels, e.g. to corrupt them
     first).
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
import io
import os
from typing import Any

import grain
import jax
import numpy as np
from PIL import Image
import tensorflow_datasets as tfds

from xsens.data import pipeline
from xsens.data import splits as data_splits
from xsens.errors import ConfigError

CROPS = ("center", "resize")
NORMALIZE = ("zero_one", "half", "uint8")
RESAMPLE = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}
IMAGENET_C_CROP = 224 / (224 + 32)  # TFDS imagenet2012_corrupted: _IMAGE_SIZE / (+ padding).
_ORDER_STREAM = 3  # default_rng([seed, 3]); pipeline uses streams 0-2.


# ------------------------------------------------------------------------------------------------
# Per-image geometry (pure NumPy / PIL).


def center_crop_box(height: int, width: int, fraction: float) -> tuple[int, int, int]:
  """(top, left, side) of the central square, TFDS imagenet2012_corrupted's arithmetic.

  side = int(fraction * min(H, W)) (at least 1), top = (H - side + 1) // 2,
  left = (W - side + 1) // 2.
  """
  side = max(1, int(fraction * min(height, width)))
  return (height - side + 1) // 2, (width - side + 1) // 2, side


def to_rgb(image: np.ndarray) -> np.ndarray:
  """[H, W] / [H, W, 1] / [H, W, 3] / [H, W, 4] uint8 -> [H, W, 3].

  Gray is repeated to three channels, alpha dropped.
  """
  image = np.asarray(image)
  if image.ndim == 2:
    image = image[..., None]
  if image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
    raise ValueError(f"need an [H, W, C] image with C in 1, 3, 4; got shape {image.shape}")
  if image.shape[-1] == 1:
    return np.repeat(image, 3, axis=-1)
  return image[..., :3]


def decode_image(value: Any) -> np.ndarray:
  """Encoded image bytes (JPEG, PNG, ...) or an already decoded array -> [H, W, 3] uint8."""
  if isinstance(value, (bytes, bytearray, memoryview, np.bytes_)):
    with Image.open(io.BytesIO(bytes(value))) as img:
      return np.asarray(img.convert("RGB"), dtype=np.uint8)
  array = np.asarray(value)
  if array.dtype == object and array.ndim == 0:  # A 0-d object array holding bytes.
    return decode_image(array.item())
  if array.dtype != np.uint8:
    raise ValueError(f"decoded images must be uint8, got {array.dtype}")
  return to_rgb(array)


def preprocess_image(image: np.ndarray, image_size: Sequence[int], *, crop: str = "center",
                     crop_fraction: float = IMAGENET_C_CROP,
                     resample: str = "bicubic") -> np.ndarray:
  """Crops and resizes one RGB uint8 image. [H, W, 3] -> [image_size[0], image_size[1], 3] uint8.

  See the module docstring (step 3) for "center" and "resize". Resizing is PIL's
  (antialiased when shrinking); an image already of the target size is returned as is.
  """
  if crop not in CROPS:
    raise ValueError(f"crop must be one of {', '.join(CROPS)}, got {crop!r}")
  h, w = image.shape[:2]
  if crop == "center":
    top, left, side = center_crop_box(h, w, crop_fraction)
    image = image[top:top + side, left:left + side]
  out_h, out_w = int(image_size[0]), int(image_size[1])
  if image.shape[:2] == (out_h, out_w):
    return np.ascontiguousarray(image)
  pil = Image.fromarray(np.ascontiguousarray(image))
  return np.asarray(pil.resize((out_w, out_h), RESAMPLE[resample]), dtype=np.uint8)


def normalize_pixels(images: np.ndarray, normalize: str) -> np.ndarray:
  """uint8 pixels -> model space: "zero_one", "half" (float32, as `pipeline.scale_pixels`) or
  "uint8" (unchanged). [...] -> same shape."""
  if normalize == "uint8":
    return images
  if normalize not in ("zero_one", "half"):
    raise ValueError(f"normalize must be one of {', '.join(NORMALIZE)}, got {normalize!r}")
  return pipeline.scale_pixels(images, normalize, True)


# ------------------------------------------------------------------------------------------------
# Opening a dataset.


def _resolve_data_dir(data_dir) -> str:
  if data_dir is None:
    return pipeline.default_data_dir()
  data_dir = os.fspath(data_dir)
  return data_dir if "://" in data_dir else os.path.expanduser(data_dir)


def _open(name: str, split: str, data_dir: str, image_key: str, label_key: str,
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
    image = decode_image(example[self.image_key])
    image = preprocess_image(image, self.image_size, crop=self.crop,
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
    return {"image": normalize_pixels(images, self.normalize), "label": labels,
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
                crop_fraction: float = IMAGENET_C_CROP, resample: str = "bicubic",
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
  if crop not in CROPS:
    raise ConfigError(f"{prefix}crop", f"got {crop!r}; allowed: {', '.join(CROPS)}")
  if not 0 < crop_fraction <= 1:
    raise ConfigError(f"{prefix}crop_fraction", f"must be in (0, 1], got {crop_fraction!r}")
  if resample not in RESAMPLE:
    raise ConfigError(f"{prefix}resample", f"got {resample!r}; allowed: {', '.join(RESAMPLE)}")
  if normalize not in NORMALIZE:
    raise ConfigError(f"{prefix}normalize", f"got {normalize!r}; allowed: "
                      f"{', '.join(NORMALIZE)}")
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
  source, num_classes = _open(name, split, data_dir, image_key, label_key, field, split_field)
  return Stream(name=name, split=split, data_dir=data_dir,
                indices=stream_order(len(source), limit, seed, shuffle),
                num_classes=None if num_classes is None else int(num_classes),
                image_size=(int(size[0]), int(size[1])), crop=crop,
                crop_fraction=float(crop_fraction), resample=resample, normalize=normalize,
                batch_size=int(batch_size), num_workers=int(num_workers), image_key=image_key,
                label_key=label_key, source=source)


# ------------------------------------------------------------------------------------------------
# Training mode: random augmentations on an endless, sharded grain stream.
#
# The same decode (`decode_image`), resize (PIL), `normalize_pixels` and TFDS opening (`_open`)
# as the evaluation mode above. Order: grain's `IndexSampler` (a seeded global shuffle, a new
# permutation every epoch, endless), sharded per JAX process (`ShardOptions(process_index,
# process_count, drop_remainder=True)`: each process reads its own contiguous slice of the
# split, shuffled within it). Per example, the generator is `example_rng(order_seed,
# augment_seed, i)` for its global sampler position i = process_index + process_count * k
# (k: the process-local position, step * (batch_size / process_count) + row), so every crop
# and flip is a pure function of (seeds, step, process, row). The iterator's state
# (`get_state()` / `set_state()`, JSON bytes) is saved with each checkpoint by the trainer.

TRAIN_CROPS = ("inception", "pad_crop", "resize")


@dataclasses.dataclass(frozen=True)
class Augment:
  """Training-time geometry of one image (see `augment_image`).

  crop: "inception" (random resized crop), "pad_crop" (zero-pad `pad` pixels, random crop
    of `image_size`) or "resize" (the whole image resized, no random crop).
  area_range: (min, max) fraction of the image area of an inception crop.
  aspect_range: (min, max) width / height of an inception crop (drawn log-uniformly).
  pad: padding of "pad_crop", in pixels on each side.
  flip: a horizontal flip with probability 1/2.
  resample: PIL filter of the resize ("bilinear", "bicubic", "nearest").
  """
  crop: str = "inception"
  area_range: tuple[float, float] = (0.08, 1.0)
  aspect_range: tuple[float, float] = (3 / 4, 4 / 3)
  pad: int = 4
  flip: bool = True
  resample: str = "bilinear"


def inception_crop_box(height: int, width: int, rng: np.random.Generator,
                       area_range: Sequence[float] = (0.08, 1.0),
                       aspect_range: Sequence[float] = (3 / 4, 4 / 3),
                       attempts: int = 10) -> tuple[int, int, int, int]:
  """(top, left, h, w) of a random resized ("inception") crop box.

  Up to `attempts` draws of an area fraction a ~ U(area_range) and a log-uniform aspect
  ratio r (width / height) in `aspect_range`; the box is w = round(sqrt(a H W r)),
  h = round(sqrt(a H W / r)), and the first one that fits is placed uniformly
  (top ~ U{0..H-h}, left ~ U{0..W-w}). If none fits, the whole image. This is the scheme
  of big_vision's `inception_crop` (pp/ops_image.py, via
  `tf.image.sample_distorted_bounding_box`, area 5%-100% by default there) and of
  torchvision's `RandomResizedCrop` (area 8%-100%, ratio 3/4-4/3, 10 attempts); the draws
  are NumPy's, so the boxes are not TensorFlow's.
  """
  area = float(height * width)
  log_lo, log_hi = np.log(aspect_range[0]), np.log(aspect_range[1])
  for _ in range(attempts):
    target = area * rng.uniform(area_range[0], area_range[1])
    ratio = float(np.exp(rng.uniform(log_lo, log_hi)))
    w = int(round(np.sqrt(target * ratio)))
    h = int(round(np.sqrt(target / ratio)))
    if 0 < h <= height and 0 < w <= width:
      top = int(rng.integers(0, height - h + 1))
      left = int(rng.integers(0, width - w + 1))
      return top, left, h, w
  return 0, 0, height, width


def augment_image(image: np.ndarray, image_size: Sequence[int], rng: np.random.Generator,
                  augment: Augment) -> np.ndarray:
  """One random training view. [H, W, 3] uint8 -> [image_size[0], image_size[1], 3] uint8.

  Draws, in this order: the crop box (`inception_crop_box`, or the pad-crop offsets
  top, left ~ U{0..2 pad}), then the flip (rng.random() < 0.5).
  """
  out_h, out_w = int(image_size[0]), int(image_size[1])
  if augment.crop == "inception":
    top, left, h, w = inception_crop_box(image.shape[0], image.shape[1], rng,
                                         augment.area_range, augment.aspect_range)
    image = _resize(image[top:top + h, left:left + w], (out_h, out_w), augment.resample)
  elif augment.crop == "pad_crop":
    image = _resize(image, (out_h, out_w), augment.resample)
    p = int(augment.pad)
    padded = np.pad(image, ((p, p), (p, p), (0, 0)))
    top, left = int(rng.integers(0, 2 * p + 1)), int(rng.integers(0, 2 * p + 1))
    image = padded[top:top + out_h, left:left + out_w]
  elif augment.crop == "resize":
    image = _resize(image, (out_h, out_w), augment.resample)
  else:
    raise ValueError(f"crop must be one of {', '.join(TRAIN_CROPS)}, got {augment.crop!r}")
  if augment.flip and rng.random() < 0.5:
    image = image[:, ::-1]
  return np.ascontiguousarray(image)


def _resize(image: np.ndarray, size: tuple[int, int], resample: str) -> np.ndarray:
  if image.shape[:2] == size:
    return image
  pil = Image.fromarray(np.ascontiguousarray(image))
  return np.asarray(pil.resize((size[1], size[0]), RESAMPLE[resample]), dtype=np.uint8)


def example_rng(order_seed: int, augment_seed: int, index: int) -> np.random.Generator:
  """The generator of the example at global sampler position `index`: grain's per-record
  `Philox(key=order_seed + index)` (what `RandomMap` receives) mixed with `augment_seed`."""
  grain_rng = np.random.Generator(np.random.Philox(key=order_seed + index))
  return _mix(grain_rng, augment_seed)


def _mix(grain_rng: np.random.Generator, augment_seed: int) -> np.random.Generator:
  return np.random.default_rng([int(augment_seed), int(grain_rng.integers(2 ** 63))])


@dataclasses.dataclass(frozen=True)
class _TrainExample(grain.transforms.RandomMap):
  """A TFDS example -> {"image": [h, w, 3] normalised, "label": int32} (picklable, so it runs
  in grain's worker processes)."""
  image_key: str
  label_key: str
  image_size: tuple[int, int]
  augment: Augment
  normalize: str
  augment_seed: int

  def random_map(self, element, rng: np.random.Generator):
    image = augment_image(decode_image(element[self.image_key]), self.image_size,
                          _mix(rng, self.augment_seed), self.augment)
    return {"image": normalize_pixels(image, self.normalize),
            "label": np.int32(element[self.label_key])}


@dataclasses.dataclass(frozen=True, eq=False)
class TrainStream:
  """Endless augmented training batches of one TFDS split (see `open_train_stream`)."""
  name: str
  split: str
  data_dir: str
  num_examples: int            # Examples in the split (all processes together).
  num_classes: int | None
  image_size: tuple[int, int]
  normalize: str
  augment: Augment
  batch_size: int              # Global batch size.
  order_seed: int
  augment_seed: int
  num_workers: int             # grain worker processes (0: in this process).
  worker_buffer_size: int
  image_key: str
  label_key: str
  source: Any = dataclasses.field(repr=False)
  vocab_size = None            # Images only (the trainer asks, like `pipeline.Split`).

  def __len__(self) -> int:
    return self.num_examples

  @property
  def input_shape(self) -> tuple[int, int, int]:
    return (*self.image_size, 3)

  @property
  def dtype(self) -> np.dtype:
    return np.dtype(np.uint8 if self.normalize == "uint8" else np.float32)

  @property
  def local_batch_size(self) -> int:
    return self.batch_size // jax.process_count()

  def sampler(self) -> "grain.samplers.IndexSampler":
    """grain's endless shuffled sampler over this process's shard of the split."""
    shard = grain.sharding.ShardOptions(shard_index=jax.process_index(),
                                        shard_count=jax.process_count(), drop_remainder=True)
    return grain.samplers.IndexSampler(self.num_examples, shard_options=shard, shuffle=True,
                                       num_epochs=None, seed=int(self.order_seed))

  def loader(self) -> "grain.DataLoader":
    """The grain DataLoader of this process's batches {"image" [b, h, w, 3], "label" [b]},
    b = batch_size / process_count."""
    op = _TrainExample(self.image_key, self.label_key, self.image_size, self.augment,
                       self.normalize, int(self.augment_seed))
    if self.num_workers:  # grain's workers read its absl flags: their defaults, outside
      from absl import flags  # an absl app (tests, notebooks).  # pylint: disable=g-import-not-at-top
      if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return grain.DataLoader(
        data_source=self.source, sampler=self.sampler(),
        operations=[op, grain.transforms.Batch(self.local_batch_size, drop_remainder=True)],
        worker_count=int(self.num_workers), worker_buffer_size=int(self.worker_buffer_size))

  def global_index(self, step: int, row: int) -> int:
    """The sampler position of local `row` of this process's batch at `step` (0-based).

    With W = max(1, num_workers) grain workers, worker w reads this process's positions
    w, w + W, w + 2W, ... and batch `step` is the (step // W)-th batch of worker step % W;
    so the batches (not their set over an epoch) depend on `num_workers`.
    """
    workers = max(1, int(self.num_workers))
    w, j = step % workers, step // workers
    k = w + workers * (j * self.local_batch_size + row)
    return jax.process_index() + jax.process_count() * k


def open_train_stream(data_config, *, batch_size: int, order_seed: int, augment_seed: int,
                      augment: Augment | None = None, num_workers: int = 0,
                      worker_buffer_size: int = 2) -> TrainStream:
  """Opens `data_config.train_split` of a prepared TFDS image dataset as a `TrainStream`.

  Reads `name`, `data_dir`, `train_split`, `image_key`, `label_key`, `image_size` (required)
  and `normalize` ("half", "zero_one") of the `data` block. ConfigErrors name `data.*`.
  """
  image_size = _image_size_field(data_config)
  normalize = data_config["normalize"]
  if normalize not in ("half", "zero_one"):
    raise ConfigError("data.normalize", f"{normalize!r} is not available when streaming; "
                      "allowed: half, zero_one")
  data_dir = _resolve_data_dir(data_config["data_dir"])
  source, num_classes = _open(data_config["name"], data_config["train_split"], data_dir,
                              data_config["image_key"], data_config["label_key"],
                              "data.name", "data.train_split")
  if batch_size % jax.process_count():
    raise ConfigError("batch_size", f"{batch_size} must be divisible by the process count "
                      f"{jax.process_count()}")
  if len(source) // jax.process_count() < batch_size // jax.process_count():
    raise ConfigError("batch_size", f"{batch_size} exceeds the {len(source)} examples of "
                      f"{data_config['train_split']!r}")
  return TrainStream(
      name=data_config["name"], split=data_config["train_split"], data_dir=data_dir,
      num_examples=len(source), num_classes=None if num_classes is None else int(num_classes),
      image_size=image_size, normalize=normalize, augment=augment or Augment(),
      batch_size=int(batch_size), order_seed=int(order_seed), augment_seed=int(augment_seed),
      num_workers=int(num_workers), worker_buffer_size=int(worker_buffer_size),
      image_key=data_config["image_key"], label_key=data_config["label_key"], source=source)


def _image_size_field(data_config) -> tuple[int, int]:
  size = data_config.get("image_size")
  if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
    size = (size, size)
  if (size is None or isinstance(size, str) or len(tuple(size)) != 2 or
      not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s > 0
              for s in size)):
    raise ConfigError("data.image_size", f"must be (H, W) when streaming (every image is "
                      f"cropped to it), got {size!r}")
  return int(size[0]), int(size[1])


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


def augment_from_config(block) -> Augment:
  """The `Augment` of a `data.stream` block; ConfigError naming `data.stream.<field>`."""
  from xsens.data import config as data_config_lib  # pylint: disable=g-import-not-at-top
  allowed = data_config_lib.stream_config()
  unknown = sorted(set(block) - set(allowed))
  if unknown:
    raise ConfigError(f"data.stream.{unknown[0]}", f"unknown field; allowed: "
                      f"{', '.join(sorted(allowed))}")
  b = {**allowed.to_dict(), **dict(block)}
  f = "data.stream."
  if b["crop"] not in TRAIN_CROPS:
    raise ConfigError(f + "crop", f"got {b['crop']!r}; allowed: {', '.join(TRAIN_CROPS)}")
  area = _check_range(b["area_range"], f + "area_range", 1.0)
  aspect = _check_range(b["aspect_range"], f + "aspect_range", None)
  for field, low in (("pad", 0), ("num_workers", 0), ("worker_buffer_size", 1),
                     ("eval_threads", 1)):
    if not _is_int(b[field], low):
      raise ConfigError(f + field, f"must be an int >= {low}, got {b[field]!r}")
  if not isinstance(b["flip"], bool):
    raise ConfigError(f + "flip", f"must be True or False, got {b['flip']!r}")
  for field in ("resample", "eval_resample"):
    if b[field] not in RESAMPLE:
      raise ConfigError(f + field, f"got {b[field]!r}; allowed: {', '.join(RESAMPLE)}")
  if b["eval_crop"] not in CROPS:
    raise ConfigError(f + "eval_crop", f"got {b['eval_crop']!r}; allowed: {', '.join(CROPS)}")
  frac = b["eval_crop_fraction"]
  if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
    raise ConfigError(f + "eval_crop_fraction", f"must be in (0, 1], got {frac!r}")
  return Augment(crop=b["crop"], area_range=area, aspect_range=aspect, pad=int(b["pad"]),
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
  _image_size_field(data_config)
  if data_config["normalize"] not in ("half", "zero_one"):
    raise ConfigError("data.normalize", f"{data_config['normalize']!r} is not available "
                      "when streaming; allowed: half, zero_one")
  if data_config["train_split"] == data_config["test_split"]:
    raise ConfigError("data.test_split", f"must differ from data.train_split, both are "
                      f"{data_config['test_split']!r}")
  data_dir = _resolve_data_dir(data_config["data_dir"])
  for role in ("train", "test"):
    _open(name, data_config[f"{role}_split"], data_dir, data_config["image_key"],
          data_config["label_key"], "data.name", f"data.{role}_split")


def open_eval_stream(data_config, role: str, *, batch_size: int,
                     limit: int | None = None) -> Stream:
  """The `role` ("train" / "test") split with the `data.stream` block's evaluation crop, as a
  `Stream` of fixed `batch_size` (global) batches in stored order."""
  block = {**_stream_defaults(), **dict(data_config["stream"])}
  return open_stream(
      data_config["name"], split=data_config[f"{role}_split"],
      data_dir=data_config["data_dir"], image_size=_image_size_field(data_config),
      crop=block["eval_crop"], crop_fraction=block["eval_crop_fraction"],
      resample=block["eval_resample"], normalize=data_config["normalize"], limit=limit,
      shuffle=False, batch_size=batch_size, num_workers=block["eval_threads"],
      image_key=data_config["image_key"], label_key=data_config["label_key"],
      field="data.name", split_field=f"data.{role}_split")


def open_training_stream(data_config, *, batch_size: int, order_seed: int,
                         augment_seed: int) -> TrainStream:
  """`open_train_stream` with the `data.stream` block's augmentation and workers."""
  block = {**_stream_defaults(), **dict(data_config["stream"])}
  return open_train_stream(data_config, batch_size=batch_size, order_seed=order_seed,
                           augment_seed=augment_seed,
                           augment=augment_from_config(data_config["stream"]),
                           num_workers=block["num_workers"],
                           worker_buffer_size=block["worker_buffer_size"])


def _stream_defaults() -> dict:
  from xsens.data import config as data_config_lib  # pylint: disable=g-import-not-at-top
  return data_config_lib.stream_config().to_dict()


class TrainFeed:
  """The trainer's cursor over a `TrainStream`: the next local batch, and the grain
  iterator's state (JSON bytes) to save with a checkpoint and restore on a resume. The
  iterator (and its worker processes) starts on first use."""

  def __init__(self, stream: TrainStream):
    self.stream = stream
    self._iterator = None

  def _it(self):
    if self._iterator is None:
      self._iterator = iter(self.stream.loader())
    return self._iterator

  def next(self) -> dict[str, np.ndarray]:
    """{"image" [b, h, w, 3], "label" [b] int32}, b = batch_size / process_count."""
    return next(self._it())

  def get_state(self) -> bytes:
    return self._it().get_state()

  def set_state(self, state: bytes) -> None:
    self._it().set_state(state)

  def close(self) -> None:
    """Stops the worker processes (if any); a later `next` starts a fresh iterator."""
    inner = getattr(self._iterator, "_iterator", None)  # grain keeps no public close().
    if inner is not None and hasattr(inner, "close"):
      inner.close()
    self._iterator = None
