"""The one-layer ViT of Jiang et al. (NeurIPS 2024, arXiv 2409.19345), as pure functions.

  f(X; θ) = (1/M) Σ_{l=1..M} softmax(x_lᵀ W_Q W_Kᵀ Xᵀ) · X W_V w_O
          = Σ_j a_j(X) · x_jᵀ W_V w_O,   a_j = (1/M) Σ_l softmax_l(j)

(docs/papers/benign_overfitting.md §2): every token is a query, the M attention rows are averaged,
no CLS token, positional embedding, residual, LayerNorm, 1/√d_h scaling or bias. The trained
parameters are the pytree {"wq": [d, d_h], "wk": [d, d_h], "wv": [d, d_v]}; the read-out w_O [d_v]
is frozen and kept *outside* that pytree, so GD on the pytree can never move it.

Initialisations (docs/papers/benign_overfitting.md §2):
  * "torch_scaled": PyTorch's Linear default U(±1/√fan_in) (fan_in = d) divided by
    `init_divisor` (16 in the authors' heat-map script, 32 in the dynamics script); w_O keeps
    U(±1/√d_v).
  * "gaussian": W_Q, W_K, W_V i.i.d. N(0, init_std²); w_O ~ U(±1/√d_v) as above.

`OneLayerViT` is the same model as a flax.linen module whose params include w_O; train it
with `frozen_readout(tx)`, which zeroes w_O's update (optax.multi_transform + set_to_zero).
The sweeps use the pure functions (w_O outside the pytree), which vmap without ceremony,
and differentiate `apply_hand_vjp` (the same f with its gradient written out).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from xsens import choices
from xsens.models import _checks
from xsens.models import precision
from xsens.models import token_split as split_lib

INITS = choices.ONE_LAYER_VIT_INITS


def init(key, d: int, d_h: int, d_v: int, *, init: str = "torch_scaled",
         init_divisor: float = 16.0, init_std: float = 1e-3):
  """Returns (params {"wq", "wk", "wv"}, w_o [d_v])."""
  kq, kk, kv, ko = jax.random.split(key, 4)
  if init == "torch_scaled":
    b = 1.0 / (d ** 0.5) / init_divisor
    u = lambda k, shape: jax.random.uniform(k, shape, jnp.float32, -b, b)
  elif init == "gaussian":
    u = lambda k, shape: init_std * jax.random.normal(k, shape, jnp.float32)
  else:
    raise ValueError(f"init must be one of {INITS}, got {init!r}")
  params = {"wq": u(kq, (d, d_h)), "wk": u(kk, (d, d_h)), "wv": u(kv, (d, d_v))}
  bo = 1.0 / d_v ** 0.5
  w_o = jax.random.uniform(ko, (d_v,), jnp.float32, -bo, bo)
  return params, w_o


def attention_logits(params, x):
  """x [..., M, d] -> [..., M (query), M (key)] logits x_lᵀ W_Q W_Kᵀ x_j."""
  q = x @ params["wq"]
  k = x @ params["wk"]
  return jnp.einsum("...lh,...jh->...lj", q, k)


def pooled_attention(params, x):
  """x [..., M, d] -> a [..., M]: softmax over keys, averaged over the M queries."""
  return pooled_attention_of(x @ params["wq"], x @ params["wk"])


def pooled_attention_of(q, k):
  """`pooled_attention` of queries q and keys k [..., M, d_h] -> a [..., M]."""
  return jax.nn.softmax(jnp.einsum("...lh,...jh->...lj", q, k), axis=-1).mean(axis=-2)


def value_readout(params, w_o):
  """W_V w_O [d]: the only way W_V enters f."""
  return params["wv"] @ w_o


def token_values(params, w_o, x):
  """x [..., M, d] -> x_jᵀ W_V w_O [..., M]."""
  return x @ value_readout(params, w_o)


def apply(params, w_o, x):
  """f(X) for x [..., M, d] -> [...] (the pooled form Σ_j a_j x_jᵀ W_V w_O)."""
  return jnp.sum(pooled_attention(params, x) * token_values(params, w_o, x), axis=-1)


@jax.custom_vjp
def apply_hand_vjp(params, w_o, x):
  """`apply` with its reverse-mode derivative written out (same value; gradients equal to
  autodiff's up to float rounding). [..., M, d] -> [...].

  Autodiff of `apply` runs many small XLA:CPU operations per GD step (softmax's JVP,
  broadcasts, transposes); the closed form below is fewer and makes the sweeps' GD step
  faster on CPU (docs/benchmarks.md). With g = ∂L/∂f [...], S the softmax rows,
  a = mean_l S_l·, v_j = x_jᵀ u, u = W_V w_O:
    ∂v = g a,  ∂a = g v,  ∂u = Σ ∂v_j x_j,
    ∂logits_lj = S_lj (∂a_j − Σ_j' S_lj' ∂a_j') / M,  ∂Q = ∂logits K,  ∂K = ∂logitsᵀ Q,
    ∂W_Q = Σ xᵀ ∂Q,  ∂W_K = Σ xᵀ ∂K,  ∂W_V = ∂u w_Oᵀ,  ∂w_O = W_Vᵀ ∂u,
    ∂x = ∂v uᵀ + ∂Q W_Qᵀ + ∂K W_Kᵀ.
  Reverse mode only (a `jax.custom_vjp`): `jax.jvp` / forward-over-reverse need `apply`.
  """
  return apply(params, w_o, x)


def _apply_fwd(params, w_o, x):
  q, k = x @ params["wq"], x @ params["wk"]
  s = jax.nn.softmax(jnp.einsum("...lh,...jh->...lj", q, k), axis=-1)
  a = s.mean(axis=-2)
  u = value_readout(params, w_o)
  v = x @ u
  return jnp.sum(a * v, axis=-1), (params, w_o, x, q, k, s, a, u, v)


def _apply_bwd(residuals, g):
  params, w_o, x, q, k, s, a, u, v = residuals
  dv, da = g[..., None] * a, g[..., None] * v                      # [..., M]
  du = jnp.einsum("...j,...jd->d", dv, x)
  dlogits = s * (da[..., None, :] - jnp.einsum("...lj,...j->...l", s, da)[..., None])
  dlogits = dlogits / s.shape[-1]
  dq = jnp.einsum("...lj,...jh->...lh", dlogits, k)
  dk = jnp.einsum("...lj,...lh->...jh", dlogits, q)
  grads = {"wq": jnp.einsum("...ld,...lh->dh", x, dq),
           "wk": jnp.einsum("...jd,...jh->dh", x, dk),
           "wv": du[:, None] * w_o[None, :]}
  dx = dv[..., None] * u + dq @ params["wq"].T + dk @ params["wk"].T
  return grads, params["wv"].T @ du, dx


apply_hand_vjp.defvjp(_apply_fwd, _apply_bwd)


def token_features(params, w_o, x):
  """The per-token part of `apply`: x [..., d] -> [x W_Q, x W_K, x W_V w_O] [..., 2d_h+1]."""
  return jnp.concatenate([x @ params["wq"], x @ params["wk"],
                          token_values(params, w_o, x)[..., None]], -1)


def from_token_features(features, d_h: int):
  """The rest of `apply`: features [..., M, 2 d_h + 1] (`token_features`) -> f [...]."""
  q, k, v = features[..., :d_h], features[..., d_h:2 * d_h], features[..., 2 * d_h]
  return jnp.sum(pooled_attention_of(q, k) * v, axis=-1)


def apply_matrix_form(params, w_o, x):
  """f(X) written as (1/M) Σ_l softmax(x_lᵀ W_Q W_Kᵀ Xᵀ) X W_V w_O (the first form of §2)."""
  s = jax.nn.softmax(attention_logits(params, x), axis=-1)  # [..., M, M]
  out = s @ (x @ params["wv"])  # [..., M, d_v]
  return jnp.mean(out @ w_o, axis=-1)


# ------------------------------------------------------------------------------------------
# The same model as a flax.linen module (for the shared trainer and optax): w_O is a
# parameter there, frozen by `frozen_readout(tx)` (optax.multi_transform + set_to_zero).


class OneLayerViT(nn.Module):
  """f(X) of the module docstring; params {"wq", "wk", "wv", "w_o"}; x [..., M, d] -> [...].

  One real score per example (the label is its sign); the registry's "one_layer_vit".
  `dtype` ("float32" | "bfloat16") is the compute dtype (`xsens.models.precision`; params and
  the score float32).
  """
  d_h: int = 64
  d_v: int = 64
  init_scheme: str = "torch_scaled"  # `init` would shadow nn.Module.init.
  init_divisor: float = 16.0
  init_std: float = 1e-3
  dtype: str = "float32"

  def check_input(self, input_shape) -> None:
    """Raises ConfigError for settings impossible on inputs of per-example shape (M, d)."""
    _checks.tokens(input_shape)
    _checks.positive_int("d_h", self.d_h)
    _checks.positive_int("d_v", self.d_v)
    _checks.one_of("init_scheme", self.init_scheme, INITS)
    _checks.positive_float("init_divisor", self.init_divisor)
    _checks.positive_float("init_std", self.init_std)
    _checks.dtype(self.dtype)

  @nn.nowrap
  def token_split(self, patch_size, input_shape):
    """The split at the attention (`xsens.models.token_split`) for token inputs (M, d):
    prefix = `token_features` [N, 2 d_h + 1], rest = `from_token_features`; None for
    images. The rest returns the score f [B'], as the module does."""
    if patch_size is not None or len(input_shape) != 2:
      return None
    m, d = input_shape
    dt = precision.compute_dtype(self.dtype)

    def prefix(variables, tokens, positions):
      del positions
      params = variables["params"]
      w = {k: params[k] for k in ("wq", "wk", "wv")}
      w, w_o, x = jax.tree.map(lambda a: precision.cast(a, dt), (w, params["w_o"], tokens))
      return token_features(w, w_o, x)

    def rest(variables, feats):
      del variables
      return from_token_features(feats, self.d_h).astype(jnp.float32)

    per_token = d * (2 * self.d_h + 1)
    total = m * per_token + m * m * self.d_h
    return split_lib.TokenSplit(prefix, rest, split_lib.share(per_token, m, total))

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train  # No dropout, no batch statistics.
    d = x.shape[-1]
    if self.init_scheme == "torch_scaled":
      b = 1.0 / d ** 0.5 / self.init_divisor
      w_init = lambda k, s: jax.random.uniform(k, s, jnp.float32, -b, b)
    else:
      w_init = lambda k, s: self.init_std * jax.random.normal(k, s, jnp.float32)
    bo = 1.0 / self.d_v ** 0.5
    params = {"wq": self.param("wq", w_init, (d, self.d_h)),
              "wk": self.param("wk", w_init, (d, self.d_h)),
              "wv": self.param("wv", w_init, (d, self.d_v))}
    w_o = self.param("w_o", lambda k, s: jax.random.uniform(k, s, jnp.float32, -bo, bo),
                     (self.d_v,))
    dt = precision.compute_dtype(self.dtype)
    params, w_o, x = jax.tree.map(lambda a: precision.cast(a, dt), (params, w_o, x))
    return apply(params, w_o, x).astype(jnp.float32)


def frozen_readout(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` on W_Q, W_K, W_V and a zero update on w_O (docs/papers/benign_overfitting.md §2: w_O is
  never trained)."""
  labels = lambda params: {k: "frozen" if k == "w_o" else "trained" for k in params}
  return optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, labels)
