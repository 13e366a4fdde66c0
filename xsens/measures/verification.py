"""Verified robustness of ReLU networks on an L∞ ball (arXiv 2010.14322, `xsens.verify`).

A property is (x, y, ε): "every input of the ball B = {x' : ‖x' − x‖∞ ≤ ε} ∩ [lo, hi]^n is
classified y". With the margin m(x') = min_{j≠y} f_y(x') − f_j(x'):
  - lower: a certified lower bound of min_B m (IBP, the backward triangle bounds, or the
    dual bound of the nonconvex reformulation solved by projected gradient or FISTA, each
    of the triangle relaxation);
  - upper: m at a PGD adversarial example (`xsens.measures.adversarial.pgd`) or at x;
  - verified if lower > 0, falsified if upper < 0 (clean or adversarial error), else open.

Calling convention of `xsens.measures`: `apply_fn` is `partial(model.apply, train=False)`
of an xsens ReLU `MLP` or a one-conv `CNN` (`xsens.verify.bounds.network_from_model`),
inputs [B, H, W, C] in [clip_min, clip_max]. Callers jit with apply_fn, method,
bounds_method, max_iters and attack_steps static; epsilon may be traced (vmap over ε).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from xsens.measures import adversarial
from xsens.verify import bounds as bounds_lib
from xsens.verify import nonconvex

Array = jax.Array
METHODS = ("ibp", "triangle") + nonconvex.METHODS


def _margins(logits: Array, labels: Array) -> Array:
  """min_{j≠y} f_y − f_j per example [B]."""
  own = jnp.take_along_axis(logits, labels[:, None], axis=1)
  others = jnp.where(jax.nn.one_hot(labels, logits.shape[-1]) > 0, -jnp.inf, logits)
  return (own - others).min(axis=1)


def lower_bounds(layers, inputs: Array, labels: Array, epsilon: Any, *, method: str,
                 bounds_method: str = "triangle", clip_min=0.0, clip_max=1.0,
                 **solver_options) -> dict[str, Array]:
  """Certified lower bounds of the margin [B] (and, for the nonconvex methods, the
  primal values, gaps and iterations, each the min / max over j ≠ y).

  method: "ibp" (IBP bounds, IBP on the last layer), "triangle" (backward bounds through
  the triangle relaxation), "pgd" / "fista" (the nonconvex reformulation of the triangle
  relaxation built on `bounds_method` bounds; `solver_options` go to `nonconvex.solve`).
  """
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")
  flat = inputs.reshape(inputs.shape[0], -1).astype(jnp.float32)

  def one(x, y):
    if method in ("ibp", "triangle"):
      b = nonconvex.relaxation_bounds(layers, x, epsilon, clip_min=clip_min,
                                      clip_max=clip_max, bounds_method=method)
      return {"lower": bounds_lib.margin_lower_bounds(layers, b, y, method).min()}
    out = nonconvex.margin_bounds(layers, x, y, epsilon, clip_min=clip_min,
                                  clip_max=clip_max, bounds_method=bounds_method,
                                  method=method, **solver_options)
    return {"lower": out["dual"].min(), "primal": out["primal"].min(),
            "gap": out["gap"].max(), "iterations": out["iterations"].max()}

  return jax.vmap(one)(flat, labels)


def verified_accuracy(apply_fn, variables, inputs: Array, *, labels: Array,
                      key: Optional[Array] = None, mask: Optional[Array] = None,
                      epsilon: Any, method: str = "fista", bounds_method: str = "triangle",
                      clip_min=0.0, clip_max=1.0, attack_steps: int = 20,
                      attack_step_size: Any = None, **solver_options) -> dict[str, Array]:
  """Verified / falsified / open properties of one batch at radius ε.

  Args:
    apply_fn, variables: the model (module doc).
    inputs: [B, H, W, C]; labels: int [B]; mask: optional [B] weights (0 = padding).
    key: PRNG key of the PGD attack's random start (None: no attack, upper = clean margin).
    epsilon: the L∞ radius (scalar, may be traced).
    method: "ibp", "triangle", "pgd" or "fista" (see `lower_bounds`).
    attack_steps: PGD steps (static); attack_step_size: default ε / 4.
    solver_options: of `xsens.verify.nonconvex.solve` (max_iters, tol, stop_on_sign, ...).

  Returns:
    dict with lower, upper [B] margin bounds, verified, falsified [B] bool, the masked
    means verified_accuracy, falsified_rate, open_rate, and count; the nonconvex methods
    add primal, gap [B] and iterations [B].
  """
  labels = labels.astype(jnp.int32)
  layers = bounds_lib.network_from_apply_fn(apply_fn, variables)
  out = lower_bounds(layers, inputs, labels, epsilon, method=method,
                     bounds_method=bounds_method, clip_min=clip_min, clip_max=clip_max,
                     **solver_options)
  upper = _margins(apply_fn(variables, inputs), labels)
  if key is not None and attack_steps > 0:
    step = epsilon / 4 if attack_step_size is None else attack_step_size
    adv = adversarial.pgd(apply_fn, variables, inputs, labels=labels, key=key,
                          epsilon=epsilon, num_steps=attack_steps, step_size=step,
                          clip_min=clip_min, clip_max=clip_max)["adv_inputs"]
    upper = jnp.minimum(upper, _margins(apply_fn(variables, adv), labels))
  verified = out["lower"] > 0
  falsified = upper < 0
  w = (jnp.ones(labels.shape, jnp.float32) if mask is None
       else jnp.asarray(mask, jnp.float32))
  count = w.sum()
  rate = lambda b: jnp.sum(w * b) / jnp.maximum(count, 1.0)
  return dict(out, upper=upper, verified=verified, falsified=falsified,
              verified_accuracy=rate(verified), falsified_rate=rate(falsified),
              open_rate=rate(~verified & ~falsified), count=count)


def duality_gap_trace(apply_fn, variables, inputs: Array, *, labels: Array,
                      key: Optional[Array] = None, mask: Optional[Array] = None,
                      epsilon: Any, method: str = "fista", bounds_method: str = "triangle",
                      clip_min=0.0, clip_max=1.0, max_iters: int = 100,
                      **solver_options) -> dict[str, Array]:
  """Best primal value and dual bound after each of `max_iters` iterations, for every
  property (x, y, j ≠ y) of the batch: primal, dual [B, K − 1, max_iters]."""
  del key, mask
  layers = bounds_lib.network_from_apply_fn(apply_fn, variables)
  flat = inputs.reshape(inputs.shape[0], -1).astype(jnp.float32)
  k = layers[-1].num_out

  def one(x, y):
    out = nonconvex.margin_bounds(layers, x, y, epsilon, clip_min=clip_min,
                                  clip_max=clip_max, bounds_method=bounds_method,
                                  method=method, max_iters=max_iters, trace=True,
                                  **solver_options)
    others = jnp.argsort(jnp.arange(k) == y, stable=True)[:k - 1]   # the j ≠ y
    return {"primal": out["primal_trace"][others], "dual": out["dual_trace"][others]}

  return jax.vmap(one)(flat, labels.astype(jnp.int32))
