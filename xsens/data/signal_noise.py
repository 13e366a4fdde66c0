"""Signal–noise token data for benign-overfitting studies (pure JAX functions of a key).

Jiang et al., "Unveil Benign Overfitting for Transformer in Vision", NeurIPS 2024
(arXiv 2409.19345), Definition 3.1 as reconstructed in
the set-up in docs/results.md (benign overfitting); Cao et al., "Benign overfitting in two-layer
convolutional neural networks", NeurIPS 2022 (arXiv 2202.06526) for the ±μ layout.

One example is X = [x_1, ..., x_M]ᵀ ∈ R^{M×d} with label y ∈ {±1}:
  * x_1 is the signal: μ₊ = ‖μ‖e₁ if y = +1 and μ₋ = ‖μ‖e₂ if y = −1 (layout "two_vectors",
    the authors' scripts), or y·‖μ‖e₁ (layout "plus_minus", Cao et al.);
  * x_2 = ξ₂ ~ N(0, (C_p σ_p)² I), the strong noise token (C_p = 5√M by default);
  * x_j = ξ_j ~ N(0, σ_p² I) for j = 3..M.
With `project_noise`, the noise has no component on span{μ₊, μ₋} (coordinates 0 and 1).
Labels alternate +1, −1, +1, ... so any even prefix of a sample is exactly balanced (this
lets a vmapped sweep pad every run to the largest N and mask the tail) and sample 0 is +1.

Everything is jittable and vmappable: `mu_norm`, `sigma_p`, `strong_std` and `label_flip`
may be traced; `n`, `num_tokens`, `d`, `layout`, `project_noise` are static.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from xsens import choices

LAYOUTS = choices.SIGNAL_NOISE_LAYOUTS


def snr(mu_norm, sigma_p, d):
  """SNR = ‖μ‖ / (σ_p √d) (docs/papers/benign_overfitting.md §1; uses σ_p, not the strong-noise
  std).

  >>> snr(1.0, 0.2, 1024)  # = 0.15625, the first heat-map tick "0.16".
  """
  return mu_norm / (sigma_p * math.sqrt(d))


def default_strong_noise_factor(num_tokens: int) -> float:
  """C_p = 5√M (Condition 4.1 item (10), docs/papers/benign_overfitting.md §1)."""
  return 5.0 * math.sqrt(num_tokens)


def balanced_labels(n: int) -> jnp.ndarray:
  """[n] float32 labels +1, −1, +1, ... (every even prefix is exactly balanced)."""
  return jnp.where(jnp.arange(n) % 2 == 0, 1.0, -1.0).astype(jnp.float32)


def signal_vectors(mu_norm, d: int, layout: str = "two_vectors") -> jnp.ndarray:
  """[2, d]: row 0 is the +1 class's signal token, row 1 the −1 class's."""
  if layout not in LAYOUTS:
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
  e = jnp.eye(2, d, dtype=jnp.float32)
  if layout == "two_vectors":
    return mu_norm * e
  return mu_norm * jnp.stack([e[0], -e[0]])


def signal_mask(d: int, layout: str = "two_vectors") -> jnp.ndarray:
  """[d] 0/1: 0 on the coordinates spanned by the signal vectors."""
  k = 2 if layout == "two_vectors" else 1
  return (jnp.arange(d) >= k).astype(jnp.float32)


def sample(key, n: int, *, num_tokens: int, d: int, mu_norm, sigma_p, strong_std=None,
           layout: str = "two_vectors", project_noise: bool = False, label_flip=0.0,
           signal_tokens=None):
  """Draws n examples.

  Args:
    key: PRNG key.
    n: number of examples (static).
    num_tokens: M >= 2 (static).
    d: token dimension (static).
    mu_norm: ‖μ‖ (scalar, may be traced).
    sigma_p: noise std of tokens 3..M.
    strong_std: std of ξ₂; None means C_p σ_p with C_p = 5√M.
    layout: "two_vectors" (μ₊ = ‖μ‖e₁, μ₋ = ‖μ‖e₂) or "plus_minus" (y‖μ‖e₁).
    project_noise: zero the noise on the signal coordinates.
    label_flip: probability of flipping each observed label (the signal follows the clean one).
    signal_tokens: optional [n, d] signal tokens replacing the μ's (e.g. MNIST digits);
      they are used as given (the caller scales them).

  Returns:
    (x [n, M, d] float32, y [n] float32 in {±1}, y_clean [n]).
  """
  if strong_std is None:
    strong_std = default_strong_noise_factor(num_tokens) * sigma_p
  y = balanced_labels(n)
  k_noise, k_flip = jax.random.split(key)
  if signal_tokens is None:
    mus = signal_vectors(mu_norm, d, layout)
    signal = jnp.where((y > 0)[:, None], mus[0], mus[1])
  else:
    signal = signal_tokens
  noise = jax.random.normal(k_noise, (n, num_tokens - 1, d), jnp.float32)
  stds = jnp.concatenate([jnp.reshape(jnp.asarray(strong_std, jnp.float32), (1,)),
                          jnp.full((num_tokens - 2,), sigma_p, jnp.float32)])
  noise = noise * stds[None, :, None]
  if project_noise:
    noise = noise * signal_mask(d, layout)
  x = jnp.concatenate([signal[:, None, :].astype(jnp.float32), noise], axis=1)
  flip = jax.random.bernoulli(k_flip, label_flip, (n,))
  y_obs = jnp.where(flip, -y, y)
  return x, y_obs, y


def sample_train_test(key, n_train: int, n_test: int, **kwargs):
  """Independent train and test draws: ((x, y), (x_test, y_test)); test labels are clean."""
  k_train, k_test = jax.random.split(key)
  x, y, _ = sample(k_train, n_train, **kwargs)
  kwargs = dict(kwargs, label_flip=0.0)
  xt, yt, _ = sample(k_test, n_test, **kwargs)
  return (x, y), (xt, yt)


def grid_n(row: int) -> int:
  """The authors' heat-map row → N map: N = 2⌊(r + 10)/10⌋ (docs/papers/benign_overfitting.md §5);
  2 at r=0, 20 at r=99."""
  return 2 * ((row + 10) // 10)
