"""Study `sensitivity_vision`: do vision transformers learn lower-sensitivity functions?

"Transformers Learn Low Sensitivity Functions: Investigations and Implications"
(ICLR 2025, arXiv 2403.06925), §4: train several architectures to the same train accuracy
on one dataset, then measure on the training set the token-wise Gaussian sensitivity

  S_σ(f) = E_x (1/T) Σ_i Pr_ε[argmax f(x + ε·1_{patch i}) ≠ argmax f(x)],  ε ~ N(0, σ²I)

with grid-aligned p×p pixel patches as tokens (spec §2.1), for every σ in a list, plus
(optionally) the official code's scattered-pixel estimate (spec §2.2). Writes
results.md/json, a bar plot at the main σ, sensitivity vs σ, and per-patch heat maps.
"""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from xsens.data import batching
from xsens.errors import ConfigError, is_finite_number, is_int
from xsens.measures import sensitivity as sens
from xsens.report import plots, tables
from xsens.studies import compare
from xsens.train import sharding


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
  validate_scattered_config(sc.scattered)


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


def _batches(images: np.ndarray, batch_size: int, mesh):
  """Yields (batch number, padded images, mask) — the last two global arrays sharded on
  the batch axis — and the host [batch_size] bool of real rows."""
  for i, (idx, mask) in enumerate(batching.padded_index_batches(len(images), batch_size)):
    yield i, *sharding.global_batch((images[idx], mask), mesh), mask > 0


def measure_model(result, sc, key, mesh) -> dict:
  """Train-set sensitivity of one trained model at every σ (and the scattered-pixel mode).

  Returns {"sigmas": {σ: (mean, stderr)}, "per_patch_map": [H/p, W/p] at the main σ,
  "scattered": (mean, stderr) or None}. The stderr is the standard error over examples
  (sample std of per-example means / √N), which includes the Monte-Carlo noise.
  """
  images = result.train.images[:sc.num_examples]
  bs = _round_up(sc.batch_size, mesh.size)
  out = {"sigmas": {}, "per_patch_map": None, "scattered": None}
  for s_idx, sigma in enumerate(sc.sigmas):
    per_example, maps = [], []
    for i, x, m, valid in _batches(images, bs, mesh):
      k = jax.random.fold_in(jax.random.fold_in(key, s_idx), i)
      pe, pm = _patch_batch(result.variables, x, m, k, jnp.float32(sigma), model=result.model,
                            patch_size=sc.patch_size, num_draws=sc.num_draws,
                            chunk_size=sc.chunk_size)
      per_example.append(np.asarray(pe)[valid])
      maps.append(np.asarray(pm)[valid])
    pe = np.concatenate(per_example)
    out["sigmas"][float(sigma)] = (float(pe.mean()), _stderr(pe))
    if sigma == sc.main_sigma:
      out["per_patch_map"] = np.concatenate(maps).mean(axis=0)
  if sc.scattered.enabled:
    per_example = []
    for i, x, m, valid in _batches(images, bs, mesh):
      k = jax.random.fold_in(jax.random.fold_in(key, len(sc.sigmas)), i)
      pe = _scattered_batch(result.variables, x, m, k, jnp.float32(sc.scattered.sigma),
                            model=result.model, num_draws=sc.scattered.num_draws,
                            num_pixels=sc.scattered.num_pixels)
      per_example.append(np.asarray(pe)[valid])
    pe = np.concatenate(per_example)
    out["scattered"] = (float(pe.mean()), _stderr(pe))
  return out


def _stderr(per_example: np.ndarray) -> float:
  n = len(per_example)
  return float(per_example.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every run of `config.runs`, measures each, writes the report into `workdir`."""
  sc = config.sensitivity
  # Bad sensitivity settings are refused before anything trains or compiles.
  probe = compare.validate_runs(config)
  validate(config, probe)
  mesh = sharding.data_mesh()
  results = compare.train_runs(config, workdir, overwrite=overwrite, experiments=probe)
  key = jax.random.key(sc.seed)
  measured, measure_s = {}, {}
  for j, (name, res) in enumerate(results.items()):
    t0 = time.time()
    measured[name] = measure_model(res, sc, jax.random.fold_in(key, j), mesh)
    measure_s[name] = round(time.time() - t0, 1)
  rows = compare.summary_rows(results)
  for row in rows:
    row["measure_s"] = measure_s[row["run"]]
    m = measured[row["run"]]
    for sigma, (mean, se) in m["sigmas"].items():
      row[f"S(σ={sigma:g})"] = mean
      row[f"s.e.(σ={sigma:g})"] = se
    if m["scattered"] is not None:
      row["S_scattered"], row["s.e._scattered"] = m["scattered"]
  names = list(results)
  main = float(sc.main_sigma)
  plot_files = [
      plots.bar_plot(os.path.join(workdir, "sensitivity_bar.png"), names,
                     [measured[n]["sigmas"][main][0] for n in names],
                     errors=[measured[n]["sigmas"][main][1] for n in names],
                     ylabel="train-set sensitivity", title=f"Token-wise sensitivity, σ={main:g}"),
      plots.line_plot(os.path.join(workdir, "sensitivity_vs_sigma.png"),
                      [float(s) for s in sc.sigmas],
                      {n: [measured[n]["sigmas"][float(s)][0] for s in sc.sigmas] for n in names},
                      errors={n: [measured[n]["sigmas"][float(s)][1] for s in sc.sigmas]
                              for n in names},
                      xlabel="σ", ylabel="sensitivity", logx=True,
                      title="Sensitivity vs noise scale"),
      plots.heatmap_grid(os.path.join(workdir, "sensitivity_patches.png"),
                         {n: measured[n]["per_patch_map"] for n in names},
                         title=f"Per-patch sensitivity (σ={main:g}, p={sc.patch_size})",
                         cbar_label="flip probability"),
  ]
  columns = ["run", "params", "steps", "train_accuracy", "test_accuracy"] + [
      c for c in rows[0] if c.startswith(("S(", "s.e.(", "S_", "s.e._"))] + [
          "wall_s", "measure_s"]
  notes = _notes(config, rows, main, min(sc.num_examples, len(probe[names[0]].train)))
  md = tables.write_results(
      workdir, f"Token-wise sensitivity on {config.train.data.name}", rows, columns=columns,
      notes=notes, plots=plot_files,
      extra={"per_patch_maps": {n: measured[n]["per_patch_map"].tolist() for n in names},
             "sensitivity": _config_summary(sc)})
  return {"rows": rows, "markdown": md, "measured": measured}


def _config_summary(sc) -> dict:
  return {"patch_size": sc.patch_size, "sigmas": [float(s) for s in sc.sigmas],
          "num_draws": sc.num_draws, "num_examples": sc.num_examples,
          "scattered": sc.scattered.to_dict()}


def _notes(config, rows, main_sigma, n) -> str:
  sc = config.sensitivity
  key = f"S(σ={main_sigma:g})"
  ranked = sorted(rows, key=lambda r: r[key])
  order = " < ".join(f"{r['run']} ({r[key]:.3g})" for r in ranked)
  return (
      f"Sensitivity: label-flip probability when one {sc.patch_size}×{sc.patch_size} "
      f"patch gets N(0, σ²) noise (pixel space, after normalisation), averaged over the "
      f"patches, {sc.num_draws} draws per patch and the first {n} training examples; "
      f"± is the standard error over examples. Models trained to train accuracy "
      f"{config.train.target_train_accuracy} (or {config.train.total_steps} steps).\n\n"
      f"Ordering at σ={main_sigma:g}: {order}.")
