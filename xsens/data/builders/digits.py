"""`digits`: scikit-learn's 1797 8x8 handwritten digits, as an offline TFDS builder."""

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from xsens.data.builders import common

NUM_CLASSES = 10
# Resulting split sizes (per class counts in `sklearn.datasets.load_digits()`:
# 178 182 177 183 181 182 181 179 174 180).
TRAIN_PER_CLASS = (142, 145, 141, 146, 144, 145, 144, 143, 139, 144)  # 1433 in all.
TEST_PER_CLASS = (36, 37, 36, 37, 37, 37, 37, 36, 35, 36)  # 364 in all.


def to_uint8(pixels: np.ndarray) -> np.ndarray:
  """Maps scikit-learn's 0..16 digit pixels to uint8: x * 16 clipped to 255 (so 16 -> 255)."""
  return np.clip(np.round(pixels * 16.0), 0, 255).astype(np.uint8)


def num_train_per_class(counts: np.ndarray) -> np.ndarray:
  """floor(0.8 * n_c) for each class count n_c, in exact integer arithmetic. [K] -> [K]."""
  return (np.asarray(counts) * 4) // 5


class Digits(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """The 1797 8x8 digits of `sklearn.datasets.load_digits()`.

  Needs no download: the digits ship inside scikit-learn.

  Features:
    image: uint8 Tensor [8, 8, 1]; scikit-learn's pixel values 0..16 multiplied by 16 and
      clipped to 255 (0 -> 0, 1 -> 16, ..., 15 -> 240, 16 -> 255).
    label: ClassLabel, 10 classes (the digit).

  Fixed split: for each class, the first floor(0.8 * n_c) examples in scikit-learn's order form
  `train` and the rest form `test`, both in scikit-learn's order (shuffling is disabled):
    train: 1433 examples, per class 142 145 141 146 144 145 144 143 139 144;
    test:   364 examples, per class  36  37  36  37  37  37  37  36  35  36.
  Example keys are the row indices in `load_digits()`.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: per class first 80% (floor) train, rest test."}
  # See Mnist5k.code_path.
  code_path = epath.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description="scikit-learn 8x8 digits (x16, uint8); per class first 80% train, rest test.",
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Tensor(shape=(8, 8, 1), dtype=np.uint8),
            "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
        }),
        supervised_keys=("image", "label"),
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is local.
    from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
    digits = load_digits()
    images = to_uint8(digits.images).reshape(-1, 8, 8, 1)
    labels = digits.target.astype(np.int64)
    counts = np.bincount(labels, minlength=NUM_CLASSES)
    train, test = common.per_class_split(labels, num_train_per_class(counts))
    return {
        "train": self._generate_examples(images, labels, train),
        "test": self._generate_examples(images, labels, test),
    }

  def _generate_examples(self, images, labels, indices):
    for i in indices:
      yield int(i), {"image": images[i], "label": int(labels[i])}
