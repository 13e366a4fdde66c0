"""Training batches streamed from a prepared TFDS image split: an endless, per-process-sharded
grain stream with random crops and flips, whose iterator state the trainer checkpoints
(`data.stream`, `xsens.data.config.stream_config`).

The TFDS opening is `xsens.data.streaming`'s (`open_source`: TF-free `as_data_source`); the
decoding, augmentation and normalisation are `xsens.data.image_prep`'. Order: grain's
`IndexSampler` (a seeded global shuffle, a new permutation every epoch, endless), sharded per
JAX process (`ShardOptions(process_index, process_count, drop_remainder=True)`: each process
reads its own contiguous slice of the split, shuffled within it). Per example, the generator
is `example_rng(order_seed, augment_seed, i)` for its global sampler position
i = process_index + process_count * k (k: the process-local position,
step * (batch_size / process_count) + row), so every crop and flip is a pure function of
(seeds, step, process, row). The iterator's state (`get_state()` / `set_state()`, JSON bytes)
is saved with each checkpoint by the trainer (`TrainFeed`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import grain
import jax
import numpy as np

from xsens.data import image_prep
from xsens.data import streaming
from xsens.errors import ConfigError


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
  augment: image_prep.Augment
  normalize: str
  augment_seed: int

  def random_map(self, element, rng: np.random.Generator):
    image = image_prep.augment_image(image_prep.decode_image(element[self.image_key]),
                                     self.image_size, _mix(rng, self.augment_seed), self.augment)
    return {"image": image_prep.normalize_pixels(image, self.normalize),
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
  augment: image_prep.Augment
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
                      augment: image_prep.Augment | None = None, num_workers: int = 0,
                      worker_buffer_size: int = 2) -> TrainStream:
  """Opens `data_config.train_split` of a prepared TFDS image dataset as a `TrainStream`.

  Reads `name`, `data_dir`, `train_split`, `image_key`, `label_key`, `image_size` (required)
  and `normalize` ("half", "zero_one") of the `data` block. ConfigErrors name `data.*`.
  """
  image_size = streaming.image_size_field(data_config)
  normalize = data_config["normalize"]
  if normalize not in ("half", "zero_one"):
    raise ConfigError("data.normalize", f"{normalize!r} is not available when streaming; "
                      "allowed: half, zero_one")
  data_dir = streaming._resolve_data_dir(data_config["data_dir"])  # pylint: disable=protected-access
  source, num_classes = streaming.open_source(
      data_config["name"], data_config["train_split"], data_dir, data_config["image_key"],
      data_config["label_key"], "data.name", "data.train_split")
  if batch_size % jax.process_count():
    raise ConfigError("batch_size", f"{batch_size} must be divisible by the process count "
                      f"{jax.process_count()}")
  if len(source) // jax.process_count() < batch_size // jax.process_count():
    raise ConfigError("batch_size", f"{batch_size} exceeds the {len(source)} examples of "
                      f"{data_config['train_split']!r}")
  return TrainStream(
      name=data_config["name"], split=data_config["train_split"], data_dir=data_dir,
      num_examples=len(source), num_classes=None if num_classes is None else int(num_classes),
      image_size=image_size, normalize=normalize, augment=augment or image_prep.Augment(),
      batch_size=int(batch_size), order_seed=int(order_seed), augment_seed=int(augment_seed),
      num_workers=int(num_workers), worker_buffer_size=int(worker_buffer_size),
      image_key=data_config["image_key"], label_key=data_config["label_key"], source=source)


def open_training_stream(data_config, *, batch_size: int, order_seed: int,
                         augment_seed: int) -> TrainStream:
  """`open_train_stream` with the `data.stream` block's augmentation and workers."""
  block = {**streaming.stream_defaults(), **dict(data_config["stream"])}
  return open_train_stream(data_config, batch_size=batch_size, order_seed=order_seed,
                           augment_seed=augment_seed,
                           augment=streaming.augment_from_config(data_config["stream"]),
                           num_workers=block["num_workers"],
                           worker_buffer_size=block["worker_buffer_size"])


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
