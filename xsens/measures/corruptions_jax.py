"""JAX versions of the cheap common corruptions (jittable; `name` and `severity` static).

`corrupt_jax(images, name, severity, key)`: the corruptions in `JAX_CORRUPTIONS` (gaussian,
shot and impulse noise, defocus and zoom blur, brightness, contrast, pixelate) run on the
device, so accuracy under them composes inside a caller's `jax.jit`
(`xsens.measures.corruption_eval.corruption_accuracy`). The deterministic ones equal the
NumPy versions of `xsens.measures.corruptions` to float32 rounding (the blur kernels and
resampling matrices are the same host arrays); the noises draw from the same distributions
with `jax.random` (different random numbers than NumPy's, so not bit-equal). The others
(`HOST_ONLY`: glass blur, motion blur, snow, frost, fog, elastic transform, JPEG) run on the
host only, in NumPy (`corruptions.corrupt`).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from xsens.measures import corruptions
from xsens.measures import image_ops


def _gaussian_noise_jax(x, severity: int, key):
  c = (0.04, 0.06, 0.08, 0.09, 0.10)[severity - 1]
  return x + jnp.float32(c) * jax.random.normal(key, x.shape, jnp.float32)


def _shot_noise_jax(x, severity: int, key):
  c = (500, 250, 100, 75, 50)[severity - 1]
  return jax.random.poisson(key, x * c, x.shape).astype(jnp.float32) / c


def _impulse_noise_jax(x, severity: int, key):
  c = (0.01, 0.02, 0.03, 0.05, 0.07)[severity - 1]
  k_hit, k_salt = jax.random.split(key)
  hit = jax.random.uniform(k_hit, x.shape) < c
  salt = jax.random.uniform(k_salt, x.shape) < 0.5
  return jnp.where(hit, salt.astype(jnp.float32), x)


def _defocus_blur_jax(x, severity: int, key):
  del key
  radius, alias = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1))[severity - 1]
  kernel = corruptions.defocus_kernel(radius, alias, image_ops.image_scale(x))
  kernel = kernel.astype(np.float32)
  k = kernel.shape[0] // 2
  c = x.shape[-1]
  # scipy's "mirror" border (d c b | a b c d | c b a) is NumPy's "reflect".
  padded = jnp.pad(x, ((0, 0), (k, k), (k, k), (0, 0)), mode="reflect")
  # ndimage.convolve is a true convolution: correlate with the flipped kernel.
  w = jnp.asarray(np.ascontiguousarray(kernel[::-1, ::-1]))[:, :, None, None]
  return jax.lax.conv_general_dilated(
      padded, jnp.tile(w, (1, 1, 1, c)), (1, 1), "VALID",
      dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=c,
      precision=jax.lax.Precision.HIGHEST)


def _separable_jax(x, mh: np.ndarray, mw: np.ndarray):
  """`image_ops.separable` on the device.

  x [N, H, W, C], mh [H', H], mw [W', W] -> [N, H', W', C].
  """
  hi = jax.lax.Precision.HIGHEST
  out = jnp.einsum("ph,nhwc->npwc", jnp.asarray(mh, jnp.float32), x, precision=hi)
  return jnp.einsum("qw,npwc->npqc", jnp.asarray(mw, jnp.float32), out, precision=hi)


def _zoom_blur_jax(x, severity: int, key):
  del key
  top = (1.06, 1.11, 1.16, 1.21, 1.26)[severity - 1]
  zooms = np.arange(1, top, 0.01)
  _, h, w, _ = x.shape
  ch, cw = (h - 1) / 2, (w - 1) / 2
  out = x
  for z in zooms:
    mh = image_ops.interp_matrix(h, (np.arange(h) - ch) / float(z) + ch, h)
    mw = image_ops.interp_matrix(w, (np.arange(w) - cw) / float(z) + cw, w)
    out = out + _separable_jax(x, mh, mw)
  return out / np.float32(len(zooms) + 1)


def _brightness_jax(x, severity: int, key):
  del key
  c = (0.05, 0.1, 0.15, 0.2, 0.3)[severity - 1]
  v = x.max(axis=-1, keepdims=True)
  v_new = jnp.minimum(v + jnp.float32(c), 1)
  ratio = jnp.where(v > 0, v_new / jnp.where(v > 0, v, 1), 0)
  return jnp.where(v > 0, x * ratio, v_new)


def _contrast_jax(x, severity: int, key):
  del key
  c = (0.75, 0.5, 0.4, 0.3, 0.15)[severity - 1]
  m = x.mean(axis=(1, 2), keepdims=True)
  return (x - m) * jnp.float32(c) + m


def _pixelate_jax(x, severity: int, key):
  del key
  c = (0.95, 0.9, 0.85, 0.75, 0.65)[severity - 1]
  _, h, w, _ = x.shape
  hs, ws = max(1, int(h * c)), max(1, int(w * c))
  mh = image_ops.nearest_up_matrix(h, hs) @ image_ops.box_down_matrix(hs, h)
  mw = image_ops.nearest_up_matrix(w, ws) @ image_ops.box_down_matrix(ws, w)
  return _separable_jax(x, mh, mw)


JAX_CORRUPTIONS: dict[str, Callable] = {
    "gaussian_noise": _gaussian_noise_jax,
    "shot_noise": _shot_noise_jax,
    "impulse_noise": _impulse_noise_jax,
    "defocus_blur": _defocus_blur_jax,
    "zoom_blur": _zoom_blur_jax,
    "brightness": _brightness_jax,
    "contrast": _contrast_jax,
    "pixelate": _pixelate_jax,
}

# Corruptions that run on the host only (NumPy / scipy, `corrupt`).
HOST_ONLY: tuple[str, ...] = tuple(n for n in corruptions.NAMES if n not in JAX_CORRUPTIONS)

RANDOM_JAX = ("gaussian_noise", "shot_noise", "impulse_noise")  # Need a key.


def corrupt_jax(images, name: str, severity: int, key=None):
  """Applies one corruption of `JAX_CORRUPTIONS` on the device (jittable).

  Args:
    images: [N, H, W, C] float in [0, 1] (pixel space), C in {1, 3}; not checked for the
      range (traced values cannot be).
    name: a key of `JAX_CORRUPTIONS` (static); `HOST_ONLY` names raise.
    severity: 1..5 (static).
    key: PRNG key, needed by the noises (`RANDOM_JAX`); the same key gives the same draws
      at every severity, as in the NumPy versions.

  Returns:
    [N, H, W, C] float32 in [0, 1].
  """
  if name not in JAX_CORRUPTIONS:
    where = ("runs on the host only (NumPy): use `corrupt`" if name in HOST_ONLY else
             f"is unknown; allowed: {', '.join(corruptions.NAMES)}")
    raise ValueError(f"corruption {name!r} {where}; JAX versions: "
                     f"{', '.join(JAX_CORRUPTIONS)}")
  if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or \
      severity not in corruptions.SEVERITIES:
    raise ValueError(f"severity must be an int in 1..5, got {severity!r}")
  if name in RANDOM_JAX and key is None:
    raise ValueError(f"corruption {name!r} needs key= (a PRNG key)")
  x = jnp.asarray(images)
  if x.ndim != 4 or x.shape[-1] not in (1, 3):
    raise ValueError(f"images must be [N, H, W, C] with C in (1, 3), got shape {x.shape}")
  x = jnp.clip(x.astype(jnp.float32), 0, 1)
  out = JAX_CORRUPTIONS[name](x, int(severity), key)
  return jnp.clip(out, 0, 1).astype(jnp.float32)
