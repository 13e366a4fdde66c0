"""Training interventions on the inputs: Gaussian augmentation and the sensitivity penalty.

The penalty is §6.1 of "Transformers Learn Low Sensitivity Functions" (ICLR 2025,
arXiv 2403.06925), as the official code implements it (estija/sensitivity,
cifar/cifar_sens.py `--reg`, docs/papers/sensitivity.md §3):

  L = (1 − p)·CE(f(x), y) + p·MSE(f(x̃), f(x)),   x̃ = x + s·ξ ⊙ 1_W,  ξ ~ N(0, 1)

with W one q×q window per example at a uniformly random corner in {0..H−q} × {0..W−q}
(the official code never draws the last offset; we do), or on the patch grid when
`grid_aligned`. The MSE is over logits, averaged over batch × classes, with no
stop-gradient on either branch. As objective terms (`xsens.train.objectives`): a
cross-entropy term of weight 1 − p and a "sensitivity" term of weight p.

`entropy_penalty` is the minimum-entropy regulariser of "On the reproducibility of neural
network predictions" (Bhojanapalli et al., arXiv 2102.03349, docs/papers/google_papers.md §F;
the form and λ are not confirmed from the paper, a reasonable default):

  L = task + λ·mean_i H(p(x_i)),   H(p) = −Σ_k p_k log p_k,

on the softmax of the training logits (after `augment`, if any): a "min_entropy" term of
weight λ added to the task term.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xsens.errors import ConfigError, is_finite_number

def validate_augment_config(config) -> None:
  """Checks `config.augment` (no compile)."""
  aug = config.augment
  if not (is_finite_number(aug.gaussian_std) and aug.gaussian_std >= 0):
    raise ConfigError("augment.gaussian_std", f"must be >= 0 and finite (0: off), got "
                      f"{aug.gaussian_std!r}")
  if not (is_finite_number(aug.gaussian_prob) and 0 <= aug.gaussian_prob <= 1):
    raise ConfigError("augment.gaussian_prob", f"must be in [0, 1], got {aug.gaussian_prob!r}")


def gaussian_augment(images: jax.Array, key: jax.Array, *, std: float, prob: float
                     ) -> jax.Array:
  """Adds N(0, std²) pixel noise to each example with probability `prob`. [B,H,W,C]."""
  k_noise, k_pick = jax.random.split(key)
  noise = std * jax.random.normal(k_noise, images.shape, images.dtype)
  pick = jax.random.bernoulli(k_pick, prob, (images.shape[0], 1, 1, 1))
  return images + jnp.where(pick, noise, 0.0)


def window_masks(key: jax.Array, batch: int, height: int, width: int, patch_size: int,
                 grid_aligned: bool) -> jax.Array:
  """One q×q window of ones per example at a random corner. Returns [B, H, W, 1] float32."""
  k_row, k_col = jax.random.split(key)
  if grid_aligned:
    rows = patch_size * jax.random.randint(k_row, (batch,), 0, height // patch_size)
    cols = patch_size * jax.random.randint(k_col, (batch,), 0, width // patch_size)
  else:  # Corners in {0..H−q} inclusive.
    rows = jax.random.randint(k_row, (batch,), 0, height - patch_size + 1)
    cols = jax.random.randint(k_col, (batch,), 0, width - patch_size + 1)
  r = jnp.arange(height)[None, :, None]
  c = jnp.arange(width)[None, None, :]
  in_rows = (r >= rows[:, None, None]) & (r < rows[:, None, None] + patch_size)
  in_cols = (c >= cols[:, None, None]) & (c < cols[:, None, None] + patch_size)
  return (in_rows & in_cols).astype(jnp.float32)[..., None]


def patch_noise(images: jax.Array, key: jax.Array, *, sigma: float, patch_size: int,
                grid_aligned: bool = False) -> jax.Array:
  """x̃ = x + σ·ξ ⊙ 1_W with one random q×q window W per example. [B,H,W,C] -> same."""
  k_win, k_noise = jax.random.split(key)
  b, h, w, _ = images.shape
  mask = window_masks(k_win, b, h, w, patch_size, grid_aligned)
  return images + sigma * jax.random.normal(k_noise, images.shape, images.dtype) * mask


def sensitivity_penalty(clean_logits: jax.Array, noisy_logits: jax.Array) -> jax.Array:
  """MSE(f(x̃), f(x)) over batch × classes (PyTorch `nn.MSELoss()` semantics). Scalar."""
  return jnp.mean(jnp.square(noisy_logits - clean_logits))


def entropy_penalty(logits: jax.Array) -> jax.Array:
  """Mean over the batch of H(softmax(logits)) in nats. [B, K] -> scalar."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  return -jnp.mean(jnp.sum(jnp.exp(logp) * logp, -1))


def combine(task_loss: jax.Array, penalty: jax.Array, weight: float) -> jax.Array:
  """(1 − p)·task + p·penalty, the official code's weighting."""
  return (1.0 - weight) * task_loss + weight * penalty
