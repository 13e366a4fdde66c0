"""Model perturbations without retraining: layer removal, weight noise, sharpness.

References:
  Bhojanapalli et al. 2021, "Understanding Robustness of Transformers for Image
    Classification", ICCV 2021, arXiv 2103.14586 (docs/papers/google_papers.md §E,
    "Model perturbations"): remove one block, or only its attention / MLP
    sub-layer, at a time (identity on the residual stream, no retraining);
    optional Gaussian weight noise scaled to each layer's norm.
  Vasudeva et al., ICLR 2025, arXiv 2403.06925, official code `check_sharpness`
    (docs/papers/sensitivity.md §4): R copies theta' = theta + delta with absolute
    delta ~ N(0, 0.05^2) on every parameter; mean L1 logit change and mean
    argmax disagreement. Unlike the official code (docs/papers/sensitivity.md §8 defect 3) both the
    clean and the perturbed model run in eval mode (`train=False`): dropout is
    off and BatchNorm uses, and never updates, its running statistics.

Calling convention (that of `xsens.measures`): every measure is
`f(apply_fn, variables, inputs, *, labels=..., key=..., mask=None, **options) -> dict` of
arrays, with `apply_fn(variables, inputs) -> logits [B, K]` in eval mode (e.g.
`TrainResult.apply_fn` = `functools.partial(model.apply, train=False)`) and `mask` an
optional [B] example mask (0 for padding rows; accuracies come back as masked means plus
per-example `correct` values and the weighted `count`, so padded batches pool as
sum(correct * mask) / sum(count)). Nothing is jitted here: callers jit, with `apply_fn`
(and `model`, `layers`, `num_draws`, ...) static and the variables traced.

Layer removal needs the module itself, since a variant is a different module
(`model.clone(skip=...)`) applied to the same variables: `layer_removal_accuracy` takes it
as the `model=` option (xsens `ViT`, `ResNet18`, `BiTResNet`, whose static `skip` field
removes residual branches), and scores every variant of one batch in one program.
Weight noise and sharpness only need `apply_fn`: they perturb `variables["params"]`.
Loops over the batches of a dataset belong to the caller (a study or evaluator).
"""

import functools
import math
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from xsens.measures.adversarial import accuracy

Array = jax.Array
ApplyFn = Callable[[Any, Array], Array]
Layer = tuple[int, str]
# Residual branches a model may drop: a whole block, or only a transformer block's
# attention / MLP sub-layer.
PARTS = ("block", "attention", "mlp")


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
# Layer removal.
# ----------------------------------------------------------------------------


def _removal_method(model: nn.Module, method: str) -> Callable[..., Any]:
  """`model.<method>` of the layer-removal protocol, or a ValueError naming the model."""
  fn = getattr(model, method, None)
  if fn is None:
    raise ValueError(f"layer removal needs a model with `removable_layers` and "
                     f"`remove_layers` methods (e.g. xsens ViT, ResNet18, BiTResNet), not "
                     f"{type(model).__name__}.")
  return fn


def removable_layers(model: nn.Module,
                     parts: Sequence[str] = PARTS) -> tuple[Layer, ...]:
  """The (layer, part) pairs of `model` that `remove_layers` can drop.

  The model says which through its `removable_layers(parts)` method (see the
  registry entry's `removable_layers`): a ViT every encoder block with any of
  PARTS; a ResNet18 (BasicBlocks) or BiTResNet (units, flat index) the blocks
  with an identity shortcut, 'block' only (their other parts are ignored).

  Args:
    model: a flax module with the layer-removal methods.
    parts: subset of ('block', 'attention', 'mlp').

  Returns:
    Pairs ordered layer-major, then in the order of `parts`.

  Raises:
    ValueError: for an unknown part, parts none of which the model has, or a
      model without the layer-removal methods.
  """
  for part in parts:
    if part not in PARTS:
      raise ValueError(f"unknown part {part!r}; allowed: {', '.join(PARTS)}")
  return tuple(_removal_method(model, "removable_layers")(tuple(parts)))


def remove_layers(model: nn.Module, layers: Sequence[Layer]) -> nn.Module:
  """A copy of `model` with the residual branches `layers` dropped.

  The copy applies to the same variables; any existing `skip` is replaced. For
  a ViT, (i, 'block') makes encoder block i the identity, (i, 'attention')
  keeps only its MLP branch x + MLP(LN(x)), (i, 'mlp') keeps only
  x + MHSA(LN(x)). For a ResNet18 / BiTResNet, (i, 'block') makes BasicBlock /
  unit i (flat index) the identity; one with a projection shortcut is refused
  with a ConfigError.

  Args:
    model: a flax module with the layer-removal methods (`removable_layers`).
    layers: (layer, part) pairs.

  Returns:
    The model's `remove_layers(layers)`: `model.clone(skip=...)`.
  """
  layers = tuple((int(i), str(p)) for i, p in layers)
  return _removal_method(model, "remove_layers")(layers)


def _stack_accuracies(results: Sequence[dict[str, Array]]) -> tuple[Array, Array]:
  """[accuracy dicts] -> (accuracies [L], correct [L, B])."""
  return (jnp.stack([r["accuracy"] for r in results]),
          jnp.stack([r["correct"] for r in results]))


def layer_removal_accuracy(apply_fn: ApplyFn, variables, inputs: Array, *,
                           labels: Array, model: nn.Module,
                           layers: Optional[Sequence[Layer]] = None,
                           parts: Sequence[str] = PARTS,
                           key: Optional[Array] = None,
                           mask: Optional[Array] = None) -> dict[str, Array]:
  """Accuracy with one residual branch removed at a time (no retraining), one batch.

  (`key` is unused: removal is deterministic; accepted for the common convention.)

  Args:
    apply_fn: the intact model, (variables, inputs) -> logits [B, K], eval mode.
    variables: the trained variables; the same ones apply to every variant.
    inputs: [B, H, W, C].
    labels: int [B].
    model: the module behind apply_fn, `ViT`, `ResNet18` or `BiTResNet` (see
      `removable_layers`); variant (i, part) is `remove_layers(model, [(i, part)])`
      applied with train=False. Static.
    layers: explicit (layer, part) pairs (static); default `removable_layers(model,
      parts)`.
    parts: which branches to remove, used when `layers` is None (ResNet18 / BiT:
      only 'block' applies, see `removable_layers`).
    mask: optional [B] weights (0 for padding rows).

  Returns:
    {"baseline": masked accuracy of the intact model, "baseline_correct": bool [B],
     "accuracy": [L] masked accuracy with branch layers[l] removed (in the order of
     `layers`), "correct": bool [L, B], "count": weighted examples}.
  """
  del key
  if layers is None:
    layers = removable_layers(model, parts)
  base_model = model.clone(skip=())
  base = accuracy(apply_fn, variables, inputs, labels=labels, mask=mask)
  variants = [accuracy(functools.partial(remove_layers(base_model, [layer]).apply,
                                         train=False),
                       variables, inputs, labels=labels, mask=mask)
              for layer in layers]
  acc, correct = (_stack_accuracies(variants) if variants else
                  (jnp.zeros((0,)), jnp.zeros((0, inputs.shape[0]), bool)))
  return {"baseline": base["accuracy"], "baseline_correct": base["correct"],
          "accuracy": acc, "correct": correct, "count": base["count"]}


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


def weight_noise_accuracy(apply_fn: ApplyFn, variables, inputs: Array, *,
                          labels: Array, key: Array, relative_scale: Any,
                          num_draws: int = 3,
                          layers: Optional[Sequence[str]] = None,
                          mask: Optional[Array] = None) -> dict[str, Array]:
  """Accuracy with norm-scaled noise on the kernels of one layer at a time, one batch.

  Draw r of layer L perturbs `variables["params"]` with `perturb_weights(...,
  fold_in(key, r), relative_scale, layer_filter=kernels under L/)`; the draws do not
  depend on the inputs, so every batch of a dataset sees the same noisy models.

  Args:
    apply_fn: (variables, inputs) -> logits [B, K], eval mode.
    variables: {"params", ...}; only "params" are perturbed.
    inputs: [B, H, W, C].
    labels: int [B].
    key: PRNG key.
    relative_scale: noise norm relative to each kernel's norm (see
      `perturb_weights`).
    num_draws: noise draws per layer (static).
    layers: top-level parameter names (static); default `weight_layers(params)`.
    mask: optional [B] weights (0 for padding rows).

  Returns:
    {"baseline": masked accuracy without noise, "baseline_correct": bool [B],
     "per_layer_draws": [L, R] masked accuracy of each draw (layers in the order of
     `layers`), "per_layer": [L] mean over the draws, "correct": bool [L, R, B],
     "count": weighted examples}.
  """
  _check_positive_int("num_draws", num_draws)
  _check_nonnegative("relative_scale", relative_scale)
  params = variables["params"]
  layers = weight_layers(params) if layers is None else tuple(layers)
  unknown = [name for name in layers if name not in params]
  if unknown:
    raise ValueError(f"unknown layer {unknown[0]!r}; params hold "
                     f"{', '.join(params)}.")
  run = lambda v: accuracy(apply_fn, v, inputs, labels=labels, mask=mask)
  base = run(variables)
  accs, correct = [], []
  for name in layers:
    in_layer = lambda path, name=name: (path.startswith(name + "/")
                                        and is_kernel(path))
    draws = []
    for r in range(num_draws):
      noisy = perturb_weights(params, jax.random.fold_in(key, r),
                              relative_scale=relative_scale,
                              layer_filter=in_layer)
      draws.append(run({**variables, "params": noisy}))
    a, c = _stack_accuracies(draws)
    accs.append(a)
    correct.append(c)
  b = inputs.shape[0]
  draws = jnp.stack(accs) if accs else jnp.zeros((0, num_draws))
  return {"baseline": base["accuracy"], "baseline_correct": base["correct"],
          "per_layer_draws": draws, "per_layer": draws.mean(axis=-1),
          "correct": jnp.stack(correct) if correct else jnp.zeros((0, num_draws, b), bool),
          "count": base["count"]}


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


def sharpness(apply_fn: ApplyFn, variables, inputs: Array, *, key: Array,
              labels: Optional[Array] = None, sigma=0.05, num_draws: int = 5,
              draw_chunk_size: Optional[int] = None,
              mask: Optional[Array] = None) -> dict[str, Array]:
  """Logit and label change under absolute Gaussian noise on all parameters.

  For draws r = 1..R, theta'_r = theta + delta_r with delta_r ~ N(0, sigma^2)
  on every entry of `variables["params"]` (other collections, e.g. BatchNorm
  running statistics, are left as they are, like the official code that
  perturbs `parameters()` only):

    sharpness_l1   = mean_{r, x} || f_theta(x) - f_theta'_r(x) ||_1,
    sharpness_flip = mean_{r, x} 1[argmax f_theta(x) != argmax f_theta'_r(x)].

  Both models are evaluated with `apply_fn` in eval mode (no dropout, BatchNorm on
  running averages and not updated), fixing defect 3 of the official code. Draw r uses
  fold_in(key, r) (then `add_gaussian`), so results do not depend on
  `draw_chunk_size`. The draws are vmapped, draw_chunk_size at a time (`lax.map`), so
  memory grows with that many copies of the parameters and activations. Pure and
  jittable (`sigma` may be traced).

  Args:
    apply_fn: (variables, inputs) -> logits [B, K] in eval mode, e.g.
      `TrainResult.apply_fn`.
    variables: {"params", ...}.
    inputs: [B, ...] inputs.
    key: PRNG key.
    labels: unused (the flips compare with the clean argmax); the common convention.
    sigma: noise standard deviation (absolute; the official default 0.05).
    num_draws: R, a static Python int.
    draw_chunk_size: draws evaluated together; None: all R at once.
    mask: optional [B] weights (0 for padding rows): the means over x are masked.

  Returns:
    float32 scalars: {"sharpness_l1", "sharpness_flip", and their Monte-Carlo
    standard errors over the R draws "l1_stderr", "flip_stderr" (sample
    standard deviation of the per-draw means / sqrt(R); 0 when R = 1)}.
  """
  del labels
  _check_positive_int("num_draws", num_draws)
  if draw_chunk_size is not None:
    _check_positive_int("draw_chunk_size", draw_chunk_size)
  _check_nonnegative("sigma", sigma)
  variables = dict(variables)
  clean = apply_fn(variables, inputs)
  clean_label = jnp.argmax(clean, axis=-1)
  if mask is None:
    mean = lambda v: v.mean()
  else:
    w = jnp.asarray(mask).astype(jnp.float32)
    mean = lambda v: jnp.sum(w * v) / jnp.maximum(w.sum(), 1.0)

  def one_draw(r):
    noisy = add_gaussian(variables["params"], jax.random.fold_in(key, r), sigma)
    logits = apply_fn({**variables, "params": noisy}, inputs)
    l1 = jnp.abs(logits - clean).sum(axis=-1).astype(jnp.float32)
    flip = (jnp.argmax(logits, axis=-1) != clean_label).astype(jnp.float32)
    return mean(l1), mean(flip)

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
