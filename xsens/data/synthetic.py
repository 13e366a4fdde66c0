"""Synthetic image-classification sources, selected by `data.name = "synthetic/<kind>"`.

Every source is a pure function registered in `SYNTHETIC`:

  fn(num_examples, seed, *, stream=0, **kind_kwargs) -> (images, labels, num_classes)

with images [N, H, W, C] float32 (already on a model-ready scale, not pixels in 0..255),
labels [N] int32 in [0, num_classes). The class structure (templates) depends only on `seed`;
the examples depend on `(seed, stream)`, so the train split (stream 0) and the test split
(stream 1) are independent draws from the same task.
"""

from collections.abc import Callable
import numbers

import numpy as np

from xsens.errors import ConfigError

_TEMPLATE_STREAM = 0
_EXAMPLE_STREAM = 1


def _check_positive_int(value, field: str) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ConfigError(field, f"must be a positive int, got {value!r}")
  return int(value)


def gaussian_patches_templates(
    seed: int, *, num_classes: int = 2, image_size: int = 16, channels: int = 1,
    patch_size: int = 4, num_signal_patches: int = 2) -> tuple[np.ndarray, np.ndarray]:
  """The class templates of `gaussian_patches` and which patches carry the signal.

  The image is a grid of (image_size / patch_size)^2 non-overlapping patch_size x patch_size
  patches. One set of `num_signal_patches` distinct patches is drawn uniformly (shared by all
  classes); each class template is an independent uniform +-1 sign on every pixel and channel of
  those patches and 0 everywhere else.

  Args:
    seed: the only source of randomness.
    num_classes: number of classes K (>= 2).
    image_size: image height and width S; a multiple of `patch_size`.
    channels: channels C.
    patch_size: patch side P.
    num_signal_patches: how many patches carry the label, in 1..(S/P)^2.

  Returns:
    templates [K, S, S, C] float32 in {-1, 0, +1};
    signal_mask [S/P, S/P] bool, True on the signal patches.
  """
  num_classes = _check_positive_int(num_classes, "data.synthetic.num_classes")
  image_size = _check_positive_int(image_size, "data.synthetic.image_size")
  channels = _check_positive_int(channels, "data.synthetic.channels")
  patch_size = _check_positive_int(patch_size, "data.synthetic.patch_size")
  num_signal_patches = _check_positive_int(num_signal_patches,
                                           "data.synthetic.num_signal_patches")
  if num_classes < 2:
    raise ConfigError("data.synthetic.num_classes", f"must be >= 2, got {num_classes}")
  if image_size % patch_size:
    raise ConfigError("data.synthetic.patch_size",
                      f"must divide data.synthetic.image_size={image_size}, got {patch_size}")
  grid = image_size // patch_size
  if num_signal_patches > grid * grid:
    raise ConfigError("data.synthetic.num_signal_patches",
                      f"must be in 1..{grid * grid} (the number of patches), "
                      f"got {num_signal_patches}")
  rng = np.random.default_rng([seed, _TEMPLATE_STREAM])
  chosen = rng.choice(grid * grid, size=num_signal_patches, replace=False)
  signal_mask = np.zeros(grid * grid, bool)
  signal_mask[chosen] = True
  signal_mask = signal_mask.reshape(grid, grid)
  pixel_mask = np.kron(signal_mask, np.ones((patch_size, patch_size), bool))  # [S, S]
  signs = rng.choice(np.array([-1.0, 1.0], np.float32),
                     size=(num_classes, image_size, image_size, channels))
  templates = signs * pixel_mask[None, :, :, None]
  return templates.astype(np.float32), signal_mask


def gaussian_patches(
    num_examples: int, seed: int, *, stream: int = 0, num_classes: int = 2,
    image_size: int = 16, channels: int = 1, patch_size: int = 4,
    num_signal_patches: int = 2, noise_std: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, int]:
  """Only a few patches carry the label: x = template[y] + noise_std * N(0, I).

  Templates come from `gaussian_patches_templates(seed, ...)` (see there). Labels are balanced:
  label i % num_classes for i in 0..N-1, randomly permuted. Noise is i.i.d. Gaussian on every
  pixel, including the signal patches. Labels and noise are drawn from `(seed, stream)`.

  Args:
    num_examples: N.
    seed: task seed (fixes the templates).
    stream: example stream; the pipeline uses 0 for train and 1 for test.
    num_classes, image_size, channels, patch_size, num_signal_patches: see
      `gaussian_patches_templates`.
    noise_std: standard deviation of the additive noise, >= 0.

  Returns:
    images [N, S, S, C] float32, labels [N] int32, num_classes.
  """
  if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)) or (
      num_examples < 1):
    raise ValueError(f"num_examples must be a positive int, got {num_examples!r}")
  if isinstance(noise_std, bool) or not isinstance(noise_std, numbers.Real) or noise_std < 0:
    raise ConfigError("data.synthetic.noise_std", f"must be a float >= 0, got {noise_std!r}")
  templates, _ = gaussian_patches_templates(
      seed, num_classes=num_classes, image_size=image_size, channels=channels,
      patch_size=patch_size, num_signal_patches=num_signal_patches)
  rng = np.random.default_rng([seed, _EXAMPLE_STREAM, stream])
  labels = rng.permutation(np.arange(num_examples) % num_classes).astype(np.int32)
  noise = rng.standard_normal((num_examples,) + templates.shape[1:], dtype=np.float32)
  images = templates[labels] + np.float32(noise_std) * noise
  return images.astype(np.float32), labels, int(num_classes)


SYNTHETIC: dict[str, Callable[..., tuple[np.ndarray, np.ndarray, int]]] = {
    "gaussian_patches": gaussian_patches,
}
