"""Streaming evaluation batches from large TFDS image-classification splits (e.g. ImageNet).

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
  """(random-access source with encoded images, num_classes). ConfigErrors name the fields."""
  if not isinstance(name, str) or not name:
    raise ConfigError(field, f"must be a TFDS dataset name, got {name!r}")
  data_splits.split_names(split, split_field)
  try:
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
