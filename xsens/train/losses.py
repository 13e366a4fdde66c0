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


def crammer_singer_hinge(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Crammer–Singer multiclass hinge, margin 1: max(0, max_{j != y} 1 + z_j - z_y). Returns [B].

  Only the most violating wrong class counts (Crammer & Singer, "On the Algorithmic
  Implementation of Multiclass Kernel-based Vector Machines", JMLR 2001). This is not
  PyTorch's `MultiMarginLoss`, which averages the hinge over all wrong classes
  (sum_{j != y} max(0, 1 + z_j - z_y) / K). Config name: `loss = "multi_margin"`.
  """
  true = jnp.take_along_axis(logits, labels[:, None], axis=1)
  margins = jnp.maximum(0.0, 1.0 + logits - true)
  margins = margins * (1 - jax.nn.one_hot(labels, logits.shape[1]))
  return margins.max(axis=1)


LOSSES: dict[str, LossFn] = {
    "cross_entropy": cross_entropy,
    "multi_margin": crammer_singer_hinge,  # The config name, kept for existing configs.
}


def get_loss(name: str) -> LossFn:
  """The loss of config name `name` (`config.loss`); ConfigError naming `loss` if unknown."""
  if name not in LOSSES:
    raise ConfigError("loss", f"unknown loss {name!r}; allowed: {', '.join(sorted(LOSSES))}")
  return LOSSES[name]
