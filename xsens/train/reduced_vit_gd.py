"""Exact reduced-state full-batch GD for the one-layer ViT (xsens.models.one_layer_vit).

With the training tokens stacked as X ∈ R^{T×d} (T = N·M), the logistic loss depends on
θ = (W_Q, W_K, W_V) only through Q = X W_Q [T, d_h], K = X W_K [T, d_h] and
v = X W_V w_O [T]. Hence (chain rule)

  ∇_{W_Q} L = Xᵀ ∂L/∂Q,   ∇_{W_K} L = Xᵀ ∂L/∂K,   ∇_{W_V} L = Xᵀ (∂L/∂v) w_Oᵀ,

so GD from θ⁰ keeps W_Q = W_Q⁰ + Xᵀ A, W_K = W_K⁰ + Xᵀ B, W_V = W_V⁰ + Xᵀ β w_Oᵀ with
A, B ∈ R^{T×d_h}, β ∈ R^T, and the updates are A ← A − η ∂L/∂Q, B ← B − η ∂L/∂K,
β ← β − η ∂L/∂v, where Q = Q⁰ + G A, K = K⁰ + G B, v = v⁰ + ‖w_O‖² G β, G = X Xᵀ.
(This is the "GD moves W only within the span of the training tokens" structure of
Jiang et al., NeurIPS 2024, arXiv 2409.19345, and of the signal/noise decomposition of
Cao et al., NeurIPS 2022, arXiv 2202.06526.) A step costs O(T² d_h) instead of O(T d d_h):
cheaper when d > T = N·M (e.g. the paper's d = 1024, N·M ≤ 320). `fit` returns the full
parameters, so results are interchangeable with `full_batch_gd.fit` (equal to float
tolerance; tested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xsens.train import full_batch_gd as gd


def _loss_qkv(q, k, v, y, mask, shape):
  """Logistic loss from token-level Q [T, h], K [T, h], v [T]; shape = (N, M)."""
  n, m = shape
  q, k, v = q.reshape(n, m, -1), k.reshape(n, m, -1), v.reshape(n, m)
  a = jax.nn.softmax(jnp.einsum("nlh,njh->nlj", q, k), axis=-1).mean(axis=-2)
  return gd.logistic_loss(y * jnp.sum(a * v, axis=-1), mask)


def fit(params, w_o, x, y, mask, *, eta, max_steps: int, eps):
  """Same contract as `full_batch_gd.fit(one_layer_vit.apply, ...)`, in the reduced state.

  Args:
    params: {"wq", "wk", "wv"} at initialisation; w_o [d_v]; x [N, M, d]; y, mask [N].

  Returns:
    (params at the stop, steps, converged).
  """
  n, m, d = x.shape
  xt = x.reshape(n * m, d)
  gram = xt @ xt.T  # [T, T]
  q0, k0 = xt @ params["wq"], xt @ params["wk"]
  v0 = xt @ (params["wv"] @ w_o)
  wo2 = w_o @ w_o
  loss = lambda q, k, v: _loss_qkv(q, k, v, y, mask, (n, m))

  def qkv(state):
    a, b, beta = state
    return q0 + gram @ a, k0 + gram @ b, v0 + wo2 * (gram @ beta)

  zeros = (jnp.zeros_like(q0), jnp.zeros_like(k0), jnp.zeros_like(v0))
  state, steps = gd.descend(lambda state: jax.vjp(loss, *qkv(state)), zeros, eta=eta,
                            max_steps=max_steps, eps=eps)
  converged = loss(*qkv(state)) < eps
  a, b, beta = state
  out = {"wq": params["wq"] + xt.T @ a, "wk": params["wk"] + xt.T @ b,
         "wv": params["wv"] + jnp.outer(xt.T @ beta, w_o)}
  return out, steps, converged
