"""Small CNN: conv-ReLU layers with 2x2 max-pool after all but the last."""

import flax.linen as nn
import jax.numpy as jnp

from xsens.models import _checks
from xsens.models import precision


class CNN(nn.Module):
  """Small CNN classifier: [B, H, W, C] -> logits [B, num_classes].

  For each f in `features`: Conv(f, k x k, SAME) -> ReLU, followed by a 2x2
  max-pool (VALID, floor) after every conv but the last. With the defaults
  (3 convs, 2 pools) a 28x28 input ends at 7x7x64. Then flatten ->
  Dense(dense_dim) -> ReLU -> Dense(num_classes). `dtype` is the compute dtype
  (`xsens.models.precision`; params and logits float32).
  """
  num_classes: int
  features: tuple[int, ...] = (32, 64, 64)
  kernel_size: int = 3
  dense_dim: int = 128
  dtype: str = "float32"

  def check_input(self, image_shape: tuple[int, int, int]) -> None:
    """Raises ConfigError for settings impossible on (H, W, C) inputs."""
    image_shape = _checks.image(image_shape, self.num_classes)
    _checks.positive_ints("features", self.features)
    _checks.positive_int("kernel_size", self.kernel_size)
    _checks.positive_int("dense_dim", self.dense_dim)
    _checks.dtype(self.dtype)
    _checks.halvings_fit("features", image_shape, len(self.features) - 1,
                         "2x2 max-pools (one per conv but the last)")

  @nn.compact
  def __call__(self, x, train: bool = False):
    k, dt = self.kernel_size, precision.compute_dtype(self.dtype)
    for i, f in enumerate(self.features):
      x = nn.relu(nn.Conv(f, (k, k), padding="SAME", dtype=dt, name=f"conv_{i}")(x))
      if i < len(self.features) - 1:
        x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="VALID")
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(self.dense_dim, dtype=dt, name="dense")(x))
    return nn.Dense(self.num_classes, dtype=dt, name="head")(x).astype(jnp.float32)
