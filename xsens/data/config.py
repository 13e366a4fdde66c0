"""The `data` section of an xsens config, with every field and its default."""

import ml_collections


def optional(field_type: type) -> ml_collections.FieldReference:
  """A None default that `--config.x=VALUE` can still override with a `field_type` value."""
  return ml_collections.FieldReference(None, field_type=field_type)


def default_data_config() -> ml_collections.ConfigDict:
  """All `data.*` fields with their defaults (see `xsens.data.pipeline` for their meaning).

  Fields:
    name: "mnist5k" | "digits" | "synthetic/<kind>" | any TFDS name ("mnist", "cifar10",
      "cifar10_corrupted/gaussian_noise_1", ...).
    data_dir: None (-> $TFDS_DATA_DIR or ~/tensorflow_datasets), a local path or gs://...
    train_split, test_split: TFDS split strings, e.g. "train", "train[:10%]".
    image_key, label_key: feature names in the TFDS dataset.
    classes: None or original class ids to keep, relabelled 0..k-1 in the given order.
    class_fractions: None or {original class id: fraction in (0, 1]}, train split only.
    num_train: None or a seeded random subset size of the train split (after class filtering).
    random_labels: None (true labels) or the fraction in (0, 1] of train labels replaced by
      seeded uniformly random ones (test labels stay true); a None default, so configs and
      workdir fingerprints without the field are unchanged.
    normalize: "zero_one" | "half" | "standardize".
    image_size: None or (H, W), bilinear resize after normalisation.
    synthetic: sizes of synthetic splits and the fields of every synthetic kind.
  """
  return ml_collections.ConfigDict({
      "name": "mnist5k",
      "data_dir": optional(str),
      "train_split": "train",
      "test_split": "test",
      "image_key": "image",
      "label_key": "label",
      "classes": optional(tuple),
      "class_fractions": optional(object),
      "num_train": optional(int),
      "random_labels": optional(float),
      "normalize": "half",
      "image_size": optional(tuple),
      "synthetic": {
          "num_train": 2048,
          "num_test": 1024,
          # synthetic/gaussian_patches
          "num_classes": 2,
          "image_size": 16,
          "channels": 1,
          "patch_size": 4,
          "num_signal_patches": 2,
          "noise_std": 1.0,
      },
  })


def stream_config(**overrides) -> ml_collections.ConfigDict:
  """A `data.stream` block: train (and evaluate) from a prepared TFDS image dataset (or an
  embedded one, e.g. mnist5k) read with grain, example by example, as RGB [H, W, 3], instead
  of holding the splits in memory.

  Absent (the default), the splits are loaded into memory (`xsens.data.pipeline`). Set
  `config.data.stream = stream_config(...)` (from the command line: the `stream` variant of
  mlcollections_configs/train.py); `data.image_size` (H, W) is then required and
  `data.normalize` is "half" or "zero_one". See `xsens.data.train_stream`.

  Fields:
    crop: training crop, "inception" (random resized crop), "pad_crop" (zero-pad, random
      crop) or "resize" (the whole image).
    area_range, aspect_range: of the "inception" crop (area fraction; width / height).
    pad: pixels of zero padding on each side for "pad_crop".
    flip: random horizontal flips.
    resample: "bilinear", "bicubic" or "nearest" (training resize).
    eval_crop: "resize" (the whole image) or "center" (a central square of
      `eval_crop_fraction` of the shorter side), resized with `eval_resample`.
    num_workers: grain worker processes of the training stream (0: in the trainer process).
    worker_buffer_size: batches each worker reads ahead.
    eval_threads: decoding threads of the evaluation streams.
  """
  block = {"crop": "inception", "area_range": (0.08, 1.0), "aspect_range": (3 / 4, 4 / 3),
           "pad": 4, "flip": True, "resample": "bilinear",
           "eval_crop": "resize", "eval_crop_fraction": 0.875, "eval_resample": "bilinear",
           "num_workers": 0, "worker_buffer_size": 2, "eval_threads": 4}
  unknown = sorted(set(overrides) - set(block))
  if unknown:
    raise ValueError(f"unknown data.stream field {unknown[0]!r}; allowed: {sorted(block)}")
  block.update({k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()})
  return ml_collections.ConfigDict(block)
