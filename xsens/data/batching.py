"""Fixed-size padded batches over n examples: the one host-side index generator.

Every evaluation loop (the loop's evaluators, the studies' per-example measures) splits
its examples with `padded_index_batches`, so each jitted batch function sees one shape
and compiles once: the last batch repeats the last example, and its mask marks the
padding with 0 (per-example outputs of padding rows are dropped, sums are masked).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np


def padded_index_batches(n: int, batch_size: int, limit: int | None = None
                         ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Yields (idx [batch_size] int, mask [batch_size] float32) over the first examples.

  Args:
    n: number of examples (0 yields nothing).
    batch_size: examples per batch (> 0).
    limit: use only the first `min(n, limit)` examples (None: all n).

  Yields:
    `idx`: the example indices start, ..., start + batch_size - 1, those past the last
    used example m - 1 replaced by m - 1; `mask`: 1.0 for real rows, 0.0 for padding.
  """
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
  if limit is not None and limit < 0:
    raise ValueError(f"limit must be None or >= 0, got {limit!r}")
  m = n if limit is None else min(n, limit)
  for start in range(0, m, batch_size):
    idx = np.arange(start, start + batch_size)
    mask = (idx < m).astype(np.float32)
    yield np.minimum(idx, m - 1), mask
