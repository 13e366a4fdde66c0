"""Study `sensitivity_vision`: do vision transformers learn lower-sensitivity functions?

"Transformers Learn Low Sensitivity Functions: Investigations and Implications"
(ICLR 2025, arXiv 2403.06925), §4: train several architectures to the same train accuracy
on one dataset, then measure on the training set the token-wise Gaussian sensitivity

  S_σ(f) = E_x (1/T) Σ_i Pr_ε[argmax f(x + ε·1_{patch i}) ≠ argmax f(x)],  ε ~ N(0, σ²I)

with grid-aligned p×p pixel patches as tokens (docs/papers/sensitivity.md §2.1), for every σ in a
list, plus (optionally) the official code's scattered-pixel estimate (docs/papers/sensitivity.md
§2.2), the global variant Pr[argmax f(x + E) ≠ argmax f(x)] with noise on every patch at once (App.
A.2, docs/papers/sensitivity.md §1) on the same examples and σ grid, and the sharpness of each
trained model (the official code's `check_sharpness`, docs/papers/sensitivity.md §4) with its
Spearman rank correlation against the token-wise sensitivity across the models (the paper's
flatness link). Every σ is also reported as a noise-to-signal ratio σ·√D / RMS‖x_i‖ (D = p·p·C
pixels per patch, the RMS taken over the patches of the evaluated examples). Writes
results.md/json, a bar plot at the main σ, sensitivity vs σ (token-wise solid, global dashed),
sharpness vs sensitivity, and per-patch heat maps.
"""

from __future__ import annotations

import itertools
import math
import os
import time

import jax
import matplotlib.pyplot as plt
import numpy as np

from mlcollections_configs import sensitivity_vision as configs
from xsens.lab import multirun
from xsens.lab import sensitivity as lab_sens
from xsens.measures import sensitivity as sens
from xsens.report import plots, seed_stats, tables, training
from xsens.train import sharding


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


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every run of `config.runs` (once per training seed, `config.num_seeds`),
  measures each, writes the report into `workdir`."""
  sc = config.sensitivity
  # Bad sensitivity settings are refused before anything trains or compiles.
  ids = multirun.run_ids(config)
  configs.validate(config)
  probe = multirun.validate_runs(config)
  lab_sens.validate_against_runs(config, probe)
  mesh = sharding.data_mesh()
  results = multirun.train_runs(config, workdir, overwrite=overwrite, experiments=probe)
  first = results[next(iter(results))]
  images = first.train.images[:sc.num_examples]
  rms = lab_sens.token_rms(images, sc.patch_size)
  rms_pixel = rms / math.sqrt(sc.patch_size ** 2 * images.shape[-1])
  scale = sens.noise_multiplier(sc.noise_scale, rms_pixel)
  key = jax.random.key(sc.seed)
  run_index = {name: j for j, name in enumerate(config.runs)}
  with_global = lab_sens.enabled(sc, "global_noise")
  with_sharpness = lab_sens.enabled(sc, "sharpness")
  measured, measure_s = {}, {}
  for run_id, res in results.items():
    t0 = time.time()
    name, seed_index = ids[run_id]
    # Seed index 0 keeps the single-seed keys, so its numbers do not depend on num_seeds.
    model_key = jax.random.fold_in(key, run_index[name])
    if seed_index:
      model_key = jax.random.fold_in(model_key, seed_index)
    measured[run_id] = lab_sens.measure_model(res, sc, model_key, mesh, scale)
    if with_global:
      measured[run_id]["global"] = lab_sens.measure_global(res, sc, model_key, mesh, scale)
    if with_sharpness:
      measured[run_id]["sharpness"] = lab_sens.measure_sharpness(res, sc, model_key, mesh)
    measure_s[run_id] = round(time.time() - t0, 1)
  rows = multirun.summary_rows(results)
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
  multi_seed = multirun.num_seeds(config) > 1
  # Plots, the sharpness link and the ordering are over the models: seed means when seeded.
  by_model = seed_means(measured, ids) if multi_seed else measured
  names = list(by_model)
  main = float(sc.main_sigma)
  nsr = {float(s): lab_sens.noise_to_signal(float(s) * scale, sc.patch_size,
                                            images.shape[-1], rms)
         for s in sc.sigmas}
  plot_files = [
      plots.bar_plot(os.path.join(workdir, "sensitivity_bar.png"), names,
                     [by_model[n]["sigmas"][main][0] for n in names],
                     errors=[by_model[n]["sigmas"][main][1] for n in names],
                     ylabel="train-set sensitivity (flip probability)", xlabel="model",
                     title=f"Token-wise sensitivity, σ={main:g}"),
      plots.sigma_plot(os.path.join(workdir, "sensitivity_vs_sigma.png"), by_model, nsr),
      plots.heatmap_grid(os.path.join(workdir, "sensitivity_patches.png"),
                         {n: by_model[n]["per_patch_map"] for n in names},
                         title=f"Per-patch sensitivity (σ={main:g}, p={sc.patch_size})",
                         cbar_label="flip probability", xlabel="patch column",
                         ylabel="patch row"),
  ]
  extra = {"per_patch_maps": {n: measured[n]["per_patch_map"].tolist() for n in measured},
           "sensitivity": lab_sens.config_summary(sc),
           "noise_to_signal": {"token_rms": rms,
                               "token_dim": sc.patch_size ** 2 * int(images.shape[-1]),
                               "num_examples": len(images), "run": next(iter(results)),
                               "noise_scale": sc.noise_scale,
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
    extra["seed_summary"] = seed_stats.seed_rows(rows, ids, means)
    seed_table = seed_stats.seed_summary_markdown(extra["seed_summary"], means,
                                               "; its ± is over examples")
  notes = _notes(config, rows if not multi_seed else extra["seed_summary"], main,
                 min(sc.num_examples, len(probe[next(iter(probe))].train)), extra, rows)
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
    return seed_stats.mean_and_stderr([v[0] for v in values])

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


def _notes(config, rows, main_sigma, n, extra, run_rows) -> str:
  sc = config.sensitivity
  key = f"S(σ={main_sigma:g})"
  ranked = sorted(rows, key=lambda r: r[key])
  order = " < ".join(f"{r['run']} ({r[key]:.3g})" for r in ranked)
  text = (
      f"Sensitivity: label-flip probability when one {sc.patch_size}×{sc.patch_size} "
      f"patch gets N(0, σ²) noise (pixel space, after normalisation), averaged over the "
      f"patches, {sc.num_draws} draws per patch and the first {n} training examples; "
      f"± is the standard error over examples. "
      f"{training.stop_note(config.train, run_rows)}\n\n"
      f"Ordering at σ={main_sigma:g}: {order}.")
  if lab_sens.enabled(sc, "global_noise"):
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
