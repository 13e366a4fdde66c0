"""Losses chosen by name: each maps (logits [B, K], labels [B]) to per-example losses [B]."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from xsens.errors import ConfigError

LossFn = Callable[[jax.Array, jax.Array], jax.Array]


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Softmax cross-entropy with integer labels. Returns [B]."""
  return optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), labels)


def multi_margin(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Multi-class hinge loss (Crammer-Singer style, margin 1). Returns [B]."""
  true = jnp.take_along_axis(logits, labels[:, None], axis=1)
  margins = jnp.maximum(0.0, 1.0 + logits - true)
  margins = margins * (1 - jax.nn.one_hot(labels, logits.shape[1]))
  return margins.max(axis=1)


LOSSES: dict[str, LossFn] = {
    "cross_entropy": cross_entropy,
    "multi_margin": multi_margin,
}


def get_loss(name: str) -> LossFn:
  if name not in LOSSES:
    raise ConfigError("loss", f"unknown loss {name!r}; allowed: {', '.join(sorted(LOSSES))}")
  return LOSSES[name]
