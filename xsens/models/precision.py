"""The compute dtype of every model (its `dtype` field, "float32" | "bfloat16").

Parameters stay float32 (flax's `param_dtype`); the arithmetic runs in the compute dtype
(flax's `dtype=` on Dense / Conv / Embed / LayerNorm / GroupNorm / BatchNorm, and `cast`
for hand-written parameters); every model returns float32 outputs, so losses are computed
in float32. BatchNorm statistics and the normalisations' reductions stay float32 (flax).

  dt = precision.compute_dtype(model.dtype)    # None (float32) or jnp.bfloat16
  y = nn.Dense(k, dtype=dt)(x)                 # kernel float32, y in dt
  w = precision.cast(self.param("w", init, shape), dt)
"""

import jax.numpy as jnp

from xsens.models import _checks

DTYPES = _checks.DTYPES


def compute_dtype(name: str):
  """The flax `dtype=` of a model's `dtype` field: None for "float32" (inferred from the
  float32 inputs and params: the numbers of the float32 models, bit for bit) or
  jnp.bfloat16. ConfigError naming `model.dtype` for another name."""
  _checks.dtype(name)
  return None if name == "float32" else jnp.dtype(name)


def cast(x, dtype):
  """`x` in the compute dtype (unchanged for dtype None)."""
  return x if dtype is None else x.astype(dtype)
