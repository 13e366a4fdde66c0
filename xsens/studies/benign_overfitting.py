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
     or with `sweep.pad_to` "chunk" the chunk's, with a sample mask) of `xsens.lab.gd_sweep`:
     `vmap` over groups of `sweep.vmap_size` runs, the groups in sequence (on CPU one run
     at a time, split over `sweep.streams` host threads; on an accelerator the whole chunk
     in one vmap), through the one loop, so an interrupted sweep resumes from the chunks
     on disk (`workdir/sweep_<model>/`).
  2. Boundary: for each N the SNR where the trial-mean test loss crosses `cutoff` (0.2)
     by interpolation in log SNR, then least squares log N = log c − k log SNR
     (theory, `theory_exponent`: k = 2 for the ViT, Jiang et al. Thm 4.1/4.2; k = q for
     the CNN, Cao et al. Thm 4.3/4.4; k = 4 for the ReLU CNN, Kou et al. ICML 2023), with
     a bootstrap-over-trials 95 % interval for k. Beside it, a logistic
     fit of 1[test loss < cutoff] on (log N, log SNR) over all runs, whose decision line
     gives k (`xsens.lab.phase_boundary`); the plots also draw the paper's N·SNR² = 1000.
  3. Dynamics: for one harmful and one benign setting, every GD step logs the losses,
     pooled attention, V projections, QK logits and the stable rank of W_V
     (docs/papers/benign_overfitting.md §6).
  4. Convergence time: a power-law fit of the recorded steps to train loss < ε over N and
     ‖μ‖ (`phase_boundary.convergence_fit`) and steps_<model>.png; the η and ε dependence
     is measured by experiments/benign_convergence_time.py.
  5. Report: heat maps, cutoff maps with the fitted and theoretical curves, the ViT/CNN
     overlay, dynamics figures (`xsens.report.phase_diagram`), results.md / results.json.

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
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from mlcollections_configs import benign_overfitting as configs
from xsens import paths
from xsens.data import signal_noise as sn
from xsens.models import one_layer_vit as vit_lib
from xsens.models import two_layer_cnn as cnn_lib
from xsens.lab import gd_sweep, phase_boundary
from xsens.report import phase_diagram, plots, tables
from xsens.train import full_batch_gd as gd
from xsens.train import reduced_vit_gd
from xsens.train.workdir import Workdir

RESULT_FIELDS = ("test_loss", "test_accuracy", "train_loss", "train_accuracy", "steps",
                 "converged")


def validate(config) -> None:
  """ConfigError naming `config.<field>` for any unusable value, before anything compiles
  or touches the workdir: every check is a field check of the config file
  (`mlcollections_configs.benign_overfitting.validate`)."""
  configs.validate(config)


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
  al.'s condition η ≤ Õ(min{‖μ‖⁻², σ_p⁻² d⁻¹}) (docs/papers/benign_overfitting.md §8) with the
  strongest noise token; a fixed η = 0.1 makes σ(z) = z^q explode on this data (‖ξ₂‖ ≈ 5√M σ_p √d).
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
  """The k of the theoretical boundary N·SNR^k = const at fixed d
  (docs/papers/benign_overfitting.md §4, §8).

  ViT: 2 (Jiang et al. Thm 4.1–4.2). CNN σ(z) = max(0, z)^q: q (Cao et al., stated for
  q > 2); ReLU, q = 1: 4 (Kou et al.'s n‖μ‖⁴ ≥ C d σ_p⁴, i.e. N·SNR⁴ ≥ C/d).
  """
  if model == "vit":
    return 2.0
  q = float(config.cnn.q)
  return 4.0 if q == 1.0 else q


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


def chunk_padding(config, chunk_n) -> int:
  """The N that a chunk's runs are padded to: the grid's largest for `sweep.pad_to` "grid"
  (the default: one program for every chunk), the chunk's largest for "chunk" (a chunk of
  the default grids holds one N: no padding, 1.8x less GD work on average over N = 2..20,
  but one compiled program per N; on CPU the compile per program outweighs the default
  study's chunks, docs/benchmarks.md)."""
  if config.sweep.pad_to == "grid":
    return int(max(config.sweep.n_values))
  return int(np.max(chunk_n))


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
                 "vmap_size": config.sweep.vmap_size,
                 "pad_to": config.sweep.pad_to}}
  fp["model_config"] = (config.vit if model == "vit" else config.cnn).to_dict()
  return json.loads(json.dumps(fp, default=str))


def sweep_dir(workdir: str, model: str) -> str:
  """The sweep's own run directory (a `Workdir`) inside the study's workdir."""
  return os.path.join(workdir, f"sweep_{model}")


_SWEEP_ADDED_DEFAULTS = {"grid.vmap_size": 0, "grid.pad_to": "grid"}
_SWEEP_HINTS = {
    "grid.vmap_size": ("a sweep whose fingerprint has no sweep.vmap_size (one vmap per "
                       "chunk) resumes with --config.sweep.vmap_size=0"),
    "grid.pad_to": ("a sweep whose fingerprint has no sweep.pad_to (every chunk padded to "
                    "the grid's largest N) resumes with --config.sweep.pad_to=grid (the default)")}


def check_sweep(config, workdir: str, model: str, overwrite: bool = False) -> Workdir:
  """The (unprepared) `Workdir` of `model`'s sweep; ConfigError on `workdir`, nothing
  written, if it holds a sweep of another config or one in the chunk-file format
  (`gd_sweep.check`)."""
  return gd_sweep.check(sweep_dir(workdir, model), sweep_fingerprint(config, model),
                        overwrite, added_defaults=_SWEEP_ADDED_DEFAULTS, hints=_SWEEP_HINTS)


def run_sweep(config, workdir: str, model: str, *, overwrite: bool = False,
              max_chunks: int | None = None, pools=None, log=print) -> dict:
  """Runs (or resumes) the sweep of `model`; returns {field: [nN, nMu, trials]} + timing.

  `gd_sweep.run` over the flattened grid (`grid_points`: run r gets fold_in(key(seed), r),
  N and ‖μ‖), `sweep.chunk_size` runs per program, one program per padded N
  (`chunk_padding`), so an interrupted sweep resumes at its last chunk. `max_chunks` stops
  after computing that many new chunks (to simulate an interruption). Extra keys:
  "complete", "wall_s_computed", "chunks_computed".
  """
  wd = check_sweep(config, workdir, model, overwrite)
  n, mu, _ = grid_points(config)
  n_max = int(max(config.sweep.n_values))
  vmap_size = gd_sweep.resolved_vmap_size(config.sweep.vmap_size)

  @functools.cache
  def chunk_fn(n_pad: int):  # One program per padded N (`sweep.pad_to`).
    return gd_sweep.chunk_program(make_run_fn(config, model, n_max, pools, n_pad), vmap_size)

  wall_s, computed = gd_sweep.run(
      wd, sweep_fingerprint(config, model), (n, mu), seed=int(config.seed),
      chunk_size=int(config.sweep.chunk_size), vmap_size=vmap_size,
      streams=config.sweep.streams,
      program_for=lambda n_rows, mu_rows: chunk_fn(chunk_padding(config, n_rows)),
      name=model, overwrite=overwrite, max_chunks=max_chunks, log=log)
  return load_sweep(config, wd.path) | {"wall_s_computed": wall_s,
                                        "chunks_computed": computed}


def load_sweep(config, path: str) -> dict:
  """The sweep saved in `path` as {field: [nN, nMu, trials]} (NaN where missing), "complete"."""
  shape = (len(config.sweep.n_values), len(config.sweep.mu_norms), config.sweep.trials)
  # float64 (steps, converged as 0./1.).
  flat, complete = gd_sweep.load(path, int(np.prod(shape)), RESULT_FIELDS)
  return {k: v.reshape(shape) for k, v in flat.items()} | {"complete": complete}


# ------------------------------------------------------------------------------------------
# Training dynamics (docs/papers/benign_overfitting.md §6).



def dynamics_metrics_fn(params_frozen_data):
  """Builds metrics(params) -> {name: scalar} for the ViT (docs/papers/benign_overfitting.md §6
  items 1–4, 6)."""
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
    # Margin decomposition y·f = a_1·y x_1ᵀW_Vw_O + Σ_{j≥2} a_j·y x_jᵀW_Vw_O
    # (docs/papers/benign_overfitting.md §6 item 5).
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
    boot = dict(bootstrap=int(config.report.bootstrap), seed=int(config.seed))
    fit = phase_boundary.fit_boundary(ns, snrs, res["test_loss"], cutoff, **boot)
    fit["logistic"] = phase_boundary.fit_boundary_logistic(ns, snrs, res["test_loss"], cutoff,
                                                           **boot)
    fits[model] = fit
    theory = theory_exponent(config, model)
    fit["convergence"] = conv = phase_boundary.convergence_fit(
        res["steps"], res["converged"], ns, config.sweep.mu_norms)
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
    curves = phase_diagram.boundary_curves(snrs, ns, fit, theory, paper_curve=model == "vit")
    plot_files += phase_diagram.heatmaps(workdir, model, res["test_loss"], ns, snrs, cutoff,
                                         curves)
    plot_files.append(phase_diagram.steps_figure(
        workdir, model, res, ns, snrs, loss_threshold=config.train.loss_threshold,
        eta_label=_eta_label(config, model)))
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
      plot_files += phase_diagram.dynamics_figures(workdir, name, logs)
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
