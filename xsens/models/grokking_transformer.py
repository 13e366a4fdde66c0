"""The one-block transformer of the sensitivity paper's grokking experiment.

Vasudeva et al., ICLR 2025 (arXiv 2403.06925), official code
estija/sensitivity language/sens_addition.py and sens_modular_addition.ipynb
(`SimpleTransformer`, docs/papers/sensitivity.md §5):

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

`dtype` ("float32" | "bfloat16") is the compute dtype (`xsens.models.precision`): the
embeddings are summed in float32 and cast, params and logits stay float32.

Token view (xsens.measures.tokens): the measured inputs are `embed`'s output (token +
position, the point where the paper adds its noise) and the measures' apply_fn is
`functools.partial(model.apply, method=model.from_embeddings)`.

The official model's parameters (`SimpleTransformer.state_dict()`, PyTorch; V = vocab_size,
C = num_classes (the official code has C = V = p + 1), T = seq_len, d = width, m = mlp_dim;
PyTorch's Linear stores its weight [out, in], flax's Dense its kernel [in, out]):

  official key                 shape     ours                        transform
  token_embed.weight           [V, d]    token_embed                 as is
  pos_embed                    [T, d]    pos_embed                   as is
  attention.in_proj_weight     [3d, d]   q_proj / k_proj / v_proj    rows [0:d] / [d:2d] /
                                         .kernel [d, d]              [2d:3d], each transposed
  attention.in_proj_bias       [3d]      q_proj / k_proj / v_proj    [0:d] / [d:2d] / [2d:3d]
                                         .bias [d]
  attention.out_proj.weight    [d, d]    out_proj.kernel             transposed
  attention.out_proj.bias      [d]       out_proj.bias               as is
  fc1.weight, fc1.bias         [m, d]    fc1.kernel [d, m], .bias    transposed, as is
  fc2.weight, fc2.bias         [d, m]    fc2.kernel [m, d], .bias    transposed, as is
  fc_out.weight, fc_out.bias   [C, d]    fc_out.kernel [d, C], .bias transposed, as is

(nn.MultiheadAttention with kdim = vdim = d packs Q, K, V in in_proj_weight, in that order;
head h uses features [h d/H, (h + 1) d/H) of each, as our reshape does.) `from_official`
and `to_official` convert either way, with any leading axes (e.g. a seed axis) kept.
`experiments/official_grokking_init.py` writes the official code's initial weights for
seeds 42..46 (PyTorch: it rebuilds `SimpleTransformer` of language/sens_addition.py, whose
`train_and_evaluate` calls `torch.manual_seed(seed)` and draws nothing else from torch
before building the model, and stacks the seeds' state_dicts):

  python -m experiments.official_grokking_init --out=official_init.npz
"""

from __future__ import annotations

import math

from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xsens import choices
from xsens.errors import ConfigError
from xsens.models import _checks
from xsens.models import precision

SEQ_LEN = choices.GROKKING_SEQ_LEN


def _uniform(bound: float):
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def _torch_linear(features: int, fan_in: int, zero_bias: bool = False, dtype=None):
  """nn.Dense with PyTorch nn.Linear's default init (weight and bias U(±1/sqrt(fan_in)))."""
  bound = 1.0 / math.sqrt(fan_in)
  return nn.Dense(features, kernel_init=_uniform(bound), dtype=dtype,
                  bias_init=nn.initializers.zeros if zero_bias else _uniform(bound))


class GrokkingTransformer(nn.Module):
  """ids [B, 3] int (a, b, "=") -> logits [B, num_classes]; see the module docstring."""
  vocab_size: int = 114
  num_classes: int = 114
  width: int = 128
  num_heads: int = 4
  mlp_dim: int = 512
  seq_len: int = SEQ_LEN
  dtype: str = "float32"   # Compute dtype: module docstring.

  def check_config(self) -> None:
    """Raises ConfigError (field `model.<name>`) for impossible sizes or compute dtype."""
    for field in ("vocab_size", "num_classes", "width", "num_heads", "mlp_dim", "seq_len"):
      _checks.positive_int(field, getattr(self, field))
    _checks.dtype(self.dtype)
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
    d, dt = self.width, precision.compute_dtype(self.dtype)
    self.token_embed = self.param("token_embed", nn.initializers.normal(1.0),
                                  (self.vocab_size, d))
    self.pos_embed = self.param("pos_embed", nn.initializers.zeros, (self.seq_len, d))
    xavier = _uniform(math.sqrt(6.0 / (d + 3 * d)))
    dense = lambda: nn.Dense(d, kernel_init=xavier, bias_init=nn.initializers.zeros, dtype=dt)
    self.q_proj, self.k_proj, self.v_proj = dense(), dense(), dense()
    self.out_proj = _torch_linear(d, d, zero_bias=True, dtype=dt)
    self.fc1 = _torch_linear(self.mlp_dim, d, dtype=dt)
    self.fc2 = _torch_linear(d, self.mlp_dim, dtype=dt)
    self.fc_out = _torch_linear(self.num_classes, d, dtype=dt)

  def embed(self, ids):
    """ids [B, T] int -> token + positional embeddings [B, T, d] (summed in float32, then
    in the compute dtype)."""
    x = jnp.take(self.token_embed, ids, axis=0) + self.pos_embed[None, :ids.shape[1]]
    return precision.cast(x, precision.compute_dtype(self.dtype))

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


# ------------------------------------------------------------------------------------------
# The official (PyTorch) parameter layout; see the module docstring for the mapping.

_LINEARS = (("attention.out_proj", "out_proj"), ("fc1", "fc1"), ("fc2", "fc2"),
            ("fc_out", "fc_out"))


def official_shapes(vocab_size: int, num_classes: int, width: int, mlp_dim: int,
                    seq_len: int = SEQ_LEN) -> dict[str, tuple[int, ...]]:
  """{official state_dict key: shape} of the official model with these sizes."""
  d, m = width, mlp_dim
  return {"token_embed.weight": (vocab_size, d), "pos_embed": (seq_len, d),
          "attention.in_proj_weight": (3 * d, d), "attention.in_proj_bias": (3 * d,),
          "attention.out_proj.weight": (d, d), "attention.out_proj.bias": (d,),
          "fc1.weight": (m, d), "fc1.bias": (m,), "fc2.weight": (d, m), "fc2.bias": (d,),
          "fc_out.weight": (num_classes, d), "fc_out.bias": (num_classes,)}


def from_official(state: Mapping[str, np.ndarray]) -> dict:
  """Official state_dict arrays -> our params tree (NumPy, dtypes kept).

  Leading axes before the official shape (e.g. [S] seeds) are kept on every leaf. Keys
  must be exactly those of `official_shapes`; KeyError otherwise.
  """
  expected = set(official_shapes(1, 1, 1, 1))
  if set(state) != expected:
    raise KeyError(f"official keys {sorted(expected)} expected; missing "
                   f"{sorted(expected - set(state))}, unexpected {sorted(set(state) - expected)}")
  t = lambda w: np.swapaxes(np.asarray(w), -1, -2)
  w_in, b_in = np.asarray(state["attention.in_proj_weight"]), np.asarray(
      state["attention.in_proj_bias"])
  d = w_in.shape[-1]
  params = {"token_embed": np.asarray(state["token_embed.weight"]),
            "pos_embed": np.asarray(state["pos_embed"])}
  for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
    params[name] = {"kernel": t(w_in[..., i * d:(i + 1) * d, :]),
                    "bias": b_in[..., i * d:(i + 1) * d]}
  for theirs, ours in _LINEARS:
    params[ours] = {"kernel": t(state[f"{theirs}.weight"]),
                    "bias": np.asarray(state[f"{theirs}.bias"])}
  return params


def to_official(params) -> dict[str, np.ndarray]:
  """Our params tree -> the official state_dict arrays (NumPy); inverse of `from_official`."""
  p = jax.tree.map(np.asarray, params)
  t = lambda w: np.swapaxes(w, -1, -2)
  qkv = ("q_proj", "k_proj", "v_proj")
  out = {"token_embed.weight": p["token_embed"], "pos_embed": p["pos_embed"],
         "attention.in_proj_weight": np.concatenate([t(p[n]["kernel"]) for n in qkv], -2),
         "attention.in_proj_bias": np.concatenate([p[n]["bias"] for n in qkv], -1)}
  for theirs, ours in _LINEARS:
    out[f"{theirs}.weight"] = t(p[ours]["kernel"])
    out[f"{theirs}.bias"] = p[ours]["bias"]
  return out
