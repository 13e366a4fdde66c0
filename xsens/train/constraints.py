"""Norm-ball constraints around the starting parameters θ₀ (constrained fine-tuning).

Zhu et al., "Modifying Memories in Transformer Models" (arXiv 2012.00363;
docs/papers/google_papers.md §G): min_θ (1/|S|) Σ_{x∈S} L(x; θ) subject to ‖θ − θ₀‖ ≤ δ, solved by
projecting after every optimiser step (ROME's re-implementation "FT-L", kmeng01/rome
baselines/ft/ft_main.py, clamps θ ← clip(θ, θ₀ − δ, θ₀ + δ) after each step).

  "linf": θ ← clip(θ, θ₀ − δ, θ₀ + δ) elementwise, so fl(θ₀ − δ) ≤ θ ≤ fl(θ₀ + δ) holds
          exactly in the parameters' dtype (the bounds rounded once).
  "l2":   θ ← θ₀ + (θ − θ₀) · δ / ‖θ − θ₀‖₂ where ‖θ − θ₀‖₂ > δ (the norm over every leaf
          together), else θ unchanged.
δ = 0 returns θ₀ bit for bit; δ = inf leaves θ unchanged (unconstrained). δ may be a traced
scalar, so a grid of δ is `jax.vmap`ped.

`project` is what the modify_memories study applies to the parameters after each update
(exact bounds). `projection(delta, norm)` is the same as an optax GradientTransformation
for any optax chain: its state holds θ₀ (so θ₀ is checkpointed with the optimiser state),
and its updates move the parameters onto the projection (params + update equals the
projection up to one rounding of the addition).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

NORMS = ("linf", "l2")


def project(params, anchor, delta, norm: str = "linf"):
  """The projection of `params` onto {θ : ‖θ − anchor‖ ≤ delta} (module docstring)."""
  if norm == "linf":
    return jax.tree.map(lambda p, a: jnp.clip(p, a - delta, a + delta), params, anchor)
  if norm == "l2":
    diff = jax.tree.map(jnp.subtract, params, anchor)
    dist = optax.global_norm(diff)
    outside = dist > delta
    scale = delta / jnp.where(outside, dist, 1.0)
    return jax.tree.map(lambda p, a, d: jnp.where(outside, a + (d * scale).astype(a.dtype), p),
                        params, anchor, diff)
  raise ValueError(f"unknown norm {norm!r}; allowed: {', '.join(NORMS)}")


def distance(params, anchor, norm: str = "linf") -> jax.Array:
  """‖params − anchor‖ in `norm` (over every leaf together)."""
  diff = jax.tree.map(jnp.subtract, params, anchor)
  if norm == "linf":
    return jnp.max(jnp.stack([jnp.max(jnp.abs(d)) for d in jax.tree.leaves(diff)]))
  if norm == "l2":
    return optax.global_norm(diff)
  raise ValueError(f"unknown norm {norm!r}; allowed: {', '.join(NORMS)}")


class ProjectionState(NamedTuple):
  anchor: optax.Params   # θ₀: the parameters `init` saw.


def projection(delta, norm: str = "linf") -> optax.GradientTransformation:
  """An optax transformation (last in a chain) that keeps ‖θ − θ₀‖ ≤ delta, θ₀ = the
  parameters at `init`: it returns project(params + updates) − params."""
  if norm not in NORMS:
    raise ValueError(f"unknown norm {norm!r}; allowed: {', '.join(NORMS)}")

  def init(params):
    return ProjectionState(anchor=jax.tree.map(jnp.asarray, params))

  def update(updates, state, params=None):
    if params is None:
      raise ValueError("projection needs the parameters: tx.update(grads, state, params)")
    target = project(optax.apply_updates(params, updates), state.anchor, delta, norm)
    return jax.tree.map(jnp.subtract, target, params), state

  return optax.GradientTransformation(init, update)
