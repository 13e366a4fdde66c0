"""Per-image preprocessing of RGB uint8 images with NumPy and PIL, for the streamed datasets
(`xsens.data.streaming`, `xsens.data.train_stream`).

- decode (`decode_image`): encoded bytes (JPEG, PNG, ...) decoded with PIL to RGB uint8
  (grayscale repeated to 3 channels, CMYK converted, alpha dropped); already decoded arrays
  (e.g. `tensor` features or `tfds.testing.mock_data` without decoders) pass through. TFDS
  4.9.10 itself would decode with OpenCV if installed, else PIL
  (`tfds.features.Image.decode_example_np`); decoding here also makes CMYK and grayscale JPEGs
  come out as 3-channel RGB.
- evaluation geometry (`preprocess_image`, `crop`):
    "center": the central square of side int(crop_fraction * min(H, W)), offsets
      ((H - s + 1) // 2, (W - s + 1) // 2), then resized to `image_size` with `resample`.
      With crop_fraction 224/256 = 0.875 and "bicubic" this is the crop box of TFDS's
      `imagenet2012_corrupted` builder, which made ImageNet-C (`_decode_and_center_crop`:
      224 / (224 + 32) of the shorter side, bicubic to 224 x 224), so clean and
      pre-corrupted images show the same region. The resampling differs: PIL's bicubic
      antialiases when shrinking, TensorFlow's does not, so clean images here are a
      little smoother than ImageNet-C's stored ones.
    "resize": the whole image resized to `image_size` (aspect ratio not kept). This is the
      eval preprocessing (up to PIL's antialiasing) of both public checkpoint releases: vit_jax
      `input_pipeline.get_data` (`tf.image.resize(im, [crop, crop])`, bilinear) and
      big_transfer `bit_pytorch/train.py` (`Resize((crop, crop))`).
- training geometry (`augment_image`, `Augment`): an inception crop, a pad-and-crop or a
  resize, then a random horizontal flip.
- `normalize_pixels` as in `pipeline.scale_pixels`: "zero_one" x / 255, "half"
  (x / 255 - .5) / .5 ([-1, 1], what vit_jax and big_transfer feed their models:
  `(im - 127.5) / 127.5` and `Normalize((.5, .5, .5), (.5, .5, .5))`), or "uint8" (raw
  pixels, e.g. to corrupt them first).
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import io
from typing import Any

import numpy as np
from PIL import Image

from xsens.data import pipeline

CROPS = ("center", "resize")
NORMALIZE = ("zero_one", "half", "uint8")
RESAMPLE = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}
IMAGENET_C_CROP = 224 / (224 + 32)  # TFDS imagenet2012_corrupted: _IMAGE_SIZE / (+ padding).


# ------------------------------------------------------------------------------------------------
# Evaluation: decoding, the fixed crop, normalisation.


def center_crop_box(height: int, width: int, fraction: float) -> tuple[int, int, int]:
  """(top, left, side) of the central square, TFDS imagenet2012_corrupted's arithmetic.

  side = int(fraction * min(H, W)) (at least 1), top = (H - side + 1) // 2,
  left = (W - side + 1) // 2.
  """
  side = max(1, int(fraction * min(height, width)))
  return (height - side + 1) // 2, (width - side + 1) // 2, side


def to_rgb(image: np.ndarray) -> np.ndarray:
  """[H, W] / [H, W, 1] / [H, W, 3] / [H, W, 4] uint8 -> [H, W, 3].

  Gray is repeated to three channels, alpha dropped.
  """
  image = np.asarray(image)
  if image.ndim == 2:
    image = image[..., None]
  if image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
    raise ValueError(f"need an [H, W, C] image with C in 1, 3, 4; got shape {image.shape}")
  if image.shape[-1] == 1:
    return np.repeat(image, 3, axis=-1)
  return image[..., :3]


def decode_image(value: Any) -> np.ndarray:
  """Encoded image bytes (JPEG, PNG, ...) or an already decoded array -> [H, W, 3] uint8."""
  if isinstance(value, (bytes, bytearray, memoryview, np.bytes_)):
    with Image.open(io.BytesIO(bytes(value))) as img:
      return np.asarray(img.convert("RGB"), dtype=np.uint8)
  array = np.asarray(value)
  if array.dtype == object and array.ndim == 0:  # A 0-d object array holding bytes.
    return decode_image(array.item())
  if array.dtype != np.uint8:
    raise ValueError(f"decoded images must be uint8, got {array.dtype}")
  return to_rgb(array)


def preprocess_image(image: np.ndarray, image_size: Sequence[int], *, crop: str = "center",
                     crop_fraction: float = IMAGENET_C_CROP,
                     resample: str = "bicubic") -> np.ndarray:
  """Crops and resizes one RGB uint8 image. [H, W, 3] -> [image_size[0], image_size[1], 3] uint8.

  See the module docstring for "center" and "resize". Resizing is PIL's
  (antialiased when shrinking); an image already of the target size is returned as is.
  """
  if crop not in CROPS:
    raise ValueError(f"crop must be one of {', '.join(CROPS)}, got {crop!r}")
  h, w = image.shape[:2]
  if crop == "center":
    top, left, side = center_crop_box(h, w, crop_fraction)
    image = image[top:top + side, left:left + side]
  out_h, out_w = int(image_size[0]), int(image_size[1])
  if image.shape[:2] == (out_h, out_w):
    return np.ascontiguousarray(image)
  pil = Image.fromarray(np.ascontiguousarray(image))
  return np.asarray(pil.resize((out_w, out_h), RESAMPLE[resample]), dtype=np.uint8)


def normalize_pixels(images: np.ndarray, normalize: str) -> np.ndarray:
  """uint8 pixels -> model space: "zero_one", "half" (float32, as `pipeline.scale_pixels`) or
  "uint8" (unchanged). [...] -> same shape."""
  if normalize == "uint8":
    return images
  if normalize not in ("zero_one", "half"):
    raise ValueError(f"normalize must be one of {', '.join(NORMALIZE)}, got {normalize!r}")
  return pipeline.scale_pixels(images, normalize, True)


# ------------------------------------------------------------------------------------------------
# Training: random crops and flips.

TRAIN_CROPS = ("inception", "pad_crop", "resize")


@dataclasses.dataclass(frozen=True)
class Augment:
  """Training-time geometry of one image (see `augment_image`).

  crop: "inception" (random resized crop), "pad_crop" (zero-pad `pad` pixels, random crop
    of `image_size`) or "resize" (the whole image resized, no random crop).
  area_range: (min, max) fraction of the image area of an inception crop.
  aspect_range: (min, max) width / height of an inception crop (drawn log-uniformly).
  pad: padding of "pad_crop", in pixels on each side.
  flip: a horizontal flip with probability 1/2.
  resample: PIL filter of the resize ("bilinear", "bicubic", "nearest").
  """
  crop: str = "inception"
  area_range: tuple[float, float] = (0.08, 1.0)
  aspect_range: tuple[float, float] = (3 / 4, 4 / 3)
  pad: int = 4
  flip: bool = True
  resample: str = "bilinear"


def inception_crop_box(height: int, width: int, rng: np.random.Generator,
                       area_range: Sequence[float] = (0.08, 1.0),
                       aspect_range: Sequence[float] = (3 / 4, 4 / 3),
                       attempts: int = 10) -> tuple[int, int, int, int]:
  """(top, left, h, w) of a random resized ("inception") crop box.

  Up to `attempts` draws of an area fraction a ~ U(area_range) and a log-uniform aspect
  ratio r (width / height) in `aspect_range`; the box is w = round(sqrt(a H W r)),
  h = round(sqrt(a H W / r)), and the first one that fits is placed uniformly
  (top ~ U{0..H-h}, left ~ U{0..W-w}). If none fits, the whole image. This is the scheme
  of big_vision's `inception_crop` (pp/ops_image.py, via
  `tf.image.sample_distorted_bounding_box`, area 5%-100% by default there) and of
  torchvision's `RandomResizedCrop` (area 8%-100%, ratio 3/4-4/3, 10 attempts); the draws
  are NumPy's, so the boxes are not TensorFlow's.
  """
  area = float(height * width)
  log_lo, log_hi = np.log(aspect_range[0]), np.log(aspect_range[1])
  for _ in range(attempts):
    target = area * rng.uniform(area_range[0], area_range[1])
    ratio = float(np.exp(rng.uniform(log_lo, log_hi)))
    w = int(round(np.sqrt(target * ratio)))
    h = int(round(np.sqrt(target / ratio)))
    if 0 < h <= height and 0 < w <= width:
      top = int(rng.integers(0, height - h + 1))
      left = int(rng.integers(0, width - w + 1))
      return top, left, h, w
  return 0, 0, height, width


def augment_image(image: np.ndarray, image_size: Sequence[int], rng: np.random.Generator,
                  augment: Augment) -> np.ndarray:
  """One random training view. [H, W, 3] uint8 -> [image_size[0], image_size[1], 3] uint8.

  Draws, in this order: the crop box (`inception_crop_box`, or the pad-crop offsets
  top, left ~ U{0..2 pad}), then the flip (rng.random() < 0.5).
  """
  out_h, out_w = int(image_size[0]), int(image_size[1])
  if augment.crop == "inception":
    top, left, h, w = inception_crop_box(image.shape[0], image.shape[1], rng,
                                         augment.area_range, augment.aspect_range)
    image = _resize(image[top:top + h, left:left + w], (out_h, out_w), augment.resample)
  elif augment.crop == "pad_crop":
    image = _resize(image, (out_h, out_w), augment.resample)
    p = int(augment.pad)
    padded = np.pad(image, ((p, p), (p, p), (0, 0)))
    top, left = int(rng.integers(0, 2 * p + 1)), int(rng.integers(0, 2 * p + 1))
    image = padded[top:top + out_h, left:left + out_w]
  elif augment.crop == "resize":
    image = _resize(image, (out_h, out_w), augment.resample)
  else:
    raise ValueError(f"crop must be one of {', '.join(TRAIN_CROPS)}, got {augment.crop!r}")
  if augment.flip and rng.random() < 0.5:
    image = image[:, ::-1]
  return np.ascontiguousarray(image)


def _resize(image: np.ndarray, size: tuple[int, int], resample: str) -> np.ndarray:
  if image.shape[:2] == size:
    return image
  pil = Image.fromarray(np.ascontiguousarray(image))
  return np.asarray(pil.resize((size[1], size[0]), RESAMPLE[resample]), dtype=np.uint8)
