"""Reference `token_sensitivity`: a Python loop of jitted batch forwards, one per pair.

For tests and benchmarks: the keys and the result of
`xsens.measures.sensitivity.token_sensitivity`, computed one (token, draw) pair at a time.
"""

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from xsens.measures import perturbed
from xsens.measures import planning
from xsens.measures import sensitivity_stats
from xsens.measures import token_prefix
from xsens.measures import tokens as tokens_lib
from xsens.measures.planning import AUTO, DEFAULT_MEMORY_BUDGET_BYTES, ChunkSize

Array = jax.Array
ApplyFn = Callable[[Any, Array], Array]


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
  perturbed.check_key(key, "token_sensitivity_loop")
  planning.check_positive_int("num_draws", num_draws)
  perturbed.check_sigma(sigma)
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
  noise_key = perturbed.example_keys(key, example_ids)
  flips = [pair_fn(variables, tokens, noise_key, y, sigma,
                   jnp.int32(tok * num_draws + r))
           for tok in range(t) for r in range(num_draws)]
  out = sensitivity_stats.token_result(jnp.stack(flips, axis=1),
                                       perturbed.unit_mask(token_mask, b, t), num_draws, mask)
  return perturbed.with_patch_map(out, inputs, patch_size)


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
  dtype = perturbed.noise_dtype(x)
  noise = perturbed.pair_noise(key, q[None], (b, d), dtype)[0]
  scaled = (sigma * noise).astype(dtype)
  onehot = jax.nn.one_hot(q // num_draws, t, dtype=dtype)
  logits = _loop_logits(apply_fn, patch_size, image_shape, variables,
                        x + onehot[None, :, None] * scaled[:, None, :])
  return jnp.argmax(logits, axis=-1) != y
