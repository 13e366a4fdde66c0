"""Which arguments of the measures are static under `jax.jit`, and a jit that knows them.

Every measure takes `apply_fn` first (static: hashable and stable, e.g.
`TrainResult.apply_fn`), arrays that may be traced (variables, inputs, labels, key, mask,
sigma, epsilon, ...) and sizes or names that fix the program's shapes and branches, which
must be static. `STATIC_ARGNAMES` lists the latter for every measure of `xsens.measures`;
`static_argnames(measure)` is the part of it that one measure takes (`jax.jit` refuses
names a function does not take); `jit(measure)` is

  jax.jit(measure, static_argnums=0, static_argnames=static_argnames(measure))

so `measures.jit(measures.token_sensitivity)(apply_fn, variables, x, key=key, sigma=0.5,
num_draws=2, patch_size=4)` compiles once per (apply_fn, shapes, static values) and takes
new variables, inputs, keys and sigmas without recompiling. Options passed as dicts
(`attack_options`, `pgd_options`, `solver_options`) are not hashable: bind them with
`functools.partial` before jitting.
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
