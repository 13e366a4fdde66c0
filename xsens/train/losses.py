"""Losses chosen by name: each maps (logits [B, K], labels [B]) to per-example losses [B].

`SOFT_LOSSES` are those that also take soft labels [B, K] (from `mixup`)."""

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


def soft_cross_entropy(logits: jax.Array, soft_labels: jax.Array) -> jax.Array:
  """Softmax cross-entropy with soft labels [B, K] (rows sum to 1). Returns [B].

  Equals `cross_entropy` for one-hot rows; for mixed rows λ·e_y + (1 − λ)·e_y' it is
  λ·CE(y) + (1 − λ)·CE(y') (linear in the target)."""
  return optax.softmax_cross_entropy(logits.astype(jnp.float32), soft_labels)


def mixup(key: jax.Array, images: jax.Array, labels: jax.Array, num_classes: int,
          alpha: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Mixup (Zhang et al. 2018, arXiv 1710.09412) as big_vision's `utils.mixup` with n = 2 and
  one ratio per batch (github.com/google-research/big_vision, big_vision/utils.py).

  λ ~ Beta(α, α) is drawn once from `key`; example i is mixed with example i − 1 (a roll of
  the batch by one, the first with the last): x̃_i = λ·x_i + (1 − λ)·x_{i−1}, soft label
  λ·e_{y_i} + (1 − λ)·e_{y_{i−1}}. The dominant label is y_i where λ ≥ 1/2, else y_{i−1}.

  Args: images [B, ...] float; labels [B] int; alpha > 0.
  Returns: (mixed images [B, ...] in images.dtype, soft labels [B, K] float32, dominant
    labels [B] in labels.dtype).
  """
  lam = jax.random.beta(key, alpha, alpha)
  partner = jnp.roll(labels, 1, axis=0)
  mixed = lam * images.astype(jnp.float32) + (1 - lam) * jnp.roll(
      images, 1, axis=0).astype(jnp.float32)
  soft = (lam * jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
          + (1 - lam) * jax.nn.one_hot(partner, num_classes, dtype=jnp.float32))
  return mixed.astype(images.dtype), soft, jnp.where(lam >= 0.5, labels, partner)


LOSSES: dict[str, LossFn] = {
    "cross_entropy": cross_entropy,
    "multi_margin": crammer_singer_hinge,  # PyTorch's name (`nn.MultiMarginLoss`).
}


# The losses that also take soft labels [B, K] (`batch["soft_label"]`, set by mixup).
SOFT_LOSSES: dict[str, LossFn] = {"cross_entropy": soft_cross_entropy}


def get_loss(name: str) -> LossFn:
  """The loss of config name `name` (`config.loss`); ConfigError naming `loss` if unknown."""
  if name not in LOSSES:
    raise ConfigError("loss", f"unknown loss {name!r}; allowed: {', '.join(sorted(LOSSES))}")
  return LOSSES[name]
