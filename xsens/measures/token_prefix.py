"""Reuse of a model's per-token first-layer work by the token-wise estimator.

A token-wise perturbation changes one token of each copy. What a model computes per token
before its first token-mixing operation (attention) depends on that token alone, so for
the other T - 1 tokens it equals the clean pass. A model exposes this as a `TokenSplit`:

  prefix(variables, tokens [N, D], positions [N] int32) -> features [N, F]
      row n depends only on tokens[n] and its token index positions[n];
  rest(variables, features [B', T, F]) -> logits [B', K]
      with rest(v, prefix(v, all tokens)) == apply_fn(v, inputs) to float rounding.

`token_sensitivity` then computes the clean features once, the prefix of only the
perturbed row of each copy, and `rest` on the clean features with that row replaced
(`perturbed_logits_fn`), chunked like the plain path (copies [B, c, ...] batch-major,
strided example blocks) and with the same noise, so its results equal the plain path's.

Where a split comes from (`find_split`), in the measures' calling convention:
- an `apply_fn` with a `token_split(patch_size, input_shape)` attribute (e.g. `SplitApply`);
- `functools.partial(model.apply, train=False)` (`TrainResult.apply_fn`, what the studies
  pass) or `model.apply` of a module with a `token_split` method: the ViT (patch tokenizer,
  measured at its own patch size: patch embedding, position embedding, the first block's
  LayerNorm and Q/K/V), `OneLayerAttention` (W_Q, W_K, W_V) and `OneLayerViT` (x W_Q,
  x W_K, x W_V w_O).
`patch_size` is the measure's (None for tokens) and `input_shape` the per-example shape of
its inputs; a model returns None where no split holds (other patch sizes, SPT tokens).

Default (`token_split="auto"`): use the split where the model has one and its
`prefix_share` (the share of the forward's matmul work per perturbed copy that reuse
saves, estimated from the model's shapes) is at least `MIN_PREFIX_SHARE`; "always" uses
any split the model has, None the plain path, and a `TokenSplit` is used as given. The
gain grows with the share (experiments/bench_token_prefix.py): one-layer models and
one-block ViTs gain most; in a deep ViT the first layer's per-token work is a few percent
of the forward and "auto" keeps the plain path.

Memory: reuse holds the clean features [B, T, F] and, per forward call, the copies'
features [e * c, T, F] where the plain path holds their inputs [e * c, T, D] (F = 4 *
width for the ViT); the chunk planner's estimate does not count the difference.
"""

import dataclasses
import functools
from typing import Any, Callable, Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from xsens.models.token_split import TokenSplit

Array = jax.Array

AUTO = "auto"
ALWAYS = "always"
# Smallest `prefix_share` at which "auto" reuses the prefix: below it the gain measured on
# CPU is within run-to-run noise (experiments/bench_token_prefix.py).
MIN_PREFIX_SHARE = 0.1


SplitOption = Union[str, None, TokenSplit]


@dataclasses.dataclass(frozen=True)
class SplitApply:
  """apply_fn(variables, inputs) -> logits that carries a token split.

  apply_fn: the model's apply in the measures' convention.
  split_fn: (patch_size, input_shape) -> TokenSplit or None.
  """
  apply_fn: Callable[[Any, Array], Array]
  split_fn: Callable[[Optional[int], tuple[int, ...]], Optional[TokenSplit]]

  def __call__(self, variables: Any, inputs: Array) -> Array:
    return self.apply_fn(variables, inputs)

  def token_split(self, patch_size: Optional[int],
                  input_shape: Sequence[int]) -> Optional[TokenSplit]:
    return self.split_fn(patch_size, tuple(input_shape))


def with_output(apply_fn: Callable[[Any, Array], Array],
                out_fn: Callable[[Array], Array]) -> SplitApply:
  """out_fn(apply_fn(variables, inputs)), carrying apply_fn's split with out_fn after
  its rest; e.g. a score f [B] -> logits [B, 2] = stack([-f, f], -1). Build it once per
  model: it is a static argument under jit, compared by identity."""

  def split_fn(patch_size, input_shape):
    split = find_split(apply_fn, patch_size, input_shape)
    if split is None:
      return None
    return split._replace(rest=lambda v, f: out_fn(split.rest(v, f)))

  return SplitApply(lambda v, x: out_fn(apply_fn(v, x)), split_fn)


def _module_of(apply_fn: Any) -> Optional[nn.Module]:
  """The module of `model.apply` or `functools.partial(model.apply, train=False)`."""
  fn = apply_fn
  if isinstance(fn, functools.partial):
    if fn.args or set(fn.keywords) - {"train"} or fn.keywords.get("train", False):
      return None
    fn = fn.func
  owner = getattr(fn, "__self__", None)
  if isinstance(owner, nn.Module) and getattr(fn, "__name__", None) == "apply":
    return owner
  return None


def find_split(apply_fn: Any, patch_size: Optional[int],
               input_shape: Sequence[int]) -> Optional[TokenSplit]:
  """The split apply_fn exposes for tokens of `patch_size`, or None.

  Args:
    apply_fn: the measure's apply_fn (module docstring for what is recognised).
    patch_size: the measure's patch size; None when the inputs are tokens.
    input_shape: per-example shape of the inputs, (H, W, C) or (T, D).
  """
  method = getattr(apply_fn, "token_split", None)
  if method is None:
    method = getattr(_module_of(apply_fn), "token_split", None)
  return None if method is None else method(patch_size, tuple(input_shape))


def resolve(token_split: SplitOption, apply_fn: Any, patch_size: Optional[int],
            input_shape: Sequence[int]) -> Optional[TokenSplit]:
  """The split the estimator uses under option `token_split` (module docstring)."""
  if token_split is None:
    return None
  if isinstance(token_split, TokenSplit):
    return token_split
  if token_split not in (AUTO, ALWAYS):
    raise ValueError(f"token_split must be 'auto', 'always', None or a TokenSplit, got "
                     f"{token_split!r}.")
  split = find_split(apply_fn, patch_size, input_shape)
  if split is None or (token_split == AUTO and split.prefix_share < MIN_PREFIX_SHARE):
    return None
  return split


def _in_blocks(call: Callable[..., Array], args: tuple[Array, ...],
               example_chunk_size: Optional[int]) -> Array:
  """call(*args) on the whole batch or in strided example blocks under `lax.map`.

  Args:
    call: per-example arrays [b', ...] -> [b', ...].
    args: arrays [B, ...].
    example_chunk_size: examples per call; None = all. Block j holds examples
      i * n + j (the last example repeated to pad), as the plain path's copies.
  """
  b = args[0].shape[0]
  if example_chunk_size is None or example_chunk_size >= b:
    return call(*args)
  num_blocks = -(-b // example_chunk_size)
  block = -(-b // num_blocks)
  pad = num_blocks * block - b

  def split(a):
    if pad:
      a = jnp.concatenate([a, jnp.broadcast_to(a[-1:], (pad, *a.shape[1:]))], 0)
    return jnp.moveaxis(a.reshape(block, num_blocks, *a.shape[1:]), 1, 0)

  out = jax.lax.map(lambda xs: call(*xs), tuple(split(a) for a in args))
  out = jnp.moveaxis(out, 0, 1)                    # [block, n, ...]
  return out.reshape(num_blocks * block, *out.shape[2:])[:b]


def clean_features(split: TokenSplit, variables: Any, tokens: Array) -> Array:
  """prefix of every token: tokens [B, T, D] -> features [B, T, F]."""
  b, t, d = tokens.shape
  positions = jnp.tile(jnp.arange(t, dtype=jnp.int32), b)
  feats = split.prefix(variables, tokens.reshape(b * t, d), positions)
  return feats.reshape(b, t, feats.shape[-1])


def perturbed_logits_fn(split: TokenSplit, variables: Any, tokens: Array,
                        example_chunk_size: Optional[int]
                        ) -> Callable[[Array, Array], Array]:
  """The logits of one-token perturbed copies, reusing the clean features.

  Args:
    split: the model's split.
    variables: the model's variables.
    tokens: clean tokens [B, T, D].
    example_chunk_size: examples per call of `rest` (None: all B).

  Returns:
    fn(token_ids [c] int, scaled [B, c, D]) -> logits [B, c, K] of the copies with
    token token_ids[j] <- token + scaled[:, j]; the clean features are computed once.
  """
  b, t, d = tokens.shape
  clean = clean_features(split, variables, tokens)                # [B, T, F]
  positions = jnp.arange(t, dtype=jnp.int32)

  def fn(token_ids: Array, scaled: Array) -> Array:
    c = token_ids.shape[0]
    rows = jnp.take(tokens, token_ids, axis=1) + scaled           # [B, c, D]
    onehot = (token_ids[:, None] == positions[None])[None, :, :, None]

    def call(rows_b, clean_b):                     # [b', c, D], [b', T, F]
      n = rows_b.shape[0]
      new = split.prefix(variables, rows_b.reshape(n * c, d), jnp.tile(token_ids, n))
      new = new.reshape(n, c, 1, new.shape[-1])
      feats = jnp.where(onehot, new, clean_b[:, None])             # [b', c, T, F]
      out = split.rest(variables, feats.reshape(n * c, t, feats.shape[-1]))
      return out.reshape(n, c, *out.shape[1:])

    return _in_blocks(call, (rows, clean), example_chunk_size)

  return fn
