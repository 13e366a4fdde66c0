"""The triangle (Planet) relaxation as a linear program, solved by HiGHS.

Ground truth for `xsens.verify.nonconvex` on small networks: the same relaxation (same
input box, same pre-activation bounds) written as

  min  cᵀ(A_L x_{L-1} + b_L)
  s.t. ẑ_k = A_k x_{k-1} + b_k,  l_k ≤ ẑ_k ≤ u_k,  l_0 ≤ x_0 ≤ u_0,
       ambiguous units (l < 0 < u): x ≥ 0, x ≥ ẑ, x ≤ u(ẑ − l)/(u − l);
       stable units: x = ẑ (l ≥ 0) or x = 0 (u ≤ 0),

with variables [x_0, ẑ_1, x_1, ..., ẑ_{L-1}, x_{L-1}], and solved by
`scipy.optimize.linprog(method="highs")` on the host (float64). A convolution enters as its
dense matrix (small networks only).
"""

from __future__ import annotations

import time
from typing import Sequence

import jax
import numpy as np
import scipy.optimize
import scipy.sparse as sp

from xsens.verify.bounds import Affine, Bounds, linear


def dense_matrix(layer: Affine) -> np.ndarray:
  """A [n_out, n_in] of one layer (a convolution's via its Jacobian)."""
  if layer.kind == "dense":
    return np.asarray(layer.weight, np.float64).T
  probe = np.zeros((layer.num_in,), np.float32)
  return np.asarray(jax.jacfwd(lambda x: linear(layer, x))(probe), np.float64)


def build(layers: Sequence[Affine], bounds: Bounds, matrices=None) -> dict:
  """The LP's constraint data (everything but the objective), as numpy / scipy.sparse.

  `matrices` (optional): the layers' `dense_matrix`, to reuse across properties.
  """
  mats = [dense_matrix(l) for l in layers] if matrices is None else matrices
  lo0, hi0 = (np.asarray(b, np.float64) for b in bounds[0])
  sizes = [lo0.size]
  for layer in layers[:-1]:
    sizes += [layer.num_out, layer.num_out]
  offsets = np.concatenate([[0], np.cumsum(sizes)])
  n = int(offsets[-1])
  var_lo, var_hi = np.empty(n), np.empty(n)
  var_lo[:sizes[0]], var_hi[:sizes[0]] = lo0, hi0
  eq_rows, eq_rhs, ub_rows, ub_rhs = [], [], [], []
  for k in range(1, len(layers)):
    xin = slice(offsets[2 * k - 2], offsets[2 * k - 1])
    zs = slice(offsets[2 * k - 1], offsets[2 * k])
    xs = slice(offsets[2 * k], offsets[2 * k + 1])
    m = sizes[2 * k - 1]
    lo, hi = (np.asarray(b, np.float64) for b in bounds[k])
    var_lo[zs], var_hi[zs] = lo, hi
    var_lo[xs], var_hi[xs] = np.maximum(lo, 0), np.maximum(hi, 0)
    eye = sp.identity(m, format="csr")
    # ẑ_k − A_k x_{k-1} = b_k.
    block = sp.hstack([sp.csr_matrix((m, xin.start)), -sp.csr_matrix(mats[k - 1]), eye,
                       sp.csr_matrix((m, n - zs.stop))], format="csr")
    eq_rows.append(block)
    eq_rhs.append(np.asarray(layers[k - 1].bias, np.float64))
    ambiguous = (lo < 0) & (hi > 0)
    active = lo >= 0
    inactive = ~ambiguous & ~active
    # Stable units: x − ẑ = 0 (active) or x = 0 (inactive: its bounds are [0, 0]).
    diag_z = np.where(active, -1.0, 0.0)
    eq_rows.append(sp.hstack([sp.csr_matrix((m, zs.start)), sp.diags(diag_z), eye,
                              sp.csr_matrix((m, n - xs.stop))], format="csr")[~ambiguous])
    eq_rhs.append(np.zeros(int((~ambiguous).sum())))
    var_hi[xs] = np.where(inactive, 0.0, var_hi[xs])
    # Ambiguous: ẑ − x ≤ 0 and x − s ẑ ≤ −s l (x ≥ 0 is a variable bound).
    idx = np.flatnonzero(ambiguous)
    s = hi[idx] / (hi[idx] - lo[idx])
    rows = np.arange(idx.size)
    ge = sp.csr_matrix((np.concatenate([np.ones(idx.size), -np.ones(idx.size)]),
                        (np.concatenate([rows, rows]),
                         np.concatenate([zs.start + idx, xs.start + idx]))), shape=(idx.size, n))
    chord = sp.csr_matrix((np.concatenate([np.ones(idx.size), -s]),
                           (np.concatenate([rows, rows]),
                            np.concatenate([xs.start + idx, zs.start + idx]))),
                          shape=(idx.size, n))
    ub_rows += [ge, chord]
    ub_rhs += [np.zeros(idx.size), -s * lo[idx]]
  last_x = slice(offsets[-2], offsets[-1]) if len(layers) > 1 else slice(0, sizes[0])
  return dict(n=n, last_x=last_x, last_matrix=mats[-1],
              last_bias=np.asarray(layers[-1].bias, np.float64),
              A_eq=sp.vstack(eq_rows, format="csr") if eq_rows else None,
              b_eq=np.concatenate(eq_rhs) if eq_rhs else None,
              A_ub=sp.vstack(ub_rows, format="csr") if ub_rows else None,
              b_ub=np.concatenate(ub_rhs) if ub_rhs else None,
              bounds=np.stack([var_lo, var_hi], axis=1))


def solve_margin(data: dict, c: np.ndarray, method: str = "highs") -> dict:
  """min cᵀ logits over the relaxation: {"value", "status", "wall_s"} (value NaN unless
  HiGHS reports optimal). method: of `linprog` ("highs" lets HiGHS choose; "highs-ds",
  "highs-ipm")."""
  c = np.asarray(c, np.float64)
  cost = np.zeros(data["n"])
  cost[data["last_x"]] = data["last_matrix"].T @ c
  start = time.perf_counter()
  res = scipy.optimize.linprog(cost, A_ub=data["A_ub"], b_ub=data["b_ub"], A_eq=data["A_eq"],
                               b_eq=data["b_eq"], bounds=data["bounds"], method=method)
  wall = time.perf_counter() - start
  value = res.fun + c @ data["last_bias"] if res.status == 0 else float("nan")
  return {"value": float(value), "status": int(res.status), "wall_s": wall}


def margin_values(layers: Sequence[Affine], bounds: Bounds, label: int,
                  matrices=None) -> np.ndarray:
  """LP optimum of f_y − f_j for every class j [K] (+inf at j = y)."""
  data = build(layers, bounds, matrices)
  k = layers[-1].num_out
  out = np.full((k,), np.inf)
  for j in range(k):
    if j != label:
      c = np.zeros(k)
      c[label], c[j] = 1.0, -1.0
      out[j] = solve_margin(data, c)["value"]
  return out
