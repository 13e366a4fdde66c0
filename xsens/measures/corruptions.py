"""The 15 common corruptions of ImageNet-C / CIFAR-10-C at severities 1..5, in NumPy.

Reference: D. Hendrycks and T. Dietterich, "Benchmarking Neural Network Robustness to
Common Corruptions and Perturbations", ICLR 2019, arXiv 1903.12261 (ImageNet-C). The
corruption definitions and the severity parameters below are those of the authors'
CIFAR-10-C generator (`make_cifar_c.py` in github.com/hendrycks/robustness, 32x32 images;
ImageNet-C uses other, larger values). This is an independent implementation with NumPy and
scipy.ndimage only (the reference uses Wand/ImageMagick, scikit-image, OpenCV, PIL and
five frost photographs); nothing is downloaded or read from disk.

Interface: `corrupt(images [N, H, W, C] float in [0, 1], name, severity, seed)` returns an
array of the same shape, float32, clipped to [0, 1]. C is 1 (grey) or 3 (RGB); H, W are
arbitrary. `CORRUPTIONS[name](x, severity, rng)` is the raw per-corruption function
(x float32 [N, H, W, C] in [0, 1], rng a `np.random.Generator`).

Image size. The reference parameters are for 32x32 images. Parameters that are absolute
pixel lengths are multiplied by s = sqrt(H * W) / 32 (so 28x28 MNIST uses s = 0.875,
224x224 uses s = 7): the defocus kernel (resampled by s, see `defocus_kernel`), the glass-blur
Gaussian sigma and shuffle distance (rounded, at least 1 px), the motion-blur radius and
sigma (motion blur and the snow streaks), the snow flake zoom (at least 1) and the frost
crystal sizes. Scale-free parameters are used as given: noise levels, zoom factors,
pixelate fractions, JPEG qualities, brightness/contrast, fog strength (the plasma fractal
is drawn on the next power-of-two square >= max(H, W) and cropped), and the elastic
parameters (the reference already writes them as fractions of the image size).

Grey images (C = 1): brightness adds to HSV value V, which for a grey pixel is the pixel
itself; snow's grey-level brightening uses the pixel itself instead of the RGB luma; frost
uses the luma of the (bluish) frost texture; JPEG codes the luma channel only.

Differences from the reference, by design:
  * frost: a procedural texture (needle-shaped ice crystals on a plasma-fractal haze,
    tinted blue-white) instead of crops of five photographs; see `frost_texture`.
  * motion blur: ImageMagick's MotionBlurImage kernel (one-sided Gaussian weights along a
    line, taps at rounded offsets, edge pixels repeated), re-implemented with gathers.
  * zoom (zoom blur, snow): bilinear zoom about the image centre (pixel-centre aligned).
  * elastic: the random affine map and the elastic displacement are composed and sampled
    once (bilinear, mirrored borders) instead of twice.
  * pixelate: area-weighted box down-sampling, then nearest-neighbour up-sampling.
  * JPEG: own baseline codec (`xsens.measures.jpeg`), not libjpeg via PIL (so no PIL
    dependency); it matches PIL/libjpeg to about 0.2 grey levels on grey images and 1 on
    RGB, against a compression error of 1.5-3 levels at these qualities (tested).
  * glass blur: no 8-bit quantisation between the two Gaussian blurs.

All randomness comes from `np.random.default_rng(seed)`: the same seed gives the same
output. The draws do not depend on the severity (except shot noise's Poisson draws), so the
severities of one corruption share their random numbers (the noise of gaussian_noise at
severity 5 is the noise of severity 1 scaled up), which makes severity sweeps smoother.

The primitives (resampling, motion blur, plasma fractals) are in `xsens.measures.image_ops`;
the device versions of the cheap corruptions in `xsens.measures.corruptions_jax`.
"""

from collections.abc import Callable, Sequence
import math

import numpy as np
from scipy import ndimage

from xsens import choices
from xsens.measures import image_ops
from xsens.measures import jpeg

SEVERITIES = choices.CORRUPTION_SEVERITIES


# ------------------------------------------------------------------------------------------------
# Noise.


def gaussian_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """x + N(0, c^2), c = 0.04, 0.06, 0.08, 0.09, 0.10."""
  c = (0.04, 0.06, 0.08, 0.09, 0.10)[severity - 1]
  return x + np.float32(c) * rng.standard_normal(x.shape, np.float32)


def shot_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """Poisson(c x) / c, c = 500, 250, 100, 75, 50 photons at full intensity."""
  c = (500, 250, 100, 75, 50)[severity - 1]
  return (rng.poisson(x.astype(np.float64) * c) / c).astype(np.float32)


def impulse_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """Salt-and-pepper: a fraction c = .01, .02, .03, .05, .07 of the values set to 0 or 1."""
  c = (0.01, 0.02, 0.03, 0.05, 0.07)[severity - 1]
  hit = rng.random(x.shape) < c
  salt = rng.random(x.shape) < 0.5
  return np.where(hit, salt.astype(np.float32), x)


# ------------------------------------------------------------------------------------------------
# Blur.


def defocus_kernel(radius: float, alias_sigma: float, scale: float = 1.0) -> np.ndarray:
  """The reference's anti-aliased disk, drawn at the 32x32 geometry and resized by `scale`.

  At scale 1: the binary disk {i^2 + j^2 <= radius^2} (integer offsets), normalised, then
  blurred by a 3x3 (5x5 if radius > 8) Gaussian of `alias_sigma`. Other scales resample
  that kernel bilinearly at offsets / scale and renormalise: a binary disk of radius
  radius * scale would jump between a single pixel and a cross as the radius crosses 1
  (at 28x28, severity 4 would be the identity), the resampled kernel changes continuously.

  Returns:
    [K, K] weights summing to 1, K odd.
  """
  half = int(math.ceil(radius)) + 2
  grid = np.arange(-half, half + 1)
  yy, xx = np.meshgrid(grid, grid, indexing="ij")
  disk = (yy ** 2 + xx ** 2 <= radius ** 2).astype(np.float64)
  disk /= disk.sum()
  ksize = 3 if radius <= 8 else 5
  t = np.arange(ksize) - ksize // 2
  g = np.exp(-t ** 2 / (2 * max(alias_sigma, 1e-6) ** 2))
  g /= g.sum()
  kernel = ndimage.convolve1d(ndimage.convolve1d(disk, g, axis=0, mode="mirror"), g, axis=1,
                              mode="mirror")
  if scale != 1:
    new_half = max(1, int(math.ceil(half * scale)))
    offsets = np.arange(-new_half, new_half + 1) / scale + half
    yy, xx = np.meshgrid(offsets, offsets, indexing="ij")
    kernel = ndimage.map_coordinates(kernel, [yy, xx], order=1, mode="constant", cval=0.0)
  return kernel / kernel.sum()


def defocus_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """Convolution with an anti-aliased disk; (radius, alias sigma) = (0.3, 0.4), (0.4, 0.5),
  (0.5, 0.6), (1, 0.2), (1.5, 0.1) px at 32x32, kernel resized by s (`defocus_kernel`)."""
  del rng
  radius, alias = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1))[severity - 1]
  kernel = defocus_kernel(radius, alias, image_ops.image_scale(x)).astype(np.float32)
  return ndimage.convolve(x, kernel[None, :, :, None], mode="mirror")


def glass_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """Gaussian blur, local pixel shuffling, Gaussian blur.

  (sigma, max_delta, iterations) = (0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2),
  (0.4, 1, 2) at 32x32 (sigma times s; d = max_delta times s, rounded, at least 1).
  Shuffling: for every pixel (h, w) from (H - d, W - d) down to (d + 1, d + 1), row-major,
  swap it with (h + dy, w + dx), dy, dx uniform integers in [-d, d) as in the reference (its
  `np.random.randint(-d, d)` excludes +d). Images are shuffled in parallel with independent
  offsets.

  The reference severities are not monotone in distortion: a larger sigma blurs the shuffled
  pixels back (severity 3 moves an image less than 2, 5 less than 4); at 32x32 severity 5
  still moves images more than 1, at 64x64 and above (sigma scaled up) it does not.
  """
  sigma, max_delta, iterations = ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2),
                                  (0.4, 1, 2))[severity - 1]
  n, h, w, _ = x.shape
  s = image_ops.image_scale(x)
  d = max(1, int(round(max_delta * s)))
  x = image_ops.gaussian_blur(x, sigma * s).copy()
  nn = np.arange(n)
  rows = range(h - d, d, -1)
  cols = range(w - d, d, -1)
  offsets = rng.integers(-d, d, size=(iterations, len(rows), len(cols), 2, n))
  for it in range(iterations):
    for i, r in enumerate(rows):
      for j, c in enumerate(cols):
        r2 = r + offsets[it, i, j, 0]
        c2 = c + offsets[it, i, j, 1]
        here = x[:, r, c].copy()
        x[:, r, c] = x[nn, r2, c2]
        x[nn, r2, c2] = here
  return image_ops.gaussian_blur(x, sigma * s)


def motion_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """One-sided Gaussian motion blur at a uniform angle in [-45, 45) degrees per image;
  (radius, sigma) = (6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5) px at 32x32, times s."""
  radius, sigma = ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5))[severity - 1]
  s = image_ops.image_scale(x)
  angles = rng.uniform(-45, 45, size=x.shape[0])
  return image_ops.motion_blur_images(x, radius * s, sigma * s, angles)


def zoom_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """(x + sum_z zoom(x, z)) / (1 + #z) over z = np.arange(1, t, 0.01), t = 1.06, 1.11, 1.16,
  1.21, 1.26 as in the reference (floating point makes these 7, 12, 16, 21, 26 zooms, up to
  1.06, 1.11, 1.15, 1.20, 1.25)."""
  del rng
  top = (1.06, 1.11, 1.16, 1.21, 1.26)[severity - 1]
  zooms = np.arange(1, top, 0.01)
  out = x.copy()
  for z in zooms:
    out += image_ops.zoom_center(x, float(z))
  return out / np.float32(len(zooms) + 1)


# ------------------------------------------------------------------------------------------------
# Weather.


def snow(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """Snow flakes: thresholded, zoomed Gaussian noise streaked by motion blur, plus a greyish
  brightening of the image.

  (loc, scale, zoom, threshold, radius, sigma, blend) =
  (0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
  (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
  (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8). Flakes: N(loc, scale^2) per pixel, zoomed by
  max(1, zoom s), values below threshold set to 0, clipped to [0, 1], 8-bit, motion-blurred
  (radius, sigma times s) at an angle uniform in [-135, -45) degrees. Image:
  blend x + (1 - blend) max(x, 1.5 gray(x) + 0.5). Output: image + flakes + flakes rotated
  by 180 degrees.
  """
  loc, scale, zoom, threshold, radius, sigma, blend = (
      (0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
      (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
      (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8))[severity - 1]
  n, h, w, _ = x.shape
  s = image_ops.image_scale(x)
  layer = (loc + scale * rng.standard_normal((n, h, w, 1))).astype(np.float32)
  layer = image_ops.zoom_center(layer, max(1.0, zoom * s))
  layer[layer < threshold] = 0
  layer = np.round(np.clip(layer, 0, 1) * 255) / 255
  angles = rng.uniform(-135, -45, size=n)
  layer = image_ops.motion_blur_images(layer.astype(np.float32), radius * s, sigma * s,
                                       angles)
  x = blend * x + (1 - blend) * np.maximum(x, image_ops.to_gray(x) * 1.5 + 0.5)
  return x + layer + layer[:, ::-1, ::-1]


def frost_texture(rng: np.random.Generator, num: int, height: int, width: int,
                  channels: int = 3) -> np.ndarray:
  """Procedural frost: needle-shaped ice crystals over a plasma-fractal haze, blue-white.

  Stands in for the reference's crops of five frost photographs (down-scaled 5x for
  CIFAR-10-C). Per image: a haze 0.15 + 0.35 * plasma (decay 2); H * W / (12 s^2) (about 85)
  straight needles with uniform random centres and angles, lengths uniform in [1.5, 8] * s
  px and brightness uniform in [0.3, 0.85], each also spawning a side branch at 60 degrees
  of half its length; drawn with max over the haze, blurred with sigma 0.4 s, then tinted
  (R, G, B) * (0.85, 0.93, 1.0). For channels = 1 the luma of that.

  Returns:
    [num, height, width, channels] float32 in [0, 1], mean about 0.4.
  """
  s = image_ops.size_scale(height, width)
  mapsize = 1 << max(1, int(math.ceil(math.log2(max(height, width)))))
  haze = 0.15 + 0.35 * image_ops.plasma_fractal(rng, num, mapsize, 2.0)[:, :height, :width]
  count = max(1, int(round(height * width / (12 * s * s))))  # About 85 at any size.
  shape = (num, count)
  cy = rng.uniform(0, height, shape)
  cx = rng.uniform(0, width, shape)
  angle = rng.uniform(0, np.pi, shape)
  length = rng.uniform(1.5, 8.0, shape) * s
  value = rng.uniform(0.3, 0.85, shape)
  canvas = np.zeros((num, height, width))
  t = np.linspace(-0.5, 0.5, max(3, int(math.ceil(8 * s)) * 2 + 1))
  branch_t = np.linspace(0, 0.5, max(2, int(math.ceil(4 * s)) + 1))
  for offsets, (oy, ox, ang) in (
      (t, (cy, cx, angle)),
      (branch_t, (cy, cx, angle + np.pi / 3))):
    ys = oy[..., None] + offsets * length[..., None] * np.sin(ang)[..., None]
    xs = ox[..., None] + offsets * length[..., None] * np.cos(ang)[..., None]
    iy = np.clip(np.round(ys).astype(np.int64), 0, height - 1)
    ix = np.clip(np.round(xs).astype(np.int64), 0, width - 1)
    nn = np.broadcast_to(np.arange(num)[:, None, None], iy.shape)
    vals = np.broadcast_to(value[..., None], iy.shape)
    np.maximum.at(canvas, (nn.ravel(), iy.ravel(), ix.ravel()), vals.ravel())
  tex = np.maximum(haze, canvas)
  tex = ndimage.gaussian_filter(tex, (0, 0.4 * s, 0.4 * s), mode="reflect")
  rgb = tex[..., None] * np.array([0.85, 0.93, 1.0])
  rgb = np.clip(rgb, 0, 1).astype(np.float32)
  return rgb if channels == 3 else image_ops.to_gray(rgb)


def frost(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """a x + b frost, (a, b) = (1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)."""
  a, b = ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45))[severity - 1]
  n, h, w, c = x.shape
  return np.float32(a) * x + np.float32(b) * frost_texture(rng, n, h, w, c)


def fog(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """(x + a plasma) max(x) / (max(x) + a), plasma decay d; (a, d) = (0.2, 3), (0.5, 3),
  (0.75, 2.5), (1, 2), (1.5, 1.75); max(x) per image."""
  a, decay = ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75))[severity - 1]
  peak = x.max(axis=(1, 2, 3), keepdims=True)
  x = x + np.float32(a) * image_ops.plasma_for(x, rng, decay)
  return x * peak / (peak + np.float32(a))


# ------------------------------------------------------------------------------------------------
# Digital.


def brightness(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """HSV value V <- min(V + c, 1), hue and saturation kept; c = .05, .1, .15, .2, .3.

  Computed without the HSV round trip: HSV -> RGB gives every channel as V (1 - S f(H)), so
  keeping S and H scales the pixel by V' / V (a black pixel, S = 0, becomes grey V'). For
  grey images V is the pixel: x <- min(x + c, 1).
  """
  del rng
  c = (0.05, 0.1, 0.15, 0.2, 0.3)[severity - 1]
  v = x.max(axis=-1, keepdims=True)
  v_new = np.minimum(v + np.float32(c), 1)
  ratio = np.where(v > 0, v_new / np.where(v > 0, v, 1), 0)
  return np.where(v > 0, x * ratio, v_new)


def contrast(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """(x - m) c + m, m the per-image, per-channel mean; c = 0.75, 0.5, 0.4, 0.3, 0.15."""
  del rng
  c = (0.75, 0.5, 0.4, 0.3, 0.15)[severity - 1]
  m = x.mean(axis=(1, 2), keepdims=True)
  return (x - m) * np.float32(c) + m


def elastic_transform(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """Random affine map, then a smooth random displacement field (Simard et al. 2003).

  (alpha, sigma, affine) = L * (0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06),
  (0.1, 0.04, 0.05), (0.1, 0.03, 0.03) with L = 32 in the reference; here L = sqrt(H W).
  Affine: the three points centre + (q, q), centre + (q, -q), centre - (q, q), q = min(H,W)//3,
  each moved by uniform(-affine, affine) px per coordinate. Displacement: alpha times a
  Gaussian-smoothed (sigma px, truncate 3) uniform(-1, 1) field per axis. Bilinear sampling
  with mirrored borders.

  Note: the reference's parameters are not monotone in distortion: severity 1 is a pure
  affine jitter of up to 2.6 px while severity 5 has a 1 px jitter plus a small elastic
  field, so severity 1 typically moves the image more than severity 5.
  """
  n, h, w, _ = x.shape
  size = math.sqrt(h * w)
  params = ((0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05),
            (0.1, 0.03, 0.03))[severity - 1]
  alpha, sigma, affine = (size * p for p in params)
  centre = np.array([w // 2, h // 2], np.float64)  # (x, y), as OpenCV.
  q = min(h, w) // 3
  src = np.stack([centre + [q, q], centre + [q, -q], centre - [q, q]])  # [3, 2]
  dst = src[None] + rng.uniform(-affine, affine, size=(n, 3, 2))       # [N, 3, 2]
  # Output p = A src + t maps src -> dst; we sample the source at A^{-1}(p - t).
  ones = np.ones((3, 1))
  src_h = np.concatenate([src, ones], axis=1)                           # [3, 3]
  coef = np.linalg.solve(src_h[None], dst)                              # [N, 3, 2]
  mat = np.transpose(coef[:, :2, :], (0, 2, 1))                         # [N, 2, 2]: A
  shift = coef[:, 2, :]                                                 # [N, 2]: t
  inv = np.linalg.inv(mat)
  field = rng.uniform(-1, 1, size=(2, n, h, w))
  if sigma > 0:
    field = ndimage.gaussian_filter(field, (0, 0, sigma, sigma), mode="reflect", truncate=3)
  dy, dx = alpha * field[0], alpha * field[1]
  yy, xx = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64),
                       indexing="ij")
  py = yy[None] + dy - shift[:, 1, None, None]
  px = xx[None] + dx - shift[:, 0, None, None]
  sx = inv[:, 0, 0, None, None] * px + inv[:, 0, 1, None, None] * py
  sy = inv[:, 1, 0, None, None] * px + inv[:, 1, 1, None, None] * py
  return image_ops.bilinear_sample(x, sy, sx)


def pixelate(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """Box down-sampling to int(c H) x int(c W), then nearest up-sampling back;
  c = 0.95, 0.9, 0.85, 0.75, 0.65. (Where the coarse grid falls on the image depends on
  int(c H), so neighbouring severities can swap order in distortion, e.g. 1 and 2 at 28x28.)"""
  del rng
  c = (0.95, 0.9, 0.85, 0.75, 0.65)[severity - 1]
  _, h, w, _ = x.shape
  hs, ws = max(1, int(h * c)), max(1, int(w * c))
  mh = image_ops.nearest_up_matrix(h, hs) @ image_ops.box_down_matrix(hs, h)
  mw = image_ops.nearest_up_matrix(w, ws) @ image_ops.box_down_matrix(ws, w)
  return image_ops.separable(x, mh, mw)


def jpeg_compression(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
  """JPEG round trip at quality 80, 65, 58, 50, 40."""
  del rng
  return jpeg.jpeg_round_trip(x, (80, 65, 58, 50, 40)[severity - 1])


# ------------------------------------------------------------------------------------------------
# Registry and entry point.

Corruption = Callable[[np.ndarray, int, np.random.Generator], np.ndarray]

CATEGORIES: dict[str, list[str]] = {
    "noise": ["gaussian_noise", "shot_noise", "impulse_noise"],
    "blur": ["defocus_blur", "glass_blur", "motion_blur", "zoom_blur"],
    "weather": ["snow", "frost", "fog"],
    "digital": ["brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression"],
}

CORRUPTIONS: dict[str, Corruption] = {
    "gaussian_noise": gaussian_noise,
    "shot_noise": shot_noise,
    "impulse_noise": impulse_noise,
    "defocus_blur": defocus_blur,
    "glass_blur": glass_blur,
    "motion_blur": motion_blur,
    "zoom_blur": zoom_blur,
    "snow": snow,
    "frost": frost,
    "fog": fog,
    "brightness": brightness,
    "contrast": contrast,
    "elastic_transform": elastic_transform,
    "pixelate": pixelate,
    "jpeg_compression": jpeg_compression,
}

NAMES: tuple[str, ...] = tuple(CORRUPTIONS)
assert NAMES == choices.CORRUPTION_NAMES, NAMES


def category_of(name: str) -> str:
  """The category ("noise", "blur", "weather", "digital") of a corruption."""
  for category, names in CATEGORIES.items():
    if name in names:
      return category
  raise ValueError(f"unknown corruption {name!r}; allowed: {', '.join(NAMES)}")


def check_images(images: np.ndarray) -> np.ndarray:
  """Validates [N, H, W, C] float images in [0, 1] with C in {1, 3}; returns float32."""
  images = np.asarray(images)
  if images.ndim != 4 or images.shape[-1] not in (1, 3):
    raise ValueError(f"images must be [N, H, W, C] with C in (1, 3), got shape {images.shape}")
  if not np.issubdtype(images.dtype, np.floating):
    raise ValueError(f"images must be floats in [0, 1], got dtype {images.dtype}")
  if images.size and not (np.isfinite(images).all() and images.min() >= -1e-6
                          and images.max() <= 1 + 1e-6):
    raise ValueError(f"images must be finite and in [0, 1] (pixel space, not the model's "
                     f"normalised space), got range [{images.min()}, {images.max()}]; see "
                     "xsens.measures.corruption_eval.to_unit_range")
  return np.clip(images.astype(np.float32), 0, 1)


def corrupt(images: np.ndarray, name: str, severity: int,
            seed: int | Sequence[int] = 0) -> np.ndarray:
  """Applies one corruption at one severity.

  Args:
    images: [N, H, W, C] float in [0, 1] (pixel space), C in {1, 3}.
    name: a key of `CORRUPTIONS`.
    severity: 1..5.
    seed: seeds `np.random.default_rng(seed)`; equal seeds give equal outputs.

  Returns:
    [N, H, W, C] float32 in [0, 1].
  """
  if name not in CORRUPTIONS:
    raise ValueError(f"unknown corruption {name!r}; allowed: {', '.join(NAMES)}")
  if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or \
      severity not in SEVERITIES:
    raise ValueError(f"severity must be an int in 1..5, got {severity!r}")
  x = check_images(images)
  if x.shape[0] == 0:
    return x
  out = CORRUPTIONS[name](x, int(severity), np.random.default_rng(seed))
  return np.clip(out, 0, 1).astype(np.float32)
