"""Pretrained checkpoints from local `.npz` files onto xsens parameter trees.

ViT: `load_vit`, `vit_params_from_checkpoint`, `vit_config_from_checkpoint`.
BiT ResNet-v2 (Kolesnikov et al. 2020, arXiv 1912.11370; the
google-research/big_transfer release, keys `resnet/...`): `load_bit`,
`bit_params_from_checkpoint`, `bit_config_from_checkpoint`; see
`xsens.models.bit` for the name map.
ConvNeXt (Liu et al. 2022, arXiv 2201.03545; the timm / Hugging Face `safetensors`
release, e.g. timm/convnext_tiny.fb_in1k `model.safetensors`, keys `stem.0.weight`, ...):
`load_convnext`, `convnext_params_from_checkpoint`, `convnext_config_from_checkpoint`;
read with `safetensors.numpy` (no PyTorch).
`VIT_JAX`, `BIG_TRANSFER` and `TIMM_CONVNEXT` bundle each release's reader and two
functions as a `Format`: the `pretrained` of the registry entries "vit", "bit_resnet" and
"convnext" (`xsens.models.REGISTRY`).

ViT (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words", arXiv
2010.11929): the google-research/vision_transformer release (`vit_jax`) stores
flat '/'-joined keys (`np.savez`), e.g.

  embedding/kernel                  [p, p, C, D]  -> embedding/kernel
  cls                               [1, 1, D]     -> cls (+ posemb of the cls slot)
  Transformer/posembed_input/pos_embedding [1, 1+N, D] -> pos_embedding [1, N, D]
  Transformer/encoderblock_i/LayerNorm_0/...             -> encoderblock_i/LayerNorm_0/...
  Transformer/encoderblock_i/MultiHeadDotProductAttention_1/{query,key,value,out}/...
                                    -> encoderblock_i/MultiHeadDotProductAttention_0/...
  Transformer/encoderblock_i/LayerNorm_2/...             -> encoderblock_i/LayerNorm_1/...
  Transformer/encoderblock_i/MlpBlock_3/Dense_{0,1}/...
                                    -> encoderblock_i/MlpBlock_0/Dense_{0,1}/...
  Transformer/encoder_norm/...      -> encoder_norm/...
  pre_logits/{kernel,bias}          -> pre_logits/... (ViT(representation_size=...))
  head/{kernel,bias}                -> head/...

Everything else in the two models is the same computation: a p x p stride-p
VALID conv patch embedding, pre-LN blocks with flax LayerNorm (epsilon 1e-6 in
both), flax multi-head attention, tanh-approximate GELU MLP, final LayerNorm,
token 0 (`classifier='token'`, our pooling='cls') or the token mean
(`classifier='gap'`, our pooling='mean'), optional tanh pre-logits, head.
The one structural difference: vit_jax adds its position embedding after
prepending the cls token, xsens before. Since concat(cls, x) + pe equals
concat(cls + pe[0], x + pe[1:]), the loader folds pe[0] into `cls`, and the
loaded model computes the same function as vit_jax (float32 rounding of that
one addition aside).

Image sizes differ from the checkpoint's: the grid part of the position
embedding is resized like `vit_jax.checkpoint.load_pretrained`, i.e.
`scipy.ndimage.zoom(grid, (gh'/gh, gw'/gw, 1), order=1)`: bilinear with
corners aligned (output index o reads input o * (g - 1) / (g' - 1)).
`resize_posemb_grid` re-implements it in NumPy (no SciPy needed).
"""

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xsens import paths
from xsens.models import bit as bit_lib
from xsens.models import convnext as convnext_lib
from xsens.models import vit as vit_lib

Checkpoint = Mapping[str, np.ndarray]

_VIT_RULES = (
    (r"embedding/(kernel|bias)", r"embedding/\1"),
    (r"Transformer/encoderblock_(\d+)/LayerNorm_0/(scale|bias)",
     r"encoderblock_\1/LayerNorm_0/\2"),
    (r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/"
     r"(query|key|value|out)/(kernel|bias)",
     r"encoderblock_\1/MultiHeadDotProductAttention_0/\2/\3"),
    (r"Transformer/encoderblock_(\d+)/LayerNorm_2/(scale|bias)",
     r"encoderblock_\1/LayerNorm_1/\2"),
    (r"Transformer/encoderblock_(\d+)/MlpBlock_3/(Dense_[01])/(kernel|bias)",
     r"encoderblock_\1/MlpBlock_0/\2/\3"),
    (r"Transformer/encoder_norm/(scale|bias)", r"encoder_norm/\1"),
    (r"pre_logits/(kernel|bias)", r"pre_logits/\1"),
    (r"head/(kernel|bias)", r"head/\1"),
)
_CLS = "cls"
_POSEMB = "Transformer/posembed_input/pos_embedding"


class CheckpointError(ValueError):
  """A checkpoint does not fit the model: missing, unexpected or misshaped keys."""


def one_line(error: Exception, limit: int = 400) -> str:
  """`error`'s message on one line (whitespace collapsed), cut to `limit` characters, for
  a one-line ConfigError."""
  text = " ".join(str(error).split()) or type(error).__name__
  return text if len(text) <= limit else text[:limit - 1] + "…"


def read_npz(path: Union[str, os.PathLike]) -> dict[str, np.ndarray]:
  """Reads a flat `np.savez` checkpoint into {key: array} (fully loaded); a remote path
  (`gs://...`) is read through `etils.epath` (`xsens.paths`)."""
  if paths.is_remote(path):
    return paths.load_npz(path, allow_pickle=False)
  with np.load(path, allow_pickle=False) as data:
    return {k: np.asarray(data[k]) for k in data.files}


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """Nested dict -> {'a/b/c': leaf}."""
  out = {}
  for k, v in tree.items():
    name = f"{prefix}{k}"
    if isinstance(v, Mapping):
      out.update(flatten(v, name + "/"))
    else:
      out[name] = v
  return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  """{'a/b/c': leaf} -> nested dict."""
  out: dict[str, Any] = {}
  for path, v in flat.items():
    node = out
    *parents, leaf = path.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  return out


def _linear_resize_axis(a: np.ndarray, size: int, axis: int) -> np.ndarray:
  """Linear interpolation along `axis` to `size` samples, corners aligned."""
  old = a.shape[axis]
  if old == size:
    return a
  pos = (np.arange(size) * ((old - 1) / (size - 1)) if size > 1
         else np.zeros(1))
  lo = np.clip(np.floor(pos).astype(int), 0, old - 1)
  hi = np.minimum(lo + 1, old - 1)
  frac = (pos - lo).reshape([-1 if i == axis else 1 for i in range(a.ndim)])
  return (np.take(a, lo, axis=axis) * (1 - frac)
          + np.take(a, hi, axis=axis) * frac)


def resize_posemb_grid(grid: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  """Bilinear resize of a position-embedding grid, as vit_jax does it.

  Equals `scipy.ndimage.zoom(grid, (h / gh, w / gw, 1), order=1)` (corner-
  aligned linear interpolation along rows, then columns).

  Args:
    grid: [gh, gw, D].
    size: (h, w) of the new grid.

  Returns:
    [h, w, D] in grid's dtype (computed in float64).
  """
  out = _linear_resize_axis(np.asarray(grid, np.float64), size[0], 0)
  out = _linear_resize_axis(out, size[1], 1)
  return out.astype(grid.dtype)


def _posemb_params(checkpoint: Checkpoint, model: vit_lib.ViT,
                   grid: tuple[int, int]) -> dict[str, np.ndarray]:
  """The checkpoint's position embedding (and cls) as xsens 'pos_embedding'/'cls'."""
  pe = np.asarray(checkpoint[_POSEMB])
  if pe.ndim != 3 or pe.shape[0] != 1:
    raise CheckpointError(f"{_POSEMB} must be [1, tokens, width]; got {pe.shape}.")
  out = {}
  if model.pooling == "cls":
    if _CLS not in checkpoint:
      raise CheckpointError("the model uses pooling='cls' but the checkpoint has "
                            "no 'cls' token (a classifier='gap' checkpoint needs "
                            "pooling='mean').")
    out["cls"] = np.asarray(checkpoint[_CLS]) + pe[:, :1]
    pe = pe[:, 1:]
  tokens = pe.shape[1]
  side = math.isqrt(tokens)
  if side * side != tokens:
    raise CheckpointError(
        f"{_POSEMB} holds {tokens} grid tokens (after any cls slot), not a square "
        f"grid; check pooling ({model.pooling!r}) against the checkpoint.")
  if (side, side) != grid:
    pe = resize_posemb_grid(pe.reshape(side, side, -1), grid)
  out["pos_embedding"] = pe.reshape(1, grid[0] * grid[1], -1)
  return out


def _target_shapes(model: nn.Module, image_shape) -> dict[str, tuple[int, ...]]:
  x = jax.ShapeDtypeStruct((1, *image_shape), jnp.float32)
  variables = jax.eval_shape(
      lambda x: model.init({"params": jax.random.key(0)}, x, train=False), x)
  return {k: tuple(v.shape) for k, v in flatten(variables["params"]).items()}


def _report(missing, unexpected, misshaped) -> None:
  """Raises CheckpointError listing every problem, or returns."""
  lines = []
  if missing:
    lines.append("missing (in the model, not in the checkpoint): "
                 + ", ".join(sorted(missing)))
  if unexpected:
    lines.append("unexpected (in the checkpoint, not in the model): "
                 + ", ".join(sorted(unexpected)))
  if misshaped:
    lines.append("shape mismatch (checkpoint -> model): " + ", ".join(
        f"{k} {got} vs {want}" for k, got, want in sorted(misshaped)))
  if lines:
    raise CheckpointError("checkpoint does not fit the model:\n  "
                          + "\n  ".join(lines))


def _map_keys(checkpoint: Checkpoint, rules, skip=()):
  """Renames checkpoint keys by the first matching (pattern, replacement) rule.

  Returns:
    ({xsens path: array}, {xsens path: checkpoint key}, [unmatched keys]).
  """
  loaded, source, unexpected = {}, {}, []
  for name, value in checkpoint.items():
    if name in skip:
      continue
    for pattern, repl in rules:
      if re.fullmatch(pattern, name):
        path = re.sub(pattern, repl, name)
        loaded[path], source[path] = np.asarray(value), name
        break
    else:
      unexpected.append(name)
  return loaded, source, unexpected


def finish(loaded, source, unexpected, target) -> dict[str, Any]:
  """Checks `loaded` against the target shapes; returns the nested jnp tree."""
  unexpected = list(unexpected) + [source.get(k, k) for k in loaded if k not in target]
  missing = [k for k in target if k not in loaded]
  misshaped = [(k, tuple(v.shape), target[k]) for k, v in loaded.items()
               if k in target and tuple(v.shape) != target[k]]
  _report(missing, unexpected, misshaped)
  return unflatten({k: jnp.asarray(v, jnp.float32) for k, v in loaded.items()})


def _head(key: Optional[jax.Array], in_dim: int, num_classes: int):
  """A fresh head: xsens's Dense initialiser under `key`, or zeros (vit_jax)."""
  if key is None:
    return {"head/kernel": np.zeros((in_dim, num_classes), np.float32),
            "head/bias": np.zeros((num_classes,), np.float32)}
  head = nn.Dense(num_classes).init(key, jnp.zeros((1, in_dim)))["params"]
  return {f"head/{k}": np.asarray(v) for k, v in head.items()}


def vit_config_from_checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
  """ViT fields implied by a vit_jax checkpoint.

  Returns:
    dict(num_classes, patch_size, width, depth, num_heads, mlp_dim, pooling,
    representation_size) for `xsens.models.ViT(**config)`; e.g. ViT-B/16 gives
    patch_size=16, width=768, depth=12, num_heads=12, mlp_dim=3072.
  """
  try:
    kernel = checkpoint["embedding/kernel"]
    blocks = {int(m.group(1)) for k in checkpoint
              if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))}
    query = checkpoint["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/"
                       "query/kernel"]
    mlp = checkpoint["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"]
    head = checkpoint["head/kernel"]
  except KeyError as e:
    raise CheckpointError(f"not a vit_jax checkpoint: no key {e}") from None
  pre = checkpoint.get("pre_logits/kernel")
  return dict(num_classes=int(head.shape[-1]), patch_size=int(kernel.shape[0]),
              width=int(kernel.shape[-1]), depth=len(blocks),
              num_heads=int(query.shape[1]), mlp_dim=int(mlp.shape[-1]),
              pooling="cls" if _CLS in checkpoint else "mean",
              representation_size=None if pre is None else int(pre.shape[-1]))


def vit_params_from_checkpoint(checkpoint: Checkpoint, model: vit_lib.ViT,
                               image_shape: tuple[int, int, int], *,
                               reinit_head: bool = False,
                               key: Optional[jax.Array] = None) -> dict[str, Any]:
  """Maps a vit_jax checkpoint onto `model`'s parameter tree.

  Args:
    checkpoint: {vit_jax key: array}, e.g. from `read_npz`.
    model: an `xsens.models.ViT` with posemb='learned' whose sizes match the
      checkpoint (see `vit_config_from_checkpoint`); its num_classes may differ
      only with reinit_head=True.
    image_shape: (H, W, C) the model will see; the position-embedding grid is
      resized to (H / p, W / p) when it differs from the checkpoint's.
    reinit_head: replace the checkpoint's head by a fresh one of
      model.num_classes outputs (zeros, as vit_jax fine-tuning does, or
      xsens's initialiser under `key`); the checkpoint's pre_logits layer is
      then dropped when the model has no representation_size (vit_jax's
      "drop-head" variant).
    key: PRNG key for the fresh head; None gives zeros.

  Returns:
    Nested dict of jnp float32 arrays: `{"params": this}` applies to `model`.

  Raises:
    CheckpointError: listing every missing, unexpected and misshaped key.
  """
  if not isinstance(model, vit_lib.ViT):
    raise TypeError(f"model must be an xsens ViT, got {type(model).__name__}.")
  if model.tokenizer != "patch" or model.attention != "mha":
    raise CheckpointError("vit_jax checkpoints hold the plain ViT; build the model with "
                          "tokenizer='patch' and attention='mha'.")
  if model.posemb != "learned":
    raise CheckpointError("vit_jax checkpoints hold a learned position embedding; "
                          "build the model with posemb='learned'.")
  model.check_input(image_shape)
  target = _target_shapes(model, image_shape)
  grid = (image_shape[0] // model.patch_size, image_shape[1] // model.patch_size)

  loaded, source, unexpected = _map_keys(checkpoint, _VIT_RULES, (_CLS, _POSEMB))
  if _POSEMB in checkpoint:
    loaded.update(_posemb_params(checkpoint, model, grid))
  elif _CLS in checkpoint:
    loaded["cls"] = np.asarray(checkpoint[_CLS])

  if reinit_head:
    if model.representation_size is None:
      loaded.pop("pre_logits/kernel", None)
      loaded.pop("pre_logits/bias", None)
    in_dim = model.representation_size or model.width
    loaded.update(_head(key, in_dim, model.num_classes))
  return finish(loaded, source, unexpected, target)


def load_vit(path: Union[str, os.PathLike], model: vit_lib.ViT,
             image_shape: tuple[int, int, int], *, reinit_head: bool = False,
             key: Optional[jax.Array] = None) -> dict[str, Any]:
  """Reads a vit_jax `.npz` and returns variables {"params": ...} for `model`.

  Example (ViT-B/16 fine-tuned on ImageNet, 224 x 224 inputs):

    ckpt = read_npz("ViT-B_16.npz")
    model = ViT(**vit_config_from_checkpoint(ckpt))
    variables = load_vit("ViT-B_16.npz", model, (224, 224, 3))
    logits = model.apply(variables, images, train=False)  # images in [-1, 1]

  See `vit_params_from_checkpoint` for the arguments.
  """
  params = vit_params_from_checkpoint(read_npz(path), model, image_shape,
                                      reinit_head=reinit_head, key=key)
  return {"params": params}


# ----------------------------------------------------------------------------
# BiT ResNet-v2 (google-research/big_transfer `.npz`).
# ----------------------------------------------------------------------------

_BIT_RULES = (
    (r"resnet/root_block/standardized_conv2d/kernel",
     r"root_block/standardized_conv2d/kernel"),
    (r"resnet/(block\d+/unit\d+/a/proj)/standardized_conv2d/kernel",
     r"\1/standardized_conv2d/kernel"),
    (r"resnet/(block\d+/unit\d+/[abc])/standardized_conv2d/kernel",
     r"\1/standardized_conv2d/kernel"),
    (r"resnet/(block\d+/unit\d+/[abc])/group_norm/gamma", r"\1/group_norm/scale"),
    (r"resnet/(block\d+/unit\d+/[abc])/group_norm/beta", r"\1/group_norm/bias"),
    (r"resnet/group_norm/gamma", r"group_norm/scale"),
    (r"resnet/group_norm/beta", r"group_norm/bias"),
    (r"resnet/head/conv2d/kernel", r"head/kernel"),
    (r"resnet/head/conv2d/bias", r"head/bias"),
)


def bit_config_from_checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
  """BiTResNet fields implied by a big_transfer checkpoint.

  Returns:
    dict(num_classes, block_units, width_factor); e.g. BiT-M-R50x1 gives
    block_units=(3, 4, 6, 3), width_factor=1.0 (num_groups stays 32).
  """
  try:
    root = checkpoint["resnet/root_block/standardized_conv2d/kernel"]
    head = checkpoint["resnet/head/conv2d/kernel"]
  except KeyError as e:
    raise CheckpointError(f"not a big_transfer checkpoint: no key {e}") from None
  units: dict[int, set[int]] = {}
  for k in checkpoint:
    if m := re.match(r"resnet/block(\d+)/unit(\d+)/", k):
      units.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
  return dict(num_classes=int(head.shape[-1]),
              block_units=tuple(len(units[b]) for b in sorted(units)),
              width_factor=root.shape[-1] / bit_lib.BASE_WIDTH)


def bit_params_from_checkpoint(checkpoint: Checkpoint, model: bit_lib.BiTResNet,
                               image_shape: tuple[int, int, int] = (224, 224, 3), *,
                               reinit_head: bool = False,
                               key: Optional[jax.Array] = None) -> dict[str, Any]:
  """Maps a big_transfer checkpoint onto `model`'s parameter tree.

  GroupNorm gamma / beta become scale / bias; arrays stored with extra unit
  axes (GroupNorm [1, 1, 1, C] -> [C]; the 1x1 conv head [1, 1, C, K] ->
  Dense [C, K]) are reshaped when only such axes differ. The model's
  parameter shapes do not depend on the image size.

  Args:
    checkpoint: {big_transfer key: array}, e.g. from `read_npz`.
    model: an `xsens.models.BiTResNet` matching the checkpoint (see
      `bit_config_from_checkpoint`).
    image_shape: (H, W, C) to trace the model's shapes with.
    reinit_head: replace the head by a fresh one of model.num_classes outputs
      (zeros, as BiT's `zero_head`, or xsens's initialiser under `key`).
    key: PRNG key for the fresh head; None gives zeros.

  Returns:
    Nested dict of jnp float32 arrays: `{"params": this}` applies to `model`.

  Raises:
    CheckpointError: listing every missing, unexpected and misshaped key.
  """
  if not isinstance(model, bit_lib.BiTResNet):
    raise TypeError(f"model must be an xsens BiTResNet, got {type(model).__name__}.")
  model.check_input(image_shape)
  target = _target_shapes(model, image_shape)
  loaded, source, unexpected = _map_keys(checkpoint, _BIT_RULES)
  for k, v in loaded.items():
    want = target.get(k)
    if (want is not None and v.shape != want and v.size == math.prod(want)
        and [d for d in v.shape if d != 1] == [d for d in want if d != 1]):
      loaded[k] = v.reshape(want)
  if reinit_head:
    _, mid = bit_lib.widths(model.width_factor)
    loaded.update(_head(key, mid[-1] * bit_lib.EXPANSION, model.num_classes))
  return finish(loaded, source, unexpected, target)


def load_bit(path: Union[str, os.PathLike], model: bit_lib.BiTResNet,
             image_shape: tuple[int, int, int] = (224, 224, 3), *,
             reinit_head: bool = False,
             key: Optional[jax.Array] = None) -> dict[str, Any]:
  """Reads a big_transfer `.npz` and returns variables {"params": ...} for `model`.

  Example (BiT-M-R50x1):

    ckpt = read_npz("BiT-M-R50x1.npz")
    model = BiTResNet(**bit_config_from_checkpoint(ckpt))
    variables = load_bit("BiT-M-R50x1.npz", model)

  See `bit_params_from_checkpoint` for the arguments.
  """
  params = bit_params_from_checkpoint(read_npz(path), model, image_shape,
                                      reinit_head=reinit_head, key=key)
  return {"params": params}


# ----------------------------------------------------------------------------
# ConvNeXt (timm / Hugging Face `model.safetensors`).
# ----------------------------------------------------------------------------
#
# timm `timm/models/convnext.py` (huggingface/pytorch-image-models), PyTorch layouts:
#
#   stem.0.weight [D0, C, p, p] (Conv2d OIHW) / .bias    -> stem_conv/kernel [p, p, C, D0] (HWIO)
#   stem.1.weight / .bias        (LayerNorm2d)           -> stem_norm/scale / bias
#   stages.i.downsample.0.weight / .bias (LayerNorm2d)   -> stage{i}_downsample_norm/...
#   stages.i.downsample.1.weight [Di, Di-1, 2, 2] / .bias -> stage{i}_downsample_conv/...
#   stages.i.blocks.j.conv_dw.weight [D, 1, k, k] / .bias -> stage{i}_block{j}/conv_dw/
#                                                            kernel [k, k, 1, D] (depthwise)
#   stages.i.blocks.j.norm.weight / .bias (LayerNorm)     -> .../norm/scale / bias
#   stages.i.blocks.j.mlp.fc1.weight [4D, D] (Linear)     -> .../fc1/kernel [D, 4D]; .bias
#   stages.i.blocks.j.mlp.fc2.weight [D, 4D]              -> .../fc2/kernel [4D, D]; .bias
#   stages.i.blocks.j.gamma [D]  (layer scale)            -> .../gamma
#   head.norm.weight / .bias     (LayerNorm2d)            -> head_norm/scale / bias
#   head.fc.weight [K, D] / .bias                         -> head/kernel [D, K] / bias
#
# (stage 0 has no downsample; timm's LayerNorm / LayerNorm2d use epsilon 1e-6, as
# `xsens.models.convnext` does.) The model computes timm's function: its inputs are images
# normalised with the ImageNet mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225).

_CONV_OIHW = (2, 3, 1, 0)   # OIHW -> HWIO
_LINEAR = (1, 0)            # [out, in] -> [in, out]
_CONVNEXT_RULES = (
    (r"stem\.0\.weight", r"stem_conv/kernel", _CONV_OIHW),
    (r"stem\.0\.bias", r"stem_conv/bias", None),
    (r"stem\.1\.weight", r"stem_norm/scale", None),
    (r"stem\.1\.bias", r"stem_norm/bias", None),
    (r"stages\.(\d+)\.downsample\.0\.weight", r"stage\1_downsample_norm/scale", None),
    (r"stages\.(\d+)\.downsample\.0\.bias", r"stage\1_downsample_norm/bias", None),
    (r"stages\.(\d+)\.downsample\.1\.weight", r"stage\1_downsample_conv/kernel", _CONV_OIHW),
    (r"stages\.(\d+)\.downsample\.1\.bias", r"stage\1_downsample_conv/bias", None),
    (r"stages\.(\d+)\.blocks\.(\d+)\.conv_dw\.weight", r"stage\1_block\2/conv_dw/kernel",
     _CONV_OIHW),
    (r"stages\.(\d+)\.blocks\.(\d+)\.conv_dw\.bias", r"stage\1_block\2/conv_dw/bias", None),
    (r"stages\.(\d+)\.blocks\.(\d+)\.norm\.weight", r"stage\1_block\2/norm/scale", None),
    (r"stages\.(\d+)\.blocks\.(\d+)\.norm\.bias", r"stage\1_block\2/norm/bias", None),
    (r"stages\.(\d+)\.blocks\.(\d+)\.mlp\.(fc[12])\.weight", r"stage\1_block\2/\3/kernel",
     _LINEAR),
    (r"stages\.(\d+)\.blocks\.(\d+)\.mlp\.(fc[12])\.bias", r"stage\1_block\2/\3/bias", None),
    (r"stages\.(\d+)\.blocks\.(\d+)\.gamma", r"stage\1_block\2/gamma", None),
    (r"head\.norm\.weight", r"head_norm/scale", None),
    (r"head\.norm\.bias", r"head_norm/bias", None),
    (r"head\.fc\.weight", r"head/kernel", _LINEAR),
    (r"head\.fc\.bias", r"head/bias", None),
)
# ImageNet mean / std of the timm ConvNeXt weights' inputs ([0, 1] pixels).
CONVNEXT_MEAN = (0.485, 0.456, 0.406)
CONVNEXT_STD = (0.229, 0.224, 0.225)


def read_safetensors(path: Union[str, os.PathLike]) -> dict[str, np.ndarray]:
  """Reads a `.safetensors` file into {key: array} with `safetensors.numpy` (no PyTorch).

  Raises:
    ValueError: for a file that is not a safetensors file (or holds a dtype NumPy lacks,
      e.g. bfloat16).
  """
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  try:
    arrays = (st_numpy.load(paths.read_bytes(path)) if paths.is_remote(path)
              else st_numpy.load_file(os.fspath(path)))
    return {k: np.asarray(v) for k, v in arrays.items()}
  except OSError:
    raise
  except Exception as e:  # safetensors raises its own SafetensorError for a bad header.
    raise ValueError(f"not a safetensors file: {str(e).splitlines()[0] if str(e) else e!r}"
                     ) from None


def convnext_config_from_checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
  """ConvNeXt fields implied by a timm ConvNeXt checkpoint.

  Returns:
    dict(num_classes, depths, dims, patch_size, kernel_size, mlp_ratio, layer_scale_init)
    for `xsens.models.ConvNeXt(**config)`; e.g. convnext_tiny gives depths=(3, 3, 9, 3),
    dims=(96, 192, 384, 768), patch_size=4, kernel_size=7, mlp_ratio=4. layer_scale_init
    is None when the checkpoint has no `gamma`.
  """
  try:
    stem = checkpoint["stem.0.weight"]
    head = checkpoint["head.fc.weight"]
  except KeyError as e:
    raise CheckpointError(f"not a timm ConvNeXt checkpoint: no key {e}") from None
  blocks: dict[int, set[int]] = {}
  for k in checkpoint:
    if m := re.match(r"stages\.(\d+)\.blocks\.(\d+)\.", k):
      blocks.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
  if not blocks or sorted(blocks) != list(range(len(blocks))):
    raise CheckpointError("not a timm ConvNeXt checkpoint: no stages.<i>.blocks.<j> keys "
                          "numbered from 0")
  try:
    dims = tuple(int(checkpoint[f"stages.{i}.blocks.0.conv_dw.weight"].shape[0])
                 for i in range(len(blocks)))
    dw = checkpoint["stages.0.blocks.0.conv_dw.weight"]
    fc1 = checkpoint["stages.0.blocks.0.mlp.fc1.weight"]
  except KeyError as e:
    raise CheckpointError(f"not a timm ConvNeXt checkpoint: no key {e}") from None
  return dict(num_classes=int(head.shape[0]),
              depths=tuple(len(blocks[i]) for i in range(len(blocks))), dims=dims,
              patch_size=int(stem.shape[-1]), kernel_size=int(dw.shape[-1]),
              mlp_ratio=int(fc1.shape[0]) // dims[0],
              layer_scale_init=(1e-6 if "stages.0.blocks.0.gamma" in checkpoint else None))


def convnext_params_from_checkpoint(checkpoint: Checkpoint, model: convnext_lib.ConvNeXt,
                                    image_shape: tuple[int, int, int] = (224, 224, 3), *,
                                    reinit_head: bool = False,
                                    key: Optional[jax.Array] = None) -> dict[str, Any]:
  """Maps a timm ConvNeXt checkpoint onto `model`'s parameter tree (layouts above).

  Args:
    checkpoint: {timm key: array}, e.g. from `read_safetensors`.
    model: an `xsens.models.ConvNeXt` matching the checkpoint (see
      `convnext_config_from_checkpoint`); its num_classes may differ only with
      reinit_head=True.
    image_shape: (H, W, C) to trace the model's shapes with (they do not depend on it).
    reinit_head: replace the head Dense by a fresh one of model.num_classes outputs
      (zeros, or xsens's initialiser under `key`); the head LayerNorm is kept.
    key: PRNG key for the fresh head; None gives zeros.

  Returns:
    Nested dict of jnp float32 arrays: `{"params": this}` applies to `model`.

  Raises:
    CheckpointError: listing every missing, unexpected and misshaped key.
  """
  if not isinstance(model, convnext_lib.ConvNeXt):
    raise TypeError(f"model must be an xsens ConvNeXt, got {type(model).__name__}.")
  model.check_input(image_shape)
  target = _target_shapes(model, image_shape)
  loaded, source, unexpected = {}, {}, []
  for name, value in checkpoint.items():
    if reinit_head and name in ("head.fc.weight", "head.fc.bias"):
      continue
    for pattern, repl, axes in _CONVNEXT_RULES:
      if re.fullmatch(pattern, name):
        path = re.sub(pattern, repl, name)
        value = np.asarray(value)
        if axes is not None and value.ndim == len(axes):
          value = np.transpose(value, axes)
        loaded[path], source[path] = value, name
        break
    else:
      unexpected.append(name)
  if reinit_head:
    loaded.update(_head(key, model.dims[-1], model.num_classes))
  return finish(loaded, source, unexpected, target)


def load_convnext(path: Union[str, os.PathLike], model: convnext_lib.ConvNeXt,
                  image_shape: tuple[int, int, int] = (224, 224, 3), *,
                  reinit_head: bool = False,
                  key: Optional[jax.Array] = None) -> dict[str, Any]:
  """Reads a timm ConvNeXt `.safetensors` and returns variables {"params": ...}.

  Example (timm/convnext_tiny.fb_in1k on the Hugging Face hub, `model.safetensors`):

    ckpt = read_safetensors("model.safetensors")
    model = ConvNeXt(**convnext_config_from_checkpoint(ckpt))
    variables = load_convnext("model.safetensors", model)
    # images: [0, 1] pixels normalised by CONVNEXT_MEAN / CONVNEXT_STD.

  See `convnext_params_from_checkpoint` for the arguments.
  """
  params = convnext_params_from_checkpoint(read_safetensors(path), model, image_shape,
                                           reinit_head=reinit_head, key=key)
  return {"params": params}


# ----------------------------------------------------------------------------
# Checkpoint formats, as the registry entries hold them.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Format:
  """A public checkpoint release that one registered model loads.

  Attributes:
    name: the release, e.g. "vit_jax".
    config_from_checkpoint: {key: array} -> the model fields it implies
      (num_classes included), e.g. `vit_config_from_checkpoint`.
    params_from_checkpoint: (checkpoint, model, input_shape, *, reinit_head, key)
      -> the params tree, e.g. `vit_params_from_checkpoint`; raises CheckpointError.
    read: path -> {key: array} (`read_npz`, `read_safetensors`); raises OSError or
      ValueError for a file it cannot read.
    suffix: the release's file type, for messages (".npz", ".safetensors").
    input_normalization: how the release's models expect [0, 1] pixels: "half"
      ((x - 0.5) / 0.5, vit_jax and big_transfer) or "imagenet" ((x - CONVNEXT_MEAN) /
      CONVNEXT_STD per channel, timm); see `normalize_input`; None for token ids
      (`xsens.models.mlm.XSENS_MLM`).
  """
  name: str
  config_from_checkpoint: Callable[[Checkpoint], dict[str, Any]]
  params_from_checkpoint: Callable[..., dict[str, Any]]
  read: Callable[[Union[str, os.PathLike]], dict[str, np.ndarray]] = read_npz
  suffix: str = ".npz"
  input_normalization: str | None = "half"

  def load(self, path: Union[str, os.PathLike], model: nn.Module, input_shape, *,
           reinit_head: bool = False, key: Optional[jax.Array] = None) -> dict[str, Any]:
    """Reads the file at `path`: variables {"params": ...} for `model` on `input_shape`."""
    params = self.params_from_checkpoint(self.read(path), model, input_shape,
                                         reinit_head=reinit_head, key=key)
    return {"params": params}


VIT_JAX = Format("vit_jax", vit_config_from_checkpoint, vit_params_from_checkpoint)
BIG_TRANSFER = Format("big_transfer", bit_config_from_checkpoint, bit_params_from_checkpoint)
TIMM_CONVNEXT = Format("timm_convnext", convnext_config_from_checkpoint,
                       convnext_params_from_checkpoint, read=read_safetensors,
                       suffix=".safetensors", input_normalization="imagenet")
INPUT_NORMALIZATIONS = {"half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
                        "imagenet": (CONVNEXT_MEAN, CONVNEXT_STD)}


def normalize_input(x, normalization: str):
  """[0, 1] RGB pixels [..., 3] -> a release's model inputs: (x - mean) / std per channel
  (`INPUT_NORMALIZATIONS`; "half" is [-1, 1])."""
  mean, std = INPUT_NORMALIZATIONS[normalization]
  return (x - jnp.asarray(mean, x.dtype)) / jnp.asarray(std, x.dtype)
