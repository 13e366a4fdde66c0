"""The pre-computed CIFAR-10-C (TFDS `cifar10_corrupted`), read like the clean dataset.

Reference: D. Hendrycks and T. Dietterich, "Benchmarking Neural Network Robustness to
Common Corruptions and Perturbations", ICLR 2019, arXiv 1903.12261. The corruption names
are those of `xsens.measures.corruptions` (Hendrycks'); TFDS spells two differently.

TFDS `cifar10_corrupted` (tensorflow_datasets/image_classification/cifar10_corrupted.py)
has one builder config `<corruption>_<severity>` per corruption and severity 1..5, each with
a single "test" split of the 10 000 CIFAR-10 test images: the 15 benchmark corruptions
(`BENCHMARK`, the list of the paper and of github.com/hendrycks/robustness, which has
defocus blur and no Gaussian blur) and 4 extra ones that the paper keeps for validation
(`EXTRA`: gaussian_blur, saturate, spatter, speckle_noise). `is_prepared` tells whether a
set can be read from a data_dir (the robustness study reads CIFAR-10-C only then, and
synthesises the corruptions otherwise).
"""

import copy

import numpy as np
import tensorflow_datasets as tfds

from xsens.data import pipeline
from xsens.data import splits

SEVERITIES = (1, 2, 3, 4, 5)
DATASET = "cifar10_corrupted"

# xsens / Hendrycks corruption names -> TFDS `cifar10_corrupted` config names.
TFDS_NAMES = {"glass_blur": "frosted_glass_blur", "elastic_transform": "elastic"}
# The 15 benchmark corruptions (Hendrycks' names; TFDS's BENCHMARK_CORRUPTIONS) and the 4
# extra ones (TFDS's EXTRA_CORRUPTIONS), which `xsens.measures.corruptions` does not
# synthesise.
BENCHMARK = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
             "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
             "elastic_transform", "pixelate", "jpeg_compression")
EXTRA = ("gaussian_blur", "saturate", "spatter", "speckle_noise")


def tfds_name(name: str, severity: int, dataset: str = DATASET) -> str:
  """TFDS name of a CIFAR-10-C set: ("glass_blur", 3) -> "cifar10_corrupted/frosted_glass_blur_3".

  Accepts the xsens names (`xsens.measures.corruptions.NAMES`) and the TFDS spellings;
  `dataset` names another TFDS dataset with the same config names.
  """
  if severity not in SEVERITIES:
    raise ValueError(f"severity must be in 1..5, got {severity!r}")
  return f"{dataset}/{TFDS_NAMES.get(name, name)}_{int(severity)}"


def is_prepared(data_config, name: str, severity: int, *, dataset: str = DATASET,
                split: str = "test") -> bool:
  """Whether the set `tfds_name(name, severity, dataset)` can be read from
  `data_config.data_dir` (None: $TFDS_DATA_DIR or ~/tensorflow_datasets): prepared there,
  or served by `tfds.testing.mock_data` (which serves unprepared builders). Reads no examples.
  """
  try:
    builder = tfds.builder(tfds_name(name, severity, dataset),
                           data_dir=splits.resolve_data_dir(data_config))
  except Exception:  # pylint: disable=broad-except  (unknown config, unreadable metadata)
    return False
  if builder.is_prepared():
    return True
  try:
    builder.as_data_source(split=split)
  except Exception:  # pylint: disable=broad-except
    return False
  return True


def _from_unit_range(images01: np.ndarray, normalize: str, stats) -> np.ndarray:
  """[0, 1] pixels -> model space (`data.normalize`), as
  `xsens.measures.corruption_eval.from_unit_range`."""
  x = np.asarray(images01, np.float32)
  if normalize == "half":
    return (x - np.float32(0.5)) / np.float32(0.5)
  if normalize == "standardize":
    mean, std = (np.asarray(s, np.float32) for s in stats)
    return (x - mean) / std
  if normalize != "zero_one":
    raise ValueError(f"normalize must be one of {', '.join(pipeline.NORMALIZE)}, "
                     f"got {normalize!r}")
  return x


def load_cifar10_corrupted(data_config, name: str, severity: int, *, split: str = "test",
                           stats=None, seed: int = 0, dataset: str = DATASET
                           ) -> pipeline.Split:
  """Loads one CIFAR-10-C corruption from `data.data_dir`, preprocessed like `data_config`.

  The dataset (TFDS `cifar10_corrupted/<name>_<severity>`) holds only a "test" split, and
  `xsens.data.pipeline.load_split` wants two different splits, so the copy of `data_config`
  used here reads `split` as its test split and `test[:1]` as a (never returned) train split;
  train-only fields (`num_train`, `class_fractions`) are dropped. `classes` applies.
  Images are read in [0, 1] and then normalised with `data_config.normalize`; for
  "standardize" the statistics are `stats` if given, else those of the clean train split of
  `data_config` (so clean and corrupted images share one normalisation). `image_size`
  resizes last, as in `load_split`.

  Args:
    data_config: the `data` ConfigDict of the clean dataset (e.g. name "cifar10").
    name: corruption (xsens or TFDS spelling).
    severity: 1..5.
    split: TFDS split string of the corrupted dataset.
    stats: (mean [C], std [C]) for "standardize".
    seed: passed to `load_split`.
    dataset: the TFDS dataset (`tfds_name`).

  Returns:
    The corrupted split in model space.
  """
  normalize = data_config["normalize"]
  if normalize == "standardize" and stats is None:
    clean = copy.deepcopy(data_config)
    clean.normalize = "zero_one"
    clean.image_size = None
    stats = pipeline.channel_stats(pipeline.load_split(clean, "train", seed=seed).images)
  cfg = copy.deepcopy(data_config)
  cfg.name = tfds_name(name, severity, dataset)
  cfg.test_split = split
  cfg.train_split = "test[:1]" if split != "test[:1]" else "test[:2]"
  cfg.num_train = None
  cfg.class_fractions = None
  if "random_labels" in cfg:
    cfg.random_labels = None
  cfg.normalize = "zero_one"
  cfg.image_size = None
  raw = pipeline.load_split(cfg, "test", seed=seed)
  x = _from_unit_range(raw.images, normalize, stats)
  if data_config["image_size"] is not None:
    x = pipeline.resize(x, data_config["image_size"])
  return pipeline.Split(inputs=np.ascontiguousarray(x, np.float32), labels=raw.labels,
                        num_classes=raw.num_classes)
