"""Token-wise and global Gaussian sensitivity of text models, and the paper's aggregates.

"Transformers Learn Low Sensitivity Functions" (ICLR 2025, arXiv 2403.06925) §5. Noise goes
on the token embeddings right after the embedding LayerNorm (`embed` of
`xsens.models.text`), one position at a time, with R draws per position; every position
whose `measure_mask` is set is perturbed (the official code perturbs every position with
attention_mask = 1, specials included).

Calling convention: that of `xsens.measures.sensitivity`,

  measure(apply_fn, variables, inputs, *, labels=None, key=None, mask=None, token_mask,
          **options) -> dict[str, Array]

with inputs = the embeddings [B, T, D] and apply_fn = the model's from-embeddings method
bound with `method=`, which for text models also takes the padding mask:
apply_fn(variables, embeddings [B', T, D], token_mask [B', T] bool) -> logits [B', K],
e.g. `functools.partial(model.apply, method=model.encode)`. `token_mask` [B, T] (or [T]) is
that padding mask; `mask` [B] the example mask of a padded batch.

>>> import functools
>>> import jax
>>> from xsens import measures
>>> from xsens.models import get_model, text
>>> model = get_model("roberta", 2, (6,), vocab_size=32, max_length=6, width=16, depth=1,
...                   num_heads=2, mlp_dim=32)
>>> ids = jax.numpy.array([[1, 7, 9, 2, 0, 0], [1, 5, 6, 8, 3, 2]])   # 0: padding.
>>> variables = model.init(jax.random.key(0), ids)
>>> embeddings = model.apply(variables, ids, method=model.embed)      # [B, T, D]
>>> encode = functools.partial(model.apply, method=model.encode)
>>> out = measures.jit(measures.text_token_sensitivity)(
...     encode, variables, embeddings, key=jax.random.key(1),
...     token_mask=text.padding_mask(ids), sigma=0.5, num_draws=2)
>>> out["per_token"].shape
(2, 6)

The generic estimators of `xsens.measures.sensitivity` do not pass a mask to the model, so
these wrappers run them under `jax.vmap` over examples, each example binding its own mask;
the estimator, its noise scheme and its chunking are reused unchanged. Example b draws its
noise from fold_in(key, example_ids[b]) (then the (token, draw) scheme of
`token_sensitivity`), so results do not depend on how a set is cut into batches.

Aggregates, from per-token flip probabilities p[b, t] over measured tokens:
  (a) pooled = sum_{b,t} p / sum_b n_b   (the code's `mean_sensitivity`; long sentences
      weigh more);
  (b) sentence_mean = mean_b (sum_t p[b, t] / n_b);
  (c) curve[k] = mean over sentences of p[b, end_b - k], k = 0 the last real token
      (right-aligned to the sequence end, as the paper's per-position plots).
All functions are pure and jittable; nothing is jitted internally.
"""

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from xsens.measures import perturbed
from xsens.measures import planning
from xsens.measures import sensitivity as sens
from xsens.measures import sensitivity_stats

Array = jax.Array
TextApplyFn = Callable[[Any, Array, Array], Array]


def _example_keys(key: Array, example_ids: Optional[Array], batch: int) -> Array:
  ids = jnp.arange(batch, dtype=jnp.int32) if example_ids is None else example_ids
  return perturbed.example_keys(key, ids)


def last_index(mask: Array) -> Array:
  """mask [B, T] bool -> [B] int32 index of the last True (0 if none)."""
  positions = jnp.arange(mask.shape[-1], dtype=jnp.int32)
  return jnp.max(jnp.where(mask, positions, 0), axis=-1)


def text_token_sensitivity(
    apply_fn: TextApplyFn,
    variables: Any,
    inputs: Array,
    *,
    labels: Optional[Array] = None,
    key: Optional[Array] = None,
    mask: Optional[Array] = None,
    token_mask: Array,
    sigma: Any,
    num_draws: int,
    measure_mask: Optional[Array] = None,
    example_ids: Optional[Array] = None,
    chunk_size: planning.ChunkSize = planning.AUTO,
    memory_budget_bytes: int = planning.DEFAULT_MEMORY_BUDGET_BYTES,
) -> dict[str, Array]:
  """Per-token label-flip probabilities of a text model (one position noised at a time).

  Args:
    apply_fn: (variables, embeddings [B', T, D], token_mask [B', T] bool) -> logits
      [B', K], any B'.
    variables: the model's variables.
    inputs: [B, T, D], the output of the model's `embed`.
    labels: [B] int reference labels; default the clean argmax (per example).
    key: PRNG key.
    mask: [B] example mask (bool or weights) for padded batches.
    token_mask: [B, T] or [T] bool padding mask given to the model (True on real tokens).
    sigma: noise standard deviation.
    num_draws: R draws per position.
    measure_mask: [B, T] bool, positions to perturb and count; default token_mask.
    example_ids: [B] int, the examples' indices in the measured set (noise keys);
      default 0..B-1.
    chunk_size: (position, draw) pairs per forward call: 'auto' or 'tune'
      (`xsens.measures.planning`, for the whole vmapped batch: a forward call sees
      B * chunk_size inputs), None (all T * R) or an int.
    memory_budget_bytes: as in `xsens.measures.planning.plan_chunks`.

  Returns:
    `token_sensitivity`'s dict over measure_mask: per_token [B, T] float32 flip
    frequency over the R draws (0 where not measured), per_example [B], mean, stderr,
    stderr_noise, flips, count, plan (the sizes used).
  """
  planning.check_positive_int("num_draws", num_draws)
  perturbed.check_sigma(sigma)
  b, t, _ = inputs.shape
  chunk_size, plan = _plan("text_token_sensitivity", apply_fn, variables, inputs,
                           token_mask, t * num_draws, chunk_size, memory_budget_bytes)

  def flips(fn, tok, lab, meas, k):
    del meas
    return sens.token_flips(fn, tok, k, lab, sigma=sigma, num_draws=num_draws,
                            chunk_size=chunk_size, example_chunk_size=None)

  flips_bp, measure_mask = _per_example(flips, apply_fn, variables, inputs, labels, key,
                                        token_mask, measure_mask, example_ids)
  counts = flips_bp.reshape(b, t, num_draws).sum(-1, dtype=jnp.int32)
  out = sensitivity_stats.summarize(counts, measure_mask, num_draws, mask)
  out["per_token"] = out.pop("per_unit")
  out["plan"] = plan
  return out


def text_global_sensitivity(
    apply_fn: TextApplyFn,
    variables: Any,
    inputs: Array,
    *,
    labels: Optional[Array] = None,
    key: Optional[Array] = None,
    mask: Optional[Array] = None,
    token_mask: Array,
    sigma: Any,
    num_draws: int,
    measure_mask: Optional[Array] = None,
    example_ids: Optional[Array] = None,
    chunk_size: planning.ChunkSize = planning.AUTO,
    memory_budget_bytes: int = planning.DEFAULT_MEMORY_BUDGET_BYTES,
) -> dict[str, Array]:
  """Per-example flip frequency with noise on every measured token at once (App. A.2).

  Args: as `text_token_sensitivity` (noise N(0, sigma^2 I) on all measure_mask tokens;
    chunk_size counts draws, None = all R).

  Returns:
    `global_sensitivity`'s dict: per_example [B] float32 in [0, 1] (flips over the R
    draws / R), mean, stderr, stderr_noise, flips, count, plan (the sizes used).
  """
  planning.check_positive_int("num_draws", num_draws)
  perturbed.check_sigma(sigma)
  b, t, _ = inputs.shape
  chunk_size, plan = _plan("text_global_sensitivity", apply_fn, variables, inputs,
                           token_mask, num_draws, chunk_size, memory_budget_bytes)

  def flips(fn, tok, lab, meas, k):
    return sens.global_flips(fn, tok, k, lab, meas, sigma=sigma, num_draws=num_draws,
                             chunk_size=chunk_size, example_chunk_size=None)

  flips_br, measure_mask = _per_example(flips, apply_fn, variables, inputs, labels, key,
                                        token_mask, measure_mask, example_ids)
  out = sensitivity_stats.draw_result(flips_br, jnp.any(measure_mask, -1, keepdims=True),
                                      num_draws, mask)
  out["plan"] = plan
  return out


def _plan(name: str, apply_fn: TextApplyFn, variables: Any, inputs: Array,
          token_mask: Array, num_items: int, chunk_size: planning.ChunkSize,
          memory_budget_bytes: int) -> tuple[Optional[int], dict[str, int]]:
  """(chunk_size, plan entry) for the vmapped batch: B examples times chunk_size
  copies per forward call (`planning.resolve` with the whole batch in one block)."""
  b, t, _ = inputs.shape
  mask = jnp.broadcast_to(jnp.asarray(token_mask).astype(bool), (b, t))
  c, _, plan = planning.resolve(name, apply_fn, variables, (inputs, mask), num_items,
                                chunk_size, None, memory_budget_bytes, vmapped_batch=b)
  return c, plan


def _per_example(flips_fn, apply_fn: TextApplyFn, variables: Any, inputs: Array,
                 labels: Optional[Array], key: Optional[Array], token_mask: Array,
                 measure_mask: Optional[Array], example_ids: Optional[Array]):
  """Runs flips_fn(fn, tokens [1, T, D], labels [1] | None, measure_mask [1, T], key) on
  each example alone (vmapped), fn binding the example's padding mask; returns (the
  stacked flips [B, ...], measure_mask [B, T])."""
  if key is None:
    raise ValueError("text sensitivity draws random noise and needs key= (a PRNG key).")
  b, t, _ = inputs.shape
  token_mask = jnp.broadcast_to(jnp.asarray(token_mask).astype(bool), (b, t))
  measure_mask = token_mask if measure_mask is None else jnp.broadcast_to(
      jnp.asarray(measure_mask).astype(bool), (b, t))

  def one(tok, m, meas, lab, k):
    fn = lambda x: apply_fn(variables, x, jnp.broadcast_to(m, x.shape[:2]))
    return flips_fn(fn, tok[None], None if lab is None else lab[None], meas[None], k)[0]

  keys = _example_keys(key, example_ids, b)
  if labels is None:
    flips = jax.vmap(lambda tok, m, meas, k: one(tok, m, meas, None, k))(
        inputs, token_mask, measure_mask, keys)
  else:
    flips = jax.vmap(one)(inputs, token_mask, measure_mask, jnp.asarray(labels), keys)
  return flips, measure_mask


def text_aggregates(per_token: Array, measure_mask: Array, end_index: Array) -> dict:
  """The three aggregates (module docstring) with standard errors over sentences.

  Args:
    per_token: [N, T] flip probabilities.
    measure_mask: [N, T] bool, measured positions.
    end_index: [N] int, index of each sequence's last real token (the alignment point).

  Returns:
    dict: pooled, pooled_se (ratio estimator over sentences), sentence_mean,
    sentence_mean_se (std of per-sentence means / sqrt(N)), per_example [N] (NaN for
    a sentence with no measured token), curve [T] (curve[k]: mean p at k positions before
    the end; NaN where no sentence has a measured token there), curve_se [T], curve_count
    [T] int32.
  """
  n, t = per_token.shape
  m = measure_mask.astype(jnp.float32)
  p = per_token.astype(jnp.float32) * m
  n_b = m.sum(-1)
  flips_b = p.sum(-1)
  total = n_b.sum()
  pooled = flips_b.sum() / jnp.maximum(total, 1.0)
  valid = n_b > 0
  num_valid = valid.sum().astype(jnp.float32)
  per_example = jnp.where(valid, flips_b / jnp.maximum(n_b, 1.0), jnp.nan)
  sentence_mean = jnp.nansum(per_example) / jnp.maximum(num_valid, 1.0)
  dev = jnp.where(valid, per_example - sentence_mean, 0.0)
  sentence_mean_se = jnp.sqrt(jnp.sum(dev**2) / jnp.maximum(num_valid - 1.0, 1.0)
                              / jnp.maximum(num_valid, 1.0))
  resid = jnp.where(valid, flips_b - pooled * n_b, 0.0)
  pooled_se = jnp.sqrt(num_valid / jnp.maximum(num_valid - 1.0, 1.0)
                       * jnp.sum(resid**2)) / jnp.maximum(total, 1.0)

  back = end_index[:, None] - jnp.arange(t)[None, :]                      # [N, T]
  onehot = ((back[..., None] == jnp.arange(t)) & measure_mask[..., None]).astype(
      jnp.float32)                                                        # [N, T, K=T]
  count = onehot.sum((0, 1))
  curve_sum = jnp.einsum("nt,ntk->k", p, onehot)
  curve = jnp.where(count > 0, curve_sum / jnp.maximum(count, 1.0), jnp.nan)
  sq = jnp.einsum("nt,ntk->k", p**2, onehot)
  var = jnp.where(count > 1, (sq - count * jnp.nan_to_num(curve)**2)
                  / jnp.maximum(count - 1.0, 1.0), jnp.nan)
  curve_se = jnp.sqrt(jnp.maximum(var, 0.0) / jnp.maximum(count, 1.0))
  return dict(pooled=pooled, pooled_se=pooled_se, sentence_mean=sentence_mean,
              sentence_mean_se=sentence_mean_se, per_example=per_example, curve=curve,
              curve_se=curve_se, curve_count=count.astype(jnp.int32))


def early_late(per_token: Array, measure_mask: Array) -> tuple[Array, Array]:
  """Pooled sensitivity of the first and the last half of each sentence's measured tokens.

  Sentence b with n_b measured tokens contributes its first floor(n_b / 2) to `early` and
  its last floor(n_b / 2) to `late` (the middle token of an odd n_b to neither), so the
  split is relative to each sentence's length. Our summary of the per-position curve:
  late / early > 1 means more sensitive to recent tokens (the paper's LSTM finding).

  Args:
    per_token: [N, T]; measure_mask: [N, T] bool.

  Returns:
    (early, late) pooled flip probabilities.
  """
  m = measure_mask.astype(jnp.int32)
  rank = jnp.cumsum(m, axis=-1) - 1
  n = m.sum(-1, keepdims=True)
  half = n // 2
  early = measure_mask & (rank < half)
  late = measure_mask & (rank >= n - half)
  p = per_token.astype(jnp.float32)
  mean = lambda sel: jnp.sum(p * sel) / jnp.maximum(jnp.sum(sel), 1)
  return mean(early), mean(late)
