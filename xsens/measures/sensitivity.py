"""Sensitivity measures: token-wise Gaussian, global, scattered-pixel, Boolean.

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
sigma or `sigma_sweep` (one compiled program):

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

`smooth_token_sensitivity` is differentiable in the inputs and the variables.
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
Python loop over (t, r) with the same keys (`token_sensitivity_loop`). With
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
    population sensitivity (examples and noise both random), see `_summarize`;
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

import functools
import math
from typing import Any, Callable, Iterable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from xsens.measures import convention
from xsens.measures import planning
from xsens.measures import token_prefix
from xsens.measures import tokens as tokens_lib
from xsens.measures.planning import (AUTO, DEFAULT_MEMORY_BUDGET_BYTES, ChunkSize,
                                     _check_positive_int)

Array = jax.Array
ApplyFn = Callable[[Any, Array], Array]
# How a study's sigma is read: "absolute", as given (the paper's); "token_rms", in units of
# the root-mean-square coordinate of the clean tokens the noise is added to (pixels of the
# patches, or text embeddings), i.e. as a noise-to-signal ratio, so one sigma means the
# same relative noise for every model and dataset (GPT-2's un-normalised embeddings are far
# smaller than LayerNorm outputs, so one absolute sigma is a much stronger noise for it).
NOISE_SCALES = ("absolute", "token_rms")


def noise_multiplier(noise_scale: str, token_rms: float) -> float:
  """The factor a study's sigma is multiplied by (`NOISE_SCALES`): 1 for "absolute",
  `token_rms` (the RMS coordinate of the clean tokens) for "token_rms"."""
  if noise_scale not in NOISE_SCALES:
    raise ValueError(f"unknown noise_scale {noise_scale!r}; allowed: {', '.join(NOISE_SCALES)}")
  return float(token_rms) if noise_scale == "token_rms" else 1.0


# ----------------------------------------------------------------------------
# Validation and small helpers.
# ----------------------------------------------------------------------------


def _check_sigma(sigma: Any) -> None:
  """Rejects a sigma that is not a scalar, and a negative one when it is concrete."""
  shape = jnp.shape(sigma)
  if shape:
    raise ValueError(
        f"sigma must be a scalar, got shape {tuple(shape)}: for several sigmas use "
        f"sigma_sweep or jax.vmap over sigma.")
  if isinstance(sigma, (int, float, np.number)) and sigma < 0:
    raise ValueError(f"sigma is a standard deviation and must be >= 0, got "
                     f"{sigma}.")


def _check_key(key: Optional[Array], name: str) -> None:
  if key is None:
    raise ValueError(f"{name} draws random noise and needs key= (a PRNG key).")


def _bind(apply_fn: ApplyFn, variables: Any) -> Callable[[Array], Array]:
  return lambda x: apply_fn(variables, x)


def _noise_dtype(x: Array) -> Any:
  return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


def _unit_mask(token_mask: Optional[Array], batch: int, units: int) -> Array:
  """token_mask [B, T] or [T] (or None) -> bool [B, T]."""
  if token_mask is None:
    return jnp.ones((batch, units), bool)
  return jnp.broadcast_to(jnp.asarray(token_mask).astype(bool), (batch, units))


def _is_key_batch(key: Array) -> bool:
  """True for a [B] batch of keys (`example_keys`), False for one key."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return key.ndim == 1
  return key.ndim == 2                             # Raw uint32 keys: [B, 2].


def example_keys(key: Array, example_ids: Optional[Array]) -> Array:
  """Per-example noise keys [B]: fold_in(key, example_ids[b]); key itself when
  example_ids is None (the batch-level scheme)."""
  if example_ids is None:
    return key
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(
      jnp.asarray(example_ids, jnp.int32))


def _pair_noise(key: Array, ids: Array, shape: tuple[int, ...],
                dtype: Any) -> Array:
  """Standard normal noise [c, *shape] (shape = (B, ...)); row j uses
  fold_in(key, ids[j]). With per-example keys key [B] (`example_keys`), example b of
  row j draws its shape[1:] from fold_in(key[b], ids[j]) instead."""
  if _is_key_batch(key):
    one = lambda k: jax.vmap(
        lambda i: jax.random.normal(jax.random.fold_in(k, i), shape[1:], dtype))(ids)
    return jnp.swapaxes(jax.vmap(one)(key), 0, 1)
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(ids)
  return jax.vmap(lambda k: jax.random.normal(k, shape, dtype))(keys)


def _map_chunks(fn: Callable[[Array], Array], num_items: int,
                chunk_size: Optional[int]) -> Array:
  """Evaluates fn over item ids 0..num_items-1, chunk_size ids at a time.

  Args:
    fn: ids [c] int32 -> [B, c, ...] (the chunk axis second, batch first).
    num_items: number of ids.
    chunk_size: ids per call; None evaluates all at once. Full chunks run
      sequentially under `lax.map` (memory bounded by one chunk); a remainder
      is one extra call of size num_items % chunk_size (as `lax.map`'s own
      `batch_size` does), so no work is padded.

  Returns:
    [B, num_items, ...], item j at position j whatever chunk_size is.
  """
  ids = jnp.arange(num_items, dtype=jnp.int32)
  if chunk_size is None or chunk_size >= num_items:
    return fn(ids)
  num_full, rem = divmod(num_items, chunk_size)
  full = jax.lax.map(fn, ids[:num_full * chunk_size].reshape(
      num_full, chunk_size))                       # [n, B, c, ...]
  full = jnp.moveaxis(full, 0, 1)                  # [B, n, c, ...]
  full = full.reshape(full.shape[0], num_full * chunk_size, *full.shape[3:])
  if rem:
    full = jnp.concatenate([full, fn(ids[num_full * chunk_size:])], axis=1)
  return full


def _forward_copies(fn: Callable[[Array], Array], copies: Array,
                    example_chunk_size: Optional[int] = None) -> Array:
  """fn on c perturbed copies of a batch, in one call or in example blocks.

  Args:
    fn: [B', ...] -> [B', ...].
    copies: [B, c, ...]; merged batch-major so a batch sharding survives.
    example_chunk_size: examples per call; None = all B (one call on B * c).
      Otherwise the batch is cut into n = ceil(B / example_chunk_size)
      strided blocks (example i * n + j in block j, the last example repeated
      to pad B to a multiple of n) that run in sequence under `lax.map`, so
      each call sees at most example_chunk_size * c inputs and every block
      spans the whole (possibly sharded) batch axis.

  Returns:
    outputs [B, c, ...]; each example's output is the same whatever
    example_chunk_size is, up to the batch-size dependence of fn's numerics.
  """
  b, c = copies.shape[:2]
  item = copies.shape[2:]

  def call(x):                                    # [b', c, ...] -> same
    out = fn(x.reshape(x.shape[0] * c, *item))
    return out.reshape(x.shape[0], c, *out.shape[1:])

  if example_chunk_size is None or example_chunk_size >= b:
    return call(copies)
  num_blocks = -(-b // example_chunk_size)
  block = -(-b // num_blocks)
  pad = num_blocks * block - b
  if pad:
    copies = jnp.concatenate(
        [copies, jnp.broadcast_to(copies[-1:], (pad, c, *item))], axis=0)
  blocks = jnp.moveaxis(copies.reshape(block, num_blocks, c, *item), 1, 0)
  out = jax.lax.map(call, blocks)                  # [n, block, c, ...]
  out = jnp.moveaxis(out, 0, 1)
  return out.reshape(num_blocks * block, *out.shape[2:])[:b]


def _token_delta(noise: Array, token_ids: Array, num_tokens: int,
                 sigma: Any, dtype: Any) -> Array:
  """Perturbation that adds sigma * noise[:, j] to token token_ids[j] only.

  Args:
    noise: [B, c, D] standard normal.
    token_ids: [c] int.
    num_tokens: T.
    sigma: scalar noise scale.
    dtype: dtype of the tokens.

  Returns:
    delta [B, c, T, D] = onehot(token_ids)[None, :, :, None] * sigma * noise.
  """
  scaled = (sigma * noise).astype(dtype)
  onehot = jax.nn.one_hot(token_ids, num_tokens, dtype=dtype)   # [c, T]
  return onehot[None, :, :, None] * scaled[:, :, None, :]


def _clean_labels(fn: Callable[[Array], Array], x: Array,
                  labels: Optional[Array],
                  example_chunk_size: Optional[int] = None) -> Array:
  if labels is not None:
    return jnp.asarray(labels)
  return jnp.argmax(_forward_copies(fn, x[:, None], example_chunk_size)[:, 0],
                    axis=-1)


# ----------------------------------------------------------------------------
# Aggregation and standard errors.
# ----------------------------------------------------------------------------


def _summarize(counts: Array, unit_mask: Array, num_draws: int,
               example_mask: Optional[Array]) -> dict[str, Array]:
  """Aggregates flip counts into means, standard errors and (flips, count).

  Notation: example b has n_b valid units (tokens; 1 for the global and
  scattered-pixel variants), unit u flips k_bu times in R draws,
  p_bu = k_bu / R, per-example mean s_b = sum_u p_bu / n_b, normalised
  weights w_b (example_mask, zero for examples with no valid unit),
  mean m = sum_b w_b s_b, and N = number of examples with w_b > 0.

  stderr (examples and noise both random; the quantity estimated is
  S_sigma(f) = E_X ..., with the N examples a sample of the data set):
    stderr^2 = N / (N - 1) * sum_b w_b^2 (s_b - m)^2,
  i.e. sample std of per_example / sqrt(N) for equal weights. By the law of
  total variance, Var(s_b) = Var_X(s(X)) + E_X Var(s_b | X), so this single
  two-stage (ultimate-cluster) estimator already includes the within-example
  binomial term; adding that term again would double count it. Needs N >= 2;
  for N = 1 it falls back to stderr_noise.

  stderr_noise (only the Gaussian draws random, examples fixed):
    stderr_noise^2 = sum_b w_b^2 V_b,
    V_b = (1 / n_b^2) sum_u p_bu (1 - p_bu) / (R - 1)          if R >= 2,
  unbiased for Var(s_b | X) because the R draws of a unit are i.i.d.
  Bernoulli(p_bu). For R = 1 the per-unit variances are not identifiable and
  we use the binomial bound V_b = s_b (1 - s_b) / (n_b - 1) (n_b >= 2; NaN
  when n_b = 1), which over-covers since sum_u p_u(1 - p_u) <= n s(1 - s).

  Args:
    counts: [B, U] int flips per unit, in [0, num_draws].
    unit_mask: [B, U] bool, valid units.
    num_draws: R.
    example_mask: [B] bool/float weights, or None for all ones.

  Returns:
    dict with per_unit [B, U], per_example [B], mean, stderr, stderr_noise,
    flips, count.
  """
  r = num_draws
  m = unit_mask.astype(jnp.float32)
  p = counts.astype(jnp.float32) / r * m                         # [B, U]
  n_units = m.sum(-1)                                            # [B]
  safe_n = jnp.maximum(n_units, 1.0)
  per_example = p.sum(-1) / safe_n                               # [B]

  w = jnp.ones_like(per_example) if example_mask is None else (
      jnp.asarray(example_mask).astype(jnp.float32))
  w = w * (n_units > 0)
  valid = w > 0
  wn = w / jnp.maximum(w.sum(), jnp.finfo(jnp.float32).tiny)
  mean = jnp.sum(wn * per_example)
  num_valid = valid.sum()

  if r >= 2:
    var_b = jnp.sum(p * (1.0 - p) * m, -1) / (r - 1) / safe_n**2
  else:
    var_b = jnp.where(
        n_units >= 2,
        per_example * (1.0 - per_example) / jnp.maximum(n_units - 1.0, 1.0),
        jnp.nan)
  stderr_noise = jnp.sqrt(jnp.sum(jnp.where(valid, wn**2 * var_b, 0.0)))

  dev2 = jnp.where(valid, wn**2 * (per_example - mean)**2, 0.0)
  n_f = num_valid.astype(jnp.float32)
  between = n_f / jnp.maximum(n_f - 1.0, 1.0) * jnp.sum(dev2)
  stderr = jnp.where(num_valid >= 2, jnp.sqrt(between), stderr_noise)

  flips = jnp.sum(jnp.where(valid[:, None] & unit_mask, counts, 0),
                  dtype=jnp.int32)
  count = r * jnp.sum(jnp.where(valid, n_units, 0.0)).astype(jnp.int32)
  return dict(per_unit=p, per_example=per_example, mean=mean, stderr=stderr,
              stderr_noise=stderr_noise, flips=flips, count=count)


def _token_result(flips_bp: Array, unit_mask: Array, num_draws: int,
                  example_mask: Optional[Array]) -> dict[str, Array]:
  """flips [B, T * R] (pair q = t * R + r) -> token_sensitivity's dict."""
  b, t = unit_mask.shape
  counts = flips_bp.reshape(b, t, num_draws).sum(-1, dtype=jnp.int32)
  out = _summarize(counts, unit_mask, num_draws, example_mask)
  out["per_token"] = out.pop("per_unit")
  return out


# ----------------------------------------------------------------------------
# Token-wise sensitivity.
# ----------------------------------------------------------------------------


def _token_flips(fn: Callable[[Array], Array], tokens: Array, key: Array,
                 labels: Optional[Array], *, sigma: Any, num_draws: int,
                 chunk_size: Optional[int],
                 example_chunk_size: Optional[int],
                 perturbed_fn: Optional[Callable[[Array, Array], Array]] = None
                 ) -> Array:
  """Flips [B, T * R] of fn (tokens -> logits); pair q = t * R + r. perturbed_fn
  (token_ids [c], scaled noise [B, c, D]) -> logits [B, c, K], when given, computes the
  copies' logits instead (`token_prefix.perturbed_logits_fn`)."""
  b, t, d = tokens.shape
  dtype = _noise_dtype(tokens)
  y = _clean_labels(fn, tokens, labels, example_chunk_size)

  def chunk_flips(ids):                            # ids [c] -> flips [B, c]
    noise = jnp.swapaxes(_pair_noise(key, ids, (b, d), dtype), 0, 1)
    if perturbed_fn is not None:
      logits = perturbed_fn(ids // num_draws, (sigma * noise).astype(dtype))
      return jnp.argmax(logits, axis=-1) != y[:, None]
    delta = _token_delta(noise, ids // num_draws, t, sigma, dtype)
    logits = _forward_copies(fn, tokens[:, None] + delta, example_chunk_size)
    return jnp.argmax(logits, axis=-1) != y[:, None]

  return _map_chunks(chunk_flips, t * num_draws, chunk_size)


def _with_patch_map(out: dict[str, Array], inputs: Array,
                    patch_size: Optional[int]) -> dict[str, Array]:
  if patch_size is not None:
    grid = tokens_lib.patch_grid(inputs.shape, patch_size)
    out["per_patch_map"] = out["per_token"].reshape(inputs.shape[0], *grid)
  return out


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
  docstring). Results do not depend on either size. Speed does: on CPU a
  small ViT runs fastest at forward batches of about 64
  (docs/benchmarks.md); accelerators prefer larger ones.

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
    (see the module docstring and `_summarize`), plan (the sizes used,
    `planning`), and for images per_patch_map [B, H/p, W/p].
  """
  _check_key(key, "token_sensitivity")
  _check_positive_int("num_draws", num_draws)
  _check_sigma(sigma)
  token_fn, tokens = tokens_lib.token_view(apply_fn, inputs, patch_size)
  b, t, d = tokens.shape
  c, e, plan = planning.resolve("token_sensitivity", token_fn, variables, (tokens,),
                                t * num_draws, chunk_size, example_chunk_size,
                                memory_budget_bytes)
  split = token_prefix.resolve(token_split, apply_fn, patch_size, inputs.shape[1:])
  flips = _token_flips(_bind(token_fn, variables), tokens,
                       example_keys(key, example_ids), labels,
                       sigma=sigma, num_draws=num_draws, chunk_size=c,
                       example_chunk_size=e, perturbed_fn=None if split is None else
                       token_prefix.perturbed_logits_fn(split, variables, tokens, e))
  out = _token_result(flips, _unit_mask(token_mask, b, t), num_draws, mask)
  out["plan"] = plan
  return _with_patch_map(out, inputs, patch_size)


def token_sensitivity_loop(
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
  """Reference `token_sensitivity`: a Python loop of jitted batch forwards.

  Same arguments, keys and result; one [B, T, D] forward per (token, draw)
  pair. For tests and benchmarks only (not jittable as a whole; T * R
  dispatches). The sizes (`chunk_size`, `example_chunk_size`,
  `memory_budget_bytes`) and `token_split` are accepted for signature parity
  and ignored (every copy runs the whole forward). The
  per-pair step is jitted once per (apply_fn, patch_size, image shape,
  num_draws) at module level, with the variables as an argument (an
  unhashable apply_fn is jitted per call).
  """
  del chunk_size, example_chunk_size, memory_budget_bytes, token_split
  _check_key(key, "token_sensitivity_loop")
  _check_positive_int("num_draws", num_draws)
  _check_sigma(sigma)
  _, tokens = tokens_lib.token_view(apply_fn, inputs, patch_size)
  image_shape = None if patch_size is None else tuple(inputs.shape[1:])
  b, t, _ = tokens.shape
  static = (apply_fn, patch_size, image_shape)
  try:
    hash(static)
    clean_fn = functools.partial(_loop_clean_labels, *static)
    pair_fn = functools.partial(_loop_pair_flips, *static, num_draws)
  except TypeError:                                # Unhashable: jit per call.
    clean_fn = jax.jit(functools.partial(_loop_clean_labels.__wrapped__,
                                         *static))
    pair_fn = jax.jit(functools.partial(_loop_pair_flips.__wrapped__,
                                        *static, num_draws))
  y = jnp.asarray(labels) if labels is not None else clean_fn(variables,
                                                               tokens)
  noise_key = example_keys(key, example_ids)
  flips = [pair_fn(variables, tokens, noise_key, y, sigma,
                   jnp.int32(tok * num_draws + r))
           for tok in range(t) for r in range(num_draws)]
  out = _token_result(jnp.stack(flips, axis=1), _unit_mask(token_mask, b, t),
                      num_draws, mask)
  return _with_patch_map(out, inputs, patch_size)


def _loop_logits(apply_fn: ApplyFn, patch_size: Optional[int],
                 image_shape: Optional[tuple[int, ...]], variables: Any,
                 tokens: Array) -> Array:
  if patch_size is not None:
    tokens = tokens_lib.unpatchify(tokens, patch_size, image_shape)
  return apply_fn(variables, tokens)


# Module-level so that repeated loop calls with the same apply_fn object reuse
# one compilation (apply_fn, patch_size, image_shape, num_draws are static;
# the variables are traced, never captured).
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _loop_clean_labels(apply_fn: ApplyFn, patch_size: Optional[int],
                       image_shape: Optional[tuple[int, ...]], variables: Any,
                       x: Array) -> Array:
  return jnp.argmax(_loop_logits(apply_fn, patch_size, image_shape, variables,
                                 x), axis=-1)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _loop_pair_flips(apply_fn: ApplyFn, patch_size: Optional[int],
                     image_shape: Optional[tuple[int, ...]], num_draws: int,
                     variables: Any, x: Array, key: Array, y: Array,
                     sigma: Any, q: Array) -> Array:
  """Flips [B] of the single (token, draw) pair q."""
  b, t, d = x.shape
  dtype = _noise_dtype(x)
  noise = _pair_noise(key, q[None], (b, d), dtype)[0]
  scaled = (sigma * noise).astype(dtype)
  onehot = jax.nn.one_hot(q // num_draws, t, dtype=dtype)
  logits = _loop_logits(apply_fn, patch_size, image_shape, variables,
                        x + onehot[None, :, None] * scaled[:, None, :])
  return jnp.argmax(logits, axis=-1) != y


def _global_flips(fn: Callable[[Array], Array], tokens: Array, key: Array,
                  labels: Optional[Array], unit_mask: Array, *, sigma: Any,
                  num_draws: int, chunk_size: Optional[int],
                  example_chunk_size: Optional[int]) -> Array:
  """Flips [B, R] with noise on every token where unit_mask [B, T] is True."""
  b, t, d = tokens.shape
  dtype = _noise_dtype(tokens)
  y = _clean_labels(fn, tokens, labels, example_chunk_size)

  def chunk_flips(ids):                            # ids [c] -> flips [B, c]
    noise = jnp.swapaxes(_pair_noise(key, ids, (b, t, d), dtype), 0, 1)
    delta = (sigma * noise).astype(dtype) * unit_mask[:, None, :, None].astype(
        dtype)
    logits = _forward_copies(fn, tokens[:, None] + delta, example_chunk_size)
    return jnp.argmax(logits, axis=-1) != y[:, None]

  return _map_chunks(chunk_flips, num_draws, chunk_size)


def _draw_result(flips: Array, unit_mask: Array, num_draws: int,
                 example_mask: Optional[Array]) -> dict[str, Array]:
  """flips [B, R] of one unit per example -> per_example, mean, ... dict."""
  counts = flips.sum(-1, dtype=jnp.int32)[:, None]
  out = _summarize(counts, unit_mask, num_draws, example_mask)
  del out["per_unit"]
  return out


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
  _check_key(key, "global_sensitivity")
  _check_positive_int("num_draws", num_draws)
  _check_sigma(sigma)
  token_fn, tokens = tokens_lib.token_view(apply_fn, inputs, patch_size)
  b, t, d = tokens.shape
  c, e, plan = planning.resolve("global_sensitivity", token_fn, variables, (tokens,),
                                num_draws, chunk_size, example_chunk_size,
                                memory_budget_bytes)
  unit_mask = _unit_mask(token_mask, b, t)
  flips = _global_flips(_bind(token_fn, variables), tokens,
                        example_keys(key, example_ids), labels,
                        unit_mask, sigma=sigma, num_draws=num_draws,
                        chunk_size=c, example_chunk_size=e)
  out = _draw_result(flips, jnp.any(unit_mask, -1, keepdims=True), num_draws,
                     mask)
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
  dtype = _noise_dtype(images)

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
  _check_key(key, "scattered_pixel_sensitivity")
  _check_positive_int("num_draws", num_draws)
  _check_positive_int("num_pixels", num_pixels)
  _check_sigma(sigma)
  b = inputs.shape[0]
  c, e, plan = planning.resolve("scattered_pixel_sensitivity", apply_fn, variables,
                                (inputs,), num_draws, chunk_size, example_chunk_size,
                                memory_budget_bytes)
  fn = _bind(apply_fn, variables)
  y = _clean_labels(fn, inputs, labels, e)

  def chunk_flips(ids):
    copies = scattered_pixel_perturb(inputs, key, ids, sigma=sigma,
                                     num_pixels=num_pixels)
    logits = _forward_copies(fn, copies, e)
    return jnp.argmax(logits, axis=-1) != y[:, None]

  flips = _map_chunks(chunk_flips, num_draws, c)                 # [B, R]
  out = _draw_result(flips, jnp.ones((b, 1), bool), num_draws, mask)
  out["plan"] = plan
  return out


# ----------------------------------------------------------------------------
# Smooth, differentiable variant.
# ----------------------------------------------------------------------------


def _output_distance(diff: Array, norm: str) -> Array:
  """Distance over the last axis: l1, l2 (safe gradient at 0) or sq_l2."""
  if norm == "l1":
    return jnp.sum(jnp.abs(diff), -1)
  sq = jnp.sum(jnp.square(diff), -1)
  if norm == "sq_l2":
    return sq
  positive = sq > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1.0)), 0.0)


def smooth_token_sensitivity(
    apply_fn: ApplyFn,
    variables: Any,
    inputs: Array,
    *,
    labels: Optional[Array] = None,
    key: Optional[Array] = None,
    mask: Optional[Array] = None,
    sigma: Any,
    num_draws: int,
    norm: str = "l2",
    on: str = "logits",
    patch_size: Optional[int] = None,
    token_mask: Optional[Array] = None,
    example_ids: Optional[Array] = None,
    chunk_size: ChunkSize = AUTO,
    example_chunk_size: ChunkSize = AUTO,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES,
) -> dict[str, Array]:
  """Differentiable token-wise sensitivity E ||g(X^(t,eps)) - g(X)||.

  g is apply_fn(variables, .) (on='logits') or its softmax (on='probs'). The
  distance is over classes: 'l1' = sum |.|, 'l2' = Euclidean norm (gradient 0
  where the difference is exactly 0), 'sq_l2' = squared Euclidean norm
  (sq_l2 / K is the MSE the official regulariser uses). Averaged over draws,
  valid tokens and (weighted) examples, with the noise of `token_sensitivity`.
  Gradients flow to the inputs and the variables, through both the clean and
  the perturbed branch (no stop-gradient, as in the official `--reg` code).
  With chunking, each chunk is rematerialised (`jax.checkpoint`) so backward
  memory is bounded by one chunk too.

  Args:
    apply_fn, variables, inputs, mask, key, sigma, num_draws, patch_size,
      token_mask, example_ids, chunk_size, example_chunk_size,
      memory_budget_bytes: as in `token_sensitivity` (the example blocks bound
      forward memory; backward
      memory is bounded by chunk_size only).
    labels: unused (the distance has no reference label); accepted so every
      measure takes the same arguments.
    norm: 'l1', 'l2' or 'sq_l2'.
    on: 'logits' or 'probs'.

  Returns:
    dict: per_token [B, T] mean distance over draws (0 where masked),
    per_example [B] (mean over valid tokens), mean (weighted over examples),
    plan (the sizes used), and for images per_patch_map [B, H/p, W/p].
  """
  del labels
  if norm not in ("l1", "l2", "sq_l2"):
    raise ValueError(f"norm must be 'l1', 'l2' or 'sq_l2', got {norm!r}.")
  if on not in ("logits", "probs"):
    raise ValueError(f"on must be 'logits' or 'probs', got {on!r}.")
  _check_key(key, "smooth_token_sensitivity")
  _check_positive_int("num_draws", num_draws)
  _check_sigma(sigma)
  token_fn, tokens = tokens_lib.token_view(apply_fn, inputs, patch_size)
  b, t, d = tokens.shape
  dtype = _noise_dtype(tokens)
  num_pairs = t * num_draws
  chunk_size, example_chunk_size, plan = planning.resolve(
      "smooth_token_sensitivity", token_fn, variables, (tokens,), num_pairs,
      chunk_size, example_chunk_size, memory_budget_bytes)

  def g(x):
    out = token_fn(variables, x)
    return jax.nn.softmax(out, -1) if on == "probs" else out

  clean = _forward_copies(g, tokens[:, None],
                          example_chunk_size)[:, 0]              # [B, K]

  noise_key = example_keys(key, example_ids)

  def chunk_dist(ids):                             # ids [c] -> dist [B, c]
    noise = jnp.swapaxes(_pair_noise(noise_key, ids, (b, d), dtype), 0, 1)
    delta = _token_delta(noise, ids // num_draws, t, sigma, dtype)
    out = _forward_copies(g, tokens[:, None] + delta,
                          example_chunk_size)                    # [B, c, K]
    return _output_distance(out - clean[:, None], norm)

  if chunk_size is not None and chunk_size < num_pairs:
    chunk_dist = jax.checkpoint(chunk_dist)
  dist = _map_chunks(chunk_dist, num_pairs, chunk_size)
  per_token = dist.reshape(b, t, num_draws).mean(-1)             # [B, T]

  m = _unit_mask(token_mask, b, t).astype(per_token.dtype)
  n_units = m.sum(-1)
  per_example = jnp.sum(per_token * m, -1) / jnp.maximum(n_units, 1.0)
  w = jnp.ones_like(per_example) if mask is None else (
      jnp.asarray(mask).astype(per_example.dtype))
  w = w * (n_units > 0)
  mean = jnp.sum(w * per_example) / jnp.maximum(jnp.sum(w), 1e-12)
  out = dict(per_token=per_token * m, per_example=per_example, mean=mean,
             plan=plan)
  return _with_patch_map(out, inputs, patch_size)


# ----------------------------------------------------------------------------
# Boolean sensitivity.
# ----------------------------------------------------------------------------


def _differs(a: Array, b: Array) -> Array:
  """a != b per leading index, any over trailing label axes."""
  ne = a != b
  return jnp.any(ne, axis=tuple(range(1, ne.ndim))) if ne.ndim > 1 else ne


def _boolean_labels(out: Array) -> Array:
  """Function values [M] as they are; logits [M, K] -> argmax [M]."""
  return jnp.argmax(out, axis=-1) if out.ndim == 2 else out


def boolean_sensitivity(
    apply_fn: ApplyFn,
    variables: Any,
    inputs: Array,
    *,
    labels: Optional[Array] = None,
    key: Optional[Array] = None,
    mask: Optional[Array] = None,
    normalize: bool = False,
) -> dict[str, Array]:
  """Average sensitivity as(f) = E_x sum_i 1[f(x) != f(x^{+i})] at given points.

  as(f) = sum_i Inf_i(f) = sum_S |S| fhat(S)^2 (O'Donnell, "Analysis of
  Boolean Functions", 2014, §2.3). s(f, x) = #{i: f(x) != f(x^{+i})} is
  counted at each row x of inputs (one call of apply_fn on the B * (n + 1)
  points x and x^{+i}); `mean` averages it over the rows. The exact as(f) is
  the mean over `xsens.measures.boolean.all_inputs(n)` (n <= 20); a
  Monte-Carlo estimate the mean over `boolean.random_inputs(key, M, n)`.

  Args:
    apply_fn: (variables, x [M, n] of ±1) -> function values [M] (compared
      exactly, e.g. ±1 labels) or logits [M, K] (compared by argmax).
    variables: passed to apply_fn (any pytree, e.g. None for a plain f).
    inputs: [B, n] points of {±1}^n (any float dtype).
    labels: [B] reference values f(x); default apply_fn's value on inputs.
    key: unused (the points are the caller's); accepted so every measure
      takes the same arguments.
    mask: [B] example mask (bool or weights).
    normalize: divide per_example, mean and stderr by n (the mean influence,
      in [0, 1]); whether the paper normalises is not known.

  Returns:
    dict: per_example [B] s(f, x) (or s / n); mean; stderr (std of
    per_example over valid rows / sqrt(N), ddof 1, as for a uniform sample;
    when inputs enumerate the cube the mean is exact and this is only their
    spread); influence [n] (the weighted share of rows where flipping bit i
    changes f: Pr_x[f(x) != f(x^{+i})] at uniform points, never normalised);
    count (int32 number of valid rows).
  """
  del key
  if inputs.ndim != 2:
    raise ValueError(
        f"inputs must be points [B, n] of {{±1}}^n, got shape "
        f"{tuple(inputs.shape)}.")
  b, n = inputs.shape
  flip = 1 - 2 * jnp.eye(n, dtype=inputs.dtype)                  # [n, n]
  x_flip = (inputs[:, None, :] * flip[None]).reshape(b * n, n)
  if labels is None:
    out = _boolean_labels(apply_fn(variables,
                                   jnp.concatenate([inputs, x_flip], 0)))
    fx, f_flip = out[:b], out[b:]
  else:
    fx, f_flip = jnp.asarray(labels), _boolean_labels(apply_fn(variables,
                                                               x_flip))
  f_flip = f_flip.reshape(b, n, *f_flip.shape[1:])
  diff = jax.vmap(_differs, in_axes=(None, 1), out_axes=1)(fx, f_flip)
  s = diff.sum(-1, dtype=jnp.float32)                            # [B]
  if mask is None:
    mean = s.mean()
    influence = diff.mean(0, dtype=jnp.float32)
    stderr = jnp.std(s, ddof=1 if b > 1 else 0) / math.sqrt(b)
    count = jnp.asarray(b, jnp.int32)
  else:
    w = jnp.asarray(mask).astype(jnp.float32)
    total = jnp.maximum(w.sum(), jnp.finfo(jnp.float32).tiny)
    mean = jnp.sum(w * s) / total
    influence = jnp.sum(w[:, None] * diff, 0) / total
    valid = w > 0
    wn = w / total
    n_f = valid.sum().astype(jnp.float32)
    stderr = jnp.sqrt(n_f / jnp.maximum(n_f - 1.0, 1.0) * jnp.sum(
        jnp.where(valid, wn**2 * (s - mean)**2, 0.0)))
    count = valid.sum(dtype=jnp.int32)
  scale = 1.0 / n if normalize else 1.0
  return dict(per_example=s * scale, mean=mean * scale, stderr=stderr * scale,
              influence=influence, count=count)


# ----------------------------------------------------------------------------
# Sweeps and planning.
# ----------------------------------------------------------------------------


def _is_static(value: Any) -> bool:
  """Hashable and free of arrays: a size, a name, a function, None."""
  if any(isinstance(leaf, (jax.Array, np.ndarray, np.generic))
         for leaf in jax.tree.leaves(value)):
    return False
  try:
    hash(value)
  except TypeError:
    return False
  return True


def _sweep(fn: Callable[..., Any], static_args: tuple, static_kwargs: tuple,
           vectorize: bool, dyn_args: dict, dyn_kwargs: dict, sigmas: Array) -> Any:
  args = dict(static_args) | dyn_args
  kwargs = dict(static_kwargs) | dyn_kwargs
  call = lambda s: fn(*(args[i] for i in range(len(args))), sigma=s, **kwargs)
  return jax.vmap(call)(sigmas) if vectorize else jax.lax.map(call, sigmas)


_sweep_jit = jax.jit(_sweep, static_argnums=(0, 1, 2, 3))


def sigma_sweep(fn: Callable[..., Any], sigmas: Iterable[float], *args: Any,
                vectorize: bool = False, **kwargs: Any) -> Any:
  """Evaluates fn(*args, sigma=s, **kwargs) for each s and stacks the results.

  The same key (kwargs['key']) is reused for every sigma: common random
  numbers, so the curve is smooth in sigma and differences between sigmas
  carry less Monte-Carlo noise. The sweep is one program, jitted here with fn,
  its `convention.static_argnames` and every array-free hashable argument
  (functions, sizes, names) static: called eagerly it compiles once per (fn,
  static values, shapes), and inside a caller's jit it is part of that program.

  Args:
    fn: an estimator of this module (or anything taking `sigma=`).
    sigmas: S noise scales (a sequence or a [S] array, may be traced).
    *args: fn's positional arguments (apply_fn, variables, inputs).
    vectorize: False maps over sigma with `lax.map` (S evaluations in
      sequence, memory of one); True vmaps over sigma (S times the memory,
      which the 'auto' chunk sizes do not see; the model is then batched by
      vmap rather than reshaped).
    **kwargs: fn's other keyword arguments.

  Returns:
    fn's output pytree with a leading [S] axis on every leaf.
  """
  values = sigmas if hasattr(sigmas, "shape") else list(sigmas)
  traced = any(isinstance(v, jax.core.Tracer)
               for v in (values if isinstance(values, list) else [values]))
  sig = jnp.asarray(values, jnp.float32) if traced else np.asarray(values, np.float32)
  if sig.ndim != 1:
    raise ValueError(f"sigmas must be a sequence or a [S] array, got shape {sig.shape}.")
  if not traced and np.any(sig < 0):
    raise ValueError(f"sigma is a standard deviation and must be >= 0, got "
                     f"{sig.tolist()}.")
  names = set(convention.static_argnames(fn))
  static_kw = {k: v for k, v in kwargs.items() if k in names or _is_static(v)}
  static_pos = {i: a for i, a in enumerate(args) if _is_static(a)}
  parts = (tuple(static_pos.items()), tuple(sorted(static_kw.items())), bool(vectorize),
           {i: a for i, a in enumerate(args) if i not in static_pos},
           {k: v for k, v in kwargs.items() if k not in static_kw}, sig)
  try:
    hash((fn,) + parts[:3])
  except TypeError:                                # e.g. an unhashable size list.
    return jax.jit(functools.partial(_sweep, fn, *parts[:3]))(*parts[3:])
  return _sweep_jit(fn, *parts)


def num_draws_for_stderr(target_stderr: float, pilot_mean: float,
                         num_examples: int, num_tokens: int) -> int:
  """Smallest R with sqrt(s (1 - s) / (N * T * R)) <= target_stderr.

  This is the within-example (noise-only) binomial bound for N examples of T
  tokens: it bounds `stderr_noise` (since sum_t p_t (1 - p_t) <= T s (1 - s))
  but not the between-example spread in `stderr`, which more draws cannot
  reduce. Plain Python, for planning outside jit.

  Args:
    target_stderr: > 0.
    pilot_mean: s in [0, 1], e.g. the `mean` of a small pilot run.
    num_examples: N.
    num_tokens: T (1 for the global and scattered-pixel variants).
  """
  if not target_stderr > 0:
    raise ValueError(f"target_stderr must be > 0, got {target_stderr}.")
  if not 0.0 <= pilot_mean <= 1.0:
    raise ValueError(f"pilot_mean must be in [0, 1], got {pilot_mean}.")
  _check_positive_int("num_examples", num_examples)
  _check_positive_int("num_tokens", num_tokens)
  var = pilot_mean * (1.0 - pilot_mean)
  trials = num_examples * num_tokens
  r = max(1, math.ceil(var / (trials * target_stderr**2)))
  while r > 1 and math.sqrt(var / (trials * (r - 1))) <= target_stderr:
    r -= 1  # Guards against float round-up in the ceil above.
  return r
