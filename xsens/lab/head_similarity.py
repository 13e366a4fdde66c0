"""Attention similarity between heads pooled over a dataset held on the host.

"Leveraging redundancy in attention with Reuse Transformers" (Bhojanapalli et al. 2021,
arXiv 2110.06821, §A.1): the per-batch measure is
`xsens.measures.attention_similarity.batch_head_similarity`; `collect_head_similarity`
averages it over padded, masked batches of a split.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xsens.data import batching
from xsens.measures import attention_similarity as asim


# One compile per apply_fn and batch shape; the variables are traced, so trained and
# random-init weights share it.
_batch_head_similarity = jax.jit(asim.batch_head_similarity, static_argnums=0)


def collect_head_similarity(apply_fn, variables, inputs: np.ndarray, *,
                            batch_size: int = 100) -> np.ndarray:
  """`attention_similarity.batch_head_similarity` pooled over a dataset held on the host.

  Args:
    apply_fn: see `attention_similarity.attention_maps`; every layer must have the same
      head count.
    variables: its variables (trained or random-init).
    inputs: [N, ...] inputs.
    batch_size: examples per forward pass (`padded_index_batches`: the last batch is
      padded and masked).

  Returns:
    [L, H, L, H] float64 mean similarities over the N inputs.
  """
  total, count = 0.0, 0.0
  for idx, mask in batching.padded_index_batches(len(inputs), batch_size):
    out = _batch_head_similarity(apply_fn, variables, jnp.asarray(inputs[idx]),
                                 mask=jnp.asarray(mask))
    total = total + np.asarray(out["head_similarity"], np.float64) * float(out["count"])
    count += float(out["count"])
  return total / count
