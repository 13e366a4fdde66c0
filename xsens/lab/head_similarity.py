"""Attention similarity between heads pooled over a dataset held on the host.

"Leveraging redundancy in attention with Reuse Transformers" (Bhojanapalli et al. 2021,
arXiv 2110.06821, §A.1): the per-batch measure is
`xsens.measures.attention_similarity.batch_head_similarity`; `collect_head_similarity`
averages it over padded, masked batches of a split.
"""

from __future__ import annotations

import functools

import numpy as np

from xsens.measures import attention_similarity as asim
from xsens.train import evaluators


@functools.lru_cache(maxsize=64)  # Jitted functions per model, bounded.
def _batch_fn(apply_fn):
  """`fn(batch, variables)` -> `batch_head_similarity` of one padded batch."""
  return lambda batch, variables: asim.batch_head_similarity(
      apply_fn, variables, batch["image"], mask=batch["mask"])


def collect_head_similarity(apply_fn, variables, inputs: np.ndarray, *,
                            batch_size: int = 100) -> np.ndarray:
  """`attention_similarity.batch_head_similarity` pooled over a dataset held on the host.

  Args:
    apply_fn: see `attention_similarity.attention_maps`; every layer must have the same
      head count.
    variables: its variables (trained or random-init).
    inputs: [N, ...] inputs.
    batch_size: examples per forward pass (`evaluators.over_split`: the last batch is
      padded and masked).

  Returns:
    [L, H, L, H] float64 mean similarities over the N inputs: Σ_b s_b·n_b / Σ_b n_b over
    the batches' masked means s_b of n_b examples.
  """
  outs = evaluators.over_split(_batch_fn(apply_fn), {"image": inputs}, args=(variables,),
                               reduce="per_batch", batch_size=batch_size)
  total, count = 0.0, 0.0
  for out in outs:
    total = total + np.asarray(out["head_similarity"], np.float64) * float(out["count"])
    count += float(out["count"])
  return total / count
