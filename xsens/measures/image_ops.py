"""Image primitives of the common corruptions (`xsens.measures.corruptions`), in NumPy.

Images are float [N, H, W, C] arrays. Lengths in pixels that the CIFAR-10-C reference gives
for 32x32 images are multiplied by `size_scale(H, W)` = sqrt(H * W) / 32. Resampling is by
matrices applied along rows and columns (`separable`), so the JAX versions
(`xsens.measures.corruptions_jax`) reuse the same host matrices.
"""

import math

import numpy as np
from scipy import ndimage

REFERENCE_SIZE = 32  # The reference parameters are for 32x32 CIFAR images.

_LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # ITU-R BT.601, as OpenCV and JPEG.


def size_scale(height: int, width: int) -> float:
  """s = sqrt(H * W) / 32: multiplies the reference's absolute pixel lengths."""
  return math.sqrt(height * width) / REFERENCE_SIZE


def image_scale(x: np.ndarray) -> float:
  """`size_scale` of [N, H, W, C] images."""
  return size_scale(x.shape[1], x.shape[2])


def to_gray(x: np.ndarray) -> np.ndarray:
  """BT.601 luma. [N, H, W, C] -> [N, H, W, 1] (identity for C = 1)."""
  if x.shape[-1] == 1:
    return x
  return np.einsum("nhwc,c->nhw", x, _LUMA.astype(x.dtype))[..., None]


def gaussian_blur(x: np.ndarray, sigma: float, mode: str = "nearest",
                   truncate: float = 4.0) -> np.ndarray:
  """Spatial Gaussian blur of every image and channel. [N, H, W, C] -> same."""
  if sigma <= 0:
    return x
  return ndimage.gaussian_filter(x, (0, sigma, sigma, 0), mode=mode, truncate=truncate)


def interp_matrix(n_out: int, coords: np.ndarray, n_in: int) -> np.ndarray:
  """Linear-interpolation matrix [n_out, n_in] sampling at float `coords` (edge-clamped)."""
  coords = np.clip(coords, 0, n_in - 1)
  lo = np.floor(coords).astype(np.int64)
  hi = np.minimum(lo + 1, n_in - 1)
  frac = coords - lo
  m = np.zeros((n_out, n_in), np.float64)
  rows = np.arange(n_out)
  np.add.at(m, (rows, lo), 1 - frac)
  np.add.at(m, (rows, hi), frac)
  return m


def separable(x: np.ndarray, mh: np.ndarray, mw: np.ndarray) -> np.ndarray:
  """Applies row and column matrices. x [N, H, W, C], mh [H', H], mw [W', W] -> [N, H', W', C]."""
  n, h, w, c = x.shape
  out = np.matmul(mh.astype(x.dtype), x.reshape(n, h, w * c)).reshape(n, -1, w, c)
  # Stacked small matmuls: much faster here than one large BLAS call under CPU contention.
  out = np.matmul(out.transpose(0, 1, 3, 2), mw.T.astype(x.dtype))  # [N, H', C, W']
  return np.ascontiguousarray(out.transpose(0, 1, 3, 2))


def zoom_center(x: np.ndarray, zoom: float) -> np.ndarray:
  """Bilinear zoom by `zoom` >= 1 about the image centre, keeping the size. [N,H,W,C] -> same.

  Output pixel centre p samples the input at (p - centre) / zoom + centre, like the reference's
  `clipped_zoom` (crop the central 1/zoom, then up-sample).
  """
  _, h, w, _ = x.shape
  ch, cw = (h - 1) / 2, (w - 1) / 2
  mh = interp_matrix(h, (np.arange(h) - ch) / zoom + ch, h)
  mw = interp_matrix(w, (np.arange(w) - cw) / zoom + cw, w)
  return separable(x, mh, mw)


def _mirror_index(i: np.ndarray, n: int) -> np.ndarray:
  """Reflect-101 (mirror without repeating the edge) integer indices into range(n)."""
  if n == 1:
    return np.zeros_like(i)
  period = 2 * (n - 1)
  i = np.mod(i, period)
  return np.where(i > n - 1, period - i, i)


def bilinear_sample(x: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
  """Samples every image at float pixel coordinates, mirrored borders.

  Args:
    x: [N, H, W, C] images.
    ys, xs: [N, H', W'] row and column coordinates (pixel centres are integers).

  Returns:
    [N, H', W', C].
  """
  n, h, w, _ = x.shape
  y0 = np.floor(ys).astype(np.int64)
  x0 = np.floor(xs).astype(np.int64)
  fy = (ys - y0).astype(x.dtype)[..., None]
  fx = (xs - x0).astype(x.dtype)[..., None]
  nn = np.arange(n)[:, None, None]
  ya, yb = _mirror_index(y0, h), _mirror_index(y0 + 1, h)
  xa, xb = _mirror_index(x0, w), _mirror_index(x0 + 1, w)
  top = x[nn, ya, xa] * (1 - fx) + x[nn, ya, xb] * fx
  bottom = x[nn, yb, xa] * (1 - fx) + x[nn, yb, xb] * fx
  return top * (1 - fy) + bottom * fy


def motion_blur_kernel(radius: float, sigma: float) -> np.ndarray:
  """ImageMagick's one-sided motion-blur weights exp(-i^2 / 2 sigma^2), i = 0..2 ceil(radius).

  Returns:
    [K] weights summing to 1 (taps below 1e-7 of the first are dropped; they are invisible).
  """
  width = 2 * int(math.ceil(radius)) + 1
  i = np.arange(width, dtype=np.float64)
  k = np.exp(-i ** 2 / (2 * sigma ** 2))
  k = k[k >= 1e-7]
  return k / k.sum()


def motion_blur_images(x: np.ndarray, radius: float, sigma: float,
                       angles_deg: np.ndarray) -> np.ndarray:
  """Blurs image n along the direction angles_deg[n] (one-sided, edge pixels repeated).

  Tap i reads the pixel at (row + round(i sin a), col + round(i cos a)), as ImageMagick's
  MotionBlurImage (which Wand's `motion_blur` calls in the reference).

  Args:
    x: [N, H, W, C].
    radius, sigma: kernel size and Gaussian width in pixels.
    angles_deg: [N] directions in degrees.

  Returns:
    [N, H, W, C].
  """
  n, h, w, _ = x.shape
  weights = motion_blur_kernel(radius, sigma)
  a = np.deg2rad(np.asarray(angles_deg, np.float64))
  nn = np.arange(n)[:, None, None]
  out = np.zeros_like(x)
  for i, wt in enumerate(weights):
    dy = np.ceil(i * np.sin(a) - 0.5).astype(np.int64)
    dx = np.ceil(i * np.cos(a) - 0.5).astype(np.int64)
    rows = np.clip(np.arange(h)[None, :] + dy[:, None], 0, h - 1)[:, :, None]
    cols = np.clip(np.arange(w)[None, :] + dx[:, None], 0, w - 1)[:, None, :]
    out += np.float32(wt) * x[nn, rows, cols]
  return out


def plasma_fractal(rng: np.random.Generator, num: int, mapsize: int,
                   wibbledecay: float) -> np.ndarray:
  """Diamond-square plasma fractals, normalised to [0, 1] each (as the reference's fog).

  Starting from 0 at the corners with perturbation scale `wibble` = 100, each level fills
  square centres and then diamond centres with the mean of their 4 neighbours (wrapping
  around) plus uniform(-wibble, wibble) * wibble, then divides wibble by `wibbledecay`; a
  smaller decay keeps more fine detail.

  Args:
    rng: random generator.
    num: number of maps.
    mapsize: side, a power of 2.
    wibbledecay: > 1.

  Returns:
    [num, mapsize, mapsize] float64 in [0, 1].
  """
  if mapsize < 1 or mapsize & (mapsize - 1):
    raise ValueError(f"mapsize must be a power of 2, got {mapsize}")
  m = np.zeros((num, mapsize, mapsize))
  step = mapsize
  wibble = 100.0

  def wibbled_mean(total):
    return total / 4 + wibble * rng.uniform(-wibble, wibble, total.shape)

  while step >= 2:
    half = step // 2
    corners = m[:, 0::step, 0::step]
    squares = corners + np.roll(corners, -1, axis=1)
    squares = squares + np.roll(squares, -1, axis=2)
    m[:, half::step, half::step] = wibbled_mean(squares)
    centres = m[:, half::step, half::step]
    corners = m[:, 0::step, 0::step]
    left = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=2)
    m[:, 0::step, half::step] = wibbled_mean(left)
    top = centres + np.roll(centres, 1, axis=2) + corners + np.roll(corners, -1, axis=1)
    m[:, half::step, 0::step] = wibbled_mean(top)
    step = half
    wibble /= wibbledecay
  m -= m.min(axis=(1, 2), keepdims=True)
  return m / np.maximum(m.max(axis=(1, 2), keepdims=True), 1e-12)


def plasma_for(x: np.ndarray, rng: np.random.Generator, wibbledecay: float) -> np.ndarray:
  """One plasma fractal per image, cropped to its size. -> [N, H, W, 1] float32."""
  n, h, w, _ = x.shape
  mapsize = 1 << max(1, int(math.ceil(math.log2(max(h, w)))))
  return plasma_fractal(rng, n, mapsize, wibbledecay)[:, :h, :w, None].astype(np.float32)


def box_down_matrix(n_out: int, n_in: int) -> np.ndarray:
  """Area-averaging matrix [n_out, n_in]: output i averages input span [i, i+1) * n_in/n_out."""
  edges = np.arange(n_out + 1) * (n_in / n_out)
  lo, hi = edges[:-1, None], edges[1:, None]
  pix = np.arange(n_in)[None, :]
  overlap = np.clip(np.minimum(hi, pix + 1) - np.maximum(lo, pix), 0, None)
  return overlap / overlap.sum(axis=1, keepdims=True)


def nearest_up_matrix(n_out: int, n_in: int) -> np.ndarray:
  """Nearest-neighbour matrix [n_out, n_in] (pixel-centre aligned)."""
  src = np.minimum(np.floor((np.arange(n_out) + 0.5) * n_in / n_out).astype(np.int64), n_in - 1)
  m = np.zeros((n_out, n_in))
  m[np.arange(n_out), src] = 1
  return m
