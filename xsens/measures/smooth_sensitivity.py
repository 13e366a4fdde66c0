"""Smooth token-wise sensitivity E ||g(X^(t,eps)) - g(X)||, differentiable.

The noise, chunking and arguments of `xsens.measures.sensitivity.token_sensitivity`; the
flip indicator is replaced by a distance between the outputs, so gradients flow to the inputs
and the variables.
"""

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from xsens.measures import perturbed
from xsens.measures import planning
from xsens.measures import tokens as tokens_lib
from xsens.measures.planning import AUTO, DEFAULT_MEMORY_BUDGET_BYTES, ChunkSize

Array = jax.Array
ApplyFn = Callable[[Any, Array], Array]


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
  perturbed.check_key(key, "smooth_token_sensitivity")
  planning.check_positive_int("num_draws", num_draws)
  perturbed.check_sigma(sigma)
  token_fn, tokens = tokens_lib.token_view(apply_fn, inputs, patch_size)
  b, t, d = tokens.shape
  dtype = perturbed.noise_dtype(tokens)
  num_pairs = t * num_draws
  chunk_size, example_chunk_size, plan = planning.resolve(
      "smooth_token_sensitivity", token_fn, variables, (tokens,), num_pairs,
      chunk_size, example_chunk_size, memory_budget_bytes)

  def g(x):
    out = token_fn(variables, x)
    return jax.nn.softmax(out, -1) if on == "probs" else out

  clean = perturbed.forward_copies(g, tokens[:, None],
                                   example_chunk_size)[:, 0]              # [B, K]

  noise_key = perturbed.example_keys(key, example_ids)

  def chunk_dist(ids):                             # ids [c] -> dist [B, c]
    noise = jnp.swapaxes(perturbed.pair_noise(noise_key, ids, (b, d), dtype), 0, 1)
    delta = perturbed.token_delta(noise, ids // num_draws, t, sigma, dtype)
    out = perturbed.forward_copies(g, tokens[:, None] + delta,
                                   example_chunk_size)                    # [B, c, K]
    return _output_distance(out - clean[:, None], norm)

  if chunk_size is not None and chunk_size < num_pairs:
    chunk_dist = jax.checkpoint(chunk_dist)
  dist = perturbed.map_chunks(chunk_dist, num_pairs, chunk_size)
  per_token = dist.reshape(b, t, num_draws).mean(-1)             # [B, T]

  m = perturbed.unit_mask(token_mask, b, t).astype(per_token.dtype)
  n_units = m.sum(-1)
  per_example = jnp.sum(per_token * m, -1) / jnp.maximum(n_units, 1.0)
  w = jnp.ones_like(per_example) if mask is None else (
      jnp.asarray(mask).astype(per_example.dtype))
  w = w * (n_units > 0)
  mean = jnp.sum(w * per_example) / jnp.maximum(jnp.sum(w), 1e-12)
  out = dict(per_token=per_token * m, per_example=per_example, mean=mean,
             plan=plan)
  return perturbed.with_patch_map(out, inputs, patch_size)
