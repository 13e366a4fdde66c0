"""The one-block transformer of the sensitivity paper's grokking experiment.

Vasudeva et al., ICLR 2025 (arXiv 2403.06925), official code
estija/sensitivity language/sens_addition.py and sens_modular_addition.ipynb
(`SimpleTransformer`, spec §5):

  ids "a b =" [B, 3] -> token embedding (vocab p + 1) + learned positional embedding
  (initialised to 0), width d -> multi-head self-attention (H heads, no mask)
  -> Linear d -> mlp_dim -> ReLU -> Linear mlp_dim -> d -> the "=" position (last)
  -> Linear d -> num_classes (the code's fc_out has vocab_size = p + 1 outputs).

No residual connections, no LayerNorm, no dropout. Only the last position is read and
nothing after the attention mixes positions, so `from_embeddings` computes the query,
the attention output and the MLP for the last position only; keys and values are
computed for all positions. This is exactly the full model's output (tested against a
full all-position numpy forward in tests/grokking_test.py) at about half the FLOPs.

Initialisation follows PyTorch's defaults so the dynamics match the official code:
nn.Embedding N(0, 1); pos_embed zeros; MultiheadAttention in_proj xavier_uniform over
the stacked [3d, d] matrix (bound sqrt(6 / 4d)) with zero biases, out_proj weight
U(±1/sqrt(d)) (nn.Linear's kaiming_uniform(a=sqrt 5)) with zero bias; the other
nn.Linear layers U(±1/sqrt(fan_in)) for weight and bias.

Token view (xsens.measures.tokens): the measured inputs are `embed`'s output (token +
position, the point where the paper adds its noise) and the measures' apply_fn is
`functools.partial(model.apply, method=model.from_embeddings)`.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from xsens.errors import ConfigError
from xsens.models import _checks

SEQ_LEN = 3


def _uniform(bound: float):
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def _torch_linear(features: int, fan_in: int, zero_bias: bool = False):
  """nn.Dense with PyTorch nn.Linear's default init (weight and bias U(±1/sqrt(fan_in)))."""
  bound = 1.0 / math.sqrt(fan_in)
  return nn.Dense(features, kernel_init=_uniform(bound),
                  bias_init=nn.initializers.zeros if zero_bias else _uniform(bound))


class GrokkingTransformer(nn.Module):
  """ids [B, 3] int (a, b, "=") -> logits [B, num_classes]; see the module docstring."""
  vocab_size: int = 114
  num_classes: int = 114
  width: int = 128
  num_heads: int = 4
  mlp_dim: int = 512
  seq_len: int = SEQ_LEN

  def check_config(self) -> None:
    """Raises ConfigError (field `model.<name>`) for impossible sizes."""
    for field in ("vocab_size", "num_classes", "width", "num_heads", "mlp_dim", "seq_len"):
      _checks.positive_int(field, getattr(self, field))
    if self.width % self.num_heads:
      raise ConfigError("model.num_heads",
                        f"must divide width={self.width}; got {self.num_heads}")

  def check_input(self, input_shape) -> None:
    """`check_config`, and refuses inputs other than ids of per-example shape (seq_len,)."""
    self.check_config()
    shape = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else None
    if shape != (self.seq_len,):
      raise ConfigError("model.seq_len", f"the model reads ids [B, {self.seq_len}]; the data "
                        f"has per-example shape {input_shape!r}")

  def setup(self):
    d = self.width
    self.token_embed = self.param("token_embed", nn.initializers.normal(1.0),
                                  (self.vocab_size, d))
    self.pos_embed = self.param("pos_embed", nn.initializers.zeros, (self.seq_len, d))
    xavier = _uniform(math.sqrt(6.0 / (d + 3 * d)))
    self.q_proj = nn.Dense(d, kernel_init=xavier, bias_init=nn.initializers.zeros)
    self.k_proj = nn.Dense(d, kernel_init=xavier, bias_init=nn.initializers.zeros)
    self.v_proj = nn.Dense(d, kernel_init=xavier, bias_init=nn.initializers.zeros)
    self.out_proj = _torch_linear(d, d, zero_bias=True)
    self.fc1 = _torch_linear(self.mlp_dim, d)
    self.fc2 = _torch_linear(d, self.mlp_dim)
    self.fc_out = _torch_linear(self.num_classes, d)

  def embed(self, ids):
    """ids [B, T] int -> token + positional embeddings [B, T, d] (float32)."""
    return jnp.take(self.token_embed, ids, axis=0) + self.pos_embed[None, :ids.shape[1]]

  def attention_last(self, x):
    """Multi-head attention output at the last position: x [B, T, d] -> [B, d]."""
    b, t, d = x.shape
    h = self.num_heads
    hd = d // h
    q = self.q_proj(x[:, -1]).reshape(b, h, hd)
    k = self.k_proj(x).reshape(b, t, h, hd)
    v = self.v_proj(x).reshape(b, t, h, hd)
    scores = jnp.einsum("bhc,bthc->bht", q, k) / math.sqrt(hd)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bht,bthc->bhc", weights, v).reshape(b, d)
    return self.out_proj(out)

  def from_embeddings(self, x):
    """Embeddings [B, T, d] -> logits [B, num_classes] (read at the last position)."""
    y = self.attention_last(x)
    y = self.fc2(nn.relu(self.fc1(y)))
    return self.fc_out(y).astype(jnp.float32)

  def __call__(self, ids, train: bool = False):
    del train  # No dropout, no batch statistics.
    return self.from_embeddings(self.embed(ids))


def num_params(vocab_size: int, num_classes: int, width: int, mlp_dim: int,
               seq_len: int = SEQ_LEN) -> int:
  """Closed-form parameter count (the PyTorch model's, with in_proj split into Q, K, V)."""
  d = width
  return (vocab_size * d + seq_len * d + 3 * (d * d + d) + (d * d + d)
          + (d * mlp_dim + mlp_dim) + (mlp_dim * d + d) + (d * num_classes + num_classes))
