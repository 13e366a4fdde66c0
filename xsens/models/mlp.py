"""Fully connected classifier on flattened pixels."""

import flax.linen as nn
import jax.numpy as jnp

from xsens.models import _checks
from xsens.models import precision

ACTIVATIONS = {
    "relu": nn.relu,
    "gelu": nn.gelu,
    "tanh": jnp.tanh,
    "leaky_relu": nn.leaky_relu,
}


class MLP(nn.Module):
  """MLP: [B, H, W, C] -> flatten -> (Dense -> act) per hidden dim -> logits [B, K].

  An empty `hidden_dims` gives a linear classifier. `dtype` is the compute dtype
  (`xsens.models.precision`; params and logits float32).
  """
  num_classes: int
  hidden_dims: tuple[int, ...] = (512, 128)
  activation: str = "relu"
  dtype: str = "float32"

  def check_input(self, image_shape: tuple[int, int, int]) -> None:
    """Raises ConfigError for settings impossible on (H, W, C) inputs."""
    _checks.image(image_shape, self.num_classes)
    _checks.positive_ints("hidden_dims", self.hidden_dims, allow_empty=True)
    _checks.one_of("activation", self.activation, tuple(ACTIVATIONS))
    _checks.dtype(self.dtype)

  @nn.compact
  def __call__(self, x, train: bool = False):
    act, dt = ACTIVATIONS[self.activation], precision.compute_dtype(self.dtype)
    x = x.reshape(x.shape[0], -1)
    for i, dim in enumerate(self.hidden_dims):
      x = act(nn.Dense(dim, dtype=dt, name=f"hidden_{i}")(x))
    return nn.Dense(self.num_classes, dtype=dt, name="head")(x).astype(jnp.float32)
