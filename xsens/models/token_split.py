"""A model's forward split at its first token mixing, for the token-wise estimator.

A model that offers the split has a method `token_split(patch_size, input_shape) ->
TokenSplit | None` (`patch_size`: the measure's patch size, None for token inputs;
`input_shape`: the per-example input shape), used by `xsens.measures.token_prefix`.
`rest` reruns the model's own `__call__` with the prefix's submodules replaced by the
precomputed features (`intercept`), so every option of the model applies unchanged and
the parameter tree is the model's.
"""

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


class TokenSplit(NamedTuple):
  """A model split at its first token mixing.

  prefix: (variables, tokens [N, D], positions [N] int32) -> features [N, F]; row n
    depends only on tokens[n] and its token index positions[n].
  rest: (variables, features [B', T, F]) -> logits [B', K]; rest(v, prefix of every
    token) equals the model's apply to float rounding.
  prefix_share: the share in [0, 1] of one perturbed copy's forward matmul work that
    the prefix of its T - 1 unperturbed tokens accounts for (what reuse saves).
  """
  prefix: Callable[[Any, Array, Array], Array]
  rest: Callable[[Any, Array], Array]
  prefix_share: float


def share(per_token_prefix: float, num_tokens: int, total: float) -> float:
  """(T - 1) * per-token prefix work / one forward's total work, clipped to [0, 1]."""
  return float(min(1.0, max(0.0, (num_tokens - 1) * per_token_prefix / max(total, 1.0))))


def intercept(replacements: dict[tuple[str, ...], Callable[..., Array]]):
  """Context manager: the `__call__` of the submodule at path p (e.g. ("embedding",))
  runs replacements[p](next_fun, *args) instead."""

  def interceptor(next_fun, args, kwargs, context):
    if context.method_name == "__call__":
      replace = replacements.get(tuple(context.module.path))
      if replace is not None:
        return replace(next_fun, *args)
    return next_fun(*args, **kwargs)

  return nn.intercept_methods(interceptor)


def rows_then(head_rows: int, tail: Array) -> Callable[..., Array]:
  """A replacement for `intercept`: the submodule on the first head_rows rows of its
  input (axis 1; e.g. a CLS token), followed by the precomputed rows tail [B', T, ...]."""

  def replace(next_fun, x, *rest):
    if not head_rows:
      return tail
    head = next_fun(x[:, :head_rows], *rest)
    return jnp.concatenate([head, tail.astype(head.dtype)], axis=1)

  return replace
