"""Model choice on a validation split, reporting on a disjoint one.

A study that picks a setting (a student model, α, τ, a margin scale, a reuse configuration)
cuts its held-out data into `val` and `eval` (`split_val_eval`), scores every candidate on
`val`, picks with `pick_on_val` (which sees only the validation score) and reports the
headline numbers on `eval` only.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def split_val_eval(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Disjoint, sorted index sets (val [round(val_fraction·n)], eval [the rest]) of range(n),
  from the permutation `default_rng([seed, 7])`."""
  perm = np.random.default_rng([seed, 7]).permutation(n)
  n_val = int(round(val_fraction * n))
  return np.sort(perm[:n_val]), np.sort(perm[n_val:])


def pick_on_val(rows: Sequence[dict], key: str, *, higher_is_better: bool = True) -> dict:
  """The row of `rows` with the best `row[key]` (a validation score); the first on ties.

  Only `row[key]` is read, so eval columns in the same rows cannot change the choice.
  Raises ValueError for no rows or a non-finite score.
  """
  if not rows:
    raise ValueError("no candidates to pick from")
  scores = [float(r[key]) for r in rows]
  if not all(math.isfinite(s) for s in scores):
    raise ValueError(f"non-finite validation score in {key!r}: {scores}")
  sign = 1.0 if higher_is_better else -1.0
  best = max(range(len(rows)), key=lambda i: (sign * scores[i], -i))
  return rows[best]
