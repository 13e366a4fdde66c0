"""Helpers shared by the embedded dataset builders."""

import numpy as np


def per_class_split(labels: np.ndarray,
                    num_train_per_class: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per class c, the first `num_train_per_class[c]` indices go to train, the rest to test.

  Args:
    labels: [N] int class ids in 0..K-1, in source order.
    num_train_per_class: [K] int, how many leading examples of each class form the train split.

  Returns:
    (train_indices, test_indices), each sorted ascending (that is, in source order).
  """
  train, test = [], []
  for c, n_train in enumerate(num_train_per_class):
    idx = np.flatnonzero(labels == c)
    train.append(idx[:n_train])
    test.append(idx[n_train:])
  return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
