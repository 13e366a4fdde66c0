"""The token interface shared by xsens models and measures.

Convention: a model that can be measured exposes a pair of pure functions

  to_tokens(x) -> tokens [B, T, D]
  from_tokens(tokens [B, T, D]) -> logits [B, K]

with `from_tokens(to_tokens(x)) == predict_fn(x)`. Token-wise measures (e.g.
`xsens.measures.sensitivity.token_sensitivity`) perturb `tokens` and call
`from_tokens`; they never look inside the model.

- Images: tokens are grid-aligned, non-overlapping p x p pixel patches of the
  (already normalised) input, flattened to D = p*p*C. `from_tokens` unpatchifies
  and runs the network, so the same estimator measures a ViT, a CNN or an MLP in
  the same space ("adding noise to one patch at a time ... the process is the
  same for CNNs and ViTs", authors' rebuttal, arXiv 2403.06925).
- Text: `to_tokens` is embedding (+ LayerNorm where the model has one) and
  `from_tokens` the rest of the network (`embed` and `encode(tokens, mask)` of
  `xsens.models.text`; the padding mask travels per example, see
  `xsens.measures.text_sensitivity`).

`from_tokens` must treat the leading axis as an ordinary batch axis: measures
call it on `[c * B, T, D]` stacks of perturbed copies.
"""

from typing import Callable, Sequence

import jax

Array = jax.Array
PredictFn = Callable[[Array], Array]


def _check_grid(height: int, width: int, patch_size: int) -> None:
  if patch_size < 1 or height % patch_size or width % patch_size:
    raise ValueError(
        f"patch_size={patch_size} must divide the image size "
        f"{height}x{width}.")


def patchify(images: Array, patch_size: int) -> Array:
  """Cuts images into grid-aligned non-overlapping patches, row-major order.

  Args:
    images: [B, H, W, C].
    patch_size: p; must divide H and W.

  Returns:
    tokens: [B, T, p*p*C] with T = (H/p)*(W/p); token t is the patch at grid
      row t // (W/p), column t % (W/p); within a token the layout is (p, p, C).
  """
  b, h, w, c = images.shape
  p = patch_size
  _check_grid(h, w, p)
  x = images.reshape(b, h // p, p, w // p, p, c)
  x = x.transpose(0, 1, 3, 2, 4, 5)  # [B, H/p, W/p, p, p, C]
  return x.reshape(b, (h // p) * (w // p), p * p * c)


def unpatchify(
    tokens: Array, patch_size: int, image_shape: Sequence[int]) -> Array:
  """The exact inverse of `patchify`.

  Args:
    tokens: [B, T, p*p*C].
    patch_size: p.
    image_shape: (H, W, C); a leading batch dimension is ignored if present.

  Returns:
    images: [B, H, W, C].
  """
  h, w, c = tuple(image_shape)[-3:]
  p = patch_size
  _check_grid(h, w, p)
  b = tokens.shape[0]
  x = tokens.reshape(b, h // p, w // p, p, p, c)
  x = x.transpose(0, 1, 3, 2, 4, 5)  # [B, H/p, p, W/p, p, C]
  return x.reshape(b, h, w, c)


def image_token_fns(
    predict_fn: PredictFn, patch_size: int, image_shape: Sequence[int]
) -> tuple[Callable[[Array], Array], Callable[[Array], Array]]:
  """Token view of an image classifier.

  Args:
    predict_fn: images [B, H, W, C] -> logits [B, K]; a pure closure over the
      variables, e.g. `lambda x: model.apply(variables, x, train=False)`.
    patch_size: p; must divide H and W.
    image_shape: (H, W, C) (a leading batch dimension is ignored).

  Returns:
    (to_tokens, from_tokens): images [B, H, W, C] -> tokens [B, T, p*p*C] and
    tokens -> logits [B, K], with from_tokens(to_tokens(x)) == predict_fn(x).
  """
  h, w, c = tuple(image_shape)[-3:]
  _check_grid(h, w, patch_size)

  def to_tokens(images: Array) -> Array:
    return patchify(images, patch_size)

  def from_tokens(tokens: Array) -> Array:
    return predict_fn(unpatchify(tokens, patch_size, (h, w, c)))

  return to_tokens, from_tokens


def patch_grid(image_shape: Sequence[int], patch_size: int) -> tuple[int, int]:
  """(H/p, W/p): the token grid of `patchify`, for reshaping [B, T] maps."""
  h, w = tuple(image_shape)[-3:-1]
  _check_grid(h, w, patch_size)
  return h // patch_size, w // patch_size

