"""Tokens: the axis along which the token-wise measures perturb a model's input.

The measures of `xsens.measures.sensitivity` take a model one way,

  measure(apply_fn, variables, inputs, *, labels=None, key=None, mask=None, ...)

with apply_fn(variables, inputs [B', ...]) -> logits [B', K] in eval mode, and
perturb the inputs one token at a time. The tokens are

- images [B, H, W, C] with `patch_size=p`: grid-aligned, non-overlapping p x p
  pixel patches of the (already normalised) input, flattened to D = p*p*C
  (`patchify`; the measure unpatchifies each perturbed copy before calling
  apply_fn), so the same estimator measures a ViT, a CNN or an MLP in the same
  space ("adding noise to one patch at a time ... the process is the same for
  CNNs and ViTs", authors' rebuttal, arXiv 2403.06925);
- token embeddings [B, T, D] (token axis 1) otherwise, e.g. a text model's
  embeddings with apply_fn its from-embeddings method bound with `method=`
  (`xsens.measures.text_sensitivity` for models that also take a padding mask).

apply_fn must treat the leading axis as an ordinary batch axis: the measures
call it on [B * c, ...] stacks of perturbed copies.
"""

from typing import Any, Callable, Optional, Sequence

import jax

Array = jax.Array
ApplyFn = Callable[[Any, Array], Array]


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


def token_view(
    apply_fn: ApplyFn, inputs: Array, patch_size: Optional[int] = None
) -> tuple[ApplyFn, Array]:
  """The token view of a measured model, in the measures' calling convention.

  Args:
    apply_fn: (variables, inputs [B', ...]) -> logits [B', K], e.g.
      `functools.partial(model.apply, train=False)`.
    inputs: images [B, H, W, C] when patch_size is given, else tokens
      [B, T, D] (token axis 1), e.g. a text model's embeddings.
    patch_size: p, which must divide H and W; None when inputs are tokens.

  Returns:
    (token_apply_fn, tokens): token_apply_fn(variables, tokens [B', T, D]) ->
    logits [B', K] (for images it unpatchifies, then calls apply_fn) and the
    tokens of `inputs`, so token_apply_fn(v, tokens) == apply_fn(v, inputs).
  """
  if patch_size is None:
    if inputs.ndim != 3:
      raise ValueError(
          f"inputs must be tokens [B, T, D] (or images [B, H, W, C] with "
          f"patch_size), got shape {tuple(inputs.shape)}.")
    return apply_fn, inputs
  if inputs.ndim != 4:
    raise ValueError(f"with patch_size, inputs must be images [B, H, W, C], "
                     f"got shape {tuple(inputs.shape)}.")
  image_shape = tuple(inputs.shape[1:])
  _check_grid(*image_shape[:2], patch_size)

  def token_apply_fn(variables: Any, tokens: Array) -> Array:
    return apply_fn(variables, unpatchify(tokens, patch_size, image_shape))

  return token_apply_fn, patchify(inputs, patch_size)


def patch_grid(image_shape: Sequence[int], patch_size: int) -> tuple[int, int]:
  """(H/p, W/p): the token grid of `patchify`, for reshaping [B, T] maps."""
  h, w = tuple(image_shape)[-3:-1]
  _check_grid(h, w, patch_size)
  return h // patch_size, w // patch_size

