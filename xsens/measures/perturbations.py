"""Model perturbations without retraining: layer removal, weight noise, sharpness.

References:
  Bhojanapalli et al. 2021, "Understanding Robustness of Transformers for Image
    Classification", ICCV 2021, arXiv 2103.14586 (spec: google_papers.md §E,
    "Model perturbations"): remove one block, or only its attention / MLP
    sub-layer, at a time (identity on the residual stream, no retraining);
    optional Gaussian weight noise scaled to each layer's norm.
  Vasudeva et al., ICLR 2025, arXiv 2403.06925, official code `check_sharpness`
    (spec: sensitivity.md §4): R copies theta' = theta + delta with absolute
    delta ~ N(0, 0.05^2) on every parameter; mean L1 logit change and mean
    argmax disagreement. Unlike the official code (spec §8 defect 3) both the
    clean and the perturbed model run in eval mode (`train=False`): dropout is
    off and BatchNorm uses, and never updates, its running statistics.

Models enter as xsens flax modules (`xsens.models.ViT`, `xsens.models.ResNet18`,
`xsens.models.BiTResNet`)
whose static `skip` field removes residual branches while the same variables
apply. `perturb_weights` and `sharpness` are pure and jittable; the accuracy
drivers (`accuracy`, `layer_removal_accuracy`, `weight_noise_accuracy`) loop
over fixed-size, masked batches on the host (one compile per model variant)
and return Python floats.
"""

import math
from typing import Any, Callable, Iterable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xsens.models import bit as bit_lib
from xsens.models import resnet as resnet_lib
from xsens.models import vit as vit_lib

Array = jax.Array
Layer = tuple[int, str]
PARTS = vit_lib.SKIP_PARTS


def _check_positive_int(name: str, value: Any) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name} must be a positive Python int, got {value!r}.")


def _check_nonnegative(name: str, value: Any) -> None:
  """Refuses a negative number when it is concrete (traced values pass)."""
  if isinstance(value, (int, float)) and value < 0:
    raise ValueError(f"{name} must be >= 0, got {value}.")


def _path_name(path) -> str:
  """A pytree key path -> 'a/b/c' (dict keys, attributes or indices)."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


# ----------------------------------------------------------------------------
# Accuracy over a dataset (host loop, fixed-size masked batches).
# ----------------------------------------------------------------------------


def _correct_fn(model: nn.Module) -> Callable[..., Array]:
  """jit (variables, x [b,...], y [b], mask [b]) -> number of correct examples."""

  @jax.jit
  def correct(variables, x, y, mask):
    logits = model.apply(variables, x, train=False)
    hit = (jnp.argmax(logits, axis=-1) == y) & mask
    return hit.sum()

  return correct


def _batches(images, labels, batch_size: int) -> Iterable[tuple[Any, ...]]:
  """Yields (x, y, mask) of exactly batch_size rows; the last one zero-padded."""
  n = len(images)
  for start in range(0, n, batch_size):
    x = np.asarray(images[start:start + batch_size])
    y = np.asarray(labels[start:start + batch_size])
    m = len(x)
    mask = np.arange(batch_size) < m
    if m < batch_size:
      x = np.concatenate([x, np.zeros((batch_size - m, *x.shape[1:]), x.dtype)])
      y = np.concatenate([y, np.zeros((batch_size - m,), y.dtype)])
    yield x, y, mask


def _accuracy_with(correct: Callable[..., Array], variables, images, labels,
                   batch_size: int) -> float:
  if len(images) != len(labels) or not len(images):
    raise ValueError(f"need as many labels as images (at least one); got "
                     f"{len(images)} images and {len(labels)} labels.")
  total = 0
  for x, y, mask in _batches(images, labels, batch_size):
    total += int(correct(variables, x, y, mask))
  return total / len(images)


def accuracy(model: nn.Module, variables, images, labels, *,
             batch_size: int = 256) -> float:
  """Top-1 accuracy of `model.apply(variables, x, train=False)`.

  Args:
    model: a flax module mapping [B, H, W, C] to logits [B, K].
    variables: its variables ({"params", maybe "batch_stats"}).
    images: [N, H, W, C] array (NumPy or JAX).
    labels: [N] int class ids.
    batch_size: rows per forward pass; the last batch is padded and masked, so
      every pass has the same shape (one compile).

  Returns:
    Fraction of the N examples whose argmax logit equals the label.
  """
  _check_positive_int("batch_size", batch_size)
  return _accuracy_with(_correct_fn(model), variables, images, labels, batch_size)


# ----------------------------------------------------------------------------
# Layer removal.
# ----------------------------------------------------------------------------


def removable_layers(model: nn.Module,
                     parts: Sequence[str] = PARTS) -> tuple[Layer, ...]:
  """The (layer, part) pairs of `model` that `remove_layers` can drop.

  Args:
    model: `ViT` (every encoder block, any of PARTS) or `ResNet18` (blocks with
      an identity shortcut, see `xsens.models.resnet.identity_blocks`; a
      BasicBlock has no separate attention / MLP, so only the 'block' entry of
      `parts` applies to it) or `BiTResNet` (units with an identity shortcut,
      `xsens.models.bit.identity_units`, flat unit index; 'block' only).
    parts: subset of ('block', 'attention', 'mlp').

  Returns:
    Pairs ordered layer-major, then in the order of `parts`.

  Raises:
    ValueError: for an unknown part, parts none of which the model has, or a
      model other than ViT / ResNet18 / BiTResNet.
  """
  for part in parts:
    if part not in PARTS:
      raise ValueError(f"unknown part {part!r}; allowed: {', '.join(PARTS)}")
  if isinstance(model, vit_lib.ViT):
    return tuple((i, p) for i in range(model.depth) for p in parts)
  if isinstance(model, resnet_lib.ResNet18):
    if "block" not in parts:
      raise ValueError(f"ResNet18 blocks have no {', '.join(map(repr, parts))} "
                       f"sub-layer; only 'block' can be removed.")
    return tuple((i, "block") for i in resnet_lib.identity_blocks())
  if isinstance(model, bit_lib.BiTResNet):
    if "block" not in parts:
      raise ValueError(f"BiT units have no {', '.join(map(repr, parts))} sub-layer; "
                       f"only 'block' (a whole unit) can be removed.")
    return tuple((i, "block") for i in bit_lib.identity_units(model.block_units))
  raise ValueError(f"layer removal supports ViT, ResNet18 and BiTResNet, not "
                   f"{type(model).__name__}.")


def remove_layers(model: nn.Module, layers: Sequence[Layer]) -> nn.Module:
  """A copy of `model` with the residual branches `layers` dropped.

  The copy applies to the same variables. For a ViT, (i, 'block') makes
  encoder block i the identity, (i, 'attention') keeps only its MLP branch
  x + MLP(LN(x)), (i, 'mlp') keeps only x + MHSA(LN(x)). For a ResNet18,
  (i, 'block') makes BasicBlock i (flat index) the identity; blocks with a
  projection shortcut are refused with a ConfigError.

  Args:
    model: `ViT`, `ResNet18` or `BiTResNet` (any existing `skip` is replaced;
      BiT: (i, 'block') makes unit i, flat index, the identity).
    layers: (layer, part) pairs.

  Returns:
    `model.clone(skip=...)`.
  """
  layers = tuple((int(i), str(p)) for i, p in layers)
  if isinstance(model, vit_lib.ViT):
    vit_lib.skipped_parts(layers, model.depth)  # Validates.
    return model.clone(skip=layers)
  if isinstance(model, resnet_lib.ResNet18):
    bad = [p for _, p in layers if p != "block"]
    if bad:
      raise ValueError(f"ResNet18 blocks have no {bad[0]!r} sub-layer; only "
                       f"'block' can be removed.")
    skip = tuple(i for i, _ in layers)
    resnet_lib.check_skip(skip)
    return model.clone(skip=skip)
  if isinstance(model, bit_lib.BiTResNet):
    bad = [p for _, p in layers if p != "block"]
    if bad:
      raise ValueError(f"BiT units have no {bad[0]!r} sub-layer; only 'block' can be "
                       f"removed.")
    skip = tuple(i for i, _ in layers)
    bit_lib.check_skip(skip, model.block_units)
    return model.clone(skip=skip)
  raise ValueError(f"layer removal supports ViT, ResNet18 and BiTResNet, not "
                   f"{type(model).__name__}.")


def layer_removal_accuracy(model: nn.Module, variables, images, labels, *,
                           parts: Sequence[str] = PARTS,
                           layers: Optional[Sequence[Layer]] = None,
                           batch_size: int = 256) -> dict[str, Any]:
  """Accuracy with one residual branch removed at a time (no retraining).

  Args:
    model: `ViT` or `ResNet18` (see `removable_layers`).
    variables: the trained variables; the same ones apply to every variant.
    images: [N, H, W, C].
    labels: [N] int.
    parts: which branches to remove, used when `layers` is None (ResNet18:
      only 'block' applies, see `removable_layers`).
    layers: explicit (layer, part) pairs; default `removable_layers(model,
      parts)`.
    batch_size: rows per forward pass.

  Returns:
    {"baseline": accuracy of the intact model,
     "accuracy": {(layer, part): accuracy with that one branch removed}}.
  """
  _check_positive_int("batch_size", batch_size)
  if layers is None:
    layers = removable_layers(model, parts)
  base = model.clone(skip=())
  out = {"baseline": accuracy(base, variables, images, labels,
                              batch_size=batch_size), "accuracy": {}}
  for layer in layers:
    variant = remove_layers(base, [layer])
    out["accuracy"][tuple(layer)] = accuracy(variant, variables, images, labels,
                                            batch_size=batch_size)
  return out


# ----------------------------------------------------------------------------
# Weight noise scaled to each layer's norm.
# ----------------------------------------------------------------------------


def is_kernel(path: str) -> bool:
  """Default filter of `perturb_weights`: Dense / Conv / attention kernels."""
  return path.rsplit("/", 1)[-1] == "kernel"


def perturb_weights(params, key: Array, *, relative_scale,
                    layer_filter: Optional[Callable[[str], bool]] = None):
  """Adds Gaussian noise scaled to each selected array's own norm.

  Each selected array W (n = W.size entries) becomes W + E with i.i.d.

    E_ij ~ N(0, (relative_scale * ||W||_F / sqrt(n))^2),

  so E ||E||_F^2 = relative_scale^2 ||W||_F^2, i.e. ||E||_F / ||W||_F ->
  relative_scale for large n (the relative size of the noise does not depend
  on the layer's scale or size). An all-zero W stays unchanged.

  The noise of the k-th leaf (in `jax.tree` flattening order of the whole
  tree) is normal(fold_in(key, k)), whatever `layer_filter` selects: the noise
  a layer receives on its own equals what it receives when all layers are
  perturbed together with the same key.

  Args:
    params: a pytree of arrays, usually `variables["params"]` (keep the
      BatchNorm statistics out).
    key: PRNG key.
    relative_scale: float >= 0 (may be traced); 0 returns params unchanged.
    layer_filter: path -> bool on '/'-joined key paths such as
      'encoderblock_3/MlpBlock_0/Dense_0/kernel'; default `is_kernel` (weights,
      not biases, LayerNorm / BatchNorm scales or embeddings).

  Returns:
    A pytree like `params`.
  """
  _check_nonnegative("relative_scale", relative_scale)
  layer_filter = is_kernel if layer_filter is None else layer_filter
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  out = []
  for k, (path, w) in enumerate(leaves):
    if not layer_filter(_path_name(path)):
      out.append(w)
      continue
    w = jnp.asarray(w)
    std = relative_scale * jnp.linalg.norm(w.reshape(-1)) / math.sqrt(w.size)
    noise = jax.random.normal(jax.random.fold_in(key, k), w.shape, w.dtype)
    out.append(w + (std * noise).astype(w.dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


def weight_layers(params) -> tuple[str, ...]:
  """Top-level names of `params` that hold at least one kernel, in tree order.

  For a ViT: 'embedding', 'encoderblock_0', ..., 'head'; for a ResNet18:
  'stem_conv', 'stage1_block1', ..., 'head'.
  """
  return tuple(name for name, sub in params.items()
               if any(is_kernel(_path_name(p)) for p, _ in
                      jax.tree_util.tree_flatten_with_path(sub)[0]))


def weight_noise_accuracy(model: nn.Module, variables, images, labels,
                          key: Array, *, relative_scale: float,
                          num_draws: int = 3,
                          layers: Optional[Sequence[str]] = None,
                          batch_size: int = 256) -> dict[str, Any]:
  """Accuracy with norm-scaled noise on the kernels of one layer at a time.

  Draw r of layer L perturbs `variables["params"]` with `perturb_weights(...,
  fold_in(key, r), relative_scale, layer_filter=kernels under L/)`.

  Args:
    model: a flax module; applied as `model.apply(variables, x, train=False)`.
    variables: {"params", ...}; only "params" are perturbed.
    images: [N, H, W, C].
    labels: [N] int.
    key: PRNG key.
    relative_scale: noise norm relative to each kernel's norm (see
      `perturb_weights`).
    num_draws: noise draws per layer.
    layers: top-level parameter names; default `weight_layers(params)`.
    batch_size: rows per forward pass.

  Returns:
    {"baseline": accuracy without noise,
     "per_layer": {layer: mean accuracy over the draws},
     "per_layer_draws": {layer: (accuracy of draw 0, ..., draw R-1)}}.
  """
  _check_positive_int("num_draws", num_draws)
  _check_positive_int("batch_size", batch_size)
  _check_nonnegative("relative_scale", relative_scale)
  params = variables["params"]
  layers = weight_layers(params) if layers is None else tuple(layers)
  unknown = [name for name in layers if name not in params]
  if unknown:
    raise ValueError(f"unknown layer {unknown[0]!r}; params hold "
                     f"{', '.join(params)}.")
  correct = _correct_fn(model)
  run = lambda v: _accuracy_with(correct, v, images, labels, batch_size)
  out = {"baseline": run(variables), "per_layer": {}, "per_layer_draws": {}}
  for name in layers:
    in_layer = lambda path, name=name: (path.startswith(name + "/")
                                        and is_kernel(path))
    draws = []
    for r in range(num_draws):
      noisy = perturb_weights(params, jax.random.fold_in(key, r),
                              relative_scale=relative_scale,
                              layer_filter=in_layer)
      draws.append(run({**variables, "params": noisy}))
    out["per_layer_draws"][name] = tuple(draws)
    out["per_layer"][name] = float(np.mean(draws))
  return out


# ----------------------------------------------------------------------------
# Sharpness (the sensitivity paper's official `check_sharpness`, in eval mode).
# ----------------------------------------------------------------------------


def add_gaussian(params, key: Array, sigma):
  """params + delta, delta ~ N(0, sigma^2) i.i.d. on every float leaf.

  One normal(key, [P]) draw covers all P float entries, laid out leaf by leaf
  in `jax.tree` flattening order (one RNG op, whatever the number of leaves).
  """
  leaves, treedef = jax.tree.flatten(params)
  leaves = [jnp.asarray(w) for w in leaves]
  floats = [k for k, w in enumerate(leaves)
            if jnp.issubdtype(w.dtype, jnp.floating)]
  total = sum(leaves[k].size for k in floats)
  noise = jax.random.normal(key, (total,), jnp.float32)
  start = 0
  for k in floats:
    w = leaves[k]
    delta = noise[start:start + w.size].reshape(w.shape)
    leaves[k] = w + (sigma * delta).astype(w.dtype)
    start += w.size
  return jax.tree.unflatten(treedef, leaves)


def sharpness(apply_fn: Callable[..., Array], variables, images: Array,
              key: Array, *, sigma=0.05, num_draws: int = 5,
              draw_chunk_size: Optional[int] = None) -> dict[str, Array]:
  """Logit and label change under absolute Gaussian noise on all parameters.

  For draws r = 1..R, theta'_r = theta + delta_r with delta_r ~ N(0, sigma^2)
  on every entry of `variables["params"]` (other collections, e.g. BatchNorm
  running statistics, are left as they are, like the official code that
  perturbs `parameters()` only):

    sharpness_l1   = mean_{r, x} || f_theta(x) - f_theta'_r(x) ||_1,
    sharpness_flip = mean_{r, x} 1[argmax f_theta(x) != argmax f_theta'_r(x)].

  Both models are evaluated as `apply_fn(variables, images, train=False)`
  (eval mode: no dropout, BatchNorm on running averages and not updated),
  fixing defect 3 of the official code. Draw r uses fold_in(key, r) (then
  `add_gaussian`), so results do not depend on `draw_chunk_size`. The draws
  are vmapped, draw_chunk_size at a time (`lax.map`), so memory grows with
  that many copies of the parameters and activations. Pure and jittable
  (`sigma` may be traced).

  Args:
    apply_fn: e.g. `model.apply`; called as apply_fn(variables, x,
      train=False) -> logits [B, K].
    variables: {"params", ...}.
    images: [B, ...] inputs.
    key: PRNG key.
    sigma: noise standard deviation (absolute; the official default 0.05).
    num_draws: R, a static Python int.
    draw_chunk_size: draws evaluated together; None: all R at once.

  Returns:
    float32 scalars: {"sharpness_l1", "sharpness_flip", and their Monte-Carlo
    standard errors over the R draws "l1_stderr", "flip_stderr" (sample
    standard deviation of the per-draw means / sqrt(R); 0 when R = 1)}.
  """
  _check_positive_int("num_draws", num_draws)
  if draw_chunk_size is not None:
    _check_positive_int("draw_chunk_size", draw_chunk_size)
  _check_nonnegative("sigma", sigma)
  variables = dict(variables)
  clean = apply_fn(variables, images, train=False)
  clean_label = jnp.argmax(clean, axis=-1)

  def one_draw(r):
    noisy = add_gaussian(variables["params"], jax.random.fold_in(key, r), sigma)
    logits = apply_fn({**variables, "params": noisy}, images, train=False)
    l1 = jnp.abs(logits - clean).sum(axis=-1).astype(jnp.float32)
    flip = (jnp.argmax(logits, axis=-1) != clean_label).astype(jnp.float32)
    return l1.mean(), flip.mean()

  draws = jnp.arange(num_draws)
  if draw_chunk_size is None or draw_chunk_size >= num_draws:
    l1, flip = jax.vmap(one_draw)(draws)
  else:
    l1, flip = jax.lax.map(one_draw, draws, batch_size=draw_chunk_size)
  return {"sharpness_l1": l1.mean(), "sharpness_flip": flip.mean(),
          "l1_stderr": _stderr(l1), "flip_stderr": _stderr(flip)}


def _stderr(values: Array) -> Array:
  """Standard error of the mean of [R] draws (0 for R = 1)."""
  r = values.shape[0]
  if r == 1:
    return jnp.zeros((), values.dtype)
  return jnp.std(values, ddof=1) / math.sqrt(r)
