"""Sensitivity measures: token-wise Gaussian, global, scattered-pixel, Boolean.

Reference: Vasudeva et al., "Transformers Learn Low Sensitivity Functions:
Investigations and Implications", ICLR 2025, arXiv 2403.06925; official code
github.com/estija/sensitivity. See /work/shared/specs/sensitivity.md for what is
(and is not) known about the paper's definitions.

Main metric (spec §1), for tokens X = (x_1..x_T), x_i in R^D and the argmax
label y(X) = argmax_k f_k(X):

  S_sigma(f) = E_X (1/T) sum_i Pr_eps[ y(X^(i,eps)) != y(X) ],
  X^(i,eps): x_i <- x_i + eps,  eps ~ N(0, sigma^2 I_D).

Every function here is pure: no globals, no I/O, no Python-side randomness.
Sizes (`num_draws`, `chunk_size`, `example_chunk_size`, ...) are static Python
ints; `sigma` may be a traced scalar. Models enter only as functions
(`from_tokens`, `predict_fn`, see `xsens.measures.tokens`), so the measures
compose with `jax.jit`, `jax.vmap` (e.g. over keys) and, for
`smooth_token_sensitivity`, `jax.grad`. Batches may be sharded over devices on
axis 0: perturbed copies are laid out [B, c, ...] and merged batch-major into
[B * c, ...] (example blocks are strided), so a batch sharding stays a batch
sharding under GSPMD; nothing calls back to the host.

Noise scheme (all token-wise estimators): the (token t, draw r) pair has index
q = t * num_draws + r and noise `normal(fold_in(key, q), [B, D])`. Results are
therefore independent of `chunk_size` and `example_chunk_size` and equal to a
Python loop over (t, r) with the same keys (`token_sensitivity_loop`).

Returned dictionaries (hard estimators) hold:
  per_example [B]: flip frequency of each example (0 where fully masked);
  mean: weighted mean of per_example over examples (`example_mask`);
  stderr: Monte-Carlo standard error of `mean` as an estimate of the
    population sensitivity (examples and noise both random), see `_summarize`;
  stderr_noise: standard error from the noise draws alone, given the examples;
  flips, count: int32 numbers of flips and of Bernoulli trials (valid examples,
    valid units, draws), to pool batches as sum(flips) / sum(count) like the
    (sum, count) accumulators of big_vision evaluators. Note flips / count
    weights examples by their number of valid tokens (the official language
    code's `mean_sensitivity`, spec §2.3 (a)), whereas `mean` is the mean of
    per-example means (spec §2.3 (b)); they agree when no token is masked.
"""

import functools
import math
from typing import Any, Callable, Iterable, Optional, Sequence

import jax
import jax.numpy as jnp

from xsens.measures import tokens as tokens_lib

Array = jax.Array
TokenFn = Callable[[Array], Array]

MAX_EXACT_BOOLEAN_BITS = 20


# ----------------------------------------------------------------------------
# Validation and small helpers.
# ----------------------------------------------------------------------------


def _check_positive_int(name: str, value: Any) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name} must be a positive Python int, got {value!r}.")


def _check_chunk_size(chunk_size: Optional[int],
                      name: str = "chunk_size") -> None:
  if chunk_size is not None:
    _check_positive_int(name, chunk_size)


def _check_sigma(sigma: Any) -> None:
  """Rejects a negative sigma when it is concrete (traced sigmas pass)."""
  if isinstance(sigma, (int, float)) and sigma < 0:
    raise ValueError(f"sigma is a standard deviation and must be >= 0, got "
                     f"{sigma}.")


def _check_tokens(tokens: Array) -> None:
  if tokens.ndim != 3:
    raise ValueError(
        f"tokens must be [B, T, D], got shape {tuple(tokens.shape)}.")


def _noise_dtype(x: Array) -> Any:
  return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


def _unit_mask(token_mask: Optional[Array], batch: int, units: int) -> Array:
  """token_mask [B, T] or [T] (or None) -> bool [B, T]."""
  if token_mask is None:
    return jnp.ones((batch, units), bool)
  return jnp.broadcast_to(jnp.asarray(token_mask).astype(bool), (batch, units))


def _pair_noise(key: Array, ids: Array, shape: tuple[int, ...],
                dtype: Any) -> Array:
  """Standard normal noise [c, *shape]; row j uses fold_in(key, ids[j])."""
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


def token_sensitivity(
    from_tokens: TokenFn,
    tokens: Array,
    key: Array,
    *,
    sigma: Any,
    num_draws: int,
    token_mask: Optional[Array] = None,
    example_mask: Optional[Array] = None,
    labels: Optional[Array] = None,
    chunk_size: Optional[int] = None,
    example_chunk_size: Optional[int] = None,
) -> dict[str, Array]:
  """Token-wise Gaussian sensitivity (arXiv 2403.06925 Fig. 1; spec §1, §2.1).

  For every token t and draw r: x_t <- x_t + eps, eps ~ N(0, sigma^2 I_D), and
  a flip is argmax from_tokens(X^(t,eps)) != labels. The T * R (token, draw)
  pairs are vectorised: a chunk of c pairs is c perturbed copies of the batch,
  [B, c, T, D] -> [B * c, T, D], one from_tokens call. Peak memory is that of
  one forward pass on chunk_size * B examples (T * R * B when chunk_size is
  None); chunks run in sequence under `lax.map`. With example_chunk_size = e,
  each chunk is further cut into blocks of at most e examples, so every
  forward sees at most e * chunk_size inputs. Results do not depend on either
  size. Speed does: on CPU a small ViT runs fastest at forward batches of
  about 64 (docs/benchmarks.md); accelerators prefer larger ones.

  Args:
    from_tokens: tokens [B', T, D] -> logits [B', K], any batch size B'.
    tokens: [B, T, D], may be sharded on axis 0.
    key: PRNG key; pair (t, r) uses fold_in(key, t * num_draws + r).
    sigma: noise standard deviation (float or traced scalar).
    num_draws: R, draws per token (static).
    token_mask: [B, T] or [T] bool; False marks padding, which is still
      evaluated but counts nowhere.
    example_mask: [B] bool or weights, for padded batches.
    labels: [B] int labels to compare with; default the clean argmax.
    chunk_size: (token, draw) pairs per forward call; None = all T * R.
    example_chunk_size: examples per forward call; None = all B. The batch
      is split into ceil(B / example_chunk_size) strided blocks, so a batch
      sharding stays a batch sharding.

  Returns:
    dict: per_token [B, T] flip probabilities (0 where masked), per_example
    [B] (mean over valid tokens), mean, stderr, stderr_noise, flips, count
    (see the module docstring and `_summarize` for the formulas).
  """
  _check_tokens(tokens)
  _check_positive_int("num_draws", num_draws)
  _check_chunk_size(chunk_size)
  _check_chunk_size(example_chunk_size, "example_chunk_size")
  _check_sigma(sigma)
  b, t, d = tokens.shape
  dtype = _noise_dtype(tokens)
  y = _clean_labels(from_tokens, tokens, labels, example_chunk_size)

  def chunk_flips(ids):                            # ids [c] -> flips [B, c]
    noise = jnp.swapaxes(_pair_noise(key, ids, (b, d), dtype), 0, 1)
    delta = _token_delta(noise, ids // num_draws, t, sigma, dtype)
    logits = _forward_copies(from_tokens, tokens[:, None] + delta,
                             example_chunk_size)
    return jnp.argmax(logits, axis=-1) != y[:, None]

  flips = _map_chunks(chunk_flips, t * num_draws, chunk_size)
  return _token_result(flips, _unit_mask(token_mask, b, t), num_draws,
                       example_mask)


def token_sensitivity_loop(
    from_tokens: TokenFn,
    tokens: Array,
    key: Array,
    *,
    sigma: Any,
    num_draws: int,
    token_mask: Optional[Array] = None,
    example_mask: Optional[Array] = None,
    labels: Optional[Array] = None,
    chunk_size: Optional[int] = None,
    example_chunk_size: Optional[int] = None,
) -> dict[str, Array]:
  """Reference `token_sensitivity`: a Python loop of jitted batch forwards.

  Same arguments, keys and result; one [B, T, D] forward per (token, draw)
  pair. For tests and benchmarks only (not jittable as a whole; T * R
  dispatches). `chunk_size` and `example_chunk_size` are accepted for
  signature parity and ignored.
  """
  del chunk_size, example_chunk_size
  _check_tokens(tokens)
  _check_positive_int("num_draws", num_draws)
  _check_sigma(sigma)
  b, t, _ = tokens.shape
  try:
    hash(from_tokens)
    clean_fn = functools.partial(_loop_clean_labels, from_tokens)
    pair_fn = functools.partial(_loop_pair_flips, from_tokens, num_draws)
  except TypeError:                                # Unhashable: jit per call.
    clean_fn = jax.jit(functools.partial(_loop_clean_labels.__wrapped__,
                                         from_tokens))
    pair_fn = jax.jit(functools.partial(_loop_pair_flips.__wrapped__,
                                        from_tokens, num_draws))
  y = jnp.asarray(labels) if labels is not None else clean_fn(tokens)
  flips = [pair_fn(tokens, key, y, sigma, jnp.int32(tok * num_draws + r))
           for tok in range(t) for r in range(num_draws)]
  return _token_result(jnp.stack(flips, axis=1), _unit_mask(token_mask, b, t),
                       num_draws, example_mask)


# Module-level so that repeated loop calls with the same from_tokens object
# reuse one compilation (from_tokens and num_draws are static).
@functools.partial(jax.jit, static_argnums=0)
def _loop_clean_labels(from_tokens: TokenFn, x: Array) -> Array:
  return jnp.argmax(from_tokens(x), axis=-1)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _loop_pair_flips(from_tokens: TokenFn, num_draws: int, x: Array,
                     key: Array, y: Array, sigma: Any, q: Array) -> Array:
  """Flips [B] of the single (token, draw) pair q."""
  b, t, d = x.shape
  dtype = _noise_dtype(x)
  noise = jax.random.normal(jax.random.fold_in(key, q), (b, d), dtype)
  scaled = (sigma * noise).astype(dtype)
  onehot = jax.nn.one_hot(q // num_draws, t, dtype=dtype)
  logits = from_tokens(x + onehot[None, :, None] * scaled[:, None, :])
  return jnp.argmax(logits, axis=-1) != y


def global_sensitivity(
    from_tokens: TokenFn,
    tokens: Array,
    key: Array,
    *,
    sigma: Any,
    num_draws: int,
    token_mask: Optional[Array] = None,
    example_mask: Optional[Array] = None,
    labels: Optional[Array] = None,
    chunk_size: Optional[int] = None,
    example_chunk_size: Optional[int] = None,
) -> dict[str, Array]:
  """Global Gaussian sensitivity: all valid tokens noised at once (App. A.2).

  Pr_E[argmax f(X + E) != y] with E_t ~ N(0, sigma^2 I_D) on every unmasked
  token (the official code's `sentence_embedding_label_sensitivity`, spec §1).
  Draw r uses noise normal(fold_in(key, r), [B, T, D]).

  Args:
    from_tokens, tokens, key, sigma, labels: as in `token_sensitivity`.
    num_draws: R draws per example.
    token_mask: [B, T] or [T] bool; masked tokens receive no noise.
    example_mask: [B] bool or weights.
    chunk_size: draws per forward call; None = all R.
    example_chunk_size: as in `token_sensitivity`.

  Returns:
    dict: per_example [B] flip frequency, mean, stderr, stderr_noise, flips,
    count (R trials per valid example).
  """
  _check_tokens(tokens)
  _check_positive_int("num_draws", num_draws)
  _check_chunk_size(chunk_size)
  _check_chunk_size(example_chunk_size, "example_chunk_size")
  _check_sigma(sigma)
  b, t, d = tokens.shape
  dtype = _noise_dtype(tokens)
  mask = _unit_mask(token_mask, b, t)
  y = _clean_labels(from_tokens, tokens, labels, example_chunk_size)

  def chunk_flips(ids):                            # ids [c] -> flips [B, c]
    noise = jnp.swapaxes(_pair_noise(key, ids, (b, t, d), dtype), 0, 1)
    delta = (sigma * noise).astype(dtype) * mask[:, None, :, None].astype(dtype)
    logits = _forward_copies(from_tokens, tokens[:, None] + delta,
                             example_chunk_size)
    return jnp.argmax(logits, axis=-1) != y[:, None]

  flips = _map_chunks(chunk_flips, num_draws, chunk_size)        # [B, R]
  counts = flips.sum(-1, dtype=jnp.int32)[:, None]
  out = _summarize(counts, jnp.any(mask, -1, keepdims=True), num_draws,
                   example_mask)
  del out["per_unit"]
  return out


# ----------------------------------------------------------------------------
# Scattered-pixel sensitivity (the official code's mode, spec §2.2).
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
    predict_fn: TokenFn,
    images: Array,
    key: Array,
    *,
    sigma: Any,
    num_draws: int,
    num_pixels: int,
    example_mask: Optional[Array] = None,
    labels: Optional[Array] = None,
    chunk_size: Optional[int] = None,
    example_chunk_size: Optional[int] = None,
) -> dict[str, Array]:
  """Scattered-pixel sensitivity, the official code's estimator (spec §2.2).

  Per draw r: sample num_pixels rows in [0, H) and num_pixels columns in
  [0, W) uniformly with replacement, mask the paired positions (all
  channels), ONE mask per draw for the whole batch; x~ = x + sigma * xi * M_r;
  mean flip over (x, r). Code defaults: sigma 0.1 (`--var`, a standard
  deviation), R 5 (`--num_reps`), num_pixels = patch_size^2 = 16.

  Args:
    predict_fn: images [B', H, W, C] -> logits [B', K].
    images: [B, H, W, C], already normalised.
    key: PRNG key; see `scattered_pixel_perturb` / `scattered_pixel_masks`.
    sigma: noise standard deviation.
    num_draws: R.
    num_pixels: indices drawn per mask (about num_pixels unique positions).
    example_mask: [B] bool or weights.
    labels: [B] int; default the clean argmax.
    chunk_size: draws per forward call; None = all R.
    example_chunk_size: as in `token_sensitivity`.

  Returns:
    dict: per_example [B], mean, stderr, stderr_noise, flips, count.
  """
  if images.ndim != 4:
    raise ValueError(
        f"images must be [B, H, W, C], got shape {tuple(images.shape)}.")
  _check_positive_int("num_draws", num_draws)
  _check_positive_int("num_pixels", num_pixels)
  _check_chunk_size(chunk_size)
  _check_chunk_size(example_chunk_size, "example_chunk_size")
  _check_sigma(sigma)
  b = images.shape[0]
  y = _clean_labels(predict_fn, images, labels, example_chunk_size)

  def chunk_flips(ids):
    copies = scattered_pixel_perturb(images, key, ids, sigma=sigma,
                                     num_pixels=num_pixels)
    logits = _forward_copies(predict_fn, copies, example_chunk_size)
    return jnp.argmax(logits, axis=-1) != y[:, None]

  flips = _map_chunks(chunk_flips, num_draws, chunk_size)        # [B, R]
  counts = flips.sum(-1, dtype=jnp.int32)[:, None]
  out = _summarize(counts, jnp.ones((b, 1), bool), num_draws, example_mask)
  del out["per_unit"]
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
    from_tokens: TokenFn,
    tokens: Array,
    key: Array,
    *,
    sigma: Any,
    num_draws: int,
    norm: str = "l2",
    on: str = "logits",
    token_mask: Optional[Array] = None,
    example_mask: Optional[Array] = None,
    chunk_size: Optional[int] = None,
    example_chunk_size: Optional[int] = None,
) -> Array:
  """Differentiable token-wise sensitivity E ||g(X^(t,eps)) - g(X)||.

  g is from_tokens (on='logits') or its softmax (on='probs'). The distance is
  over classes: 'l1' = sum |.|, 'l2' = Euclidean norm (gradient 0 where the
  difference is exactly 0), 'sq_l2' = squared Euclidean norm (sq_l2 / K is
  the MSE the official regulariser uses, spec §3). Averaged over draws, valid
  tokens and (weighted) examples, with the noise of `token_sensitivity`.
  Gradients flow to tokens and to anything from_tokens closes over, through
  both the clean and the perturbed branch (no stop-gradient, as in the
  official `--reg` code). With chunking, each chunk is rematerialised
  (`jax.checkpoint`) so backward memory is bounded by one chunk too.

  Args:
    from_tokens, tokens, key, sigma, num_draws, token_mask, example_mask,
      chunk_size, example_chunk_size: as in `token_sensitivity` (the
      example blocks bound forward memory; backward memory is bounded by
      chunk_size only).
    norm: 'l1', 'l2' or 'sq_l2'.
    on: 'logits' or 'probs'.

  Returns:
    scalar mean distance.
  """
  if norm not in ("l1", "l2", "sq_l2"):
    raise ValueError(f"norm must be 'l1', 'l2' or 'sq_l2', got {norm!r}.")
  if on not in ("logits", "probs"):
    raise ValueError(f"on must be 'logits' or 'probs', got {on!r}.")
  _check_tokens(tokens)
  _check_positive_int("num_draws", num_draws)
  _check_chunk_size(chunk_size)
  _check_chunk_size(example_chunk_size, "example_chunk_size")
  _check_sigma(sigma)
  b, t, d = tokens.shape
  dtype = _noise_dtype(tokens)

  def g(x):
    out = from_tokens(x)
    return jax.nn.softmax(out, -1) if on == "probs" else out

  clean = _forward_copies(g, tokens[:, None],
                          example_chunk_size)[:, 0]              # [B, K]

  def chunk_dist(ids):                             # ids [c] -> dist [B, c]
    noise = jnp.swapaxes(_pair_noise(key, ids, (b, d), dtype), 0, 1)
    delta = _token_delta(noise, ids // num_draws, t, sigma, dtype)
    out = _forward_copies(g, tokens[:, None] + delta,
                          example_chunk_size)                    # [B, c, K]
    return _output_distance(out - clean[:, None], norm)

  num_pairs = t * num_draws
  if chunk_size is not None and chunk_size < num_pairs:
    chunk_dist = jax.checkpoint(chunk_dist)
  dist = _map_chunks(chunk_dist, num_pairs, chunk_size)
  per_token = dist.reshape(b, t, num_draws).mean(-1)             # [B, T]

  m = _unit_mask(token_mask, b, t).astype(per_token.dtype)
  n_units = m.sum(-1)
  per_example = jnp.sum(per_token * m, -1) / jnp.maximum(n_units, 1.0)
  w = jnp.ones_like(per_example) if example_mask is None else (
      jnp.asarray(example_mask).astype(per_example.dtype))
  w = w * (n_units > 0)
  return jnp.sum(w * per_example) / jnp.maximum(jnp.sum(w), 1e-12)


# ----------------------------------------------------------------------------
# Images: patch tokens.
# ----------------------------------------------------------------------------


def image_token_sensitivity(
    predict_fn: TokenFn,
    images: Array,
    key: Array,
    *,
    patch_size: int,
    sigma: Any,
    num_draws: int,
    chunk_size: Optional[int] = None,
    labels: Optional[Array] = None,
    example_mask: Optional[Array] = None,
    example_chunk_size: Optional[int] = None,
) -> dict[str, Array]:
  """Patch-wise sensitivity of an image classifier (spec §2.1, paper mode).

  Tokens are grid-aligned p x p pixel patches of the normalised images
  (`xsens.measures.tokens.patchify`); works for any predict_fn (ViT, CNN,
  MLP).

  Args:
    predict_fn: images [B', H, W, C] -> logits [B', K].
    images: [B, H, W, C].
    key, sigma, num_draws, chunk_size, labels, example_mask,
      example_chunk_size: as in `token_sensitivity`.
    patch_size: p; must divide H and W (CIFAR code default 4, T = 64).

  Returns:
    token_sensitivity's dict plus per_patch_map [B, H/p, W/p].
  """
  to_tokens, from_tokens = tokens_lib.image_token_fns(
      predict_fn, patch_size, images.shape[1:])
  out = token_sensitivity(
      from_tokens, to_tokens(images), key, sigma=sigma, num_draws=num_draws,
      labels=labels, example_mask=example_mask, chunk_size=chunk_size,
      example_chunk_size=example_chunk_size)
  grid = tokens_lib.patch_grid(images.shape, patch_size)
  out["per_patch_map"] = out["per_token"].reshape(images.shape[0], *grid)
  return out


# ----------------------------------------------------------------------------
# Boolean sensitivity (spec §1).
# ----------------------------------------------------------------------------


def _differs(a: Array, b: Array) -> Array:
  """a != b per leading index, any over trailing label axes."""
  ne = a != b
  return jnp.any(ne, axis=tuple(range(1, ne.ndim))) if ne.ndim > 1 else ne


def boolean_sensitivity(
    f: Callable[[Array], Array],
    n: int,
    *,
    key: Optional[Array] = None,
    num_samples: Optional[int] = None,
    normalize: bool = False,
    dtype: Any = jnp.float32,
) -> dict[str, Array]:
  """Average sensitivity as(f) = E_x sum_i 1[f(x) != f(x^{+i})], x ~ U{±1}^n.

  as(f) = sum_i Inf_i(f) = sum_S |S| fhat(S)^2 (O'Donnell, "Analysis of
  Boolean Functions", 2014, §2.3). Exact when num_samples is None: one call
  of f on all 2^n inputs, neighbours looked up by index XOR. Otherwise a
  Monte-Carlo mean over num_samples uniform x (one call of f on the
  num_samples * (n + 1) inputs x and x^{+i}).

  Args:
    f: inputs [M, n] of ±1 (dtype `dtype`) -> labels [M] (or [M, ...],
      compared elementwise).
    n: number of bits (static).
    key: PRNG key; required when num_samples is given.
    num_samples: None for exact enumeration (n <= 20), else M.
    normalize: divide mean and stderr by n (the mean influence, in [0, 1]);
      whether the paper normalises is not known.
    dtype: dtype of the ±1 inputs.

  Returns:
    dict: mean (as(f), or as(f) / n), stderr (0 when exact; sample std of
    s(f, x) / sqrt(M) otherwise), influence [n] (Pr_x[f(x) != f(x^{+i})],
    never normalised), count (inputs evaluated as x).
  """
  _check_positive_int("n", n)
  if num_samples is None:
    if n > MAX_EXACT_BOOLEAN_BITS:
      raise ValueError(
          f"Exact Boolean sensitivity enumerates 2^n inputs; n={n} > "
          f"{MAX_EXACT_BOOLEAN_BITS} is too large. Pass num_samples (and key) "
          f"for a Monte-Carlo estimate.")
    idx = jnp.arange(2**n, dtype=jnp.int32)
    shifts = jnp.arange(n - 1, -1, -1, dtype=jnp.int32)          # bit i: MSB
    bits = (idx[:, None] >> shifts[None, :]) & 1
    fx = f((1 - 2 * bits).astype(dtype))
    neighbours = idx[:, None] ^ (1 << shifts)[None, :]           # [2^n, n]
    diff = jax.vmap(lambda j: _differs(fx, fx[j]), in_axes=1, out_axes=1)(
        neighbours)                                              # [2^n, n]
    influence = diff.mean(0, dtype=jnp.float32)
    mean = influence.sum()
    stderr = jnp.zeros((), jnp.float32)
    count = 2**n
  else:
    _check_positive_int("num_samples", num_samples)
    if key is None:
      raise ValueError("boolean_sensitivity needs a key when num_samples is "
                       "given.")
    x = jax.random.rademacher(key, (num_samples, n), dtype=dtype)
    flip = 1 - 2 * jnp.eye(n, dtype=dtype)                       # [n, n]
    x_flip = (x[:, None, :] * flip[None]).reshape(num_samples * n, n)
    out = f(jnp.concatenate([x, x_flip], 0))
    fx, f_flip = out[:num_samples], out[num_samples:]
    f_flip = f_flip.reshape(num_samples, n, *f_flip.shape[1:])
    diff = jax.vmap(_differs, in_axes=(None, 1), out_axes=1)(fx, f_flip)
    s = diff.sum(-1, dtype=jnp.float32)                          # [M]
    influence = diff.mean(0, dtype=jnp.float32)
    mean = s.mean()
    ddof = 1 if num_samples > 1 else 0
    stderr = jnp.std(s, ddof=ddof) / math.sqrt(num_samples)
    count = num_samples
  scale = 1.0 / n if normalize else 1.0
  return dict(mean=mean * scale, stderr=stderr * scale, influence=influence,
              count=jnp.asarray(count, jnp.int32))


# ----------------------------------------------------------------------------
# Sweeps and planning.
# ----------------------------------------------------------------------------


def sigma_sweep(fn: Callable[..., Any], sigmas: Iterable[float], *,
                vectorize: bool = False, **kwargs) -> Any:
  """Evaluates fn(sigma=s, **kwargs) for each s and stacks the results.

  The same key (kwargs['key']) is reused for every sigma: common random
  numbers, so the curve is smooth in sigma and differences between sigmas
  carry less Monte-Carlo noise.

  Args:
    fn: an estimator of this module (or anything taking `sigma=`).
    sigmas: S noise scales.
    vectorize: False runs a Python loop (S forward passes in sequence, memory
      of one); True vmaps over a traced sigma array (one program, S times the
      memory; the model is then batched by vmap rather than reshaped).
    **kwargs: the other arguments of fn (functions and ints stay static).

  Returns:
    fn's output pytree with a leading [S] axis on every leaf.
  """
  if vectorize:
    return jax.vmap(lambda s: fn(sigma=s, **kwargs))(
        jnp.asarray(list(sigmas), jnp.float32))
  results = [fn(sigma=s, **kwargs) for s in sigmas]
  return jax.tree.map(lambda *xs: jnp.stack(xs), *results)


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
