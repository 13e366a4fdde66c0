"""Study `benign_overfitting`: the N × SNR phase diagram of a one-layer ViT (and Cao's CNN).

Jiang et al., "Unveil Benign Overfitting for Transformer in Vision: Training Dynamics,
Convergence, and Generalization", NeurIPS 2024 (arXiv 2409.19345), Fig. 1 and §5; the
baseline is Cao et al., "Benign overfitting in two-layer convolutional neural networks",
NeurIPS 2022 (arXiv 2202.06526). Set-up: docs/results.md (benign overfitting).

What it does:
  1. Sweep: for every (N, ‖μ‖, trial) of the grid, draw data (`xsens.data.signal_noise`),
     train the model by full-batch GD on the logistic loss until the train loss < ε or
     `max_steps`, and record test loss/accuracy at the stop, the step and `converged`.
     All runs of a chunk are ONE jitted program (every run padded to the grid's largest N,
     or with `sweep.pad_to` "chunk" the chunk's, with a sample mask): `vmap` over groups
     of `sweep.vmap_size` runs, the groups in sequence (`lax.map`; on CPU one run at a
     time, on an accelerator the whole chunk in one vmap). On CPU the chunk's groups are
     split over `sweep.streams` pieces that run at once, one host thread each (default:
     one per core; `xsens.train.streams`), with bit-identical results.
     The sweep runs through the one loop (`xsens.train.loop`) with a run of the grid as
     its step: each chunk's results are array logs of its `Workdir`
     (`workdir/sweep_<model>/`) and each chunk is checkpointed, so an interrupted sweep
     resumes from the chunks on disk.
  2. Boundary: for each N the SNR where the trial-mean test loss crosses `cutoff` (0.2)
     by interpolation in log SNR, then least squares log N = log c − k log SNR
     (theory, `theory_exponent`: k = 2 for the ViT, Jiang et al. Thm 4.1/4.2; k = q for
     the CNN, Cao et al. Thm 4.3/4.4; k = 4 for the ReLU CNN, Kou et al. ICML 2023), with
     a bootstrap-over-trials 95 % interval for k. Beside it, a logistic
     fit of 1[test loss < cutoff] on (log N, log SNR) over all runs, whose decision line
     gives k (`fit_boundary_logistic`); the plots also draw the paper's N·SNR² = 1000.
  3. Dynamics: for one harmful and one benign setting, every GD step logs the losses,
     pooled attention, V projections, QK logits and the stable rank of W_V (spec §6).
  4. Convergence time: a power-law fit of the recorded steps to train loss < ε over N and
     ‖μ‖ (`convergence_fit`) and steps_<model>.png; the η and ε dependence is measured by
     experiments/benign_convergence_time.py.
  5. Report: heat maps, cutoff maps with the fitted and theoretical curves, the ViT/CNN
     overlay, dynamics figures, results.md / results.json.

Stopping: a run stops at the first step whose train loss (before the update) is < ε, and
the test loss is evaluated at those same parameters (the authors' script evaluates it one
update later); runs that never cross record their last values with converged=False.
`train.solver` = "direct" (GD on W_Q, W_K, W_V), "reduced" (the exact reduced-state solver
`xsens.train.reduced_vit_gd`) or "auto" (reduced when d > N·M).

Run keys: run r of the flattened grid (order N, ‖μ‖, trial) uses fold_in(key(seed), r) for
its data (fold 0) and init (fold 1); both models see the same data.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from xsens import paths
from xsens.data import signal_noise as sn
from xsens.errors import ConfigError, require
from xsens.models import one_layer_vit as vit_lib
from xsens.models import two_layer_cnn as cnn_lib
from xsens.report import plots, tables
from xsens.train import full_batch_gd as gd
from xsens.train import loop
from xsens.train import reduced_vit_gd
from xsens.train import sharding
from xsens.train import streams as streams_lib
from xsens.train.workdir import Workdir

MODELS = ("vit", "cnn")
DATA_KINDS = ("synthetic", "mnist")
SOLVERS = ("auto", "direct", "reduced")
PAD_TO = ("chunk", "grid")  # sweep.pad_to: a chunk's runs padded to its / the grid's max N.
RESULT_FIELDS = ("test_loss", "test_accuracy", "train_loss", "train_accuracy", "steps",
                 "converged")
# The pre-loop sweep format (refused with a message to rerun with --overwrite).
LEGACY_INDEX_FILE = "index.json"
_KEEP_CHECKPOINTS = 2  # The state is one int32: the number of runs done.

# ------------------------------------------------------------------------------------------
# Validation (before anything compiles or touches the workdir).


def _positive_int(value) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0


def _positive(value) -> bool:
  return (isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
          and math.isfinite(value) and value > 0)


def validate(config) -> None:
  """Raises ConfigError naming `config.<field>` for any unusable value."""
  require(config.get("models") and all(m in MODELS for m in config.models), "models",
        f"must be a non-empty list of {MODELS}, got {config.get('models')!r}")
  d = config.data
  require(d.kind in DATA_KINDS, "data.kind", f"got {d.kind!r}; allowed: {', '.join(DATA_KINDS)}")
  require(d.layout in sn.LAYOUTS, "data.layout",
        f"got {d.layout!r}; allowed: {', '.join(sn.LAYOUTS)}")
  for f in ("d", "num_test"):
    require(_positive_int(d[f]), f"data.{f}", f"must be a positive int, got {d[f]!r}")
  require(_positive_int(d.num_tokens) and d.num_tokens >= 2, "data.num_tokens",
        f"must be an int >= 2 (signal + strong noise), got {d.num_tokens!r}")
  require(d.d >= 2, "data.d", f"must be >= 2 (μ₊ and μ₋ on e₁, e₂), got {d.d}")
  require(_positive(d.sigma_p), "data.sigma_p", f"must be > 0, got {d.sigma_p!r}")
  require(d.strong_noise_factor is None or _positive(d.strong_noise_factor),
        "data.strong_noise_factor", f"must be None (5√M) or > 0, got {d.strong_noise_factor!r}")
  require(isinstance(d.get("project_noise", False), bool), "data.project_noise",
        f"must be true or false, got {d.get('project_noise')!r}")
  require(not (d.get("project_noise", False) and d.kind == "mnist"), "data.project_noise",
        "projects off the coordinates of μ₊, μ₋ (e₁, e₂); it has no meaning for data.kind='mnist'")
  require(isinstance(d.label_flip, (int, float)) and 0 <= d.label_flip < 0.5, "data.label_flip",
        f"must be in [0, 0.5), got {d.label_flip!r}")
  if d.kind == "mnist":
    require(d.d == 784, "data.d", f"must be 784 (28×28 digits) for data.kind='mnist', got {d.d}")
    require(len(d.mnist_classes) == 2 and all(0 <= c <= 9 for c in d.mnist_classes)
          and d.mnist_classes[0] != d.mnist_classes[1], "data.mnist_classes",
          f"must be two distinct digits, got {tuple(d.mnist_classes)!r}")
  v = config.vit
  for f in ("d_h", "d_v"):
    require(_positive_int(v[f]), f"vit.{f}", f"must be a positive int, got {v[f]!r}")
  require(v.init in vit_lib.INITS, "vit.init", f"got {v.init!r}; allowed: {vit_lib.INITS}")
  require(_positive(v.init_divisor), "vit.init_divisor", f"must be > 0, got {v.init_divisor!r}")
  require(_positive(v.init_std), "vit.init_std", f"must be > 0, got {v.init_std!r}")
  c = config.cnn
  require(_positive_int(c.m), "cnn.m", f"must be a positive int, got {c.m!r}")
  require(_positive(c.q) and c.q >= 1, "cnn.q", f"must be >= 1, got {c.q!r}")
  require(_positive(c.sigma_0), "cnn.sigma_0", f"must be > 0, got {c.sigma_0!r}")
  require(_positive(c.learning_rate), "cnn.learning_rate",
        f"must be > 0, got {c.learning_rate!r}")
  t = config.train
  require(_positive(t.learning_rate), "train.learning_rate",
        f"must be > 0, got {t.learning_rate!r}")
  require(_positive_int(t.max_steps), "train.max_steps", f"must be a positive int, got "
        f"{t.max_steps!r}")
  require(t.solver in SOLVERS, "train.solver", f"got {t.solver!r}; allowed: {', '.join(SOLVERS)}")
  require(_positive(t.loss_threshold), "train.loss_threshold",
        f"must be > 0, got {t.loss_threshold!r}")
  s = config.sweep
  ns = list(s.n_values)
  require(ns and all(_positive_int(n) and n % 2 == 0 for n in ns), "sweep.n_values",
        f"must be a non-empty list of even positive ints (balanced classes), got {ns!r}")
  require(s.mu_norms and all(_positive(m) for m in s.mu_norms), "sweep.mu_norms",
        f"must be a non-empty list of ‖μ‖ > 0, got {list(s.mu_norms)!r}")
  require(_positive_int(s.trials), "sweep.trials", f"must be a positive int, got {s.trials!r}")
  require(_positive_int(s.chunk_size), "sweep.chunk_size",
        f"must be a positive int, got {s.chunk_size!r}")
  vs = s.get("vmap_size")
  require(vs is None or (isinstance(vs, int) and not isinstance(vs, bool) and vs >= 0),
        "sweep.vmap_size", f"must be None (auto: 1 on CPU, the whole chunk on an "
        f"accelerator), 0 (the whole chunk) or a positive int, got {vs!r}")
  streams_lib.check_field("sweep.streams", s.get("streams"))
  require(s.get("pad_to", "grid") in PAD_TO, "sweep.pad_to",
        f"got {s.get('pad_to')!r}; allowed: {', '.join(PAD_TO)}")
  require(d.num_test % 2 == 0, "data.num_test", f"must be even (balanced), got {d.num_test}")
  r = config.report
  require(_positive(r.cutoff), "report.cutoff", f"must be > 0, got {r.cutoff!r}")
  require(isinstance(r.bootstrap, int) and r.bootstrap >= 0, "report.bootstrap",
        f"must be an int >= 0, got {r.bootstrap!r}")
  for name, run in config.dynamics.runs.items():
    f = f"dynamics.runs.{name}"
    for k in ("d", "num_tokens", "n", "num_test", "d_h", "d_v", "steps", "trials"):
      require(_positive_int(run[k]), f"{f}.{k}", f"must be a positive int, got {run[k]!r}")
    require(run.num_tokens >= 2 and run.d >= 2, f"{f}.num_tokens",
          f"need num_tokens >= 2 and d >= 2, got {run.num_tokens}, {run.d}")
    require(run.n % 2 == 0, f"{f}.n", f"must be even, got {run.n}")
    for k in ("mu_norm", "sigma_p", "learning_rate", "init_divisor"):
      require(_positive(run[k]), f"{f}.{k}", f"must be > 0, got {run[k]!r}")


# ------------------------------------------------------------------------------------------
# One run and one chunk of runs (pure, jittable, vmappable).


def _data_kwargs(dc) -> dict:
  strong = (None if dc.strong_noise_factor is None
            else float(dc.strong_noise_factor) * float(dc.sigma_p))
  return dict(num_tokens=int(dc.num_tokens), d=int(dc.d), sigma_p=float(dc.sigma_p),
              strong_std=strong, layout=dc.layout, project_noise=bool(dc.project_noise))


def model_fns(config, model: str):
  """(init_fn(key) -> (params, frozen), apply_fn(params, frozen, x) -> f [...])."""
  d = int(config.data.d)
  if model == "vit":
    v = config.vit
    init_fn = functools.partial(vit_lib.init, d=d, d_h=int(v.d_h), d_v=int(v.d_v),
                                init=v.init, init_divisor=float(v.init_divisor),
                                init_std=float(v.init_std))
    return lambda k: init_fn(k), vit_lib.apply_hand_vjp  # GD: its closed-form gradient.
  c = config.cnn
  return (lambda k: cnn_lib.init(k, d, int(c.m), sigma_0=float(c.sigma_0)),
          functools.partial(cnn_lib.apply, q=float(c.q)))


def mnist_pools(config) -> dict:
  """Unit-norm flattened digits of the two classes: {"train": ([P, 784], [P, 784]), "test": …}.

  mnist5k (`xsens.data.pipeline.load_split`), normalised to [0, 1] then to unit L2 norm; the
  first class listed is y = +1. The signal token is ‖μ‖ times a random digit of the class.
  """
  from xsens.data import config as data_config_lib  # pylint: disable=g-import-not-at-top
  from xsens.data import pipeline  # pylint: disable=g-import-not-at-top
  dc = data_config_lib.default_data_config()
  dc.name = "mnist5k"
  dc.normalize = "zero_one"
  dc.classes = tuple(int(c) for c in config.data.mnist_classes)
  out = {}
  for split in ("train", "test"):
    s = pipeline.load_split(dc, split)
    x = s.images.reshape(len(s.images), -1)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    out[split] = (jnp.asarray(x[s.labels == 0]), jnp.asarray(x[s.labels == 1]))
  return out


def _digit_signals(key, pools, n, mu_norm):
  """[n, 784] signal tokens: ‖μ‖ × a random digit of class +1 (even i) or −1 (odd i)."""
  pos, neg = pools
  kp, kn = jax.random.split(key)
  ip = jax.random.randint(kp, (n,), 0, pos.shape[0])
  ineg = jax.random.randint(kn, (n,), 0, neg.shape[0])
  y = sn.balanced_labels(n)
  return mu_norm * jnp.where((y > 0)[:, None], pos[ip], neg[ineg])


def cnn_lr_scale(config):
  """‖μ‖ -> the CNN's GD step size.

  With `cnn.normalize_lr`, η = cnn.learning_rate / max(‖μ‖², σ̃_p² d), the scale of Cao et
  al.'s condition η ≤ Õ(min{‖μ‖⁻², σ_p⁻² d⁻¹}) (spec §8) with the strongest noise token;
  a fixed η = 0.1 makes σ(z) = z^q explode on this data (‖ξ₂‖ ≈ 5√M σ_p √d).
  """
  c, dc = config.cnn, config.data
  lr = float(c.learning_rate)
  if not c.normalize_lr:
    return lambda mu_norm: lr
  factor = (sn.default_strong_noise_factor(int(dc.num_tokens)) if dc.strong_noise_factor is None
            else float(dc.strong_noise_factor))
  noise2 = (factor * float(dc.sigma_p)) ** 2 * int(dc.d)
  return lambda mu_norm: lr / jnp.maximum(mu_norm ** 2, noise2)


def theory_exponent(config, model: str) -> float:
  """The k of the theoretical boundary N·SNR^k = const at fixed d (spec §4, §8).

  ViT: 2 (Jiang et al. Thm 4.1–4.2). CNN σ(z) = max(0, z)^q: q (Cao et al., stated for
  q > 2); ReLU, q = 1: 4 (Kou et al.'s n‖μ‖⁴ ≥ C d σ_p⁴, i.e. N·SNR⁴ ≥ C/d).
  """
  if model == "vit":
    return 2.0
  q = float(config.cnn.q)
  return 4.0 if q == 1.0 else q


def power_law_fit(t, factors: dict) -> dict:
  """Least squares log t = a + Σ_f b_f log f over the entries with t ≥ 1 and finite t.

  Args:
    t: [...] positive times (GD steps); NaN marks a run to leave out.
    factors: {name: [...] positive values broadcastable to t's shape}.
  Returns:
    {"a", "b_<name>" per factor, "r2", "runs"}; NaN coefficients when fewer usable runs
    than factors + 2.
  """
  t = np.asarray(t, float)
  ok = np.isfinite(t) & (t >= 1)
  cols = [np.log(np.broadcast_to(np.asarray(v, float), t.shape)[ok]) for v in factors.values()]
  out = {"runs": int(ok.sum())}
  if ok.sum() < len(factors) + 2:
    return out | {"a": float("nan"), "r2": float("nan")} | {f"b_{k}": float("nan")
                                                            for k in factors}
  design = np.stack([np.ones(ok.sum())] + cols, 1)
  target = np.log(t[ok])
  coef, *_ = np.linalg.lstsq(design, target, rcond=None)
  resid = target - design @ coef
  r2 = 1.0 - float(resid @ resid) / max(float(((target - target.mean()) ** 2).sum()), 1e-12)
  return out | {"a": float(coef[0]), "r2": r2} | {
      f"b_{k}": float(b) for k, b in zip(factors, coef[1:])}


def convergence_fit(steps, converged, n_values, mu_norms) -> dict:
  """`power_law_fit` of the steps to train loss < ε on N and ‖μ‖ over the converged runs.

  Args:
    steps, converged: [nN, nMu, trials] GD steps to train loss < ε and the flag.
    n_values [nN], mu_norms [nMu].
  Returns:
    {"a", "b_n", "b_mu", "r2", "runs", "median_steps", "max_steps_seen"}: t ∝ N^b_n ‖μ‖^b_mu.
  """
  steps = np.where(np.asarray(converged) > 0.5, np.asarray(steps, float), np.nan)
  seen = steps[np.isfinite(steps)]
  fit = power_law_fit(steps, {"n": np.asarray(n_values, float)[:, None, None],
                              "mu": np.asarray(mu_norms, float)[None, :, None]})
  return fit | {"median_steps": float(np.median(seen)) if seen.size else float("nan"),
                "max_steps_seen": float(seen.max()) if seen.size else float("nan")}


def uses_reduced_solver(config, n_max: int) -> bool:
  """`train.solver`: "reduced" (xsens.train.reduced_vit_gd), "direct", or "auto" = reduced
  when it is cheaper per step, i.e. d > N_max·M (the ViT's state lives in the token span)."""
  solver = config.train.solver
  tokens = n_max * int(config.data.num_tokens)
  return solver == "reduced" or (solver == "auto" and int(config.data.d) > tokens)


def make_run_fn(config, model: str, n_max: int, pools=None, n_pad: int | None = None):
  """run(key, n, mu_norm) -> {field: scalar} for one grid point (pure; vmap it).

  The training set is drawn with `n_max` samples (the grid's largest N: a run's data do not
  depend on the program it runs in) and trained on its first `n_pad` (default `n_max`;
  any n ≤ n_pad, the rest masked). The masked samples add exact zeros, so `n_pad` changes
  a run's numbers by float rounding only, and the work per step by n_pad / n_max.
  """
  init_fn, apply_fn = model_fns(config, model)
  kw = _data_kwargs(config.data)
  n_test = int(config.data.num_test)
  t = config.train
  eta, max_steps, eps = float(t.learning_rate), int(t.max_steps), float(t.loss_threshold)
  label_flip = float(config.data.label_flip)
  lr_scale = cnn_lr_scale(config) if model == "cnn" else None
  n_pad = n_max if n_pad is None else int(n_pad)
  reduced = model == "vit" and uses_reduced_solver(config, n_pad)

  def run(key, n, mu_norm):
    k_data, k_init = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
    k_train, k_test = jax.random.split(k_data)
    sig_train = sig_test = None
    if pools is not None:
      k_train, ks = jax.random.split(k_train)
      k_test, kt = jax.random.split(k_test)
      sig_train = _digit_signals(ks, pools["train"], n_max, mu_norm)
      sig_test = _digit_signals(kt, pools["test"], n_test, mu_norm)
    x, y, _ = sn.sample(k_train, n_max, mu_norm=mu_norm, label_flip=label_flip,
                        signal_tokens=sig_train, **kw)
    xt, yt, _ = sn.sample(k_test, n_test, mu_norm=mu_norm, signal_tokens=sig_test, **kw)
    x, y = x[:n_pad], y[:n_pad]
    mask = (jnp.arange(n_pad) < n).astype(jnp.float32)
    params, frozen = init_fn(k_init)
    run_eta = eta if lr_scale is None else lr_scale(mu_norm)
    if reduced:
      params, steps, converged = reduced_vit_gd.fit(params, frozen, x, y, mask, eta=run_eta,
                                                    max_steps=max_steps, eps=eps)
    else:
      params, steps, converged = gd.fit(apply_fn, params, frozen, x, y, mask, eta=run_eta,
                                        max_steps=max_steps, eps=eps)
    m_train = y * apply_fn(params, frozen, x)
    m_test = yt * apply_fn(params, frozen, xt)
    return {"test_loss": gd.logistic_loss(m_test), "test_accuracy": gd.accuracy(m_test),
            "train_loss": gd.logistic_loss(m_train, mask),
            "train_accuracy": gd.accuracy(m_train, mask), "steps": steps,
            "converged": converged}

  return run


def resolved_vmap_size(config) -> int:
  """Runs per vmapped group of a chunk: `sweep.vmap_size`, or for None 1 on CPU (XLA:CPU
  runs a run's small GEMMs fastest alone, and a vmapped `while_loop` runs every run until
  the group's slowest stops: 2-4x faster chunks, docs/benchmarks.md) and 0 (the whole
  chunk in one vmap) on an accelerator."""
  size = config.sweep.get("vmap_size")
  if size is None:
    return 1 if jax.default_backend() == "cpu" else 0
  return int(size)


def chunk_padding(config, chunk_n) -> int:
  """The N that a chunk's runs are padded to: the grid's largest for `sweep.pad_to` "grid"
  (the default: one program for every chunk), the chunk's largest for "chunk" (a chunk of
  the default grids holds one N: no padding, 1.8x less GD work on average over N = 2..20,
  but one compiled program per N; on CPU the default study's ~2.5 s compile per program
  outweighs its ~0.5 s chunks, docs/benchmarks.md)."""
  if config.sweep.get("pad_to", "grid") == "grid":
    return int(max(config.sweep.n_values))
  return int(np.max(chunk_n))


def chunk_program(run_fn, vmap_size: int):
  """Jitted chunk(*args [R, ...]) -> outputs [R, ...] (the sweep's: keys, n, mu ->
  {field: [R]}): `run_fn` vmapped over groups of `vmap_size` runs in sequence (`lax.map`),
  or over all R at once for `vmap_size` 0. Groups of one are not vmapped at all (a plain
  `lax.map`), so the `lax.cond` in `full_batch_gd.fit` stays a branch.

  Each run's numbers do not depend on its group but for float rounding (the batched
  matmuls' shapes change), so `vmap_size` is part of the sweep's fingerprint."""
  if vmap_size == 0:
    return jax.jit(jax.vmap(run_fn))
  batch_size = None if vmap_size == 1 else vmap_size
  return jax.jit(lambda *args: jax.lax.map(lambda a: run_fn(*a), args, batch_size=batch_size))


def stream_pieces(size: int, vmap_size: int, streams: int) -> tuple[int, int]:
  """(runs per piece, pieces): a chunk of `size` runs split into at most `streams` equal
  pieces of whole groups of `vmap_size` runs (one piece for `vmap_size` 0 or one stream),
  so that every group holds the runs it holds in the unsplit chunk; the last piece is
  padded by repeating the chunk's last run."""
  if vmap_size == 0 or streams <= 1:
    return size, 1
  groups = -(-size // vmap_size)
  piece = -(-groups // min(streams, groups)) * vmap_size
  return piece, -(-size // piece)


def piece_indices(size: int, vmap_size: int, streams: int):
  """(indices [piece·pieces] into a chunk of `size` runs, the last repeated as padding,
  piece, pieces): the `stream_pieces` layout as the rows to take."""
  piece, pieces = stream_pieces(size, vmap_size, streams)
  return np.minimum(np.arange(piece * pieces), size - 1), piece, pieces


def run_pieces(program, args, piece: int, num_pieces: int):
  """`program` (a `chunk_program`) on `args` ([piece·num_pieces, ...] each) cut into
  `num_pieces` pieces that run at once, one host thread each (`xsens.train.streams`); its
  outputs as NumPy [piece·num_pieces, ...]. Every run's numbers are those of one call on
  all of `args` when the pieces hold whole groups (`stream_pieces`)."""
  parts = streams_lib.ordered_map(
      lambda i: jax.device_get(program(*jax.tree.map(
          lambda a: a[i * piece:(i + 1) * piece], args))), range(num_pieces), num_pieces)
  return jax.tree.map(lambda *p: np.concatenate(p), *parts)


# ------------------------------------------------------------------------------------------
# The sweep: chunks of vmapped runs, saved and resumable.


def grid_points(config):
  """Flattened grid: (n [R] int, mu [R] float, index [R] = run id); order N, ‖μ‖, trial."""
  ns, mus, trials = list(config.sweep.n_values), list(config.sweep.mu_norms), config.sweep.trials
  n, mu, _ = np.meshgrid(np.asarray(ns), np.asarray(mus, np.float32), np.arange(trials),
                         indexing="ij")
  return n.ravel().astype(np.int32), mu.ravel().astype(np.float32), np.arange(n.size)


def sweep_fingerprint(config, model: str) -> dict:
  """Everything that determines the sweep's numbers and its chunk files."""
  fp = {"model": model, "seed": config.seed, "data": config.data.to_dict(),
        "train": config.train.to_dict(),
        "grid": {"n_values": list(config.sweep.n_values),
                 "mu_norms": [float(m) for m in config.sweep.mu_norms],
                 "trials": config.sweep.trials, "chunk_size": config.sweep.chunk_size,
                 "vmap_size": config.sweep.get("vmap_size"),
                 "pad_to": config.sweep.get("pad_to", "grid")}}
  fp["model_config"] = (config.vit if model == "vit" else config.cnn).to_dict()
  return json.loads(json.dumps(fp, default=str))


def sweep_dir(workdir: str, model: str) -> str:
  """The sweep's own run directory (a `Workdir`) inside the study's workdir."""
  return os.path.join(workdir, f"sweep_{model}")


def _legacy_files(path: str) -> list[str]:
  """The files of a sweep written before the one loop: index.json + chunk_*.npz."""
  if not paths.isdir(path):
    return []
  return [os.path.join(path, f) for f in sorted(paths.listdir(path))
          if f.startswith(LEGACY_INDEX_FILE) or (f.startswith("chunk_") and ".npz" in f)]


def check_sweep(config, workdir: str, model: str, overwrite: bool = False) -> Workdir:
  """The (unprepared) `Workdir` of `model`'s sweep; ConfigError on `workdir`, nothing
  written, if it holds a sweep of another config or one in the pre-loop format."""
  path = sweep_dir(workdir, model)
  if not overwrite and paths.exists(os.path.join(path, LEGACY_INDEX_FILE)):
    raise ConfigError(
        "workdir", f"{path!r} holds a sweep in the old format ({LEGACY_INDEX_FILE} + "
        "chunk_*.npz); rerun with --overwrite to recompute it there, or choose another "
        "--workdir")
  wd = Workdir(path, keep_checkpoints=_KEEP_CHECKPOINTS,
               added_defaults={"grid.vmap_size": 0, "grid.pad_to": "grid"}, hints={
                   "grid.vmap_size": ("a sweep written before sweep.vmap_size existed (one "
                                      "vmap per chunk) resumes with "
                                      "--config.sweep.vmap_size=0"),
                   "grid.pad_to": ("a sweep written before sweep.pad_to existed (every "
                                   "chunk padded to the grid's largest N) resumes with "
                                   "--config.sweep.pad_to=grid (the default)")})
  # Array logs without a checkpoint (a run stopped before its first save) count as a run.
  has_state = wd.latest_step() is not None or bool(wd.step_log_files())
  wd.check(sweep_fingerprint(config, model), overwrite=overwrite, has_state=has_state)
  return wd


def run_sweep(config, workdir: str, model: str, *, overwrite: bool = False,
              max_chunks: int | None = None, pools=None, log=print) -> dict:
  """Runs (or resumes) the sweep of `model`; returns {field: [nN, nMu, trials]} + timing.

  Through the one loop (`xsens.train.loop`): a step is one run of the flattened grid
  (`grid_points`), a chunk is `sweep.chunk_size` runs computed as ONE program (the
  last chunk padded to that size by repeating its last run), saved as the array logs of
  those steps and checkpointed (state: the number of runs done), so an interrupted sweep
  resumes at its last chunk. `max_chunks` stops after computing that many new chunks (to
  simulate an interruption). Extra keys: "complete", "wall_s_computed", "chunks_computed".
  """
  fp = sweep_fingerprint(config, model)
  wd = check_sweep(config, workdir, model, overwrite)
  if overwrite and wd.is_writer:
    for f in _legacy_files(wd.path):
      paths.remove(f)
  wd.prepare(fp, overwrite=overwrite)
  n, mu, idx = grid_points(config)
  num_runs, size = len(n), int(config.sweep.chunk_size)
  num_chunks = -(-num_runs // size)
  n_max = int(max(config.sweep.n_values))
  vmap_size = resolved_vmap_size(config)
  fill, piece, num_pieces = piece_indices(size, vmap_size,
                                          streams_lib.resolve(config.sweep.get("streams")))

  @functools.cache
  def chunk_fn(n_pad: int):  # One program per padded N (`sweep.pad_to`).
    return chunk_program(make_run_fn(config, model, n_max, pools, n_pad), vmap_size)

  base = jax.random.key(int(config.seed))
  repl = sharding.replicated(sharding.data_mesh())
  # From NumPy: `device_put` of a jax.Array onto a multi-process sharding builds a broken
  # array (jax 0.10; orbax cannot save it), of a NumPy value a correct one.
  as_state = lambda runs: {"runs_done": jax.device_put(np.asarray(runs, np.int32), repl)}

  def advance(state, start, length):
    del state
    # Always piece × pieces (≥ `size`) runs: the same program for every chunk; the last
    # chunk, and the last piece, are padded by repeating their last run.
    sel = np.minimum(start + fill, num_runs - 1)
    valid = np.arange(len(fill)) < length
    keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.asarray(idx[sel]))
    out = run_pieces(chunk_fn(chunk_padding(config, n[sel])),
                     (keys, jnp.asarray(n[sel]), jnp.asarray(mu[sel])), piece, num_pieces)
    return as_state(start + length), None, {k: v[valid] for k, v in out.items()}

  computed = 0

  def on_chunk(start, end, logs, dt):
    nonlocal computed
    del end, logs
    computed += 1
    log(f"[{model}] chunk {start // size + 1}/{num_chunks}: {dt:.1f}s")

  program = loop.Program(
      init=lambda: as_state(0), advance=advance, on_chunk=on_chunk,
      abstract_state={"runs_done": jax.ShapeDtypeStruct((), jnp.int32, sharding=repl)})
  schedule = loop.Schedule(num_runs, checkpoint_every=size, max_chunk=size)
  out = loop.run(wd, program, schedule, desc=f"sweep {model}", max_chunks=max_chunks)
  return load_sweep(config, wd.path) | {"wall_s_computed": out.wall_s,
                                        "chunks_computed": computed}


def load_sweep(config, path: str) -> dict:
  """The sweep saved in `path` as {field: [nN, nMu, trials]} (NaN where missing), "complete"."""
  num_runs = len(grid_points(config)[0])
  shape = (len(config.sweep.n_values), len(config.sweep.mu_norms), config.sweep.trials)
  wd = Workdir(path)
  # float64 like the results of the pre-loop sweeps (steps, converged as 0./1.).
  flat = wd.read_step_log(num_runs, RESULT_FIELDS, dtype=np.float64)
  done = np.zeros(num_runs, bool)
  for start, end, _ in wd.step_log_files():
    if end <= num_runs:
      done[start:end] = True
  out = {k: v.reshape(shape) for k, v in flat.items()}
  out["complete"] = bool(done.all())
  return out


# ------------------------------------------------------------------------------------------
# Boundary fit: N · SNR^k = c.


def crossing_snr(snrs, mean_loss, cutoff: float) -> float:
  """SNR where `mean_loss` (over increasing `snrs`) last crosses `cutoff` from above.

  Linear interpolation of the loss in log SNR between the last grid point at or above the
  cutoff and the next one; NaN if the loss is below the cutoff on the whole row or never
  gets below it.
  """
  above = np.nonzero(np.asarray(mean_loss) >= cutoff)[0]
  if len(above) == 0 or above[-1] == len(snrs) - 1:
    return float("nan")
  j = above[-1]
  l0, l1 = mean_loss[j], mean_loss[j + 1]
  s0, s1 = np.log(snrs[j]), np.log(snrs[j + 1])
  w = (l0 - cutoff) / (l0 - l1) if l0 != l1 else 0.5
  return float(np.exp(s0 + w * (s1 - s0)))


def fit_power_law(n_values, crossings) -> tuple[float, float, float]:
  """Least squares log N = log c − k log SNR* over finite crossings: (k, c, stderr of k)."""
  n_values, crossings = np.asarray(n_values, float), np.asarray(crossings, float)
  ok = np.isfinite(crossings)
  if ok.sum() < 2:
    return float("nan"), float("nan"), float("nan")
  xs, ys = np.log(crossings[ok]), np.log(n_values[ok])
  slope, intercept = np.polyfit(xs, ys, 1)
  se = float("nan")
  if ok.sum() > 2:
    resid = ys - (slope * xs + intercept)
    se = float(np.sqrt(resid @ resid / (ok.sum() - 2) / np.sum((xs - xs.mean()) ** 2)))
  return float(-slope), float(np.exp(intercept)), se


def fit_boundary(n_values, snrs, test_loss, cutoff: float, *, bootstrap: int = 200,
                 seed: int = 0) -> dict:
  """Fits N·SNR^k = c to the cutoff crossing of the trial-mean test loss.

  Args:
    n_values: [nN]; snrs: [nS] increasing; test_loss: [nN, nS, T].
    cutoff: the loss level of the boundary (0.2 in Fig. 1b).
    bootstrap: resamples of the trials (independently per cell) for a 95 % interval of k.

  Returns:
    {"k", "c", "k_stderr", "k_ci95": [lo, hi], "crossings": [nN], "num_points"}.
  """
  mean = np.nanmean(test_loss, axis=-1)
  cross = np.array([crossing_snr(snrs, row, cutoff) for row in mean])
  k, c, se = fit_power_law(n_values, cross)
  ks = []
  rng = np.random.default_rng(seed)
  t = test_loss.shape[-1]
  for _ in range(bootstrap):
    pick = rng.integers(0, t, size=test_loss.shape)
    m = np.take_along_axis(test_loss, pick, axis=-1).mean(-1)
    kb = fit_power_law(n_values, [crossing_snr(snrs, row, cutoff) for row in m])[0]
    if np.isfinite(kb):
      ks.append(kb)
  ci = [float(np.percentile(ks, 2.5)), float(np.percentile(ks, 97.5))] if len(ks) > 10 else [
      float("nan")] * 2
  return {"k": k, "c": c, "k_stderr": se, "k_ci95": ci, "crossings": cross.tolist(),
          "num_points": int(np.isfinite(cross).sum()), "bootstrap_valid": len(ks)}


def _logistic_coef(xs, ys, ridge: float) -> np.ndarray:
  """Ridge-penalised logistic regression of ys ∈ {0, 1} on [1, xs]: the coefficients."""
  from scipy import optimize  # pylint: disable=g-import-not-at-top
  design = np.concatenate([np.ones((len(xs), 1)), xs], axis=1)
  sign = 2.0 * ys - 1.0
  pen = np.array([0.0] + [ridge] * xs.shape[1])

  def f(w):
    z = sign * (design @ w)
    loss = np.logaddexp(0.0, -z).sum() + 0.5 * pen @ (w * w)
    g = -(design * (sign * np.exp(-np.logaddexp(0.0, z)))[:, None]).sum(0) + pen * w
    return loss, g

  return optimize.minimize(f, np.zeros(design.shape[1]), jac=True, method="L-BFGS-B").x


def logistic_k(n_values, snrs, test_loss, cutoff: float, *, ridge: float = 1e-3) -> tuple:
  """k from a logistic fit of 1[test loss < cutoff] on (log N, log SNR) over all runs.

  P(benign) = σ(a + b log N + c log SNR); the decision line a + b log N + c log SNR = 0 is
  N·SNR^k = C with k = c / b and C = exp(−a / b) (i.e. SNR ∝ N^{−1/k}). A small ridge keeps
  the fit finite on separable labels (it scales the coefficients, barely the ratio).

  Args:
    n_values: [nN]; snrs: [nS]; test_loss: [nN, nS, T] (NaN runs are left out).

  Returns:
    (k, C); NaN if the labels are all one class or b <= 0.
  """
  loss = np.asarray(test_loss, float)
  ln = np.broadcast_to(np.log(np.asarray(n_values, float))[:, None, None], loss.shape)
  ls = np.broadcast_to(np.log(np.asarray(snrs, float))[None, :, None], loss.shape)
  ok = np.isfinite(loss)
  lab = (loss[ok] < cutoff).astype(float)
  if lab.min() == lab.max():
    return float("nan"), float("nan")
  feats = np.stack([ln[ok], ls[ok]], axis=1)
  mu, sd = feats.mean(0), feats.std(0)
  sd = np.where(sd > 0, sd, 1.0)
  w = _logistic_coef((feats - mu) / sd, lab, ridge)
  b, c = w[1] / sd[0], w[2] / sd[1]
  a = w[0] - w[1] * mu[0] / sd[0] - w[2] * mu[1] / sd[1]
  if not b > 0:
    return float("nan"), float("nan")
  return float(c / b), float(np.exp(-a / b))


def fit_boundary_logistic(n_values, snrs, test_loss, cutoff: float, *, bootstrap: int = 200,
                          seed: int = 0) -> dict:
  """`logistic_k` with a bootstrap-over-trials 95 % interval (as `fit_boundary`)."""
  test_loss = np.asarray(test_loss, float)
  k, c = logistic_k(n_values, snrs, test_loss, cutoff)
  ks = []
  rng = np.random.default_rng(seed)
  t = test_loss.shape[-1]
  for _ in range(bootstrap):
    pick = rng.integers(0, t, size=test_loss.shape)
    kb = logistic_k(n_values, snrs, np.take_along_axis(test_loss, pick, axis=-1), cutoff)[0]
    if np.isfinite(kb):
      ks.append(kb)
  ci = [float(np.percentile(ks, 2.5)), float(np.percentile(ks, 97.5))] if len(ks) > 10 else [
      float("nan")] * 2
  return {"k": k, "c": c, "k_ci95": ci, "bootstrap_valid": len(ks)}


# ------------------------------------------------------------------------------------------
# Training dynamics (spec §6).


def dynamics_metrics_fn(params_frozen_data):
  """Builds metrics(params) -> {name: scalar} for the ViT (spec §6 items 1–4, 6)."""
  w_o, x, y, mask, xt, yt, mus = params_frozen_data
  m_tokens = x.shape[1]

  def metrics(params):
    out = {}
    mt = y * vit_lib.apply(params, w_o, x)
    ms = yt * vit_lib.apply(params, w_o, xt)
    out["train_loss"], out["train_accuracy"] = gd.logistic_loss(mt, mask), gd.accuracy(mt, mask)
    out["test_loss"], out["test_accuracy"] = gd.logistic_loss(ms), gd.accuracy(ms)
    a = vit_lib.pooled_attention(params, x)  # [N, M]
    msum = jnp.sum(mask)
    mean = lambda v: jnp.sum(v * mask) / msum
    out["attn_signal_s0"], out["attn_xi2_s0"] = a[0, 0], a[0, 1]
    out["attn_other_s0"] = jnp.sum(a[0, 2:])
    out["attn_signal_mean"], out["attn_xi2_mean"] = mean(a[:, 0]), mean(a[:, 1])
    out["attn_other_mean"] = mean(jnp.sum(a[:, 2:], axis=-1))
    v = vit_lib.value_readout(params, w_o)  # [d]
    out["gamma_plus"], out["gamma_minus"] = mus[0] @ v, mus[1] @ v
    # Margin decomposition y·f = a_1·y x_1ᵀW_Vw_O + Σ_{j≥2} a_j·y x_jᵀW_Vw_O (spec §6 item 5).
    parts = a * (x @ v) * y[:, None]  # [N, M]
    out["margin_signal_mean"] = mean(parts[:, 0])
    out["margin_noise_mean"] = mean(jnp.sum(parts[:, 1:], axis=-1))
    rho = (x[:, 1:] @ v) * y[:, None]  # [N, M-1], y-signed
    neg = jnp.where(mask > 0, 0.0, -jnp.inf)
    out["rho_xi2_s0"] = x[0, 1] @ v
    out["rho_xi2_mean"] = mean(rho[:, 0])
    out["rho_xi2_max"] = jnp.max(rho[:, 0] + neg)
    if m_tokens > 2:
      out["rho_weak_mean"] = mean(rho[:, 1:].mean(-1))
      out["rho_weak_max"] = jnp.max(rho[:, 1:].max(-1) + neg)
    # QK logits for sample 0 (label +1): u W_Q W_Kᵀ w = (u W_Q)·(w W_K).
    qk = lambda u, w: (u @ params["wq"]) @ (w @ params["wk"])
    xi2 = x[0, 1]
    out["qk_mu_mu"], out["qk_mu_xi2"] = qk(mus[0], mus[0]), qk(mus[0], xi2)
    if m_tokens > 2:
      xi3 = x[0, 2]
      out["qk_xi3_mu"], out["qk_xi3_xi2"] = qk(xi3, mus[0]), qk(xi3, xi2)
    sv = jnp.linalg.svd(params["wv"], compute_uv=False)
    out["stable_rank_wv"] = jnp.sum(sv ** 2) / sv[0] ** 2
    return out

  return metrics


def run_dynamics(run_cfg, layout: str, project_noise: bool, init: str, init_std: float,
                 seed: int) -> dict:
  """`trials` vmapped ViT trajectories of one setting: {metric: [trials, steps + 1]}."""
  r = run_cfg
  strong = None if r.strong_std is None else float(r.strong_std)
  kw = dict(num_tokens=int(r.num_tokens), d=int(r.d), sigma_p=float(r.sigma_p),
            strong_std=strong, layout=layout, project_noise=project_noise)

  def one(key):
    k_train, k_test, k_init = jax.random.split(key, 3)
    x, y, _ = sn.sample(k_train, int(r.n), mu_norm=float(r.mu_norm), **kw)
    xt, yt, _ = sn.sample(k_test, int(r.num_test), mu_norm=float(r.mu_norm), **kw)
    mask = jnp.ones((int(r.n),), jnp.float32)
    params, w_o = vit_lib.init(k_init, int(r.d), int(r.d_h), int(r.d_v), init=init,
                               init_divisor=float(r.init_divisor), init_std=init_std)
    mus = sn.signal_vectors(float(r.mu_norm), int(r.d), layout)
    metrics = dynamics_metrics_fn((w_o, x, y, mask, xt, yt, mus))
    _, logs = gd.trajectory(vit_lib.apply, params, w_o, x, y, mask,
                            eta=float(r.learning_rate), steps=int(r.steps),
                            metrics_fn=metrics)
    return logs

  keys = jax.random.split(jax.random.key(seed), int(r.trials))
  return jax.device_get(jax.jit(jax.vmap(one))(keys))


# ------------------------------------------------------------------------------------------
# The study.


def snr_values(config) -> np.ndarray:
  return np.asarray([sn.snr(float(m), float(config.data.sigma_p), int(config.data.d))
                     for m in config.sweep.mu_norms])


def _dyn_figures(workdir: str, name: str, logs: dict) -> list[str]:
  steps = np.arange(next(iter(logs.values())).shape[-1])
  stat = lambda k: (np.mean(logs[k], 0), np.std(logs[k], 0))
  groups = {
      "loss": ["train_loss", "test_loss"],
      "attention": ["attn_signal_s0", "attn_xi2_s0", "attn_other_s0", "attn_signal_mean",
                    "attn_xi2_mean", "attn_other_mean"],
      "value": ["gamma_plus", "gamma_minus", "rho_xi2_s0", "rho_xi2_mean", "rho_weak_mean"],
      "margin": ["margin_signal_mean", "margin_noise_mean"],
      "qk": ["qk_mu_mu", "qk_mu_xi2", "qk_xi3_mu", "qk_xi3_xi2"],
      "rank": ["stable_rank_wv"],
  }
  ylabels = {"loss": "loss (logistic, nats)", "attention": "attention probability",
             "value": "value-projection coefficient", "margin": "margin (logit units)",
             "qk": "query–key inner product", "rank": "stable rank of W_V"}
  files = []
  for g, keys in groups.items():
    series = {k: stat(k) for k in keys if k in logs}
    files.append(plots.dynamics_plot(
        os.path.join(workdir, f"dynamics_{name}_{g}.png"), steps, series,
        xlabel="GD step", ylabel=ylabels[g],
        title=f"{name}: {g} (mean ± std over {logs['train_loss'].shape[0]})"))
  return files


def run(config, workdir: str, *, overwrite: bool = False, log=print) -> dict:
  """Sweeps every model of `config.models`, fits boundaries, runs dynamics, writes the report."""
  validate(config)
  for model in config.models:
    check_sweep(config, workdir, model, overwrite)
  paths.makedirs(workdir)
  pools = mnist_pools(config) if config.data.kind == "mnist" else None
  snrs = snr_values(config)
  ns = np.asarray(list(config.sweep.n_values))
  cutoff = float(config.report.cutoff)
  sweeps, fits, rows, plot_files = {}, {}, [], []
  for model in config.models:
    t0 = time.perf_counter()
    res = run_sweep(config, workdir, model, overwrite=overwrite, pools=pools, log=log)
    res["wall_s"] = time.perf_counter() - t0
    sweeps[model] = res
    fit = fit_boundary(ns, snrs, res["test_loss"], cutoff,
                       bootstrap=int(config.report.bootstrap), seed=int(config.seed))
    fit["logistic"] = fit_boundary_logistic(ns, snrs, res["test_loss"], cutoff,
                                            bootstrap=int(config.report.bootstrap),
                                            seed=int(config.seed))
    fits[model] = fit
    theory = theory_exponent(config, model)
    fit["convergence"] = conv = convergence_fit(res["steps"], res["converged"], ns,
                                                config.sweep.mu_norms)
    lg = fit["logistic"]
    rows.append({"model": model, "runs": int(res["test_loss"].size),
                 "converged_frac": float(np.nanmean(res["converged"])),
                 "k_fit": fit["k"], "k_ci95_lo": fit["k_ci95"][0], "k_ci95_hi": fit["k_ci95"][1],
                 "k_stderr": fit["k_stderr"], "k_logistic": lg["k"],
                 "k_logistic_ci95_lo": lg["k_ci95"][0], "k_logistic_ci95_hi": lg["k_ci95"][1],
                 "k_theory": theory, "c_fit": fit["c"],
                 "boundary_points": fit["num_points"],
                 "median_steps": conv["median_steps"], "wall_s": round(res["wall_s"], 1)})
    if paths.is_writer():
      paths.save_npz(os.path.join(workdir, f"grid_{model}.npz"), dict(
          n_values=ns, mu_norms=np.asarray(list(config.sweep.mu_norms)), snr=snrs,
          **{k: res[k] for k in RESULT_FIELDS}))
    mean = np.nanmean(res["test_loss"], -1)
    curves = _curves(snrs, ns, fit, theory, paper_curve=model == "vit")
    # Every run as its own row, like the authors' heat map (N repeated once per trial).
    trials = res["test_loss"].shape[-1]
    all_rows = np.transpose(res["test_loss"], (0, 2, 1)).reshape(-1, len(snrs))
    plot_files.append(plots.phase_heatmap(
        os.path.join(workdir, f"heatmap_{model}_all_runs.png"), all_rows,
        np.repeat(ns, trials) + np.tile(np.linspace(-0.45, 0.45, trials), len(ns)) * (
            np.min(np.diff(ns)) if len(ns) > 1 else 1.0), snrs,
        title=f"{model}: test loss of every run ({trials} per N)", cbar_label="test loss",
        curves=curves))
    plot_files.append(plots.phase_heatmap(
        os.path.join(workdir, f"heatmap_{model}.png"), mean, ns, snrs,
        title=f"{model}: mean test loss", cbar_label="test loss", curves=curves))
    plot_files.append(plots.phase_heatmap(
        os.path.join(workdir, f"cutoff_{model}.png"), (mean < cutoff).astype(float), ns, snrs,
        title=f"{model}: mean test loss < {cutoff}", cbar_label=f"loss < {cutoff}",
        curves=curves, cmap="gray"))
    plot_files.append(_steps_figure(workdir, model, res, ns, snrs, config))
  if len(fits) > 1:
    plot_files.append(plots.boundary_overlay(
        os.path.join(workdir, "boundary_overlay.png"),
        {m: (snrs, fits[m]["crossings"], fits[m]["k"], fits[m]["c"]) for m in fits}, ns))
  dyn = {}
  if config.dynamics.enabled and "vit" in config.models:
    for name, rc in config.dynamics.runs.items():
      t0 = time.perf_counter()
      logs = run_dynamics(rc, config.data.layout, bool(config.data.project_noise),
                          config.vit.init, float(config.vit.init_std), int(config.seed))
      final = {k: float(np.mean(v[:, -1])) for k, v in logs.items()}
      dyn[name] = {"final_mean": final, "wall_s": round(time.perf_counter() - t0, 1),
                   "snr": sn.snr(float(rc.mu_norm), float(rc.sigma_p), int(rc.d)),
                   "n_snr2": int(rc.n) * sn.snr(float(rc.mu_norm), float(rc.sigma_p),
                                                int(rc.d)) ** 2}
      if paths.is_writer():
        paths.save_npz(os.path.join(workdir, f"dynamics_{name}.npz"), logs)
      plot_files += _dyn_figures(workdir, name, logs)
  extra = {"snr": snrs.tolist(), "n_values": ns.tolist(),
           "mu_norms": [float(m) for m in config.sweep.mu_norms], "fits": fits,
           "mean_test_loss": {m: np.nanmean(s["test_loss"], -1).tolist()
                              for m, s in sweeps.items()},
           "dynamics": dyn, "config": json.loads(config.to_json_best_effort())}
  md = tables.write_results(
      workdir, f"Benign overfitting phase diagram ({config.data.kind}, d={config.data.d}, "
      f"M={config.data.num_tokens})", rows, notes=_notes(config, fits, dyn, snrs),
      extra=extra, plots=plot_files)
  return {"rows": rows, "markdown": md, "sweeps": sweeps, "fits": fits, "dynamics": dyn}


PAPER_N_SNR2 = 1000.0  # Jiang et al. Fig. 1's red curve N·SNR² = 1000.


def _curves(snrs, ns, fit, theory_k, *, paper_curve: bool = False) -> dict:
  """Overlays (SNR, N): the interpolation fit, the theory slope through its crossings, the
  logistic decision line and (ViT) the paper's fixed N·SNR² = 1000 (at most four styles)."""
  s = np.geomspace(snrs.min(), snrs.max(), 100)
  out = {}
  if np.isfinite(fit["k"]):
    out[f"fit N·SNR^{fit['k']:.2f}={fit['c']:.3g}"] = (s, fit["c"] / s ** fit["k"])
    # Theory slope through the geometric mean of the crossings.
    cr = np.asarray(fit["crossings"])
    ok = np.isfinite(cr)
    c_th = float(np.exp(np.mean(np.log(ns[ok]) + theory_k * np.log(cr[ok]))))
    out[f"N·SNR^{theory_k:g}={c_th:.3g}"] = (s, c_th / s ** theory_k)
  lg = fit.get("logistic") or {}
  if np.isfinite(lg.get("k", np.nan)):
    out[f"logistic N·SNR^{lg['k']:.2f}={lg['c']:.3g}"] = (s, lg["c"] / s ** lg["k"])
  if paper_curve:
    out[f"paper N·SNR²={PAPER_N_SNR2:g}"] = (s, PAPER_N_SNR2 / s ** 2)
  return out


def _steps_figure(workdir: str, model: str, res: dict, ns, snrs, config) -> str:
  """Mean GD steps to train loss < ε (converged runs) against SNR, for three N."""
  steps = np.where(res["converged"] > 0.5, res["steps"], np.nan)
  picks = sorted({0, len(ns) // 2, len(ns) - 1})
  with warnings.catch_warnings():  # A (N, ‖μ‖) with no converged run is NaN (no point).
    warnings.simplefilter("ignore", RuntimeWarning)
    series = {f"N={ns[i]}": np.nanmean(steps[i], -1) for i in picks}
  return plots.line_plot(
      os.path.join(workdir, f"steps_{model}.png"), snrs, series,
      xlabel="SNR = ‖μ‖ / (σ_p √d), log scale", logx=True,
      ylabel=f"GD steps to train loss < {config.train.loss_threshold}",
      title=f"{model}: convergence time ({_eta_label(config, model)})", logy=True)


def _eta_label(config, model: str) -> str:
  """The GD step of `model`'s runs, in words (the CNN's may be normalised per ‖μ‖)."""
  if model == "cnn" and config.cnn.normalize_lr:
    return f"η = {config.cnn.learning_rate:g}/max(‖μ‖², σ̃_p² d)"
  return f"η = {config.cnn.learning_rate if model == 'cnn' else config.train.learning_rate:g}"


def _notes(config, fits, dyn, snrs) -> str:
  mus = [float(m) for m in config.sweep.mu_norms]
  lines = [f"Grid: N ∈ {list(config.sweep.n_values)}, ‖μ‖ ∈ {mus} "
           f"(SNR {snrs.min():.3g}..{snrs.max():.3g}), {config.sweep.trials} trials; "
           f"σ_p={config.data.sigma_p}, GD "
           f"{', '.join(f'{m}: {_eta_label(config, m)}' for m in config.models)}, "
           f"stop at train loss "
           f"< {config.train.loss_threshold} or {config.train.max_steps} steps.",
           f"Boundary: per N the SNR where the trial-mean test loss crosses "
           f"{config.report.cutoff}; least squares log N = log c − k log SNR; 95 % CI from "
           f"{config.report.bootstrap} bootstrap resamples of the trials."]
  for m, f in fits.items():
    lines.append(f"- {m}: k = {f['k']:.3g} (95 % CI {f['k_ci95'][0]:.3g}..{f['k_ci95'][1]:.3g}, "
                 f"regression s.e. {f['k_stderr']:.3g}) from {f['num_points']} N values; "
                 f"logistic fit of 1[loss < {config.report.cutoff}] on (log N, log SNR) over "
                 f"all runs: k = {f['logistic']['k']:.3g} (95 % CI "
                 f"{f['logistic']['k_ci95'][0]:.3g}..{f['logistic']['k_ci95'][1]:.3g}).")
    c = f["convergence"]
    lines.append(f"  Convergence time ({c['runs']} converged runs, median {c['median_steps']:g} "
                 f"steps, max {c['max_steps_seen']:g}): log t = a + b_N log N + b_μ log ‖μ‖ "
                 f"with b_N = {c['b_n']:.3g}, b_μ = {c['b_mu']:.3g} (R² {c['r2']:.2f}).")
  for name, d in dyn.items():
    fm = d["final_mean"]
    lines.append(f"- dynamics {name} (SNR {d['snr']:.3g}, N·SNR² {d['n_snr2']:.3g}): final test "
                 f"loss {fm['test_loss']:.3g}, attention signal {fm['attn_signal_mean']:.3g} vs "
                 f"ξ₂ {fm['attn_xi2_mean']:.3g}, γ₊ {fm['gamma_plus']:.3g}, "
                 f"y·ρ(ξ₂) {fm['rho_xi2_mean']:.3g}.")
  return "\n".join(lines)
