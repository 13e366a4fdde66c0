"""Adversarial attacks and the structure of adversarial perturbations.

Attacks:
  - FGSM, the fast gradient sign method: one step in the direction that
    increases the cross-entropy (Goodfellow et al., "Explaining and Harnessing
    Adversarial Examples", ICLR 2015, arXiv 1412.6572).
  - PGD, projected gradient descent on the negative loss with a random start
    (Madry et al., "Towards Deep Learning Models Resistant to Adversarial
    Attacks", ICLR 2018, arXiv 1706.06083).
  Both support L-inf and L2 threat models and optional pixel-range clipping.
  `transfer_attack` crafts PGD examples on one model and scores another, as in
  the ViT vs ResNet transfer experiments of Bhojanapalli et al.,
  "Understanding Robustness of Transformers for Image Classification",
  ICCV 2021, arXiv 2103.14586.

Perturbation structure (Bhojanapalli et al. 2021 report that ViT perturbations
are lower-frequency and patch-aligned, ResNet ones high-frequency):
  - `patch_energy`: share of the squared-L2 energy in each patch of the
    model's patch grid.
  - `patch_alignment`: share of the perturbation's spatial variation that
    sits on patch boundaries (0.5 = no preference).
  - `frequency_share` / `radial_power_spectrum`: the 2-D Fourier power of the
    perturbation, per channel, as a function of radial frequency.

Conventions (the measures calling convention of `xsens.measures`). A model enters as
`apply_fn, variables`: `apply_fn(variables, inputs [B, H, W, C]) -> logits [B, K]` in eval
mode (e.g. `TrainResult.apply_fn`, `functools.partial(model.apply, train=False)`), inputs
float in the model's normalised space. Every attack / accuracy is
`f(apply_fn, variables, inputs, *, labels, key=None, mask=None, **options) -> dict` of
arrays; labels are int [B] and `mask` an optional [B] example mask (0 for padding rows).
Nothing here is jitted internally over the weights: callers jit, with `apply_fn` static
(hashable and stable: build it once per model, as `TrainResult.apply_fn` is) and the
variables traced, e.g. `measures.jit(measures.fgsm)` (that is,
`jax.jit(fgsm, static_argnums=0, static_argnames=("norm",))`); `epsilon`,
`step_size`, `clip_min` and `clip_max` may be traced, so a sweep over epsilon compiles
once per (apply_fn, shape); `num_steps`, `norm` and `random_start` must be static.
Everything is pure: no globals, no I/O, randomness only from `key`. The
perturbation-structure functions take a perturbation array (no model), are jitted
(patch_size and num_bins static) and differentiable almost everywhere (|.| and the
zero-perturbation guards have kinks); `perturbation_structure` bundles them as a masked
dict.

Constraints. Every attack returns `adv` with ||adv - images|| <= epsilon in
the chosen norm (up to float rounding, ~1 ulp) and, when given,
clip_min <= adv <= clip_max. The pixel clip is applied after the projection
onto the epsilon-ball; since it moves each coordinate toward the clean image
(which must itself lie in [clip_min, clip_max]) it never leaves the ball.
"""

import functools
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from xsens import choices

Array = jax.Array
ApplyFn = Callable[[Any, Array], Array]

NORMS = choices.ADVERSARIAL_NORMS


# ----------------------------------------------------------------------------
# Helpers.
# ----------------------------------------------------------------------------


def _check_norm(norm: str) -> None:
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")


def _check_images(images: Array) -> None:
  if images.ndim < 2:
    raise ValueError(
        f"images must be batched [B, ...], got shape {tuple(images.shape)}.")


def _per_example_norm(x: Array) -> Array:
  """L2 norm over all but the leading axis, kept broadcastable: [B, 1, ...]."""
  axes = tuple(range(1, x.ndim))
  return jnp.sqrt(jnp.sum(jnp.square(x), axis=axes, keepdims=True))


def _safe_normalize(g: Array) -> Array:
  """g / ||g|| per example; a zero gradient stays zero."""
  n = _per_example_norm(g)
  return jnp.where(n > 0, g / jnp.where(n > 0, n, 1.0), 0.0)


def _ascent_direction(grad: Array, norm: str) -> Array:
  """Steepest-ascent unit direction of a linearised loss in the given norm."""
  if norm == "linf":
    return jnp.sign(grad)
  return _safe_normalize(grad)


def _project(delta: Array, epsilon: Any, norm: str) -> Array:
  """Euclidean projection of delta [B, ...] onto the epsilon-ball."""
  if norm == "linf":
    return jnp.clip(delta, -epsilon, epsilon)
  n = _per_example_norm(delta)
  scale = jnp.minimum(1.0, epsilon / jnp.where(n > 0, n, 1.0))
  return delta * scale


def _clip_pixels(x: Array, clip_min: Any, clip_max: Any) -> Array:
  if clip_min is None and clip_max is None:
    return x
  return jnp.clip(x, clip_min, clip_max)


def _loss_grad(apply_fn: ApplyFn, variables, images: Array, labels: Array) -> Array:
  """Gradient of the summed cross-entropy w.r.t. the images, [B, ...].

  The sum (not the mean) keeps each example's gradient independent of the
  batch size; both attacks only use its sign or per-example direction.
  """
  def loss(x):
    logits = apply_fn(variables, x).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum()
  return jax.grad(loss)(images)


def _finish(images: Array, delta: Array, epsilon: Any, norm: str,
            clip_min: Any, clip_max: Any) -> Array:
  """Projects delta onto the ball, adds it and clips to the pixel range."""
  adv = images + _project(delta, epsilon, norm)
  return _clip_pixels(adv, clip_min, clip_max).astype(images.dtype)


# ----------------------------------------------------------------------------
# Attacks.
# ----------------------------------------------------------------------------


def _check_labels(labels: Optional[Array]) -> Array:
  if labels is None:
    raise ValueError("the attacks need labels=int [B] (the true classes).")
  return labels


def fgsm(apply_fn: ApplyFn, variables, inputs: Array, *, labels: Array,
         epsilon: Any, norm: str = "linf", clip_min: Any = None,
         clip_max: Any = None, key: Optional[Array] = None,
         mask: Optional[Array] = None) -> dict[str, Array]:
  """Fast gradient (sign) method, one untargeted step (Goodfellow et al. 2015).

  L-inf: adv = x + epsilon * sign(g); L2: adv = x + epsilon * g / ||g||
  (per example; zero where g = 0), with g the gradient of the cross-entropy
  of `labels` w.r.t. x. Then clipped to [clip_min, clip_max] if given.

  Args:
    apply_fn: (variables, inputs [B, H, W, C]) -> logits [B, K], eval mode.
    variables: the model's variables.
    inputs: [B, ...] clean inputs (inside the pixel range if one is given).
    labels: int [B] true labels.
    epsilon: scalar perturbation budget in the chosen norm.
    norm: "linf" or "l2" (static).
    clip_min: optional lower bound of the (normalised) pixel range.
    clip_max: optional upper bound of the (normalised) pixel range.
    key: unused (FGSM is deterministic); accepted for the common convention.
    mask: unused: every example is attacked on its own (the summed loss keeps
      the rows independent), so padding rows do not affect the others.

  Returns:
    {"adv_inputs": same shape and dtype as inputs}.
  """
  del key, mask
  _check_norm(norm)
  _check_images(inputs)
  grad = _loss_grad(apply_fn, variables, inputs, _check_labels(labels))
  delta = epsilon * _ascent_direction(grad, norm)
  return {"adv_inputs": _finish(inputs, delta, epsilon, norm, clip_min, clip_max)}


def _random_start(key: Array, images: Array, epsilon: Any,
                  norm: str) -> Array:
  """Uniform sample from the epsilon-ball (L-inf cube or L2 ball)."""
  shape, dtype = images.shape, images.dtype
  if norm == "linf":
    return jax.random.uniform(key, shape, dtype, -1.0, 1.0) * epsilon
  k_dir, k_rad = jax.random.split(key)
  direction = _safe_normalize(jax.random.normal(k_dir, shape, dtype))
  dim = math.prod(shape[1:])
  radius = jax.random.uniform(k_rad, (shape[0],) + (1,) * (len(shape) - 1),
                              dtype) ** (1.0 / dim)
  return direction * radius * epsilon


def pgd(apply_fn: ApplyFn, variables, inputs: Array, *, labels: Array,
        key: Optional[Array] = None, epsilon: Any, num_steps: int,
        step_size: Any, norm: str = "linf", random_start: bool = True,
        clip_min: Any = None, clip_max: Any = None,
        mask: Optional[Array] = None) -> dict[str, Array]:
  """Projected gradient ascent on the cross-entropy (Madry et al. 2018).

  x_0 = clip(x + u), u ~ Uniform(epsilon-ball) if random_start else x;
  x_{t+1} = clip(x + Proj_eps(x_t + step_size * d_t - x)), with
  d_t = sign(g_t) (L-inf) or g_t / ||g_t|| (L2), g_t the loss gradient at
  x_t, Proj_eps the projection onto the ball (L-inf: coordinate clip; L2:
  rescale to norm epsilon when outside) and clip the optional pixel clip.
  Runs under `lax.fori_loop`, so the step is traced once. The last iterate
  is returned (not the best one seen). Bhojanapalli et al. 2021 use 10 steps
  of size epsilon / 4 (a default not confirmed from the paper).

  Args:
    apply_fn: (variables, inputs [B, H, W, C]) -> logits [B, K], eval mode.
    variables: the model's variables.
    inputs: [B, ...] clean inputs (inside the pixel range if one is given).
    labels: int [B] true labels.
    key: PRNG key for the random start (needed if random_start).
    epsilon: scalar budget.
    num_steps: static number of gradient steps (>= 0).
    step_size: scalar step length in the chosen norm.
    norm: "linf" or "l2" (static).
    random_start: start from a uniform point of the ball (static).
    clip_min: optional lower bound of the (normalised) pixel range.
    clip_max: optional upper bound of the (normalised) pixel range.
    mask: unused (rows are attacked independently, see `fgsm`).

  Returns:
    {"adv_inputs": same shape and dtype as inputs}.
  """
  del mask
  _check_norm(norm)
  _check_images(inputs)
  labels = _check_labels(labels)
  if not isinstance(num_steps, int) or num_steps < 0:
    raise ValueError(f"num_steps must be a Python int >= 0, got {num_steps!r}.")
  if random_start:
    if key is None:
      raise ValueError("pgd with random_start=True needs key= (a PRNG key).")
    start = _random_start(key, inputs, epsilon, norm)
  else:
    start = jnp.zeros_like(inputs)
  x0 = _finish(inputs, start, epsilon, norm, clip_min, clip_max)

  def step(_, x):
    grad = _loss_grad(apply_fn, variables, x, labels)
    delta = x + step_size * _ascent_direction(grad, norm) - inputs
    return _finish(inputs, delta, epsilon, norm, clip_min, clip_max)

  return {"adv_inputs": jax.lax.fori_loop(0, num_steps, step, x0)}


# ----------------------------------------------------------------------------
# Accuracy bookkeeping.
# ----------------------------------------------------------------------------


def _correct(apply_fn: ApplyFn, variables, images: Array, labels: Array) -> Array:
  return jnp.argmax(apply_fn(variables, images), axis=-1) == labels


def _weighted_mean(x: Array, example_mask: Optional[Array]) -> Array:
  x = x.astype(jnp.float32)
  if example_mask is None:
    return x.mean()
  w = jnp.asarray(example_mask).astype(jnp.float32)
  return jnp.sum(w * x) / jnp.maximum(w.sum(), 1.0)


def _count(labels: Array, mask: Optional[Array]) -> Array:
  return (jnp.float32(labels.shape[0]) if mask is None else
          jnp.asarray(mask).astype(jnp.float32).sum())


def accuracy(apply_fn: ApplyFn, variables, inputs: Array, *, labels: Array,
             key: Optional[Array] = None,
             mask: Optional[Array] = None) -> dict[str, Array]:
  """Top-1 accuracy of one model on one (padded) batch.

  Args:
    apply_fn: (variables, inputs) -> logits [B, K], eval mode.
    variables: the model's variables.
    inputs: [B, ...].
    labels: int [B].
    mask: optional [B] weights (0 for padding examples).

  Returns:
    {"accuracy": masked mean, "correct": bool [B] (pool padded batches as
    sum(correct * mask) / sum(count)), "count": number of weighted examples}.
  """
  del key  # Deterministic; accepted for the common convention.
  correct = _correct(apply_fn, variables, inputs, _check_labels(labels))
  return dict(accuracy=_weighted_mean(correct, mask), correct=correct,
              count=_count(labels, mask))


def adversarial_accuracy(apply_fn: ApplyFn, variables, inputs: Array, *,
                         labels: Array, adv_inputs: Array,
                         key: Optional[Array] = None,
                         mask: Optional[Array] = None) -> dict[str, Array]:
  """Clean and adversarial top-1 accuracy of one model.

  Args:
    apply_fn: (variables, inputs) -> logits [B, K], eval mode.
    variables: the model's variables.
    inputs: [B, ...] clean inputs.
    labels: int [B].
    adv_inputs: [B, ...] perturbed inputs (e.g. `pgd(...)["adv_inputs"]`).
    mask: optional [B] weights (0 for padding examples).

  Returns:
    dict with clean_acc, adv_acc (scalars, weighted means), clean_correct and
    adv_correct (bool [B], to pool padded batches as sum / count), and
    count (the number of weighted examples).
  """
  del key  # Deterministic; accepted for the common convention.
  labels = _check_labels(labels)
  clean = _correct(apply_fn, variables, inputs, labels)
  adv = _correct(apply_fn, variables, adv_inputs, labels)
  return dict(clean_acc=_weighted_mean(clean, mask),
              adv_acc=_weighted_mean(adv, mask),
              clean_correct=clean, adv_correct=adv, count=_count(labels, mask))


def transfer_attack(apply_fn: ApplyFn, variables, inputs: Array, *,
                    labels: Array, key: Array, target_apply_fn: ApplyFn,
                    target_variables, mask: Optional[Array] = None,
                    **pgd_options) -> dict[str, Array]:
  """Black-box transfer: PGD on the source model, scored on the target.

  Args:
    apply_fn: the source model (the one attacked), see `pgd`.
    variables: the source's variables.
    inputs: [B, ...] clean inputs.
    labels: int [B].
    key: PRNG key for PGD's random start.
    target_apply_fn: the target model (the one evaluated), static like apply_fn.
    target_variables: the target's variables.
    mask: optional [B] weights (0 for padding examples).
    **pgd_options: keyword arguments of `pgd` (epsilon, num_steps, step_size,
      norm, random_start, clip_min, clip_max).

  Returns:
    dict with
      source_acc: white-box adversarial accuracy of the source;
      source_acc_clean: clean accuracy of the source;
      target_acc_clean: clean accuracy of the target;
      target_acc_adv: accuracy of the target on the source's examples;
      adv_inputs: [B, ...] the source's adversarial examples.
  """
  adv = pgd(apply_fn, variables, inputs, labels=labels, key=key,
            **pgd_options)["adv_inputs"]
  src = adversarial_accuracy(apply_fn, variables, inputs, labels=labels,
                             adv_inputs=adv, mask=mask)
  tgt = adversarial_accuracy(target_apply_fn, target_variables, inputs,
                             labels=labels, adv_inputs=adv, mask=mask)
  return dict(source_acc=src["adv_acc"], source_acc_clean=src["clean_acc"],
              target_acc_clean=tgt["clean_acc"],
              target_acc_adv=tgt["adv_acc"], adv_inputs=adv)


# ----------------------------------------------------------------------------
# Structure of perturbations.
# ----------------------------------------------------------------------------


def _check_delta(delta: Array, patch_size: Optional[int] = None,
                 min_patch: int = 1) -> None:
  if delta.ndim != 4:
    raise ValueError(
        f"delta must be [B, H, W, C], got shape {tuple(delta.shape)}.")
  if patch_size is None:
    return
  _, h, w, _ = delta.shape
  if (not isinstance(patch_size, int) or patch_size < min_patch
      or h % patch_size or w % patch_size):
    raise ValueError(
        f"patch_size={patch_size!r} must be an int >= {min_patch} dividing "
        f"the image size {h}x{w}.")


def _safe_div(num: Array, den: Array) -> Array:
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


@functools.partial(jax.jit, static_argnames=("patch_size",))
def patch_energy(delta: Array, patch_size: int) -> Array:
  """Share of the squared-L2 energy of each patch of the model's patch grid.

  Args:
    delta: [B, H, W, C] perturbation (adv - images).
    patch_size: p, the ViT patch size (grid-aligned, non-overlapping, as in
      `xsens.measures.tokens.patchify`); must divide H and W.

  Returns:
    [B, H/p, W/p] energies ||delta_patch||^2 / ||delta||^2; each example sums
    to 1 (all zeros for a zero perturbation).
  """
  _check_delta(delta, patch_size)
  b, h, w, c = delta.shape
  p = patch_size
  sq = jnp.square(delta.astype(jnp.float32)).reshape(b, h // p, p, w // p, p, c)
  per_patch = sq.sum(axis=(2, 4, 5))
  total = per_patch.sum(axis=(1, 2), keepdims=True)
  return _safe_div(per_patch, total)


def _boundary_and_interior(diff: Array, axis: int, patch_size: int
                           ) -> tuple[Array, Array, int, int]:
  """Sums |diff| over pixel pairs across vs inside patch boundaries.

  diff[..., i, ...] = delta[i + 1] - delta[i] along `axis` (length n - 1);
  the pair (i, i + 1) crosses a boundary iff (i + 1) % p == 0.
  """
  n = diff.shape[axis]
  crosses = (jnp.arange(n) + 1) % patch_size == 0
  shape = [1] * diff.ndim
  shape[axis] = n
  crosses = crosses.reshape(shape)
  a = jnp.abs(diff)
  sum_axes = tuple(range(1, diff.ndim))
  boundary = jnp.sum(jnp.where(crosses, a, 0.0), axis=sum_axes)
  interior = jnp.sum(jnp.where(crosses, 0.0, a), axis=sum_axes)
  num_boundary = n // patch_size
  return boundary, interior, num_boundary, n - num_boundary


@functools.partial(jax.jit, static_argnames=("patch_size",))
def patch_alignment(delta: Array, patch_size: int) -> Array:
  """How much of a perturbation's spatial variation sits on patch boundaries.

  With the horizontal and vertical finite differences |delta[i+1] - delta[i]|
  (per channel) split into pairs that cross a patch boundary and pairs inside
  a patch, let b = mean over boundary pairs and w = mean over interior pairs.
  The score is

    alignment = b / (b + w)  in [0, 1].

  It is 0.5 for any perturbation whose statistics do not depend on the
  position relative to the grid (i.i.d. noise, a linear ramp, a smooth field:
  the expected |difference| is the same at every pair), 1 for a perturbation
  that is constant inside each patch and changes only between patches (the
  blocky, "patch-aligned" perturbations Bhojanapalli et al. 2021 report for
  ViTs), and 0 for one that changes only inside patches. The ratio b / w of
  the two means, an equivalent reading, is alignment / (1 - alignment).
  Means (not sums) make the score independent of the 1 : (p - 1) ratio of
  boundary to interior pairs. Invariant to scaling delta.

  Args:
    delta: [B, H, W, C] perturbation.
    patch_size: p >= 2 dividing H and W.

  Returns:
    [B] alignment scores (0.5 for a constant perturbation, which has no
    variation at all).
  """
  _check_delta(delta, patch_size, min_patch=2)
  x = delta.astype(jnp.float32)
  bh, ih, nbh, nih = _boundary_and_interior(jnp.diff(x, axis=1), 1, patch_size)
  bw, iw, nbw, niw = _boundary_and_interior(jnp.diff(x, axis=2), 2, patch_size)
  _, h, w, c = x.shape
  # Pair counts per example: rows of vertical pairs * W * C, and so on.
  num_b = nbh * w * c + nbw * h * c
  num_i = nih * w * c + niw * h * c
  b = (bh + bw) / max(num_b, 1)
  i = (ih + iw) / max(num_i, 1)
  return jnp.where(b + i > 0, _safe_div(b, b + i), 0.5)


def radial_frequency(height: int, width: int) -> Array:
  """Radial frequency of each 2-D FFT bin as a fraction of Nyquist, [H, W].

  r = sqrt(fy^2 + fx^2) / 0.5 with fy, fx in cycles per pixel
  (`jnp.fft.fftfreq` order, DC at [0, 0]); 0 at DC, 1 at the Nyquist
  frequency of one axis, sqrt(2) at the corner (the checkerboard).
  """
  fy = jnp.fft.fftfreq(height)[:, None]
  fx = jnp.fft.fftfreq(width)[None, :]
  return jnp.sqrt(fy**2 + fx**2) / 0.5


def _power(delta: Array) -> Array:
  """|FFT2|^2 over (H, W), summed over channels: [B, H, W]."""
  f = jnp.fft.fft2(delta.astype(jnp.float32), axes=(1, 2))
  return jnp.sum(jnp.square(jnp.abs(f)), axis=-1)


@jax.jit
def frequency_share(delta: Array, cutoff: Any) -> Array:
  """Share of a perturbation's energy at low spatial frequencies.

  Power spectrum |FFT2(delta_c)|^2 per channel over (H, W) (periodic
  boundaries, no window, the mean is kept), summed over channels; the share
  is the power at radial frequency r <= cutoff (r as in `radial_frequency`,
  a fraction of Nyquist) over the total power. By Parseval the total equals
  H * W * ||delta||^2.

  Args:
    delta: [B, H, W, C] perturbation.
    cutoff: scalar radial cutoff as a fraction of Nyquist (0 keeps only DC,
      sqrt(2) keeps everything).

  Returns:
    [B] low-frequency shares in [0, 1] (0 for a zero perturbation). A
    constant perturbation gives 1; a +-1 checkerboard gives 0 for any
    cutoff < sqrt(2).
  """
  _check_delta(delta)
  power = _power(delta)
  r = radial_frequency(delta.shape[1], delta.shape[2])
  low = jnp.sum(jnp.where(r <= cutoff, power, 0.0), axis=(1, 2))
  return _safe_div(low, power.sum(axis=(1, 2)))


@functools.partial(jax.jit, static_argnames=("num_bins",))
def radial_power_spectrum(delta: Array, num_bins: int = 16
                          ) -> tuple[Array, Array]:
  """Radially averaged power spectrum of a perturbation.

  Bins the radial frequency r in [0, sqrt(2)] (fraction of Nyquist, see
  `radial_frequency`) into `num_bins` equal bins and averages the
  channel-summed power |FFT2|^2 of the FFT bins in each (empty bins are 0).

  Args:
    delta: [B, H, W, C] perturbation.
    num_bins: static number of radial bins.

  Returns:
    (centers [num_bins], spectrum [B, num_bins]); normalise the spectrum per
    example (e.g. by its sum) to compare perturbations of different sizes.
  """
  _check_delta(delta)
  if not isinstance(num_bins, int) or num_bins < 1:
    raise ValueError(f"num_bins must be a positive int, got {num_bins!r}.")
  power = _power(delta)
  b = power.shape[0]
  r = radial_frequency(delta.shape[1], delta.shape[2]).reshape(-1)
  edge = math.sqrt(2.0)
  ids = jnp.clip(jnp.floor(r / edge * num_bins).astype(jnp.int32), 0,
                 num_bins - 1)
  sums = jax.vmap(lambda p: jax.ops.segment_sum(p, ids, num_bins))(
      power.reshape(b, -1))
  counts = jax.ops.segment_sum(jnp.ones_like(r), ids, num_bins)
  spectrum = _safe_div(sums, counts[None, :])
  centers = (jnp.arange(num_bins) + 0.5) * edge / num_bins
  return centers, spectrum



def perturbation_structure(delta: Array, *, patch_size: int, cutoff: Any,
                           mask: Optional[Array] = None) -> dict[str, Array]:
  """The structure measures of one batch of perturbations, masked sums and counts.

  Args:
    delta: [B, H, W, C] perturbations (adv - inputs).
    patch_size: p >= 2 dividing H and W (static).
    cutoff: radial cutoff of `frequency_share` (fraction of Nyquist).
    mask: optional [B] weights (0 for padding rows).

  Returns:
    {"patch_energy": [H/p, W/p], "low_freq_share": scalar, "patch_alignment":
    scalar, each summed over the (weighted) rows (divide by "count" for the mean
    over examples), and "count"}.
  """
  w = (jnp.ones((delta.shape[0],), jnp.float32) if mask is None else
       jnp.asarray(mask).astype(jnp.float32))
  return {"patch_energy": jnp.einsum("b,bij->ij", w, patch_energy(delta, patch_size)),
          "low_freq_share": jnp.sum(w * frequency_share(delta, cutoff)),
          "patch_alignment": jnp.sum(w * patch_alignment(delta, patch_size)),
          "count": w.sum()}


def attack_accuracy(apply_fn: ApplyFn, variables, inputs: Array, *, labels: Array,
                    key: Optional[Array] = None, mask: Optional[Array] = None,
                    attack: str = "fgsm", **attack_options) -> dict[str, Array]:
  """Clean and adversarial accuracy under `attack` ("fgsm" or "pgd") in one call.

  `attack_options` go to `fgsm` / `pgd` (epsilon, norm, clip_min, clip_max; PGD's
  num_steps, step_size, random_start; `key` is PGD's random start). Returns
  `adversarial_accuracy`'s dict: clean_acc, adv_acc (masked means), clean_correct,
  adv_correct [B], count. Usable as an evaluator (`config.evals`, kind "measure").
  """
  attacks = {"fgsm": fgsm, "pgd": pgd}
  if attack not in attacks:
    raise ValueError(f"attack must be one of {sorted(attacks)}, got {attack!r}")
  adv = attacks[attack](apply_fn, variables, inputs, labels=labels, key=key, mask=mask,
                        **attack_options)["adv_inputs"]
  return adversarial_accuracy(apply_fn, variables, inputs, labels=labels, adv_inputs=adv,
                              mask=mask)
