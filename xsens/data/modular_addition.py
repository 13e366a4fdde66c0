"""(a + b) mod p on the inputs "a b =" (ids a, b, p; vocabulary p + 1), split as the
official grokking code does (estija/sensitivity language/sens_modular_addition.ipynb):
all p² pairs, the first int(train_fraction · p²) of a `np.random.RandomState(seed)`
permutation for training, the rest for testing."""

from __future__ import annotations

import numpy as np


def all_pairs(p: int) -> tuple[np.ndarray, np.ndarray]:
  """Every input "a b =" in the notebook's order (a major): ids [p^2, 3], labels [p^2]."""
  a, b = np.divmod(np.arange(p * p), p)
  ids = np.stack([a, b, np.full_like(a, p)], axis=1).astype(np.int32)
  return ids, ((a + b) % p).astype(np.int32)


def split(p: int, train_fraction: float, seed: int) -> dict:
  """The official split: pair indices shuffled by RandomState(seed), first int(f p^2) train.

  Returns {"train_ids", "train_labels", "test_ids", "test_labels", "train_index",
  "test_index"} (index = position in `all_pairs`).
  """
  ids, labels = all_pairs(p)
  order = np.arange(p * p)
  np.random.RandomState(seed).shuffle(order)
  n_train = int(train_fraction * p * p)
  tr, te = order[:n_train], order[n_train:]
  return {"train_ids": ids[tr], "train_labels": labels[tr], "test_ids": ids[te],
          "test_labels": labels[te], "train_index": tr, "test_index": te}
