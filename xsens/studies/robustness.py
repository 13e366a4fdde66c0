"""Study `robustness`: ViT vs ResNet under input and model perturbations.

"Understanding Robustness of Transformers for Image Classification" (Bhojanapalli et al.,
ICCV 2021, arXiv 2103.14586), docs/papers/google_papers.md §E, on the one trainer's models:
  - common corruptions (15 × 5 severities): accuracy per corruption, category and
    severity, mean corruption accuracy, mCE relative to `robustness.baseline_run`; the
    corrupted images are read from a pre-computed TFDS set (`robustness.corruptions.
    tfds_name`, CIFAR-10-C for setup cifar10) when the data_dir has it, else synthesised
    (`corruption_source`); the report says which;
  - adversarial: FGSM and PGD accuracy vs ε, transfer between the runs, and the structure
    of the PGD perturbations (energy per patch on the ViT patch grid, low-frequency share);
  - model perturbations: accuracy with one block / attention / MLP removed, per-layer
    relative weight noise, and the sensitivity paper's sharpness;
  - representations: linear CKA between every pair of layers (and across the runs) and a
    linear probe per layer (these two sections can be skipped: `robustness.skip_sections`);
  - data scale: runs of one model trained on different training-set sizes
    (`data.num_train`, config `robustness.py:scale`) get a per-size table
    (`data_scale_section`, `data_scale.png`).
Each section is a small function of trained runs; the report is results.md/json + plots.
"""

from __future__ import annotations

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from mlcollections_configs import robustness as configs
from xsens.data import splits
from xsens.errors import ConfigError
from xsens.lab import corruptions, multirun
from xsens.lab import robustness as lab_robustness
from xsens.measures import adversarial as adv
from xsens.measures import perturbations as pert
from xsens.measures import similarity
from xsens.report import plots, seed_stats, tables
from xsens.train import evaluators


OPTIONAL_SECTIONS = ("perturbations", "representations")


def skipped_sections(rc) -> tuple[str, ...]:
  """`robustness.skip_sections`: optional sections not measured (e.g. the data-scale
  sweep, which reports the corruption / adversarial measures per scale)."""
  skip = tuple(rc.skip_sections or ())
  bad = [s for s in skip if s not in OPTIONAL_SECTIONS]
  if bad:
    raise ConfigError("robustness.skip_sections", f"unknown {bad}; allowed: "
                      f"{', '.join(OPTIONAL_SECTIONS)} (corruptions and adversarial always run)")
  return skip


def validate_patch_size(config, experiments) -> None:
  """`robustness.patch_size` is the grid of the perturbation-structure measures: it must
  divide the images and be the ViT's patch size."""
  p = config.robustness.patch_size
  h, w, _ = next(iter(experiments.values())).train.image_shape
  if h % p or w % p:
    raise ConfigError("robustness.patch_size", f"{p} must divide the image size {h}x{w}")
  multirun.require_vit_patch_size(config, experiments, "robustness.patch_size", p)


# --------------------------------------------------------------------------- adversarial


def _attack_fns(apply_fn, ac):
  """FGSM / PGD batch functions of one model for `evaluators.over_split` (reduce
  "concat"): `fgsm(batch, variables, ε, lo, hi)` and `pgd(batch, variables, key, ε, step,
  lo, hi)` -> adversarial inputs [B, ...]; the arguments after the batch are traced, so
  each compiles once per model."""
  def fgsm(batch, variables, eps, lo, hi):
    return adv.fgsm(apply_fn, variables, batch["image"], labels=batch["label"], epsilon=eps,
                    norm=ac.norm, clip_min=lo, clip_max=hi)["adv_inputs"]

  def pgd(batch, variables, k, eps, step, lo, hi):
    return adv.pgd(apply_fn, variables, batch["image"], labels=batch["label"], key=k,
                   epsilon=eps, num_steps=ac.pgd_steps, step_size=step, norm=ac.norm,
                   clip_min=lo, clip_max=hi)["adv_inputs"]
  return fgsm, pgd


def adversarial_section(results, rc, normalize, key) -> dict:
  """FGSM/PGD accuracy vs ε per run, transfer at the main ε, and perturbation structure."""
  ac = rc.adversarial
  lo, hi = lab_robustness.PIXEL_RANGE[normalize]
  scale = lab_robustness.PIXEL_SCALE[normalize]
  out = {"fgsm": {}, "pgd": {}, "transfer": {}, "patch_energy": {}, "low_freq_share": {},
         "patch_alignment": {}}
  deltas = {}
  for j, (name, res) in enumerate(results.items()):
    images = res.test.images[:rc.num_examples]
    labels = res.test.labels[:rc.num_examples]
    split = {"image": images, "label": labels}
    fgsm, pgd = _attack_fns(res.apply_fn, ac)
    out["fgsm"][name], out["pgd"][name] = [], []
    for e_idx, eps in enumerate(ac.epsilons):
      e = eps * scale
      x_f = evaluators.over_split(fgsm, split, args=(res.variables, e, lo, hi),
                                  reduce="concat", batch_size=rc.batch_size)
      k = jax.random.fold_in(jax.random.fold_in(key, j), e_idx)
      x_p = evaluators.over_split(
          pgd, split, args=(res.variables, k, e, e * ac.step_size_fraction, lo, hi),
          reduce="concat", batch_size=rc.batch_size)
      for attack, x_adv in (("fgsm", x_f), ("pgd", x_p)):
        out[attack][name].append(lab_robustness.split_accuracy(
            res.apply_fn, res.variables, x_adv, labels, rc.batch_size))
      if eps == ac.main_epsilon:
        deltas[name] = x_p - images
    d = jnp.asarray(deltas[name])
    out["patch_energy"][name] = np.asarray(adv.patch_energy(d, rc.patch_size).mean(0))
    out["low_freq_share"][name] = float(adv.frequency_share(d, ac.low_freq_cutoff).mean())
    out["patch_alignment"][name] = float(adv.patch_alignment(d, rc.patch_size).mean())
  for source in results:
    for target in results:
      if source != target:
        images = results[target].test.images[:rc.num_examples]
        labels = results[target].test.labels[:rc.num_examples]
        x_adv = images + deltas[source]
        out["transfer"][f"{source}->{target}"] = lab_robustness.split_accuracy(
            results[target].apply_fn, results[target].variables, x_adv, labels,
            rc.batch_size)
  return out


# ------------------------------------------------------------------ model perturbations


def perturbation_section(results, rc, key) -> dict:
  """Layer removal, per-layer relative weight noise and sharpness of every run."""
  out = {"layer_removal": {}, "weight_noise": {}, "sharpness": {}}
  for j, (name, res) in enumerate(results.items()):
    images = res.test.images[:rc.num_examples]
    labels = res.test.labels[:rc.num_examples]
    out["layer_removal"][name] = lab_robustness.split_layer_removal(
        res, images, labels, batch_size=rc.batch_size)
    out["weight_noise"][name] = lab_robustness.split_weight_noise(
        res, images, labels, jax.random.fold_in(key, j),
        relative_scale=rc.perturbations.relative_scale,
        num_draws=rc.perturbations.num_draws, batch_size=rc.batch_size)
    train_x = jnp.asarray(res.train.images[:rc.perturbations.sharpness_examples])
    sharpness = jax.jit(functools.partial(
        pert.sharpness, res.apply_fn, sigma=rc.perturbations.sharpness_sigma,
        num_draws=rc.perturbations.num_draws))
    s = sharpness(res.variables, train_x, key=jax.random.fold_in(key, 1000 + j))
    out["sharpness"][name] = {k: float(v) for k, v in s.items()}
  return out


# ---------------------------------------------------------------------- representations


def representation_section(results, rc) -> dict:
  """Layer-by-layer linear CKA within and across runs, and per-layer linear probes."""
  feats, probes, cka = {}, {}, {}
  for name, res in results.items():
    n = rc.representations.num_examples
    features = jax.jit(functools.partial(similarity.layer_features, res.apply_fn))
    test_f = _forward_order(features(res.variables, jnp.asarray(res.test.images[:n])))
    train_f = _forward_order(features(res.variables, jnp.asarray(res.train.images[:n])))
    feats[name] = test_f
    cka[name] = np.asarray(similarity.cka_matrix(list(test_f.values())))
    acc = similarity.layerwise_probe_accuracy(
        train_f, jnp.asarray(res.train.labels[:n]), test_f, jnp.asarray(res.test.labels[:n]),
        num_classes=res.train.num_classes)
    probes[name] = {layer: float(a) for layer, a in acc.items()}
  names = list(results)
  cross = {}
  for a in names:
    for b in names:
      if a < b:
        cross[f"{a} vs {b}"] = np.asarray(similarity.cka_matrix(
            list(feats[a].values()), list(feats[b].values())))
  return {"cka": cka, "cross_cka": cross, "probes": probes,
          "layers": {n: list(f) for n, f in feats.items()}}


def _forward_order(features: dict) -> dict:
  """Layers in network order (jit returns dict keys sorted as strings: block_10 < block_2)."""
  key = lambda name: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
  return {name: features[name] for name in sorted(features, key=key)}


# ------------------------------------------------------------------------------ report


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains the runs, measures every section, writes results.md/json and the plots.

  (A config with an `imagenet` section, setup "imagenet", runs
  `xsens.studies.robustness_imagenet` instead: `xsens.studies.STUDY_SETUPS`.)
  """
  rc = config.robustness
  configs.validate(config)
  experiments = multirun.validate_runs(config)
  lab_robustness.validate_robustness_config(rc, list(experiments), config.train.data.normalize)
  validate_patch_size(config, experiments)
  skipped_sections(rc)
  source = corruptions.corruption_source(rc, config.train.data)  # Before training: may refuse.
  results = multirun.train_runs(config, workdir, overwrite=overwrite, experiments=experiments)
  key = jax.random.key(rc.seed)
  normalize = config.train.data.normalize
  timings = {}
  with lab_robustness.timed(timings, "corruptions"):
    corr = corruptions.corruption_section(
        results, rc, normalize, source=source,
        data_configs={n: e.config.data for n, e in experiments.items()},
        data_seeds={n: e.config.seed for n, e in experiments.items()})
  with lab_robustness.timed(timings, "adversarial"):
    advs = adversarial_section(results, rc, normalize, jax.random.fold_in(key, 1))
  skip = skipped_sections(rc)
  perts = reps = None
  if "perturbations" not in skip:
    with lab_robustness.timed(timings, "perturbations"):
      perts = perturbation_section(results, rc, jax.random.fold_in(key, 2))
  if "representations" not in skip:
    with lab_robustness.timed(timings, "representations"):
      reps = representation_section(results, rc)
  rows = _rows(results, rc, corr, advs, perts)
  ids = multirun.run_ids(config)
  scale = data_scale_section(results, rows, ids)
  num_classes = next(iter(results.values())).train.num_classes
  plot_files = _plots(workdir, rc, corr, advs, perts, reps, num_classes=num_classes)
  if scale:
    plot_files.append(_scale_plot(workdir, scale, num_classes))
  seed_summary, seed_table = None, ""
  if multirun.num_seeds(config) > 1:
    columns = [c for c in rows[0] if c not in ("run", "params", "train_examples")]
    seed_summary = seed_stats.seed_rows(rows, ids, columns)
    seed_table = seed_stats.seed_summary_markdown(
        seed_summary, columns, f"; every seed's mCE is relative to run `{rc.baseline_run}`")
  md = tables.write_results(
      workdir, f"Robustness on {config.train.data.name}", rows,
      notes=seed_table + _notes(rc, advs, perts, corr, config.train.data, scale),
      plots=plot_files, extra={**_extra(corr, advs, perts, reps), "timings_s": timings,
                               "corruption_source": corr["source"], "data_scale": scale,
                               "seed_summary": seed_summary})
  return {"rows": rows, "markdown": md, "corruptions": corr, "adversarial": advs,
          "perturbations": perts, "representations": reps, "data_scale": scale,
          "seed_summary": seed_summary}


# -------------------------------------------------------------------------- data scale

SCALE_MEASURES = ("test_accuracy", "mCA", "rel_mCE", "FGSM", "PGD", "worst_removal_acc")


def data_scale_section(results, rows, ids=None) -> dict:
  """The measures per training-set size, for each model kind trained on several sizes.

  Runs are grouped by model name (e.g. vit, resnet18); a group counts only if its runs
  have different numbers of training examples (`data.num_train`, e.g. the
  `robustness.py:scale` sweep). The training seeds of a run (`ids`, from
  `multirun.run_ids`; None: every run id is its own run) are averaged. Returns
  {model: {"runs": [...], "train_examples": [...], "seeds": [...], <measure>: [mean ...],
  "<measure> s.e.": [standard error over seeds (NaN for one seed) ...]}} sorted by size
  ({} when no group qualifies); FGSM / PGD at the main ε.
  """
  by_row = {r["run"]: r for r in rows}
  ids = ids or {name: (name, 0) for name in results}
  groups: dict[str, dict[int, list[str]]] = {}
  for run_id, res in results.items():
    size = by_row[run_id]["train_examples"]
    groups.setdefault(res.summary["model"], {}).setdefault(size, []).append(run_id)
  out = {}
  for model, by_size in groups.items():
    if len(by_size) < 2:
      continue
    sizes = sorted(by_size)
    first = by_row[by_size[sizes[0]][0]]
    entry = {"runs": [ids[by_size[n][0]][0] for n in sizes], "train_examples": sizes,
             "seeds": [len(by_size[n]) for n in sizes]}
    for m in SCALE_MEASURES:
      col = next((k for k in first if k == m or k.startswith(f"{m}@")), None)
      if col is None:  # (worst_removal_acc: absent when perturbations are skipped)
        continue
      stats = [seed_stats.mean_and_stderr([by_row[r][col] for r in by_size[n]]) for n in sizes]
      entry[m] = [mean for mean, _ in stats]
      entry[f"{m} s.e."] = [se for _, se in stats]
    out[model] = entry
  return out


def _scale_plot(workdir, scale, num_classes=None) -> str:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.4))
  styles = plots.line_styles(len(scale))
  sizes = sorted({n for e in scale.values() for n in e["train_examples"]})
  for ax, (measure, title) in zip(axes, (("test_accuracy", "clean test accuracy"),
                                         ("mCA", "mean corruption accuracy"),
                                         ("PGD", "PGD accuracy (main ε)"))):
    for (model, entry), style in zip(scale.items(), styles):
      se = entry.get(f"{measure} s.e.")
      seeds = max(entry.get("seeds") or [1])
      ax.errorbar(entry["train_examples"], entry[measure],
                  yerr=None if se is None or not np.isfinite(se).any() else np.nan_to_num(se),
                  capsize=3, label=model + (f" ({seeds} seeds, ± s.e.)" if seeds > 1 else ""),
                  **style)
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{n:,}" for n in sizes])  # The sizes trained, not powers of 10.
    ax.minorticks_off()
    plots.chance_line(ax, num_classes)
    plots.styled_axes(ax, title, "training examples (log scale)", plots.ACCURACY)
  plots.legend_outside(axes[-1])
  fig.suptitle("Robustness vs training-set size (from scratch)")
  fig.tight_layout()
  path = os.path.join(workdir, "data_scale.png")
  return plots.save_figure(fig, path)


def _rows(results, rc, corr, advs, perts) -> list[dict]:
  rows = []
  main = rc.adversarial.epsilons.index(rc.adversarial.main_epsilon)
  for name, res in results.items():
    s = corr["summary"][name]
    row = {"run": name, "params": res.summary["num_params"],
           "train_examples": len(res.train.labels),
           "test_accuracy": s["clean"], "mCA": s["mca"], "mCE": corr["mce"][name]["mce"],
           "rel_mCE": corr["mce"][name]["relative_mce"],
           **{f"acc_{c}": v for c, v in s["per_category"].items()},
           f"FGSM@{rc.adversarial.main_epsilon:g}": advs["fgsm"][name][main],
           f"PGD@{rc.adversarial.main_epsilon:g}": advs["pgd"][name][main],
           "low_freq_share": advs["low_freq_share"][name],
           "patch_alignment": advs["patch_alignment"][name]}
    if perts is not None:
      row.update({
          "worst_removal_acc": min(perts["layer_removal"][name]["accuracy"].values()),
          "worst_weight_noise_acc": min(perts["weight_noise"][name]["per_layer"].values()),
          "sharpness_l1": perts["sharpness"][name]["sharpness_l1"],
          "sharpness_flip": perts["sharpness"][name]["sharpness_flip"]})
    rows.append(row)
  return rows


def _plots(workdir, rc, corr, advs, perts, reps, num_classes=None) -> list[str]:
  """The study's figures (see docs/results.md, "Figures"); `num_classes` draws the chance
  line on the accuracy plots."""
  names = list(corr["summary"])
  sev = [int(s) for s in rc.corruptions.severities]
  eps = [float(e) for e in rc.adversarial.epsilons]
  files = [
      plots.line_plot(os.path.join(workdir, "corruption_severity.png"), sev,
                      corr["by_severity"], xlabel="corruption severity (1 = mildest)",
                      ylabel="accuracy (mean over corruptions)",
                      title="Accuracy vs corruption severity", num_classes=num_classes),
      plots.line_plot(os.path.join(workdir, "adversarial_epsilon.png"), eps,
                      {**{f"{n} FGSM": advs["fgsm"][n] for n in names},
                       **{f"{n} PGD": advs["pgd"][n] for n in names}},
                      xlabel="ε (pixel units in [0, 1])", ylabel=plots.ACCURACY,
                      title=f"{rc.adversarial.norm} attacks", num_classes=num_classes),
      plots.heatmap_grid(os.path.join(workdir, "perturbation_patch_energy.png"),
                         advs["patch_energy"],
                         title=f"PGD perturbation energy per {rc.patch_size}×{rc.patch_size} "
                               f"patch (ε={rc.adversarial.main_epsilon:g})",
                         cbar_label="energy share", xlabel="patch column",
                         ylabel="patch row"),
  ]
  if reps is not None:
    files.append(plots.heatmap_grid(os.path.join(workdir, "cka_layers.png"),
                                    {**reps["cka"], **reps["cross_cka"]},
                                    title="Linear CKA between layers", cbar_label="linear CKA",
                                    xlabel="layer", ylabel="layer",
                                    tick_labels=_cka_ticks(reps),
                                    axis_labels={p: (f"{p.partition(' vs ')[2]} layer",
                                                     f"{p.partition(' vs ')[0]} layer")
                                                 for p in reps["cross_cka"]}))
  for name in names if perts is not None else ():
    removal = perts["layer_removal"][name]["accuracy"]
    labels = [f"{layer}:{part}" for layer, part in removal]
    files.append(plots.bar_plot(
        os.path.join(workdir, f"layer_removal_{name}.png"), labels, list(removal.values()),
        ylabel="test accuracy (fraction correct)", xlabel="removed part (layer:part)",
        title=f"{name}: one part removed "
        f"(intact {perts['layer_removal'][name]['baseline']:.3f})", num_classes=num_classes))
  if reps is None:
    return files
  files.append(plots.line_plot(
      os.path.join(workdir, "linear_probes.png"),
      list(range(1, 1 + max(len(p) for p in reps["probes"].values()))),
      {n: list(p.values()) + [np.nan] * (max(len(q) for q in reps["probes"].values()) - len(p))
       for n, p in reps["probes"].items()},
      xlabel="layer (1 = first)", ylabel="probe test accuracy (fraction correct)",
      title="Linear probe per layer", num_classes=num_classes))
  return files


def _cka_ticks(reps) -> dict:
  """{panel: (column layer names, row layer names)} for the CKA heat maps: a run's own
  map is its layers × its layers; "a vs b" is a's layers (rows) × b's layers (columns)."""
  layers = reps.get("layers", {})
  out = {n: (layers[n], layers[n]) for n in reps["cka"] if n in layers}
  for panel in reps["cross_cka"]:
    a, _, b = panel.partition(" vs ")
    if a in layers and b in layers:
      out[panel] = (layers[b], layers[a])
  return out


def _source_note(corr, rc, data_config) -> str:
  if corr["source"] == "tfds":
    return (f"Corrupted images: read from TFDS `{rc.corruptions.tfds_name}` "
            f"(`<corruption>_<severity>` sets in {splits.resolve_data_dir(data_config)!r}; "
            f"the first {rc.num_examples} of each set's seeded order, preprocessed like the "
            "clean split). ")
  dataset = rc.corruptions.tfds_name
  why = (f" because `{dataset}` is not (fully) prepared in the data_dir or "
         "robustness.corruptions.source='synthesize'" if dataset else "")
  return (f"Corrupted images: synthesised from the clean test images by "
          f"xsens.measures.corruptions (seed {rc.seed}){why}. ")


def _scale_note(scale) -> str:
  if not scale:
    return ""
  def cell(e, m, i):
    se = e[f"{m} s.e."][i]
    return f"{e[m][i]:.3f}" + (f" ± {se:.3f}" if np.isfinite(se) else "")
  parts = []
  for model, e in scale.items():
    cells = ", ".join(
        f"n={n}: clean {cell(e, 'test_accuracy', i)} / mCA {cell(e, 'mCA', i)} / PGD "
        f"{cell(e, 'PGD', i)}" for i, n in enumerate(e["train_examples"]))
    seeds = max(e["seeds"])
    parts.append(f"{model} ({cells}" + (f"; mean ± s.e. over {seeds} seeds" if seeds > 1
                                        else "") + ")")
  return " Data scale (runs grouped by model, training examples n): " + "; ".join(parts) + "."


def _notes(rc, advs, perts, corr=None, data_config=None, scale=None) -> str:
  transfer = ", ".join(f"{k}: {v:.3f}" for k, v in advs["transfer"].items())
  source = "" if corr is None else _source_note(corr, rc, data_config)
  warning = (corr or {}).get("rel_mce_warning")
  return (
      (f"**Warning:** {warning}.\n\n" if warning else "") +
      f"Accuracies on the first {rc.num_examples} test examples. {source}Corruptions: "
      f"{len(rc.corruptions.names)} × severities {list(rc.corruptions.severities)} "
      f"(`acc_<category>` = mean over its corruptions and severities); mCE relative to "
      f"`{rc.baseline_run}`. Attacks: {rc.adversarial.norm}, ε in [0, 1] pixel units, PGD "
      f"{rc.adversarial.pgd_steps} steps of ε·{rc.adversarial.step_size_fraction:g} with a "
      f"random start. Transfer (PGD at ε={rc.adversarial.main_epsilon:g}, target accuracy): "
      f"{transfer}. `low_freq_share`: share of the PGD perturbation's energy below "
      f"{rc.adversarial.low_freq_cutoff:g}× Nyquist; `patch_alignment` 0.5 = no preference "
      f"for the {rc.patch_size}-pixel patch grid, 1 = constant within patches."
      + ("" if perts is None else
         f" `worst_removal_acc`: accuracy with the most harmful single block / attention / MLP "
         f"removed; `worst_weight_noise_acc`: with N(0, ({rc.perturbations.relative_scale:g}·"
         f"‖W‖/√numel)²) noise on the most fragile layer's kernels "
         f"({rc.perturbations.num_draws} draws). Sharpness: the sensitivity paper's code "
         f"metric (θ + N(0, {rc.perturbations.sharpness_sigma:g}²), "
         f"{rc.perturbations.num_draws} draws, train set).")
      + ("" if not skipped_sections(rc) else
         f" Not measured (robustness.skip_sections): {', '.join(skipped_sections(rc))}.")
      + _scale_note(scale or {}))


def _extra(corr, advs, perts, reps) -> dict:
  def keyed(d):
    return {f"{k[0]}:{k[1]}" if isinstance(k, tuple) else str(k): v for k, v in d.items()}
  out = {
      "corruption_accuracy": {n: keyed(a) for n, a in corr["accuracy"].items()},
      "corruption_summary": corr["summary"], "mce": corr["mce"],
      "rel_mce_warning": corr.get("rel_mce_warning"),
      "adversarial": {k: advs[k] for k in ("fgsm", "pgd", "transfer", "low_freq_share",
                                           "patch_alignment")},
      "patch_energy": {n: m.tolist() for n, m in advs["patch_energy"].items()},
  }
  if perts is not None:
    out.update({
        "layer_removal": {n: {"baseline": r["baseline"], "accuracy": keyed(r["accuracy"])}
                          for n, r in perts["layer_removal"].items()},
        "weight_noise": {n: {"baseline": w["baseline"], "per_layer": w["per_layer"]}
                         for n, w in perts["weight_noise"].items()},
        "sharpness": perts["sharpness"]})
  if reps is not None:
    out.update({
        "cka": {n: m.tolist() for n, m in {**reps["cka"], **reps["cross_cka"]}.items()},
        "layers": reps["layers"], "probes": reps["probes"]})
  return out
