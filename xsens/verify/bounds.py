"""ReLU networks as affine layers, and bounds on their activations over an L∞ ball.

A network is a tuple of `Affine` layers with a ReLU between consecutive ones:

  ẑ_1 = A_1 x_0 + b_1,  x_k = relu(ẑ_k),  ẑ_{k+1} = A_{k+1} x_k + b_{k+1},  logits = ẑ_L.

Every activation is a flat vector (a convolution reads and writes its [H, W, C] map
flattened in row-major order, as the flax models flatten before their dense layers), so a
convolution is one more linear map A. The input set is the box

  [l_0, u_0] = [clip(x − ε, lo, hi), clip(x + ε, lo, hi)]

(the L∞ ball around x cut to the input domain [lo, hi]).

Bounds on the pre-activations ẑ_k, layer by layer:
  - `interval_bounds` (IBP): centre/radius propagation, m' = A m + b, r' = |A| r.
  - `triangle_bounds`: linear bounds propagated backwards through the triangle (Planet)
    relaxation of every earlier ReLU (the upper chord u(ẑ − l)/(u − l), the lower line αẑ
    with α = 1 if u ≥ −l else 0, as in CROWN, Zhang et al. 2018, arXiv 1811.00866),
    concretised on the input box and intersected with IBP. Both hold for every point of the
    triangle relaxation of the earlier layers (not only for the network's exact outputs),
    which is what the relaxation of `xsens.verify.nonconvex` and `xsens.verify.lp` needs.

Everything is pure jnp; shapes: l, u [n_k] per layer (vmap over examples and ε).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from xsens.errors import ConfigError

Array = jax.Array
Bounds = list  # [(l_0, u_0), (l_1, u_1), ..., (l_L, u_L)]: input box, then each ẑ_k.


@struct.dataclass
class Affine:
  """One affine layer y = A x + b on flat vectors.

  kind "dense": weight [n_in, n_out] (flax Dense kernel), y = x @ W + b.
  kind "conv": weight [kh, kw, c_in, c_out] (flax Conv kernel, stride 1, SAME padding),
    in_shape (H, W, c_in); bias [n_out] is the per-channel bias tiled over H × W.
  """
  weight: Array
  bias: Array
  kind: str = struct.field(pytree_node=False, default="dense")
  in_shape: tuple = struct.field(pytree_node=False, default=())

  @property
  def num_in(self) -> int:
    return self.weight.shape[0] if self.kind == "dense" else math.prod(self.in_shape)

  @property
  def num_out(self) -> int:
    return self.bias.shape[-1]


def _conv(x: Array, kernel: Array, in_shape: tuple) -> Array:
  lead = x.shape[:-1]
  img = x.reshape((-1,) + tuple(in_shape))
  out = jax.lax.conv_general_dilated(img, kernel.astype(x.dtype), (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
  return out.reshape(lead + (-1,))


def linear(layer: Affine, x: Array) -> Array:
  """A x for x [..., n_in] -> [..., n_out] (no bias)."""
  if layer.kind == "dense":
    return x @ layer.weight.astype(x.dtype)
  return _conv(x, layer.weight, layer.in_shape)


def affine(layer: Affine, x: Array) -> Array:
  """A x + b, [..., n_in] -> [..., n_out]."""
  return linear(layer, x) + layer.bias.astype(x.dtype)


def linear_abs(layer: Affine, r: Array) -> Array:
  """|A| r (entrywise absolute weights), [..., n_in] -> [..., n_out]."""
  return linear(layer.replace(weight=jnp.abs(layer.weight)), r)


def linear_t(layer: Affine, y: Array) -> Array:
  """Aᵀ y, [..., n_out] -> [..., n_in]."""
  if layer.kind == "dense":
    return y @ layer.weight.T.astype(y.dtype)
  probe = jnp.zeros(y.shape[:-1] + (layer.num_in,), y.dtype)
  return jax.linear_transpose(lambda x: linear(layer, x), probe)(y)[0]


# ----------------------------------------------------------------------------- from models


def check_model(model) -> None:
  """ConfigError naming `model.<field>` unless `model` is a ReLU `MLP` or a one-conv `CNN`
  of `xsens.models` (a max-pool is not an affine map followed by a ReLU)."""
  from xsens.models.cnn import CNN  # Local: keep this module free of model imports at load.
  from xsens.models.mlp import MLP
  if isinstance(model, MLP):
    if model.activation != "relu":
      raise ConfigError("model.activation", f"verification needs ReLU networks, got "
                        f"{model.activation!r}; use 'relu'")
  elif isinstance(model, CNN):
    if len(model.features) != 1:
      raise ConfigError("model.features", f"verification supports a CNN with one conv (no "
                        f"max-pool layer), got features={tuple(model.features)}; use e.g. (16,)")
  else:
    raise ConfigError("model.name", f"verification supports the ReLU 'mlp' and a one-conv "
                      f"'cnn', got {type(model).__name__}")


def network_from_model(model, variables) -> tuple[Affine, ...]:
  """The affine layers of a flax ReLU network of `xsens.models` (see `check_model`)."""
  from xsens.models.mlp import MLP
  check_model(model)
  params = variables["params"] if "params" in variables else variables
  if isinstance(model, MLP):
    names = [f"hidden_{i}" for i in range(len(model.hidden_dims))] + ["head"]
    return tuple(Affine(params[n]["kernel"], params[n]["bias"]) for n in names)
  conv = params["conv_0"]
  kernel = conv["kernel"]
  dense = params["dense"]["kernel"]
  side = int(round(math.sqrt(dense.shape[0] // kernel.shape[-1])))
  in_shape = (side, side, kernel.shape[2])
  bias = jnp.tile(conv["bias"], side * side)
  return (Affine(kernel, bias, "conv", in_shape),
          Affine(dense, params["dense"]["bias"]),
          Affine(params["head"]["kernel"], params["head"]["bias"]))


def network_from_apply_fn(apply_fn, variables) -> tuple[Affine, ...]:
  """`network_from_model` of the module behind `apply_fn` (a `functools.partial` of a
  bound `model.apply`, as `TrainResult.apply_fn`)."""
  fn = getattr(apply_fn, "func", apply_fn)
  model = getattr(fn, "__self__", None)
  if model is None:
    raise ConfigError("model.name", "verification needs apply_fn = partial(model.apply, "
                      "train=False) of an xsens MLP or one-conv CNN")
  return network_from_model(model, variables)


def forward(layers: Sequence[Affine], x: Array) -> Array:
  """The network's logits for flat inputs x [..., n_0]."""
  for layer in layers[:-1]:
    x = jax.nn.relu(affine(layer, x))
  return affine(layers[-1], x)


# ----------------------------------------------------------------------------- bounds


def check_epsilon(epsilon, field: str = "verification.epsilons") -> None:
  """ConfigError unless every ε is a finite number >= 0 (host values only)."""
  eps = np.asarray(epsilon, np.float64)
  if eps.dtype.kind not in "fi" or not np.all(np.isfinite(eps)) or np.any(eps < 0):
    raise ConfigError(field, f"every ε must be a finite number >= 0, got {epsilon!r}")


def input_box(x: Array, epsilon, clip_min=None, clip_max=None) -> tuple[Array, Array]:
  """The L∞ ball around flat x [n_0] cut to [clip_min, clip_max]: (l_0, u_0)."""
  lo, hi = x - epsilon, x + epsilon
  if clip_min is not None:
    lo, hi = jnp.maximum(lo, clip_min), jnp.maximum(hi, clip_min)
  if clip_max is not None:
    lo, hi = jnp.minimum(lo, clip_max), jnp.minimum(hi, clip_max)
  return lo, hi


def _ibp_layer(layer: Affine, lo: Array, hi: Array) -> tuple[Array, Array]:
  mid, rad = (hi + lo) / 2, (hi - lo) / 2
  m, r = affine(layer, mid), linear_abs(layer, rad)
  return m - r, m + r


def interval_bounds(layers: Sequence[Affine], lo: Array, hi: Array) -> Bounds:
  """IBP: [(l_0, u_0), (l_1, u_1), ..., (l_L, u_L)] of the input and every ẑ_k."""
  out = [(lo, hi)]
  for layer in layers:
    z_lo, z_hi = _ibp_layer(layer, lo, hi)
    out.append((z_lo, z_hi))
    lo, hi = jax.nn.relu(z_lo), jax.nn.relu(z_hi)
  return out


def relu_relaxation(lo: Array, hi: Array) -> tuple[Array, Array, Array, Array]:
  """Linear bounds of relu on [l, u]: (lower slope α, upper slope s, upper intercept t)
  with αẑ ≤ relu(ẑ) ≤ sẑ + t on [l, u], and the mask of ambiguous units (l < 0 < u).

  Stable units are exact (α = s = 1, t = 0 if l ≥ 0; α = s = t = 0 if u ≤ 0).
  """
  ambiguous = (lo < 0) & (hi > 0)
  width = jnp.where(ambiguous, hi - lo, 1.0)
  s = jnp.where(ambiguous, hi / width, (lo >= 0).astype(lo.dtype))
  t = jnp.where(ambiguous, -hi * lo / width, 0.0)
  alpha = jnp.where(ambiguous, (hi >= -lo).astype(lo.dtype), s)
  return alpha, s, t, ambiguous


def _backward_lower(layers: Sequence[Affine], bounds: Bounds, coeffs: Array) -> Array:
  """Lower bounds of coeffs · ẑ_k [m] over the relaxation, ẑ_k the output of
  layers[-1], given bounds of the earlier ẑ's. coeffs: [m, n_k]."""
  const = coeffs @ layers[-1].bias
  lam = linear_t(layers[-1], coeffs)          # coefficients on x_{k-1}
  for j in range(len(layers) - 2, -1, -1):   # back through relu_j then layer j
    alpha, s, t, _ = relu_relaxation(*bounds[j + 1])
    pos, neg = jnp.maximum(lam, 0), jnp.minimum(lam, 0)
    const = const + neg @ t                   # negative coefficients take the chord
    mu = pos * alpha + neg * s                # coefficients on ẑ_{j+1}
    const = const + mu @ layers[j].bias
    lam = linear_t(layers[j], mu)
  lo, hi = bounds[0]
  return const + jnp.maximum(lam, 0) @ lo + jnp.minimum(lam, 0) @ hi


def triangle_bounds(layers: Sequence[Affine], lo: Array, hi: Array) -> Bounds:
  """Backward linear bounds through the triangle relaxation, layer by layer (module doc),
  intersected with IBP: [(l_0, u_0), ..., (l_L, u_L)]."""
  ibp = interval_bounds(layers, lo, hi)
  out = [(lo, hi), ibp[1]]                    # the first layer is exact with IBP
  for k in range(2, len(layers) + 1):
    n = layers[k - 1].num_out
    eye = jnp.eye(n, dtype=lo.dtype)
    low = _backward_lower(layers[:k], out, jnp.concatenate([eye, -eye]))
    l_k = jnp.maximum(low[:n], ibp[k][0])
    u_k = jnp.minimum(-low[n:], ibp[k][1])
    out.append((l_k, jnp.maximum(u_k, l_k)))
  return out


def margin_matrix(label: Array, num_classes: int, dtype=jnp.float32) -> Array:
  """Rows c_j = e_y − e_j for every class j [K, K] (row y is zero)."""
  eye = jnp.eye(num_classes, dtype=dtype)
  return eye[label][None, :] - eye


def margin_lower_bounds(layers: Sequence[Affine], bounds: Bounds, label: Array,
                        method: str = "ibp") -> Array:
  """Lower bounds of f_y − f_j [K] (j = y gives +inf), from the bounds of the last hidden
  layer: "ibp" concretises c_jᵀ(A_L x + b_L) on the box of x_{L-1} = relu(ẑ_{L-1});
  "triangle" back-propagates c_j through the whole relaxation."""
  k = layers[-1].num_out
  c = margin_matrix(label, k, bounds[0][0].dtype)
  if method == "ibp":
    if len(layers) == 1:
      lo, hi = bounds[0]
    else:
      lo, hi = jax.nn.relu(bounds[-2][0]), jax.nn.relu(bounds[-2][1])
    w = linear_t(layers[-1], c)
    low = c @ layers[-1].bias + jnp.maximum(w, 0) @ lo + jnp.minimum(w, 0) @ hi
  elif method == "triangle":
    low = _backward_lower(layers, bounds[:-1], c)
  else:
    raise ValueError(f"method must be 'ibp' or 'triangle', got {method!r}")
  return jnp.where(jnp.arange(k) == label, jnp.inf, low)
