"""Full-batch gradient descent on the logistic loss, as pure, vmappable JAX functions.

For grids of tiny models (phase diagrams): one run is a pure function of its arrays, so a
sweep is `jax.vmap` of it inside one jitted program. Samples are masked (`mask` [N], 1 for
real samples, 0 for padding) so runs with different N share one shape.

  L_S(θ) = Σ_i mask_i log(1 + exp(−y_i f(X_i; θ))) / Σ_i mask_i     
  (docs/papers/benign_overfitting.md §3) θ_{t+1} = θ_t − η ∇L_S(θ_t)                               
          (no momentum, no decay)

`apply_fn(params, frozen, x)` is the model; `frozen` (e.g. the ViT's w_O) is an argument,
never differentiated nor updated.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def logistic_loss(margins, mask=None):
  """Mean of log(1 + exp(−margin)) over the masked samples. margins, mask: [N]."""
  losses = jax.nn.softplus(-margins)
  if mask is None:
    return losses.mean()
  return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def accuracy(margins, mask=None):
  """Fraction of masked samples with margin > 0."""
  correct = (margins > 0).astype(jnp.float32)
  if mask is None:
    return correct.mean()
  return jnp.sum(correct * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def loss_fn(apply_fn: Callable, params, frozen, x, y, mask=None):
  """L_S of params on (x [N, M, d], y [N])."""
  return logistic_loss(y * apply_fn(params, frozen, x), mask)


def gd_step(apply_fn: Callable, params, frozen, x, y, mask, eta):
  """(loss at params, params − η ∇loss)."""
  loss, grads = jax.value_and_grad(loss_fn, argnums=1)(apply_fn, params, frozen, x, y, mask)
  return loss, jax.tree.map(lambda p, g: p - eta * g, params, grads)


def fit(apply_fn: Callable, params, frozen, x, y, mask, *, eta, max_steps: int, eps):
  """GD until the train loss is below `eps` or `max_steps` updates were made.

  A `lax.while_loop` with a per-run `done` flag: under `vmap` it runs until every run is
  done (or max_steps) and leaves finished runs untouched, so each run stops at its own
  first crossing. `eps = 0` gives exactly `max_steps` updates. Each iteration runs the
  forward (the loss check) and then, under `lax.cond`, the backward only if the run goes
  on, as the authors' loop checks with a forward alone; unbatched (one run, or the
  sweeps' `lax.map` groups of one) that skips the gradient of the stopping step, under
  `vmap` the cond becomes a select that computes both. Same numbers as `gd_step`'s.

  Returns:
    (params at the stop, steps [] int32 = number of updates made, converged [] bool =
    train loss at the returned params < eps).
  """
  def vjp(p):
    loss, pullback = jax.vjp(lambda q: loss_fn(apply_fn, q, frozen, x, y, mask), p)
    return loss, lambda ct: pullback(ct)[0]

  params, steps = descend(vjp, params, eta=eta, max_steps=max_steps, eps=eps)
  final = loss_fn(apply_fn, params, frozen, x, y, mask)
  return params, steps, final < eps


def descend(vjp: Callable, state, *, eta, max_steps: int, eps):
  """The GD loop of `fit` and of `reduced_vit_gd.fit`: state ← state − η·direction until
  the loss is below `eps` or `max_steps` updates were made.

  `vjp(state) -> (loss, pullback)`, `pullback(1.0)` the direction (a pytree like `state`):
  the gradient for `fit`, ∂L/∂(Q, K, v) for the reduced state. The forward runs every
  iteration (the stop check), the backward under `lax.cond` only if the run goes on;
  under `vmap` each run stops at its own first crossing (finished runs are untouched).
  Returns (state, steps [] int32 = number of updates made).
  """
  def cond(carry):
    _, step, done = carry
    return (step < max_steps) & ~done

  def body(carry):
    s, step, _ = carry
    loss, pullback = vjp(s)
    done = loss < eps

    def update(s):
      return jax.tree.map(lambda a, g: a - eta * g, s, pullback(jnp.ones_like(loss)))

    s = jax.lax.cond(done, lambda s: s, update, s)
    return s, step + jnp.where(done, 0, 1).astype(jnp.int32), done

  state, steps, _ = jax.lax.while_loop(cond, body, (state, jnp.int32(0), jnp.bool_(False)))
  return state, steps


def trajectory(apply_fn: Callable, params, frozen, x, y, mask, *, eta, steps: int,
               metrics_fn: Callable):
  """`steps` GD updates; `metrics_fn(params) -> {name: scalar}` logged at θ_0..θ_steps.

  Returns:
    (final params, {name: [steps + 1]}).
  """
  def body(p, _):
    m = metrics_fn(p)
    _, p = gd_step(apply_fn, p, frozen, x, y, mask, eta)
    return p, m

  params, logs = jax.lax.scan(body, params, None, length=steps)
  last = metrics_fn(params)
  logs = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), logs, last)
  return params, logs
