"""The sensitivity paper's single self-attention layer and an MLP baseline on tokens.

Vasudeva et al., ICLR 2025 (arXiv 2403.06925) §3.1 (OpenReview numbering): "a standard
attention layer with key, query, and value weights W_K, W_Q, W_V, composed with a linear
decoder U" (authors' rebuttal). The exact form is not known; ours (docs/papers/sensitivity.md §6,
not confirmed from the paper):

  f(X) = U · mean_rows( softmax(X W_Q (X W_K)^T / sqrt(d_k)) X W_V ),   X [n, d]

with the softmax over keys (each row of the n x n map sums to one). The formula of
docs/papers/sensitivity.md §6 has no 1/sqrt(d_k); we keep the standard scaling (a reparametrisation
of W_Q that changes only the initial attention temperature and the training dynamics, not the
function class). No biases, no positional encoding (put position into the tokens if the task needs
it; the layer is permutation invariant). `TokenMLP` flattens the n x d tokens and applies a ReLU
MLP.

Both take tokens [B, n, d] directly, so the token measures (xsens.measures.tokens) take
the model's apply as apply_fn and the tokens as inputs. `dtype` ("float32" | "bfloat16") is
the compute dtype (`xsens.models.precision`; params and outputs float32).
"""

from __future__ import annotations

import math
from typing import ClassVar, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xsens.models import _checks
from xsens.models import precision
from xsens.models import token_split as split_lib


class OneLayerAttention(nn.Module):
  """tokens [B, n, d] -> outputs [B, num_outputs]; W_Q, W_K [d, qk_dim], W_V [d, v_dim],
  U [v_dim, num_outputs]; every weight N(0, 1/fan_in) (LeCun normal), no biases."""
  num_outputs: int
  qk_dim: Optional[int] = None   # None: d.
  v_dim: Optional[int] = None    # None: d.
  dtype: str = "float32"         # Compute dtype: module docstring.
  uniform_attention: ClassVar[bool] = False   # `UniformAttention` (not a config field).

  def check_input(self, input_shape) -> None:
    """Raises ConfigError for settings impossible on tokens of per-example shape (n, d)."""
    _checks.tokens(input_shape)
    _checks.positive_int("num_outputs", self.num_outputs)
    for field in ("qk_dim", "v_dim"):
      if getattr(self, field) is not None:
        _checks.positive_int(field, getattr(self, field))
    _checks.dtype(self.dtype)

  @nn.nowrap
  def token_split(self, patch_size, input_shape):
    """The split at the attention (`xsens.models.token_split`) for token inputs (n, d):
    prefix = [x W_Q, x W_K, x W_V] [N, 2 qk_dim + v_dim]; None for images."""
    if patch_size is not None or len(input_shape) != 2:
      return None
    n, d = input_shape
    dt = precision.compute_dtype(self.dtype)
    sizes = {"w_q": self.qk_dim or d, "w_k": self.qk_dim or d, "w_v": self.v_dim or d}

    def prefix(variables, tokens, positions):
      del positions
      return jnp.concatenate([
          nn.Dense(size, use_bias=False, dtype=dt).apply(
              {"params": variables["params"][name]}, tokens)
          for name, size in sizes.items()], -1)

    def rest(variables, feats):
      cuts = np.cumsum([0] + list(sizes.values()))
      replace = {(name,): split_lib.rows_then(0, feats[..., a:b])
                 for name, a, b in zip(sizes, cuts[:-1], cuts[1:])}
      with split_lib.intercept(replace):
        return self.apply(variables, jnp.zeros((feats.shape[0], n, d), jnp.float32))

    dk, dv = sizes["w_k"], sizes["w_v"]
    per_token = d * (2 * dk + dv)
    total = n * per_token + n * n * (dk + dv) + dv * self.num_outputs
    return split_lib.TokenSplit(prefix, rest, split_lib.share(per_token, n, total))

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    d, dt = x.shape[-1], precision.compute_dtype(self.dtype)
    dk = self.qk_dim or d
    q = nn.Dense(dk, use_bias=False, dtype=dt, name="w_q")(x)
    k = nn.Dense(dk, use_bias=False, dtype=dt, name="w_k")(x)
    a = jax.nn.softmax(jnp.einsum("bqc,bkc->bqk", q, k) / math.sqrt(dk), axis=-1)
    if self.uniform_attention:
      a = jnp.full_like(a, 1.0 / a.shape[-1])
    self.sow("intermediates", "attention", a)                      # [B, n, n]
    v = nn.Dense(self.v_dim or d, use_bias=False, dtype=dt, name="w_v")(x)
    pooled = jnp.einsum("bqk,bkc->bqc", a, v).mean(axis=1)          # mean over rows
    return nn.Dense(self.num_outputs, use_bias=False, dtype=dt,
                    name="u")(pooled).astype(jnp.float32)


class UniformAttention(OneLayerAttention):
  """`OneLayerAttention` with the softmax map replaced by the uniform one (every entry 1/n):
  an ablation applied to trained weights (same params; W_Q and W_K are then unused)."""
  uniform_attention: ClassVar[bool] = True


class TokenMLP(nn.Module):
  """tokens [B, n, d] -> flatten [B, n d] -> (Dense -> ReLU) per hidden dim -> [B, K]."""
  num_outputs: int
  hidden_dims: tuple[int, ...] = (256, 256)
  dtype: str = "float32"   # Compute dtype: module docstring.

  def check_input(self, input_shape) -> None:
    """Raises ConfigError for settings impossible on tokens of per-example shape (n, d)."""
    _checks.tokens(input_shape)
    _checks.positive_int("num_outputs", self.num_outputs)
    _checks.positive_ints("hidden_dims", self.hidden_dims, allow_empty=True)
    _checks.dtype(self.dtype)

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    dt = precision.compute_dtype(self.dtype)
    x = x.reshape(x.shape[0], -1)
    for i, h in enumerate(self.hidden_dims):
      x = nn.relu(nn.Dense(h, dtype=dt, name=f"hidden_{i}")(x))
    return nn.Dense(self.num_outputs, dtype=dt, name="head")(x).astype(jnp.float32)


def token_mlp_num_params(input_dim: int, hidden_dims, num_outputs: int) -> int:
  """Parameters of `TokenMLP` on flattened inputs of `input_dim` (weights and biases)."""
  dims = [input_dim, *hidden_dims, num_outputs]
  return sum((a + 1) * b for a, b in zip(dims[:-1], dims[1:]))


def matched_mlp_width(input_dim: int, num_outputs: int, num_params: int) -> int:
  """The hidden width h >= 1 of a one-hidden-layer `TokenMLP` whose parameter count
  (input_dim + 1) h + (h + 1) num_outputs is closest to `num_params` (ties: the smaller)."""
  per_unit = input_dim + 1 + num_outputs
  h = max(1, (num_params - num_outputs) // per_unit)
  cands = [c for c in (h, h + 1) if c >= 1]
  return min(cands, key=lambda c: (abs(token_mlp_num_params(input_dim, (c,), num_outputs)
                                       - num_params), c))
