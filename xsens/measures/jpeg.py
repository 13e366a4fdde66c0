"""A baseline JPEG encoder + decoder in NumPy (ITU-T T.81), for the `jpeg_compression`
corruption of `xsens.measures.corruptions`.

It matches PIL/libjpeg to about 0.2 grey levels on grey images and 1 on RGB, against a
compression error of 1.5-3 levels at the corruption's qualities (tests/corruptions_test.py).
"""

import numpy as np

# JPEG (ITU-T T.81 Annex K) base quantisation tables.
_JPEG_LUMA = np.array([
    [16, 11, 10, 16, 24, 40, 51, 61], [12, 12, 14, 19, 26, 58, 60, 55],
    [14, 13, 16, 24, 40, 57, 69, 56], [14, 17, 22, 29, 51, 87, 80, 62],
    [18, 22, 37, 56, 68, 109, 103, 77], [24, 35, 55, 64, 81, 104, 113, 92],
    [49, 64, 78, 87, 103, 121, 120, 101], [72, 92, 95, 98, 112, 100, 103, 99]], np.float64)
_JPEG_CHROMA = np.full((8, 8), 99.0)
_JPEG_CHROMA[:4, :4] = [[17, 18, 24, 47], [18, 21, 26, 66], [24, 26, 56, 99], [47, 66, 99, 99]]


def jpeg_quant_table(base: np.ndarray, quality: int) -> np.ndarray:
  """IJG quality scaling: base * (5000 / q if q < 50 else 200 - 2 q) / 100, in [1, 255]."""
  q = min(max(int(quality), 1), 100)
  scale = 5000 / q if q < 50 else 200 - 2 * q
  return np.clip(np.floor((base * scale + 50) / 100), 1, 255)


def _dct_matrix() -> np.ndarray:
  """Orthonormal 8-point DCT-II matrix D [k, n]; coefficients = D @ block @ D.T."""
  k = np.arange(8)[:, None]
  n = np.arange(8)[None, :]
  d = np.cos(np.pi * (2 * n + 1) * k / 16) * np.sqrt(2 / 8)
  d[0] /= np.sqrt(2)
  return d


def _jpeg_plane(plane: np.ndarray, table: np.ndarray) -> np.ndarray:
  """DCT, quantise, dequantise, inverse DCT of 8x8 blocks. [N, H, W] (H, W multiples of 8)."""
  n, h, w = plane.shape
  d = _dct_matrix()
  blocks = (plane - 128).reshape(n, h // 8, 8, w // 8, 8).transpose(0, 1, 3, 2, 4)
  coef = d @ blocks @ d.T                                   # [N, H/8, W/8, 8, 8]
  coef = np.round(coef / table) * table
  back = (d.T @ coef @ d).transpose(0, 1, 3, 2, 4)
  return back.reshape(n, h, w) + 128


def _pad_to(x: np.ndarray, multiple: int) -> np.ndarray:
  """Edge-pads axes 1, 2 of [N, H, W, ...] up to multiples of `multiple`."""
  ph = -x.shape[1] % multiple
  pw = -x.shape[2] % multiple
  pad = [(0, 0), (0, ph), (0, pw)] + [(0, 0)] * (x.ndim - 3)
  return np.pad(x, pad, mode="edge")


def jpeg_round_trip(x: np.ndarray, quality: int) -> np.ndarray:
  """Baseline JPEG encode + decode at `quality` (1..100), in NumPy.

  8-bit input; RGB -> YCbCr (JFIF); chroma 4:2:0 (2x2 means; libjpeg's triangle up-sampling on
  decode; PIL's default subsampling); 8x8 orthonormal DCT-II of level-shifted blocks;
  quantisation with the Annex K luminance / chrominance tables scaled by IJG's quality
  formula; decode back to 8-bit RGB. Images are edge-padded to whole blocks (16 px for RGB,
  8 for grey) and cropped back. Grey images code their single (luma) channel.

  Args:
    x: [N, H, W, C] in [0, 1], C in {1, 3}.
    quality: JPEG quality.

  Returns:
    [N, H, W, C] float32 on the 8-bit grid k / 255.
  """
  n, h, w, c = x.shape
  pix = np.round(np.clip(x.astype(np.float64), 0, 1) * 255)
  luma_table = jpeg_quant_table(_JPEG_LUMA, quality)
  if c == 1:
    out = _jpeg_plane(_pad_to(pix, 8)[..., 0], luma_table)[:, :h, :w, None]
  else:
    pix = _pad_to(pix, 16)
    r, g, b = pix[..., 0], pix[..., 1], pix[..., 2]
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = -0.168736 * r - 0.331264 * g + 0.5 * b + 128
    cr = 0.5 * r - 0.418688 * g - 0.081312 * b + 128
    hp, wp = y.shape[1:]

    def sub(p):  # 2x2 mean.
      return p.reshape(n, hp // 2, 2, wp // 2, 2).mean(axis=(2, 4))

    def up(p):  # libjpeg's "fancy" (triangle) up-sampling, separable: 3/4 near + 1/4 far.
      for axis in (1, 2):
        prev = np.concatenate([np.take(p, [0], axis), np.take(p, range(p.shape[axis] - 1),
                                                              axis)], axis)
        nxt = np.concatenate([np.take(p, range(1, p.shape[axis]), axis),
                              np.take(p, [p.shape[axis] - 1], axis)], axis)
        p = np.stack([0.75 * p + 0.25 * prev, 0.75 * p + 0.25 * nxt], axis=axis + 1)
        shape = list(p.shape)
        p = p.reshape(shape[:axis] + [shape[axis] * 2] + shape[axis + 2:])
      return p

    chroma_table = jpeg_quant_table(_JPEG_CHROMA, quality)
    y = _jpeg_plane(y, luma_table)
    cb = up(_jpeg_plane(sub(cb), chroma_table)) - 128
    cr = up(_jpeg_plane(sub(cr), chroma_table)) - 128
    out = np.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb],
                   axis=-1)[:, :h, :w]
  return (np.clip(np.round(out), 0, 255) / 255).astype(np.float32)
