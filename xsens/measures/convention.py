"""Which arguments of the measures are static under `jax.jit`, and a jit that knows them.

Every measure takes `apply_fn` first (static: hashable and stable, e.g.
`TrainResult.apply_fn`), arrays that may be traced (variables, inputs, labels, key, mask,
sigma, epsilon, ...) and sizes or names that fix the program's shapes and branches, which
must be static. `STATIC_ARGNAMES` lists the latter for every measure of `xsens.measures`;
`static_argnames(measure)` is the part of it that one measure takes (`jax.jit` refuses
names a function does not take); `jit(measure)` is
`jax.jit(measure, static_argnums=0, static_argnames=static_argnames(measure))`, which
compiles once per (apply_fn, shapes, static values) and takes new variables, inputs, keys
and sigmas without recompiling. Options passed as dicts (`attack_options`, `pgd_options`,
`solver_options`) are not hashable: bind them with `functools.partial` before jitting.

>>> import jax
>>> from xsens import measures
>>> apply_fn = lambda w, x: x.reshape(x.shape[0], -1) @ w   # [B, 4, 4, 1] -> [B, 3]
>>> w = jax.random.normal(jax.random.key(0), (16, 3))
>>> x = jax.random.normal(jax.random.key(1), (2, 4, 4, 1))
>>> measures.static_argnames(measures.token_sensitivity)[:3]   # Sizes, then plan options.
('num_draws', 'patch_size', 'chunk_size')
>>> by_hand = jax.jit(measures.token_sensitivity, static_argnums=0,
...                   static_argnames=measures.static_argnames(measures.token_sensitivity))
>>> kw = dict(key=jax.random.key(2), sigma=0.5, num_draws=2, patch_size=2)
>>> a = by_hand(apply_fn, w, x, **kw)["per_token"]
>>> b = measures.jit(measures.token_sensitivity)(apply_fn, w, x, **kw)["per_token"]
>>> a.shape, bool((a == b).all())
((2, 4), True)
"""

import inspect
from typing import Any, Callable

import jax

STATIC_ARGNAMES = (
    # Sensitivity estimators and sweeps.
    "num_draws", "patch_size", "chunk_size", "example_chunk_size", "memory_budget_bytes",
    "token_split", "num_pixels", "norm", "on", "normalize", "vectorize",
    # Attacks, corruptions, weight perturbations, representations.
    "num_steps", "random_start", "attack", "name", "severity", "model", "layers", "parts",
    "draw_chunk_size", "filter", "pooling", "kind", "matrix_tokens", "num_classes",
    "batch_size", "steps",
    # Verification.
    "method", "bounds_method", "attack_steps", "max_iters",
)


def static_argnames(measure: Callable[..., Any]) -> tuple[str, ...]:
  """The names of `STATIC_ARGNAMES` that `measure` takes, in its signature's order."""
  params = inspect.signature(measure).parameters
  return tuple(name for name in params if name in STATIC_ARGNAMES)


def jit(measure: Callable[..., Any], **jit_kwargs: Any) -> Callable[..., Any]:
  """`jax.jit(measure, static_argnums=0, static_argnames=static_argnames(measure))`.

  Args:
    measure: a measure of `xsens.measures` (apply_fn first).
    **jit_kwargs: more `jax.jit` options (e.g. `donate_argnames`).
  """
  return jax.jit(measure, static_argnums=0, static_argnames=static_argnames(measure),
                 **jit_kwargs)
