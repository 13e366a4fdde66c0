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
