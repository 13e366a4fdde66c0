"""Sensitivity estimators: token-wise Gaussian, global Gaussian, scattered-pixel.

Reference: Vasudeva et al., "Transformers Learn Low Sensitivity Functions:
Investigations and Implications", ICLR 2025, arXiv 2403.06925; official code
github.com/estija/sensitivity.

Main metric, for tokens X = (x_1..x_T), x_i in R^D and the argmax label
y(X) = argmax_k f_k(X):

  S_sigma(f) = E_X (1/T) sum_i Pr_eps[ y(X^(i,eps)) != y(X) ],
  X^(i,eps): x_i <- x_i + eps,  eps ~ N(0, sigma^2 I_D).

Calling convention (that of every measure in `xsens.measures`):

  measure(apply_fn, variables, inputs, *, labels=None, key=None, mask=None,
          **options) -> dict[str, Array]

- apply_fn(variables, inputs [B', ...]) -> logits [B', K] in eval mode (e.g.
  `TrainResult.apply_fn` or `functools.partial(model.apply, train=False)`),
  any batch size B'; the measures call it on stacks of perturbed copies.
- inputs: token embeddings [B, T, D] (token axis 1), or images [B, H, W, C]
  with `patch_size=p`, whose tokens are the p x p patches
  (`xsens.measures.tokens`). Text models, whose forward also takes the padding
  mask, go through `xsens.measures.text_sensitivity`.
- labels [B]: the reference labels; default the clean argmax.
- key: PRNG key (required by the random estimators).
- mask [B]: example mask (bool or weights; 0 for padding rows), so a padded,
  sharded batch can be measured: `mean`, `stderr`, `flips` and `count` leave
  masked examples out, per-example values are returned for every row.
- token_mask [B, T] or [T]: tokens that count (False: padding; still
  evaluated, never counted).

Every estimator is pure: no I/O, no Python-side randomness, no internal jit
(callers jit, with apply_fn static and the variables traced; the one global is
the process cache of `chunk_size="tune"`). Sizes (`num_draws`, `chunk_size`,
...) are static Python values (`xsens.measures.convention.STATIC_ARGNAMES`);
`sigma` is a scalar that may be traced, so a sigma sweep is `jax.vmap` over
sigma or `xsens.measures.sweep.sigma_sweep` (one compiled program):

>>> import jax
>>> from xsens import measures
>>> def apply_fn(variables, tokens):                    # tokens [B, T, D] -> [B, 2]
...   score = (tokens * variables).sum((1, 2))
...   return jax.numpy.stack([-score, score], -1)
>>> tokens = jax.random.normal(jax.random.key(0), (4, 5, 3))
>>> w = jax.random.normal(jax.random.key(1), (5, 3))
>>> sens = measures.jit(measures.token_sensitivity)  # apply_fn, num_draws static.
>>> out = sens(apply_fn, w, tokens, key=jax.random.key(2), sigma=0.5, num_draws=4)
>>> out["per_token"].shape
(4, 5)
>>> many = jax.vmap(lambda s: sens(apply_fn, w, tokens, key=jax.random.key(2), sigma=s,
...                                num_draws=4)["mean"])(jax.numpy.array([0.1, 1.0]))
>>> many.shape
(2,)

Related estimators in their own modules: `smooth_sensitivity.smooth_token_sensitivity`
(differentiable in the inputs and the variables), `boolean.boolean_sensitivity` (functions
on {±1}^n), `text_sensitivity` (text models), `sensitivity_loop.token_sensitivity_loop`
(the reference loop); `sensitivity_stats` aggregates flips into the returned statistics.

Batches may be sharded over devices on axis 0: perturbed copies are laid out
[B, c, ...] and merged batch-major into [B * c, ...] (example blocks are
strided), so a batch sharding stays a batch sharding under GSPMD.

Chunking, speed and memory. An estimator makes N perturbed copies of each
example (N = T * R token-draw pairs, or R draws). `chunk_size` copies per
example go through one forward call (None: all N at once); `example_chunk_size`
cuts the batch into strided blocks of at most that many examples (None: the
whole batch); chunks and blocks run in sequence under `lax.map`. The default
"auto" picks both for speed within the memory cap `memory_budget_bytes`
(default 256 MiB); "tune" times a few forward batches once per model and
shape (`xsens.measures.planning`). The result's `plan` says which sizes ran.

Noise scheme (all token-wise estimators): the (token t, draw r) pair has index
q = t * num_draws + r and noise `normal(fold_in(key, q), [B, D])`. Results are
therefore independent of `chunk_size` and `example_chunk_size` and equal to a
Python loop over (t, r) with the same keys (`sensitivity_loop`). With
`example_ids` [B] (the examples' indices in the measured set), example b draws
`normal(fold_in(fold_in(key, example_ids[b]), q), [D])` instead, independent of
its row and of the batch size, so a slice of a batch (one device's under
`shard_map`, or a smaller batch) draws what the whole batch draws for it (the
text estimators' scheme). The global estimator's draw r is q = r, [T, D] per
example.

Returned dictionaries (hard estimators) hold:
  per_example [B]: flip frequency of each example (0 where fully masked);
  mean: weighted mean of per_example over examples (`mask`);
  stderr: Monte-Carlo standard error of `mean` as an estimate of the
    population sensitivity (examples and noise both random), see
    `sensitivity_stats.summarize`;
  stderr_noise: standard error from the noise draws alone, given the examples;
  flips, count: int32 numbers of flips and of Bernoulli trials (valid examples,
    valid units, draws), to pool batches as sum(flips) / sum(count) like the
    (sum, count) accumulators of big_vision evaluators. Note flips / count
    weights examples by their number of valid tokens (the official language
    code's `mean_sensitivity`), whereas `mean` is the mean of per-example
    means; they agree when no token is masked;
  plan: {"chunk_size", "example_chunk_size", "forward_batch"}, the sizes of one
    forward call (also in the smooth variant's dict): Python ints eagerly, int32
    scalars out of `jax.jit`, [S] under a vmap over S sigmas (`planning`).
"""

from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp

from xsens import choices
from xsens.measures import perturbed
from xsens.measures import planning
from xsens.measures import sensitivity_stats
from xsens.measures import token_prefix
from xsens.measures import tokens as tokens_lib
from xsens.measures.planning import AUTO, DEFAULT_MEMORY_BUDGET_BYTES, ChunkSize

Array = jax.Array
ApplyFn = Callable[[Any, Array], Array]
# How a study's sigma is read: "absolute", as given (the paper's); "token_rms", in units of
# the root-mean-square coordinate of the clean tokens the noise is added to (pixels of the
# patches, or text embeddings), i.e. as a noise-to-signal ratio, so one sigma means the
# same relative noise for every model and dataset (GPT-2's un-normalised embeddings are far
# smaller than LayerNorm outputs, so one absolute sigma is a much stronger noise for it).
NOISE_SCALES = choices.NOISE_SCALES


def noise_multiplier(noise_scale: str, token_rms: float) -> float:
  """The factor a study's sigma is multiplied by (`NOISE_SCALES`): 1 for "absolute",
  `token_rms` (the RMS coordinate of the clean tokens) for "token_rms"."""
  if noise_scale not in NOISE_SCALES:
    raise ValueError(f"unknown noise_scale {noise_scale!r}; allowed: {', '.join(NOISE_SCALES)}")
  return float(token_rms) if noise_scale == "token_rms" else 1.0


# ----------------------------------------------------------------------------
# Token-wise sensitivity.
# ----------------------------------------------------------------------------


def token_flips(fn: Callable[[Array], Array], tokens: Array, key: Array,
                labels: Optional[Array], *, sigma: Any, num_draws: int,
                chunk_size: Optional[int],
                example_chunk_size: Optional[int],
                perturbed_fn: Optional[Callable[[Array, Array], Array]] = None
                ) -> Array:
  """Flips [B, T * R] of fn (tokens -> logits); pair q = t * R + r. perturbed_fn
  (token_ids [c], scaled noise [B, c, D]) -> logits [B, c, K], when given, computes the
  copies' logits instead (`token_prefix.perturbed_logits_fn`)."""
  b, t, d = tokens.shape
  dtype = perturbed.noise_dtype(tokens)
  y = perturbed.clean_labels(fn, tokens, labels, example_chunk_size)

  def chunk_flips(ids):                            # ids [c] -> flips [B, c]
    noise = jnp.swapaxes(perturbed.pair_noise(key, ids, (b, d), dtype), 0, 1)
    if perturbed_fn is not None:
      logits = perturbed_fn(ids // num_draws, (sigma * noise).astype(dtype))
      return jnp.argmax(logits, axis=-1) != y[:, None]
    delta = perturbed.token_delta(noise, ids // num_draws, t, sigma, dtype)
    logits = perturbed.forward_copies(fn, tokens[:, None] + delta, example_chunk_size)
    return jnp.argmax(logits, axis=-1) != y[:, None]

  return perturbed.map_chunks(chunk_flips, t * num_draws, chunk_size)


def token_sensitivity(
    apply_fn: ApplyFn,
    variables: Any,
    inputs: Array,
    *,
    labels: Optional[Array] = None,
    key: Optional[Array] = None,
    mask: Optional[Array] = None,
    sigma: Any,
    num_draws: int,
    patch_size: Optional[int] = None,
    token_mask: Optional[Array] = None,
    example_ids: Optional[Array] = None,
    chunk_size: ChunkSize = AUTO,
    example_chunk_size: ChunkSize = AUTO,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES,
    token_split: token_prefix.SplitOption = token_prefix.AUTO,
) -> dict[str, Array]:
  """Token-wise Gaussian sensitivity (arXiv 2403.06925 Fig. 1 and §4).

  For every token t and draw r: x_t <- x_t + eps, eps ~ N(0, sigma^2 I_D), and
  a flip is argmax apply_fn(variables, X^(t,eps)) != labels. The T * R
  (token, draw) pairs are vectorised: a chunk of c pairs is c perturbed copies
  of the batch, [B, c, T, D] -> [B * c, T, D], one forward call; with
  example_chunk_size = e each call sees at most e * c inputs (see the module
  docstring). Results do not depend on either size; speed does ('auto' picks
  them, `xsens.measures.planning`).

  For images (patch_size = p) the tokens are the p x p patches of the
  normalised images; any classifier (ViT, CNN, MLP) is measured the same way.

  Args:
    apply_fn: (variables, inputs [B', ...]) -> logits [B', K].
    variables: the model's variables (traced; any pytree).
    inputs: tokens [B, T, D], or images [B, H, W, C] with patch_size; may be
      sharded on axis 0.
    labels: [B] int labels to compare with; default the clean argmax.
    key: PRNG key; pair (t, r) uses fold_in(key, t * num_draws + r).
    mask: [B] example mask (bool or weights), for padded batches.
    sigma: noise standard deviation (float or traced scalar).
    num_draws: R, draws per token (static).
    patch_size: p for images (must divide H and W); None for tokens.
    token_mask: [B, T] or [T] bool; False marks padding, which is still
      evaluated but counts nowhere.
    example_ids: [B] int, the examples' indices in the measured set: example b's
      noise then comes from fold_in(key, example_ids[b]) (module docstring), so
      a slice of the batch draws what the whole batch draws; None: batch-level.
    chunk_size: (token, draw) pairs per forward call: 'auto', 'tune', None
      (all T * R) or an int (`xsens.measures.planning`).
    example_chunk_size: examples per forward call: 'auto', None (all B) or an
      int; the batch is split into ceil(B / example_chunk_size) strided
      blocks, so a batch sharding stays a batch sharding.
    memory_budget_bytes: the memory cap of one forward call for 'auto' and
      'tune' (`planning.plan_chunks`).
    token_split: reuse of the clean pass's per-token first-layer work
      (`xsens.measures.token_prefix`): 'auto' (where the model offers it and it
      pays), 'always', None (off) or a `TokenSplit`; results are the same.

  Returns:
    dict: per_token [B, T] flip probabilities (0 where masked), per_example
    [B] (mean over valid tokens), mean, stderr, stderr_noise, flips, count
    (see the module docstring and `sensitivity_stats.summarize`), plan (the sizes used,
    `planning`), and for images per_patch_map [B, H/p, W/p].
  """
  perturbed.check_key(key, "token_sensitivity")
  planning.check_positive_int("num_draws", num_draws)
  perturbed.check_sigma(sigma)
  token_fn, tokens = tokens_lib.token_view(apply_fn, inputs, patch_size)
  b, t, d = tokens.shape
  c, e, plan = planning.resolve("token_sensitivity", token_fn, variables, (tokens,),
                                t * num_draws, chunk_size, example_chunk_size,
                                memory_budget_bytes)
  split = token_prefix.resolve(token_split, apply_fn, patch_size, inputs.shape[1:])
  flips = token_flips(perturbed.bind(token_fn, variables), tokens,
                      perturbed.example_keys(key, example_ids), labels,
                      sigma=sigma, num_draws=num_draws, chunk_size=c,
                      example_chunk_size=e, perturbed_fn=None if split is None else
                      token_prefix.perturbed_logits_fn(split, variables, tokens, e))
  out = sensitivity_stats.token_result(flips, perturbed.unit_mask(token_mask, b, t),
                                       num_draws, mask)
  out["plan"] = plan
  return perturbed.with_patch_map(out, inputs, patch_size)


# ----------------------------------------------------------------------------
# Global sensitivity.
# ----------------------------------------------------------------------------


def global_flips(fn: Callable[[Array], Array], tokens: Array, key: Array,
                 labels: Optional[Array], unit_mask: Array, *, sigma: Any,
                 num_draws: int, chunk_size: Optional[int],
                 example_chunk_size: Optional[int]) -> Array:
  """Flips [B, R] with noise on every token where unit_mask [B, T] is True."""
  b, t, d = tokens.shape
  dtype = perturbed.noise_dtype(tokens)
  y = perturbed.clean_labels(fn, tokens, labels, example_chunk_size)

  def chunk_flips(ids):                            # ids [c] -> flips [B, c]
    noise = jnp.swapaxes(perturbed.pair_noise(key, ids, (b, t, d), dtype), 0, 1)
    delta = (sigma * noise).astype(dtype) * unit_mask[:, None, :, None].astype(
        dtype)
    logits = perturbed.forward_copies(fn, tokens[:, None] + delta, example_chunk_size)
    return jnp.argmax(logits, axis=-1) != y[:, None]

  return perturbed.map_chunks(chunk_flips, num_draws, chunk_size)


def global_sensitivity(
    apply_fn: ApplyFn,
    variables: Any,
    inputs: Array,
    *,
    labels: Optional[Array] = None,
    key: Optional[Array] = None,
    mask: Optional[Array] = None,
    sigma: Any,
    num_draws: int,
    patch_size: Optional[int] = None,
    token_mask: Optional[Array] = None,
    example_ids: Optional[Array] = None,
    chunk_size: ChunkSize = AUTO,
    example_chunk_size: ChunkSize = AUTO,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES,
) -> dict[str, Array]:
  """Global Gaussian sensitivity: all valid tokens noised at once (App. A.2).

  Pr_E[argmax f(X + E) != y] with E_t ~ N(0, sigma^2 I_D) on every unmasked
  token (the official code's `sentence_embedding_label_sensitivity`). Draw r
  uses noise normal(fold_in(key, r), [B, T, D]) (in token layout for images).

  Args:
    apply_fn, variables, inputs, labels, mask, sigma, patch_size,
      example_chunk_size, memory_budget_bytes: as in `token_sensitivity`.
    key: PRNG key.
    num_draws: R draws per example.
    token_mask: [B, T] or [T] bool; masked tokens receive no noise.
    example_ids: [B] int, the examples' indices in the measured set: example b's
      noise then comes from fold_in(key, example_ids[b]) (module docstring), so
      a slice of the batch draws what the whole batch draws; None: batch-level.
    chunk_size: draws per forward call: 'auto', 'tune', None (all R) or an int.

  Returns:
    dict: per_example [B] flip frequency, mean, stderr, stderr_noise, flips,
    count (R trials per valid example), plan (the sizes used).
  """
  perturbed.check_key(key, "global_sensitivity")
  planning.check_positive_int("num_draws", num_draws)
  perturbed.check_sigma(sigma)
  token_fn, tokens = tokens_lib.token_view(apply_fn, inputs, patch_size)
  b, t, d = tokens.shape
  c, e, plan = planning.resolve("global_sensitivity", token_fn, variables, (tokens,),
                                num_draws, chunk_size, example_chunk_size,
                                memory_budget_bytes)
  unit_mask = perturbed.unit_mask(token_mask, b, t)
  flips = global_flips(perturbed.bind(token_fn, variables), tokens,
                       perturbed.example_keys(key, example_ids), labels,
                       unit_mask, sigma=sigma, num_draws=num_draws,
                       chunk_size=c, example_chunk_size=e)
  out = sensitivity_stats.draw_result(flips, jnp.any(unit_mask, -1, keepdims=True),
                                      num_draws, mask)
  out["plan"] = plan
  return out


# ----------------------------------------------------------------------------
# Scattered-pixel sensitivity (the official code's mode).
# ----------------------------------------------------------------------------


def _scattered_mask(key: Array, height: int, width: int,
                    num_pixels: int) -> Array:
  """[H, W] 0/1 mask at num_pixels (row, col) pairs drawn with replacement."""
  k_rows, k_cols = jax.random.split(key)
  rows = jax.random.randint(k_rows, (num_pixels,), 0, height)
  cols = jax.random.randint(k_cols, (num_pixels,), 0, width)
  return jnp.zeros((height, width), jnp.float32).at[rows, cols].set(1.0)


def _scattered_draw_keys(key: Array, draw: Array) -> tuple[Array, Array]:
  """(mask key, noise key) of draw r, both from fold_in(key, r)."""
  k_mask, k_noise = jax.random.split(jax.random.fold_in(key, draw))
  return k_mask, k_noise


def scattered_pixel_masks(key: Array, *, num_draws: int,
                          image_shape: Sequence[int],
                          num_pixels: int) -> Array:
  """The masks M_r [R, H, W] used by `scattered_pixel_sensitivity`.

  Args:
    key: the key passed to `scattered_pixel_sensitivity`.
    num_draws: R.
    image_shape: (..., H, W, C).
    num_pixels: row/column indices drawn per mask.
  """
  h, w = tuple(image_shape)[-3:-1]
  draws = jnp.arange(num_draws, dtype=jnp.int32)
  return jax.vmap(lambda r: _scattered_mask(
      _scattered_draw_keys(key, r)[0], h, w, num_pixels))(draws)


def scattered_pixel_perturb(images: Array, key: Array, draws: Array, *,
                            sigma: Any, num_pixels: int) -> Array:
  """Perturbed copies x + sigma * xi * M_r for the given draw indices.

  Args:
    images: [B, H, W, C].
    key: PRNG key; draw r uses fold_in(key, r) (split into mask and noise).
    draws: [c] int draw indices.
    sigma: noise standard deviation.
    num_pixels: row/column indices per mask.

  Returns:
    [B, c, H, W, C]; the mask of a draw is shared by the whole batch and all
    channels, the noise xi is i.i.d. per example, pixel and channel (as
    `compute_sensitivity` in estija/sensitivity cifar/cifar_sens.py).
  """
  b, h, w, ch = images.shape
  dtype = perturbed.noise_dtype(images)

  def one(r):
    k_mask, k_noise = _scattered_draw_keys(key, r)
    mask = _scattered_mask(k_mask, h, w, num_pixels).astype(dtype)
    noise = jax.random.normal(k_noise, (b, h, w, ch), dtype)
    return (sigma * noise).astype(dtype) * mask[None, :, :, None]

  delta = jnp.moveaxis(jax.vmap(one)(draws), 0, 1)   # [B, c, H, W, C]
  return images[:, None] + delta


def scattered_pixel_sensitivity(
    apply_fn: ApplyFn,
    variables: Any,
    inputs: Array,
    *,
    labels: Optional[Array] = None,
    key: Optional[Array] = None,
    mask: Optional[Array] = None,
    sigma: Any,
    num_draws: int,
    num_pixels: int,
    chunk_size: ChunkSize = AUTO,
    example_chunk_size: ChunkSize = AUTO,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES,
) -> dict[str, Array]:
  """Scattered-pixel sensitivity, the official code's estimator.

  Per draw r: sample num_pixels rows in [0, H) and num_pixels columns in
  [0, W) uniformly with replacement, mask the paired positions (all
  channels), ONE mask per draw for the whole batch; x~ = x + sigma * xi * M_r;
  mean flip over (x, r). Code defaults: sigma 0.1 (`--var`, a standard
  deviation), R 5 (`--num_reps`), num_pixels = patch_size^2 = 16.

  Args:
    apply_fn, variables, labels, mask, sigma, example_chunk_size,
      memory_budget_bytes: as in `token_sensitivity`.
    inputs: images [B, H, W, C], already normalised.
    key: PRNG key; see `scattered_pixel_perturb` / `scattered_pixel_masks`.
    num_draws: R.
    num_pixels: indices drawn per mask (about num_pixels unique positions).
    chunk_size: draws per forward call: 'auto', 'tune', None (all R) or an int.

  Returns:
    dict: per_example [B], mean, stderr, stderr_noise, flips, count, plan.
  """
  if inputs.ndim != 4:
    raise ValueError(
        f"inputs must be images [B, H, W, C], got shape "
        f"{tuple(inputs.shape)}.")
  perturbed.check_key(key, "scattered_pixel_sensitivity")
  planning.check_positive_int("num_draws", num_draws)
  planning.check_positive_int("num_pixels", num_pixels)
  perturbed.check_sigma(sigma)
  b = inputs.shape[0]
  c, e, plan = planning.resolve("scattered_pixel_sensitivity", apply_fn, variables,
                                (inputs,), num_draws, chunk_size, example_chunk_size,
                                memory_budget_bytes)
  fn = perturbed.bind(apply_fn, variables)
  y = perturbed.clean_labels(fn, inputs, labels, e)

  def chunk_flips(ids):
    copies = scattered_pixel_perturb(inputs, key, ids, sigma=sigma,
                                     num_pixels=num_pixels)
    logits = perturbed.forward_copies(fn, copies, e)
    return jnp.argmax(logits, axis=-1) != y[:, None]

  flips = perturbed.map_chunks(chunk_flips, num_draws, c)                 # [B, R]
  out = sensitivity_stats.draw_result(flips, jnp.ones((b, 1), bool), num_draws, mask)
  out["plan"] = plan
  return out
