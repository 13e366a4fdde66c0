"""Perturbed copies of a batch and their forward calls: the parts of the sensitivity estimators.

The noise scheme and the chunking are those of `xsens.measures.sensitivity` (module docstring):
pair q draws `normal(fold_in(key, q), [B, ...])`, or per example
`normal(fold_in(fold_in(key, example_ids[b]), q), [...])`; c perturbed copies [B, c, ...] are
merged batch-major into one forward call on [B * c, ...]; chunks of ids run in sequence under
`lax.map`.
"""

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from xsens.measures import tokens as tokens_lib

Array = jax.Array
ApplyFn = Callable[[Any, Array], Array]


def check_sigma(sigma: Any) -> None:
  """Rejects a sigma that is not a scalar, and a negative one when it is concrete."""
  shape = jnp.shape(sigma)
  if shape:
    raise ValueError(
        f"sigma must be a scalar, got shape {tuple(shape)}: for several sigmas use "
        f"sigma_sweep or jax.vmap over sigma.")
  if isinstance(sigma, (int, float, np.number)) and sigma < 0:
    raise ValueError(f"sigma is a standard deviation and must be >= 0, got "
                     f"{sigma}.")


def check_key(key: Optional[Array], name: str) -> None:
  if key is None:
    raise ValueError(f"{name} draws random noise and needs key= (a PRNG key).")


def bind(apply_fn: ApplyFn, variables: Any) -> Callable[[Array], Array]:
  return lambda x: apply_fn(variables, x)


def noise_dtype(x: Array) -> Any:
  return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


def unit_mask(token_mask: Optional[Array], batch: int, units: int) -> Array:
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


def pair_noise(key: Array, ids: Array, shape: tuple[int, ...],
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


def map_chunks(fn: Callable[[Array], Array], num_items: int,
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


def forward_copies(fn: Callable[[Array], Array], copies: Array,
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


def token_delta(noise: Array, token_ids: Array, num_tokens: int,
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


def clean_labels(fn: Callable[[Array], Array], x: Array,
                 labels: Optional[Array],
                 example_chunk_size: Optional[int] = None) -> Array:
  if labels is not None:
    return jnp.asarray(labels)
  return jnp.argmax(forward_copies(fn, x[:, None], example_chunk_size)[:, 0],
                    axis=-1)


def with_patch_map(out: dict[str, Array], inputs: Array,
                   patch_size: Optional[int]) -> dict[str, Array]:
  if patch_size is not None:
    grid = tokens_lib.patch_grid(inputs.shape, patch_size)
    out["per_patch_map"] = out["per_token"].reshape(inputs.shape[0], *grid)
  return out
