"""Study `sensitivity_vision`: do vision transformers learn lower-sensitivity functions?

"Transformers Learn Low Sensitivity Functions: Investigations and Implications"
(ICLR 2025, arXiv 2403.06925), §4: train several architectures to the same train accuracy
on one dataset, then measure on the training set the token-wise Gaussian sensitivity

  S_σ(f) = E_x (1/T) Σ_i Pr_ε[argmax f(x + ε·1_{patch i}) ≠ argmax f(x)],  ε ~ N(0, σ²I)

with grid-aligned p×p pixel patches as tokens (spec §2.1), for every σ in a list, plus
(optionally) the official code's scattered-pixel estimate (spec §2.2), the global variant
Pr[argmax f(x + E) ≠ argmax f(x)] with noise on every patch at once (App. A.2, spec §1) on
the same examples and σ grid, and the sharpness of each trained model (the official code's
`check_sharpness`, spec §4) with its Spearman rank correlation against the token-wise
sensitivity across the models (the paper's flatness link). Every σ is also reported as a
noise-to-signal ratio σ·√D / RMS‖x_i‖ (D = p·p·C pixels per patch, the RMS taken over the
patches of the evaluated examples). Writes results.md/json, a bar plot at the main σ,
sensitivity vs σ (token-wise solid, global dashed), sharpness vs sensitivity, and
per-patch heat maps.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from xsens import measures
from xsens.data import batching
from xsens.errors import ConfigError, is_finite_number, is_int
from xsens.measures import sensitivity as sens
from xsens.report import plots, tables
from xsens.train.progress import progress
from xsens.studies import compare
from xsens.train import sharding
from xsens.train import streams as streams_lib


def validate_sensitivity_config(sc, image_shape) -> None:
  """Checks `config.sensitivity` against the data's image shape (before any compile)."""
  h, w, _ = image_shape
  p = sc.patch_size
  if not (is_int(p) and p > 0 and h % p == 0 and w % p == 0):
    allowed = [d for d in range(1, min(h, w) + 1) if h % d == 0 and w % d == 0]
    raise ConfigError("sensitivity.patch_size",
                      f"{p} must divide the image size {h}x{w}; allowed: {allowed}")
  if not sc.sigmas or not all(is_finite_number(s) and s >= 0 for s in sc.sigmas):
    raise ConfigError("sensitivity.sigmas", f"must be a non-empty list of finite σ >= 0, got "
                      f"{list(sc.sigmas)}")
  if sc.main_sigma not in sc.sigmas:
    raise ConfigError("sensitivity.main_sigma",
                      f"{sc.main_sigma} must be one of sensitivity.sigmas {list(sc.sigmas)}")
  for field in ("num_draws", "num_examples", "batch_size"):
    if not (is_int(sc[field]) and sc[field] > 0):
      raise ConfigError(f"sensitivity.{field}", f"must be an int > 0, got {sc[field]!r}")
  if sc.chunk_size is not None and not (is_int(sc.chunk_size) and sc.chunk_size > 0):
    raise ConfigError("sensitivity.chunk_size", f"must be an int > 0 or None, got "
                      f"{sc.chunk_size!r}")
  streams_lib.check_field("sensitivity.streams", sc.get("streams"))
  noise_scale = sc.get("noise_scale", "absolute")
  if noise_scale not in sens.NOISE_SCALES:
    raise ConfigError("sensitivity.noise_scale", f"unknown value {noise_scale!r}; allowed: "
                      f"{', '.join(sens.NOISE_SCALES)}")
  validate_scattered_config(sc.scattered)
  validate_global_config(sc.get("global_noise"))
  validate_sharpness_config(sc.get("sharpness"))


def _check_enabled(block, path: str) -> None:
  if not isinstance(block.enabled, bool):
    raise ConfigError(f"{path}.enabled", f"must be True or False, got {block.enabled!r}")


def validate_global_config(block) -> None:
  """Checks `config.sensitivity.global_noise` (App. A.2; absent: not measured)."""
  if block is None:
    return
  path = "sensitivity.global_noise"
  _check_enabled(block, path)
  if not (is_int(block.num_draws) and block.num_draws > 0):
    raise ConfigError(f"{path}.num_draws", f"must be an int > 0 (noise draws per example "
                      f"and σ), got {block.num_draws!r}")


def validate_sharpness_config(block) -> None:
  """Checks `config.sensitivity.sharpness` (spec §4; absent: not measured)."""
  if block is None:
    return
  path = "sensitivity.sharpness"
  _check_enabled(block, path)
  if not (is_finite_number(block.sigma) and block.sigma >= 0):
    raise ConfigError(f"{path}.sigma", f"must be a finite σ >= 0 (absolute weight noise), "
                      f"got {block.sigma!r}")
  if not (is_int(block.num_draws) and block.num_draws > 1):
    raise ConfigError(f"{path}.num_draws", f"must be an int > 1 (the standard error is "
                      f"over the draws), got {block.num_draws!r}")


def validate_scattered_config(scattered) -> None:
  """Checks `config.sensitivity.scattered` (the official code's estimator, spec §2.2)."""
  path = "sensitivity.scattered"
  if not isinstance(scattered.enabled, bool):
    raise ConfigError(f"{path}.enabled", f"must be True or False, got {scattered.enabled!r}")
  if not (is_finite_number(scattered.sigma) and scattered.sigma >= 0):
    raise ConfigError(f"{path}.sigma", f"must be a finite σ >= 0, got {scattered.sigma!r}")
  if not (is_int(scattered.num_draws) and scattered.num_draws > 0):
    raise ConfigError(f"{path}.num_draws", f"must be an int > 0, got {scattered.num_draws!r}")
  if not (is_int(scattered.num_pixels) and scattered.num_pixels > 0):
    raise ConfigError(f"{path}.num_pixels", f"must be an int > 0 (positions drawn with "
                      f"replacement per mask), got {scattered.num_pixels!r}")


def validate(config, experiments) -> None:
  """`config.sensitivity` against the runs: the image shape, and the ViT's patch size (the
  tokens measured are the ViT's tokens)."""
  sc = config.sensitivity
  validate_sensitivity_config(sc, next(iter(experiments.values())).train.image_shape)
  compare.require_vit_patch_size(config, experiments, "sensitivity.patch_size", sc.patch_size)


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


@functools.partial(jax.jit, static_argnames=("model", "patch_size", "num_draws", "chunk_size"))
def _patch_batch(variables, images, mask, key, sigma, *, model, patch_size, num_draws,
                 chunk_size):
  """Per-example and per-patch flip rates of one padded batch (paper mode, spec §2.1)."""
  out = sens.token_sensitivity(
      functools.partial(model.apply, train=False), variables, images, key=key, mask=mask,
      patch_size=patch_size, sigma=sigma, num_draws=num_draws, chunk_size=chunk_size,
      example_chunk_size=None)
  return out["per_example"], out["per_patch_map"]


@functools.partial(jax.jit, static_argnames=("model", "num_draws", "num_pixels"))
def _scattered_batch(variables, images, mask, key, sigma, *, model, num_draws, num_pixels):
  """Per-example flip rates of one padded batch (the official code's mode, spec §2.2)."""
  out = sens.scattered_pixel_sensitivity(
      functools.partial(model.apply, train=False), variables, images, key=key, mask=mask,
      sigma=sigma, num_draws=num_draws, num_pixels=num_pixels, chunk_size=None,
      example_chunk_size=None)
  return out["per_example"]


@functools.partial(jax.jit, static_argnames=("model", "patch_size", "num_draws", "chunk_size"))
def _global_batch(variables, images, mask, key, sigma, *, model, patch_size, num_draws,
                  chunk_size):
  """Per-example flip rates of one padded batch with noise on every patch (App. A.2)."""
  out = measures.global_sensitivity(
      functools.partial(model.apply, train=False), variables, images, key=key, mask=mask,
      patch_size=patch_size, sigma=sigma, num_draws=num_draws, chunk_size=chunk_size,
      example_chunk_size=None)
  return out["per_example"]


@functools.partial(jax.jit, static_argnames=("model",))
def _sharpness_batch(variables, images, mask, key, sigma, *, model):
  """Masked means over one padded batch of one weight-noise draw (spec §4): the L1 logit
  change and the label flips. The draw depends on `key` only, not on the batch."""
  out = measures.sharpness(functools.partial(model.apply, train=False), variables, images,
                           key=key, sigma=sigma, num_draws=1, mask=mask)
  return out["sharpness_l1"], out["sharpness_flip"]


def _batches(images: np.ndarray, batch_size: int, mesh):
  """Yields (batch number, padded images, mask) — the last two global arrays sharded on
  the batch axis — and the host [batch_size] bool of real rows."""
  for i, (idx, mask) in enumerate(batching.padded_index_batches(len(images), batch_size)):
    yield i, *sharding.global_batch((images[idx], mask), mesh), mask > 0


def measure_model(result, sc, key, mesh, scale: float = 1.0) -> dict:
  """Train-set sensitivity of one trained model at every σ (and the scattered-pixel mode).

  The noise's standard deviation is σ·`scale` (`sensitivity.noise_scale`). Returns
  {"sigmas": {σ: (mean, stderr)}, "per_patch_map": [H/p, W/p] at the main σ,
  "scattered": (mean, stderr) or None}. The stderr is the standard error over examples
  (sample std of per-example means / √N), which includes the Monte-Carlo noise.
  """
  images = result.train.images[:sc.num_examples]
  over_batches = functools.partial(_map_batches, images, sc, mesh)
  out = {"sigmas": {}, "per_patch_map": None, "scattered": None}
  for s_idx, sigma in enumerate(progress(sc.sigmas, desc="σ sweep", unit="σ")):
    pe, pm = over_batches(lambda i, x, m, s_idx=s_idx, sigma=sigma: _patch_batch(
        result.variables, x, m, jax.random.fold_in(jax.random.fold_in(key, s_idx), i),
        jnp.float32(sigma * scale), model=result.model, patch_size=sc.patch_size,
        num_draws=sc.num_draws, chunk_size=sc.chunk_size))
    out["sigmas"][float(sigma)] = (float(pe.mean()), _stderr(pe))
    if sigma == sc.main_sigma:
      out["per_patch_map"] = pm.mean(axis=0)
  if sc.scattered.enabled:
    pe = over_batches(lambda i, x, m: _scattered_batch(
        result.variables, x, m, jax.random.fold_in(jax.random.fold_in(key, len(sc.sigmas)), i),
        jnp.float32(sc.scattered.sigma * scale), model=result.model,
        num_draws=sc.scattered.num_draws, num_pixels=sc.scattered.num_pixels))
    out["scattered"] = (float(pe.mean()), _stderr(pe))
  return out


def _map_batches(images: np.ndarray, sc, mesh, batch_fn):
  """`batch_fn(batch number, images, mask)` -> per-example outputs ([bs, ...] each), over
  the padded batches of `images` (`sensitivity.batch_size`, rounded up to the mesh), up
  to `sensitivity.streams` batches at once (`xsens.train.streams`; the results do not
  depend on it); the outputs concatenated over the real examples, on the host."""
  bs = _round_up(sc.batch_size, mesh.size)
  outs = streams_lib.ordered_map(
      lambda b: (jax.device_get(batch_fn(*b[:3])), b[3]), _batches(images, bs, mesh),
      streams_lib.resolve(sc.get("streams")))
  return jax.tree.map(lambda *a: np.concatenate(a),
                      *[jax.tree.map(lambda v, ok=ok: np.asarray(v)[ok], o) for o, ok in outs])


def _stderr(per_example: np.ndarray) -> float:
  n = len(per_example)
  return float(per_example.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")


def measure_global(result, sc, key, mesh, scale: float = 1.0) -> dict:
  """Train-set global sensitivity (noise on every patch at once, App. A.2) at every σ
  (standard deviation σ·`scale`).

  The same examples, batches and σ grid as `measure_model`, with
  `sensitivity.global_noise.num_draws` draws per example; its own keys (`key` is the
  model's key, folded with len(σ) + 1, then the σ index, then the batch), so the
  token-wise numbers do not change. Returns {σ: (mean, stderr over examples)}.
  """
  images = result.train.images[:sc.num_examples]
  key = jax.random.fold_in(key, len(sc.sigmas) + 1)
  out = {}
  for s_idx, sigma in enumerate(progress(sc.sigmas, desc="global σ sweep", unit="σ")):
    pe = _map_batches(images, sc, mesh, lambda i, x, m, s_idx=s_idx, sigma=sigma: _global_batch(
        result.variables, x, m, jax.random.fold_in(jax.random.fold_in(key, s_idx), i),
        jnp.float32(sigma * scale), model=result.model, patch_size=sc.patch_size,
        num_draws=sc.global_noise.num_draws, chunk_size=sc.chunk_size))
    out[float(sigma)] = (float(pe.mean()), _stderr(pe))
  return out


def measure_sharpness(result, sc, key, mesh) -> dict:
  """Sharpness of one trained model on the evaluated training examples (spec §4).

  Draw r adds N(0, σ²) to every parameter (`xsens.measures.sharpness` with the key
  fold_in(fold_in(key, len(σ) + 2), r), the same noisy weights for every batch); its value
  is the mean over the examples of the L1 logit change (and of the label flips). Returns
  {"sharpness_l1": (mean, stderr), "sharpness_flip": (mean, stderr)}, mean and standard
  error over the `sensitivity.sharpness.num_draws` draws (the examples are fixed).
  """
  shc = sc.sharpness
  images = result.train.images[:sc.num_examples]
  bs = _round_up(sc.batch_size, mesh.size)
  key = jax.random.fold_in(key, len(sc.sigmas) + 2)
  draws = np.zeros((shc.num_draws, 2))
  for r in range(shc.num_draws):
    k = jax.random.fold_in(key, r)
    sums, count = np.zeros(2), 0
    for _, x, m, valid in _batches(images, bs, mesh):
      l1, flip = _sharpness_batch(result.variables, x, m, k, jnp.float32(shc.sigma),
                                  model=result.model)
      n = int(valid.sum())
      sums += n * np.array([float(l1), float(flip)])
      count += n
    draws[r] = sums / count
  return {name: (float(draws[:, j].mean()), _stderr(draws[:, j]))
          for j, name in enumerate(("sharpness_l1", "sharpness_flip"))}


def token_rms(images: np.ndarray, patch_size: int) -> float:
  """RMS norm of a clean p×p patch, sqrt(mean over examples and patches of ‖x_i‖²), in
  float64 (patches tile the image, so it is sqrt(D · mean pixel²), D = p·p·C)."""
  x = np.asarray(images, np.float64)
  return math.sqrt(patch_size * patch_size * x.shape[-1] * float(np.mean(x * x)))


def noise_to_signal(sigma: float, patch_size: int, channels: int, rms: float) -> float:
  """σ relative to the tokens' scale: the RMS norm of a patch's noise, σ·√(p·p·C), over
  the RMS norm of a clean patch (`token_rms`)."""
  return sigma * math.sqrt(patch_size * patch_size * channels) / rms


def _ranks(values) -> np.ndarray:
  """Ranks 1..n of `values`, ties sharing their average rank."""
  v = np.asarray(values, np.float64)
  order = np.argsort(v, kind="stable")
  ranks = np.empty(len(v))
  ranks[order] = np.arange(1, len(v) + 1)
  for u in np.unique(v):
    ranks[v == u] = ranks[v == u].mean()
  return ranks


def spearman(x, y, *, exact_max_n: int = 8) -> tuple[float, float]:
  """Spearman's rank correlation of paired values (average ranks for ties) and its exact
  two-sided permutation p-value (the fraction of the n! orderings of y whose |ρ| is at
  least the observed one; NaN for n > exact_max_n). ρ is NaN when either side is constant
  or n < 2."""
  rx, ry = _ranks(x), _ranks(y)
  n = len(rx)

  def rho(a, b):
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float(np.sum(a * a) * np.sum(b * b)))
    return float(np.sum(a * b)) / den if den > 0 else float("nan")

  r = rho(rx, ry) if n >= 2 else float("nan")
  if math.isnan(r) or n > exact_max_n:
    return r, float("nan")
  perms = [rho(rx, ry[list(p)]) for p in itertools.permutations(range(n))]
  return r, float(np.mean([abs(q) >= abs(r) - 1e-12 for q in perms]))


def _enabled(sc, name: str) -> bool:
  """Whether the optional block `sensitivity.<name>` is present and enabled."""
  block = sc.get(name)
  return block is not None and block.enabled


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every run of `config.runs` (once per training seed, `config.num_seeds`),
  measures each, writes the report into `workdir`."""
  sc = config.sensitivity
  # Bad sensitivity settings are refused before anything trains or compiles.
  ids = compare.run_ids(config)
  probe = compare.validate_runs(config)
  validate(config, probe)
  mesh = sharding.data_mesh()
  results = compare.train_runs(config, workdir, overwrite=overwrite, experiments=probe)
  first = results[next(iter(results))]
  images = first.train.images[:sc.num_examples]
  rms = token_rms(images, sc.patch_size)
  rms_pixel = rms / math.sqrt(sc.patch_size ** 2 * images.shape[-1])
  scale = sens.noise_multiplier(sc.get("noise_scale", "absolute"), rms_pixel)
  key = jax.random.key(sc.seed)
  run_index = {name: j for j, name in enumerate(config.runs)}
  with_global, with_sharpness = _enabled(sc, "global_noise"), _enabled(sc, "sharpness")
  measured, measure_s = {}, {}
  for run_id, res in results.items():
    t0 = time.time()
    name, seed_index = ids[run_id]
    # Seed index 0 keeps the single-seed keys, so its numbers do not depend on num_seeds.
    model_key = jax.random.fold_in(key, run_index[name])
    if seed_index:
      model_key = jax.random.fold_in(model_key, seed_index)
    measured[run_id] = measure_model(res, sc, model_key, mesh, scale)
    if with_global:
      measured[run_id]["global"] = measure_global(res, sc, model_key, mesh, scale)
    if with_sharpness:
      measured[run_id]["sharpness"] = measure_sharpness(res, sc, model_key, mesh)
    measure_s[run_id] = round(time.time() - t0, 1)
  rows = compare.summary_rows(results)
  for row in rows:
    row["measure_s"] = measure_s[row["run"]]
    m = measured[row["run"]]
    for sigma, (mean, se) in m["sigmas"].items():
      row[f"S(σ={sigma:g})"] = mean
      row[f"s.e.(σ={sigma:g})"] = se
    if m["scattered"] is not None:
      row["S_scattered"], row["s.e._scattered"] = m["scattered"]
    for sigma, (mean, se) in m.get("global", {}).items():
      row[f"S_global(σ={sigma:g})"] = mean
      row[f"s.e._global(σ={sigma:g})"] = se
    for field, (mean, se) in m.get("sharpness", {}).items():
      row[field], row[f"s.e._{field}"] = mean, se
  multi_seed = compare.num_seeds(config) > 1
  # Plots, the sharpness link and the ordering are over the models: seed means when seeded.
  by_model = seed_means(measured, ids) if multi_seed else measured
  names = list(by_model)
  main = float(sc.main_sigma)
  nsr = {float(s): noise_to_signal(float(s) * scale, sc.patch_size, images.shape[-1], rms)
         for s in sc.sigmas}
  plot_files = [
      plots.bar_plot(os.path.join(workdir, "sensitivity_bar.png"), names,
                     [by_model[n]["sigmas"][main][0] for n in names],
                     errors=[by_model[n]["sigmas"][main][1] for n in names],
                     ylabel="train-set sensitivity (flip probability)", xlabel="model",
                     title=f"Token-wise sensitivity, σ={main:g}"),
      _sigma_plot(os.path.join(workdir, "sensitivity_vs_sigma.png"), by_model, nsr),
      plots.heatmap_grid(os.path.join(workdir, "sensitivity_patches.png"),
                         {n: by_model[n]["per_patch_map"] for n in names},
                         title=f"Per-patch sensitivity (σ={main:g}, p={sc.patch_size})",
                         cbar_label="flip probability", xlabel="patch column",
                         ylabel="patch row"),
  ]
  extra = {"per_patch_maps": {n: measured[n]["per_patch_map"].tolist() for n in measured},
           "sensitivity": _config_summary(sc),
           "noise_to_signal": {"token_rms": rms,
                               "token_dim": sc.patch_size ** 2 * int(images.shape[-1]),
                               "num_examples": len(images), "run": next(iter(results)),
                               "noise_scale": sc.get("noise_scale", "absolute"),
                               "by_sigma": {f"{s:g}": v for s, v in nsr.items()}}}
  if sc.scattered.enabled:
    extra["noise_to_signal"]["scattered"] = float(sc.scattered.sigma) * scale / rms_pixel
  if with_sharpness:
    extra["sharpness_vs_sensitivity"] = _sharpness_link(by_model, names, main)
    plot_files.append(_sharpness_plot(os.path.join(workdir, "sharpness_vs_sensitivity.png"),
                                      by_model, main, extra["sharpness_vs_sensitivity"]))
  columns = ["run", "params", "steps", "train_accuracy", "test_accuracy"] + [
      c for c in rows[0] if c.startswith(("S(", "s.e.(", "S_", "s.e._"))
      and "sharpness" not in c] + [
          c for c in rows[0] if "sharpness" in c] + ["wall_s", "measure_s"]
  seed_table = ""
  if multi_seed:
    means = [c for c in columns[2:] if not c.startswith("s.e.") and c not in
             ("wall_s", "measure_s")]
    extra["seed_summary"] = compare.seed_rows(rows, ids, means)
    seed_table = compare.seed_summary_markdown(extra["seed_summary"], means,
                                               "; its ± is over examples")
  notes = _notes(config, rows if not multi_seed else extra["seed_summary"], main,
                 min(sc.num_examples, len(probe[next(iter(probe))].train)), extra)
  md = tables.write_results(
      workdir, f"Token-wise sensitivity on {config.train.data.name}", rows, columns=columns,
      notes=seed_table + notes, plots=plot_files, extra=extra)
  return {"rows": rows, "markdown": md, "measured": measured, "noise_to_signal": nsr,
          "sharpness_vs_sensitivity": extra.get("sharpness_vs_sensitivity"),
          "seed_summary": extra.get("seed_summary")}


def seed_means(measured: dict, ids: dict) -> dict:
  """`measured` per run id → per run (model): every (mean, s.e.) pair becomes the mean
  over the run's seeds of the means and the standard error over the seeds; the per-patch
  map is the seed mean."""
  groups: dict[str, list[dict]] = {}
  for run_id, m in measured.items():
    groups.setdefault(ids[run_id][0], []).append(m)

  def over(values):
    return compare.mean_and_stderr([v[0] for v in values])

  out = {}
  for name, ms in groups.items():
    agg = {"sigmas": {s: over([m["sigmas"][s] for m in ms]) for s in ms[0]["sigmas"]},
           "per_patch_map": np.mean([m["per_patch_map"] for m in ms], axis=0),
           "scattered": (over([m["scattered"] for m in ms])
                         if ms[0]["scattered"] is not None else None)}
    for part in ("global", "sharpness"):
      if part in ms[0]:
        agg[part] = {k: over([m[part][k] for m in ms]) for k in ms[0][part]}
    out[name] = agg
  return out


def _sharpness_link(measured, names, main_sigma) -> dict:
  """Spearman's ρ across the models between each sharpness and S(main σ)."""
  s = [measured[n]["sigmas"][main_sigma][0] for n in names]
  out = {"sigma": main_sigma, "num_models": len(names)}
  for name in ("sharpness_l1", "sharpness_flip"):
    rho, p = spearman([measured[n]["sharpness"][name][0] for n in names], s)
    out[f"spearman_{name}"], out[f"p_{name}"] = rho, p
  return out


def _sigma_plot(path: str, measured, nsr) -> str:
  """Sensitivity vs σ per model: token-wise solid, global dashed (same colour), ± s.e.
  bands; the top axis gives σ as noise-to-signal."""
  sigmas = list(nsr)
  fig, ax = plt.subplots(figsize=(6.6, 3.8))
  for (name, m), style in zip(measured.items(), plots.line_styles(len(measured))):
    parts = [("token-wise", "-", m["sigmas"])]
    if "global" in m:
      parts.append(("global", "--", m["global"]))
    for i, (label, linestyle, values) in enumerate(parts):
      y = np.array([values[s][0] for s in sigmas])
      e = np.array([values[s][1] for s in sigmas])
      ax.plot(sigmas, y, **{**style, "linestyle": linestyle if len(parts) > 1
                             else style["linestyle"]},
              label=name if i == 0 else None)
      ax.fill_between(sigmas, y - e, y + e, alpha=0.15, color=style["color"])
  if any("global" in m for m in measured.values()):
    ax.plot([], [], "k-", label="token-wise (one patch)")
    ax.plot([], [], "k--", label="global (all patches)")
  ax.set_xscale("log")
  ax.set_xticks(sigmas, [f"{s:g}" for s in sigmas])
  ax.minorticks_off()
  ratio = nsr[sigmas[0]] / sigmas[0] if sigmas[0] > 0 else None
  if ratio:
    top = ax.secondary_xaxis("top", functions=(lambda s: s * ratio, lambda r: r / ratio))
    top.set_xticks([nsr[s] for s in sigmas], [f"{nsr[s]:.2g}" for s in sigmas])
    top.minorticks_off()
    top.set_xlabel("noise-to-signal σ√D / RMS‖x_i‖", fontsize=8)
  plots.styled_axes(ax, "Sensitivity vs noise scale", "σ (pixel units, log scale)",
                    "train-set sensitivity (flip probability)")
  plots.legend_outside(ax)
  fig.tight_layout()
  return plots.save_figure(fig, path)


def _sharpness_plot(path: str, measured, main_sigma, link) -> str:
  """Token-wise sensitivity at the main σ against sharpness (L1), one point per model."""
  fig, ax = plt.subplots(figsize=(6.0, 3.6))
  for (name, m), style in zip(measured.items(), plots.line_styles(len(measured))):
    (x, xe), (y, ye) = m["sharpness"]["sharpness_l1"], m["sigmas"][main_sigma]
    ax.errorbar([x], [y], xerr=[xe], yerr=[ye], fmt=style["marker"], color=style["color"],
                markerfacecolor="none", capsize=2, label=name)
  plots.styled_axes(ax, f"Sensitivity vs sharpness: Spearman ρ = "
                    f"{link['spearman_sharpness_l1']:.2f} ({link['num_models']} models)",
                    "sharpness: mean L1 logit change (logit units)",
                    f"token-wise sensitivity, σ={main_sigma:g} (flip probability)")
  plots.legend_outside(ax)
  fig.tight_layout()
  return plots.save_figure(fig, path)


def _config_summary(sc) -> dict:
  out = {"patch_size": sc.patch_size, "sigmas": [float(s) for s in sc.sigmas],
         "num_draws": sc.num_draws, "num_examples": sc.num_examples,
         "scattered": sc.scattered.to_dict()}
  for name in ("global_noise", "sharpness"):
    if sc.get(name) is not None:
      out[name] = sc[name].to_dict()
  return out


def _notes(config, rows, main_sigma, n, extra) -> str:
  sc = config.sensitivity
  key = f"S(σ={main_sigma:g})"
  ranked = sorted(rows, key=lambda r: r[key])
  order = " < ".join(f"{r['run']} ({r[key]:.3g})" for r in ranked)
  text = (
      f"Sensitivity: label-flip probability when one {sc.patch_size}×{sc.patch_size} "
      f"patch gets N(0, σ²) noise (pixel space, after normalisation), averaged over the "
      f"patches, {sc.num_draws} draws per patch and the first {n} training examples; "
      f"± is the standard error over examples. Models trained to train accuracy "
      f"{config.train.target_train_accuracy} (or {config.train.total_steps} steps).\n\n"
      f"Ordering at σ={main_sigma:g}: {order}.")
  if _enabled(sc, "global_noise"):
    text += (f"\n\nS_global: the same with N(0, σ²) on every patch at once (App. A.2), "
             f"{sc.global_noise.num_draws} draws per example and σ, the same examples; "
             f"± is the standard error over examples.")
  ns = extra["noise_to_signal"]
  if ns["noise_scale"] == "token_rms":
    text += ("\n\nnoise_scale=token_rms: every σ above is in units of the RMS pixel of the "
             "measured examples (the noise's standard deviation is σ·RMS pixel), so σ is the "
             "noise-to-signal ratio.")
  text += (f"\n\nσ relative to the tokens' scale (noise-to-signal σ·√D / RMS‖x_i‖, "
           f"D = {ns['token_dim']} pixels per patch, RMS‖x_i‖ = {ns['token_rms']:.4g} over the "
           f"patches of the {ns['num_examples']} examples): " +
           ", ".join(f"σ={s} → {v:.3g}" for s, v in ns["by_sigma"].items()) + ".")
  link = extra.get("sharpness_vs_sensitivity")
  if link is not None:
    shc = sc.sharpness
    text += (f"\n\nSharpness (official `check_sharpness`, eval mode): N(0, {shc.sigma:g}²) "
             f"on every parameter, {shc.num_draws} draws; mean L1 logit change and label-flip "
             f"rate on the same examples; ± is the standard error over the draws. Spearman ρ "
             f"across the {link['num_models']} models with S(σ={main_sigma:g}): "
             f"{link['spearman_sharpness_l1']:.2f} (L1, exact permutation p = "
             f"{link['p_sharpness_l1']:.3g}), {link['spearman_sharpness_flip']:.2f} (flips, "
             f"p = {link['p_sharpness_flip']:.3g}); with this few models only a near-perfect "
             f"ordering is distinguishable from chance.")
  return text
