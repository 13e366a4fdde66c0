"""Long-tailed versions of a dataset: exponential class imbalance for `data.class_fractions`.

The usual construction of CIFAR-10/100-LT (Cui et al. 2019, "Class-balanced loss based on
effective number of samples", arXiv 1901.05555; Cao et al. 2019, LDAM, arXiv 1906.07413):
class c (in the order `order`, head first) keeps the fraction

  f_c = ρ^(−r_c / (K − 1)),   r_c = position of c in `order` (0 for the head class),

of its training examples, so the most frequent class keeps all and the rarest keeps 1/ρ
(imbalance ratio n_max / n_min = ρ on a balanced source). Only the train split is
subsampled (`xsens.data.pipeline`, `class_fractions`); the test split stays balanced.
"""

from __future__ import annotations

from typing import Sequence


def long_tail_fractions(num_classes: int, ratio: float,
                        order: Sequence[int] | None = None) -> dict[str, float]:
  """{str(class id): fraction} for `data.class_fractions` (str keys: a ConfigDict's keys).

  Args:
    num_classes: K >= 2 classes, ids 0..K-1 (after `data.classes` selection: use the
      original ids listed there).
    ratio: ρ >= 1, the imbalance ratio (1 = balanced).
    order: class ids from head (most frequent) to tail; default 0, 1, ..., K-1.
  """
  if num_classes < 2:
    raise ValueError(f"need at least 2 classes, got {num_classes}")
  if not ratio >= 1:
    raise ValueError(f"the imbalance ratio must be >= 1, got {ratio}")
  order = list(range(num_classes)) if order is None else [int(c) for c in order]
  if len(order) != num_classes or len(set(order)) != num_classes:
    raise ValueError(f"order must list {num_classes} distinct class ids, got {order}")
  return {str(c): float(ratio ** (-rank / (num_classes - 1))) for rank, c in enumerate(order)}
