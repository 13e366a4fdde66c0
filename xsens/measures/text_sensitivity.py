"""Token-wise and global Gaussian sensitivity of text models, and the paper's aggregates.

"Transformers Learn Low Sensitivity Functions" (ICLR 2025, arXiv 2403.06925) §5; spec
/work/shared/specs/sensitivity.md §2.3. Noise goes on the token embeddings right after the
embedding LayerNorm (`embed` of `xsens.models.text`), one position at a time, with R draws
per position; every position whose `measure_mask` is set is perturbed (the official code
perturbs every position with attention_mask = 1, specials included).

Text models need the padding mask in their forward pass (`encode(tokens, mask)`), which
the generic estimators of `xsens.measures.sensitivity` do not carry. These wrappers run
them under `jax.vmap` over examples, each example closing over its own mask, so the
estimator, its noise scheme and its chunking are reused unchanged. Example b draws its
noise from fold_in(key, example_ids[b]) (then the (token, draw) scheme of
`token_sensitivity`), so results do not depend on how a set is cut into batches.

Aggregates (spec §2.3), from per-token flip probabilities p[b, t] over measured tokens:
  (a) pooled = sum_{b,t} p / sum_b n_b   (the code's `mean_sensitivity`; long sentences
      weigh more);
  (b) sentence_mean = mean_b (sum_t p[b, t] / n_b);
  (c) curve[k] = mean over sentences of p[b, end_b - k], k = 0 the last real token
      (right-aligned to the sequence end, as the paper's per-position plots).
All functions are pure and jittable.
"""

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from xsens.measures import sensitivity as sens

Array = jax.Array
EncodeFn = Callable[[Array, Array], Array]


def _example_keys(key: Array, example_ids: Optional[Array], batch: int) -> Array:
  ids = jnp.arange(batch, dtype=jnp.int32) if example_ids is None else example_ids
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(ids)


def last_index(mask: Array) -> Array:
  """mask [B, T] bool -> [B] int32 index of the last True (0 if none)."""
  positions = jnp.arange(mask.shape[-1], dtype=jnp.int32)
  return jnp.max(jnp.where(mask, positions, 0), axis=-1)


def masked_token_sensitivity(
    encode: EncodeFn,
    tokens: Array,
    mask: Array,
    key: Array,
    *,
    sigma: Any,
    num_draws: int,
    measure_mask: Optional[Array] = None,
    example_ids: Optional[Array] = None,
    chunk_size: Optional[int] = None,
) -> Array:
  """Per-token label-flip probabilities of a text model (one position noised at a time).

  Args:
    encode: (tokens [B', T, D], mask [B', T] bool) -> logits [B', K], any B'.
    tokens: [B, T, D], the output of the model's `embed`.
    mask: [B, T] bool attention mask (True on real tokens).
    key: PRNG key.
    sigma: noise standard deviation.
    num_draws: R draws per position.
    measure_mask: [B, T] bool, positions to perturb and count; default `mask`.
    example_ids: [B] int, the examples' indices in the measured set (noise keys);
      default 0..B-1.
    chunk_size: (position, draw) pairs per forward call; None = all T * R.

  Returns:
    per_token [B, T] float32: flip frequency over the R draws, 0 where not measured.
    The reference label is the clean argmax.
  """
  return _per_example(sens.token_sensitivity, "per_token", encode, tokens, mask, key,
                      measure_mask, example_ids, sigma=sigma, num_draws=num_draws,
                      chunk_size=chunk_size)


def masked_global_sensitivity(
    encode: EncodeFn,
    tokens: Array,
    mask: Array,
    key: Array,
    *,
    sigma: Any,
    num_draws: int,
    measure_mask: Optional[Array] = None,
    example_ids: Optional[Array] = None,
) -> Array:
  """Per-example flip frequency with noise on every measured token at once (App. A.2).

  Args: as `masked_token_sensitivity` (noise N(0, sigma^2 I) on all measure_mask tokens).

  Returns:
    per_example [B] float32 in [0, 1]: flips over the R draws / R.
  """
  return _per_example(sens.global_sensitivity, "per_example", encode, tokens, mask, key,
                      measure_mask, example_ids, sigma=sigma, num_draws=num_draws)


def _per_example(measure, output: str, encode: EncodeFn, tokens: Array, mask: Array,
                 key: Array, measure_mask: Optional[Array], example_ids: Optional[Array],
                 **kwargs) -> Array:
  """Runs a `xsens.measures.sensitivity` estimator on each example alone (vmapped), so each
  closes over its own padding mask; returns `measure(...)[output][0]` stacked over B."""
  b = tokens.shape[0]
  measure_mask = mask if measure_mask is None else measure_mask

  def one(tok, m, meas, k):
    from_tokens = lambda t: encode(t, jnp.broadcast_to(m, t.shape[:2]))
    return measure(from_tokens, tok[None], k, token_mask=meas[None], **kwargs)[output][0]

  return jax.vmap(one)(tokens, mask, measure_mask, _example_keys(key, example_ids, b))


def text_aggregates(per_token: Array, measure_mask: Array, end_index: Array) -> dict:
  """The three aggregates of spec §2.3 with standard errors over sentences.

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
