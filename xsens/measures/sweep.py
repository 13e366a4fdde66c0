"""`sigma_sweep`: one measure at several noise scales sigma, as one compiled program."""

import functools
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from xsens.measures import convention

Array = jax.Array


def _is_static(value: Any) -> bool:
  """Hashable and free of arrays: a size, a name, a function, None."""
  if any(isinstance(leaf, (jax.Array, np.ndarray, np.generic))
         for leaf in jax.tree.leaves(value)):
    return False
  try:
    hash(value)
  except TypeError:
    return False
  return True


def _sweep(fn: Callable[..., Any], static_args: tuple, static_kwargs: tuple,
           vectorize: bool, dyn_args: dict, dyn_kwargs: dict, sigmas: Array) -> Any:
  args = dict(static_args) | dyn_args
  kwargs = dict(static_kwargs) | dyn_kwargs
  call = lambda s: fn(*(args[i] for i in range(len(args))), sigma=s, **kwargs)
  return jax.vmap(call)(sigmas) if vectorize else jax.lax.map(call, sigmas)


_sweep_jit = jax.jit(_sweep, static_argnums=(0, 1, 2, 3))


def sigma_sweep(fn: Callable[..., Any], sigmas: Iterable[float], *args: Any,
                vectorize: bool = False, **kwargs: Any) -> Any:
  """Evaluates fn(*args, sigma=s, **kwargs) for each s and stacks the results.

  The same key (kwargs['key']) is reused for every sigma: common random
  numbers, so the curve is smooth in sigma and differences between sigmas
  carry less Monte-Carlo noise. The sweep is one program, jitted here with fn,
  its `convention.static_argnames` and every array-free hashable argument
  (functions, sizes, names) static: called eagerly it compiles once per (fn,
  static values, shapes), and inside a caller's jit it is part of that program.

  Args:
    fn: a measure of `xsens.measures` (or anything taking `sigma=`).
    sigmas: S noise scales (a sequence or a [S] array, may be traced).
    *args: fn's positional arguments (apply_fn, variables, inputs).
    vectorize: False maps over sigma with `lax.map` (S evaluations in
      sequence, memory of one); True vmaps over sigma (S times the memory,
      which the 'auto' chunk sizes do not see; the model is then batched by
      vmap rather than reshaped).
    **kwargs: fn's other keyword arguments.

  Returns:
    fn's output pytree with a leading [S] axis on every leaf.
  """
  values = sigmas if hasattr(sigmas, "shape") else list(sigmas)
  traced = any(isinstance(v, jax.core.Tracer)
               for v in (values if isinstance(values, list) else [values]))
  sig = jnp.asarray(values, jnp.float32) if traced else np.asarray(values, np.float32)
  if sig.ndim != 1:
    raise ValueError(f"sigmas must be a sequence or a [S] array, got shape {sig.shape}.")
  if not traced and np.any(sig < 0):
    raise ValueError(f"sigma is a standard deviation and must be >= 0, got "
                     f"{sig.tolist()}.")
  names = set(convention.static_argnames(fn))
  static_kw = {k: v for k, v in kwargs.items() if k in names or _is_static(v)}
  static_pos = {i: a for i, a in enumerate(args) if _is_static(a)}
  parts = (tuple(static_pos.items()), tuple(sorted(static_kw.items())), bool(vectorize),
           {i: a for i, a in enumerate(args) if i not in static_pos},
           {k: v for k, v in kwargs.items() if k not in static_kw}, sig)
  try:
    hash((fn,) + parts[:3])
  except TypeError:                                # e.g. an unhashable size list.
    return jax.jit(functools.partial(_sweep, fn, *parts[:3]))(*parts[3:])
  return _sweep_jit(fn, *parts)
