"""Weak spectral bias (Prop. 2.1): NTK eigenvalues at initialisation by monomial degree.

  python experiments/ntk_spectral_bias.py             # n = 6, 8, 10; ~3 min on 2 busy cores
  python experiments/ntk_spectral_bias.py --quick     # n = 6 only, ~1 min
  python experiments/ntk_spectral_bias.py --n=8 --widths=1x16,16x16,64x16 --seeds=16

For each n, model and width: the empirical NTK (`xsens.measures.empirical_ntk`) of the
one-layer linear-attention model and of a ReLU MLP with about as many parameters
(`xsens.measures.spectral`, definitions in its docstring), exactly over all 2^n inputs, at
`--seeds` initialisations; the Walsh diagonal lambda_S = chi_S^T K chi_S / 2^{2n} averaged
over the subsets of each degree k (mean ± s.e. over the seeds), and the order of consecutive
degrees: ">" / "<" when the paired per-seed difference lambda_k - lambda_{k+1} is more than
two standard errors from 0, "≈" otherwise, and "=0" for degrees whose lambda is below
1e-6 of the trace (zero up to float32 round-off). Then, for the mean kernel at the largest
width, how far the monomials are from being its eigenfunctions (the eigenvalues of each
within-degree block, and its rank: eigenvalues above 1e-6 of the largest), and how the
ordering moves with the position-embedding scale.
Widths are HxM: H heads of head dimension M (width H M); the MLP has one hidden layer whose
width matches the attention model's parameter count.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
import jax
import jax.numpy as jnp
import numpy as np

from xsens import boolean_cube
from xsens import measures
from xsens.measures import boolean
from xsens.measures import spectral

ZERO_TOL = 1e-6   # |lambda_k| below this fraction of the trace counts as 0.


def _models(n, heads, head_dim, position_scale):
  att = spectral.linear_attention_model(n, heads=heads, head_dim=head_dim,
                                        position_scale=position_scale)
  att_params = spectral.num_params(att[0](jax.random.key(0)))
  mlp_width = max(1, round(att_params / (n * (n + 1) + 1)))
  mlp = spectral.relu_mlp_model(n, width=mlp_width, position_scale=position_scale)
  mlp_params = spectral.num_params(mlp[0](jax.random.key(0)))
  return [("linear attention", f"{heads}x{head_dim}", heads * head_dim, att_params, att),
          ("ReLU MLP", f"{mlp_width}", mlp_width, mlp_params, mlp)]


def _kernels(model, n, seeds, seed0):
  init_fn, apply_fn = model
  x = boolean_cube.all_inputs(n)
  ntk = jax.jit(lambda key: measures.empirical_ntk(apply_fn, init_fn(key), x)["kernel"])
  keys = jax.random.split(jax.random.key(seed0), seeds)
  return jnp.stack([ntk(k) for k in keys])


def order(per_seed, trace):
  """(relation of consecutive degrees, "yes"/"no" non-increasing): per_seed [R, n + 1]
  degree means, trace [R]."""
  mean = per_seed.mean(0)
  zero = np.abs(mean) <= ZERO_TOL * trace.mean()
  n = per_seed.shape[1] - 1
  parts = ["0"]
  for k in range(n):
    if zero[k + 1:].all():
      parts += ["=" if zero[k] else ">", f"{k + 1}" + (f"..{n}" if k + 1 < n else "") + "=0"]
      break
    d = per_seed[:, k] - per_seed[:, k + 1]
    se = d.std(ddof=1) / math.sqrt(d.shape[0])
    parts += [">" if d.mean() > 2 * se else "<" if d.mean() < -2 * se else "≈", f"{k + 1}"]
  return " ".join(parts), ("no" if "<" in parts else "yes")


def _fmt(mean, se):
  return f"{mean:.3g} ± {se:.1g}" if se > 0 else f"{mean:.3g}"


def _stats(model, n, seeds, seed0, spectrum):
  """(per-seed degree means [R, n + 1], traces [R], spectrum dict per seed, mean kernel)."""
  kernels = _kernels(model, n, seeds, seed0)
  out = jax.tree.map(np.asarray, spectrum(kernels))
  return out["degree_mean"], out["trace"], out, np.asarray(kernels.mean(0))


def degree_table(n, widths, seeds, seed0, position_scale, spectrum, done):
  rows, kept = [], {}
  for heads, head_dim in widths:
    for name, width_text, width, params, model in _models(n, heads, head_dim,
                                                          position_scale):
      per_seed, trace, out, mean_kernel = _stats(model, n, seeds, seed0, spectrum)
      done[(n, name, (heads, head_dim), position_scale)] = (per_seed, trace)
      mean = per_seed.mean(0)
      se = per_seed.std(0, ddof=1) / math.sqrt(seeds)
      text, monotone = order(per_seed, trace)
      cells = [_fmt(mean[k], se[k]) for k in range(min(n, 4) + 1)]
      rest = f"{np.abs(mean[5:]).max():.2g}" if n >= 5 else "–"
      whole = jax.tree.map(np.asarray, spectrum(mean_kernel[None]))
      rows.append(f"| {name} | {width_text} | {width} | {params:,} | " + " | ".join(cells)
                  + f" | {rest} | {text} | {monotone} | {whole['offdiag_mass'][0]:.3f} | "
                  f"{whole['cross_degree_mass'][0]:.4f} | {out['offdiag_mass'].mean():.3f} |")
      kept[name] = mean_kernel
  head = ("| model | heads x dim / hidden | width | params | "
          + " | ".join(f"λ_{k}" for k in range(min(n, 4) + 1))
          + " | max abs λ_k, k≥5 | order of degrees | non-increasing | off-diag (mean K) | "
          "cross-degree (mean K) | off-diag (per seed) |")
  sep = "|" + "---|" * (head.count("|") - 1)
  return [head, sep] + rows, kept


def block_table(n, kernels):
  lines = [f"| model (n = {n}) | degree k | C(n,k) | Walsh mean λ_k | block eigenvalues: "
           "largest | second | smallest | rank |", "|---|---|---|---|---|---|---|---|"]
  for name, kernel in kernels.items():
    blocks = spectral.degree_block_eigenvalues(kernel)
    top = max(b.max() for b in blocks)
    lam = np.asarray(jax.jit(spectral.walsh_diagonal)(kernel), np.float64)
    sizes = boolean.subset_sizes(n)
    for k in range(min(n, 3) + 1):
      b = blocks[k]
      second = f"{b[1]:.3g}" if b.shape[0] > 1 else "–"
      rank = int((b > ZERO_TOL * top).sum())
      lines.append(f"| {name} | {k} | {b.shape[0]} | {lam[sizes == k].mean():.3g} | "
                   f"{b[0]:.3g} | {second} | {b[-1]:.3g} | {rank} |")
  return lines


def scale_table(n, width, seeds, seed0, scales, spectrum, done):
  lines = [f"| model (n = {n}, width {width[0]}x{width[1]}) | position scale | "
           + " | ".join(f"λ_{k}" for k in range(4)) + " | order of degrees |",
           "|---|---|---|---|---|---|---|"]
  for scale in scales:
    for name, _, _, _, model in _models(n, *width, scale):
      key = (n, name, tuple(width), scale)
      if key not in done:
        done[key] = _stats(model, n, seeds, seed0, spectrum)[:2]
      per_seed, trace = done[key]
      mean = per_seed.mean(0)
      se = per_seed.std(0, ddof=1) / math.sqrt(seeds)
      text, _ = order(per_seed, trace)
      lines.append(f"| {name} | {scale:g} | "
                   + " | ".join(_fmt(mean[k], se[k]) for k in range(4)) + f" | {text} |")
  return lines


def _widths(text):
  return [tuple(int(v) for v in w.split("x")) for w in text.split(",")]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--n", default="6,8,10", help="cube dimensions, comma-separated")
  parser.add_argument("--widths", default="1x16,4x16,16x16", help="HxM per width")
  parser.add_argument("--seeds", type=int, default=8, help="initialisations per row")
  parser.add_argument("--seed", type=int, default=0, help="base PRNG seed")
  parser.add_argument("--position_scale", type=float, default=1.0)
  parser.add_argument("--scales", default="0.25,1,4",
                      help="position scales of the last table (empty: skip)")
  parser.add_argument("--quick", action="store_true", help="n = 6 only")
  args = parser.parse_args(argv)
  ns = [6] if args.quick else [int(v) for v in args.n.split(",")]
  widths = _widths(args.widths)
  start = time.time()
  print(f"# NTK eigenvalues by monomial degree (jax {jax.__version__}, "
        f"{jax.devices()[0].platform}, float32, {args.seeds} seeds, position scale "
        f"{args.position_scale:g})\n")
  kept, done = {}, {}
  spectra = {n: jax.jit(jax.vmap(spectral.walsh_degree_spectrum)) for n in ns}
  for n in ns:
    spectrum = spectra[n]
    lines, kept[n] = degree_table(n, widths, args.seeds, args.seed, args.position_scale,
                                  spectrum, done)
    print(f"## n = {n} ({2**n} inputs; mean ± s.e. over {args.seeds} initialisations)\n")
    print("\n".join(lines) + "\n", flush=True)
  n_block = max(ns)
  print(f"## Within-degree blocks of the mean kernel (n = {n_block}, width "
        f"{widths[-1][0]}x{widths[-1][1]})\n")
  print("\n".join(block_table(n_block, kept[n_block])) + "\n", flush=True)
  if args.scales:
    n_scale = 8 if 8 in ns else ns[0]
    spectrum = spectra[n_scale]
    scales = sorted({float(v) for v in args.scales.split(",")} | {args.position_scale})
    print(f"## Position-embedding scale (n = {n_scale})\n")
    print("\n".join(scale_table(n_scale, widths[-1], args.seeds, args.seed, scales,
                                spectrum, done)) + "\n")
  print(f"total {time.time() - start:.0f} s")


if __name__ == "__main__":
  main()
