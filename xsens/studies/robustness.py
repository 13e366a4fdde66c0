"""Study `robustness`: ViT vs ResNet under input and model perturbations.

"Understanding Robustness of Transformers for Image Classification" (Bhojanapalli et al.,
ICCV 2021, arXiv 2103.14586), spec google_papers.md §E, on the one trainer's models:
  - common corruptions (15 × 5 severities): accuracy per corruption, category and
    severity, mean corruption accuracy, mCE relative to `robustness.baseline_run`;
  - adversarial: FGSM and PGD accuracy vs ε, transfer between the runs, and the structure
    of the PGD perturbations (energy per patch on the ViT patch grid, low-frequency share);
  - model perturbations: accuracy with one block / attention / MLP removed, per-layer
    relative weight noise, and the sensitivity paper's sharpness;
  - representations: linear CKA between every pair of layers (and across the runs) and a
    linear probe per layer.
Each section is a small function of trained runs; the report is results.md/json + plots.
"""

from __future__ import annotations

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from xsens.errors import ConfigError
from xsens.measures import adversarial as adv
from xsens.measures import corruption_eval
from xsens.measures import perturbations as pert
from xsens.measures import similarity
from xsens.report import plots, tables
from xsens.studies import compare
from xsens.studies import robustness_common as common

# Kept here for callers of the old names; defined in `robustness_common`.
PIXEL_SCALE = common.PIXEL_SCALE
PIXEL_RANGE = common.PIXEL_RANGE
validate_robustness_config = common.validate_robustness_config


def validate_patch_size(config, experiments) -> None:
  """`robustness.patch_size` is the grid of the perturbation-structure measures: it must
  divide the images and be the ViT's patch size."""
  p = config.robustness.patch_size
  h, w, _ = next(iter(experiments.values())).train.image_shape
  if h % p or w % p:
    raise ConfigError("robustness.patch_size", f"{p} must divide the image size {h}x{w}")
  compare.require_vit_patch_size(config, experiments, "robustness.patch_size", p)


# --------------------------------------------------------------------------- corruptions


def corruption_section(results, rc, normalize) -> dict:
  """Accuracy per (corruption, severity) of every run, summaries and mCE."""
  acc, summary = {}, {}
  for name, res in results.items():
    images = res.test.images[:rc.num_examples]
    labels = res.test.labels[:rc.num_examples]
    label_fn = common.bind(res.apply_fn, res.variables)
    acc[name] = common.corruption_accuracy(
        label_fn, images, labels, normalize=normalize, names=list(rc.corruptions.names),
        severities=list(rc.corruptions.severities), seed=rc.seed, batch_size=rc.batch_size)
    clean = common.accuracy(label_fn, images, labels, rc.batch_size)
    summary[name] = corruption_eval.summarize(acc[name], clean)
  errs = {n: corruption_eval.errors(a) for n, a in acc.items()}
  mce = corruption_eval.mce_table(errs, rc.baseline_run,
                                  {n: 1 - s["clean"] for n, s in summary.items()})
  by_severity = {n: [float(np.mean([a[(c, s)] for c in rc.corruptions.names]))
                     for s in rc.corruptions.severities] for n, a in acc.items()}
  return {"accuracy": acc, "summary": summary, "mce": mce, "by_severity": by_severity}


# --------------------------------------------------------------------------- adversarial


def _attack_fns(apply_fn, variables, ac):
  """Jitted FGSM / PGD of one model (closed over its variables, see
  `robustness_common`); ε, step size, key and pixel range are traced: one compile each."""
  fgsm = jax.jit(lambda x, y, eps, lo, hi: adv.fgsm(
      apply_fn, variables, x, labels=y, epsilon=eps, norm=ac.norm, clip_min=lo,
      clip_max=hi)["adv_inputs"])
  pgd = jax.jit(lambda x, y, k, eps, step, lo, hi: adv.pgd(
      apply_fn, variables, x, labels=y, key=k, epsilon=eps, num_steps=ac.pgd_steps,
      step_size=step, norm=ac.norm, clip_min=lo, clip_max=hi)["adv_inputs"])
  return fgsm, pgd


def adversarial_section(results, rc, normalize, key) -> dict:
  """FGSM/PGD accuracy vs ε per run, transfer at the main ε, and perturbation structure."""
  ac = rc.adversarial
  lo, hi = common.PIXEL_RANGE[normalize]
  scale = common.PIXEL_SCALE[normalize]
  out = {"fgsm": {}, "pgd": {}, "transfer": {}, "patch_energy": {}, "low_freq_share": {},
         "patch_alignment": {}}
  deltas = {}
  label_fns = {name: common.bind(res.apply_fn, res.variables) for name, res in results.items()}
  for j, (name, res) in enumerate(results.items()):
    images = res.test.images[:rc.num_examples]
    labels = res.test.labels[:rc.num_examples]
    fgsm, pgd = _attack_fns(res.apply_fn, res.variables, ac)
    out["fgsm"][name], out["pgd"][name] = [], []
    for e_idx, eps in enumerate(ac.epsilons):
      e = eps * scale
      x_f = common.batched(lambda x, y: fgsm(x, y, e, lo, hi), images, labels,
                           batch_size=rc.batch_size)
      k = jax.random.fold_in(jax.random.fold_in(key, j), e_idx)
      x_p = common.batched(lambda x, y: pgd(x, y, k, e, e * ac.step_size_fraction, lo, hi),
                           images, labels, batch_size=rc.batch_size)
      out["fgsm"][name].append(common.accuracy(label_fns[name], x_f, labels, rc.batch_size))
      out["pgd"][name].append(common.accuracy(label_fns[name], x_p, labels, rc.batch_size))
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
        out["transfer"][f"{source}->{target}"] = common.accuracy(
            label_fns[target], x_adv, labels, rc.batch_size)
  return out


# ------------------------------------------------------------------ model perturbations


def perturbation_section(results, rc, key) -> dict:
  """Layer removal, per-layer relative weight noise and sharpness of every run."""
  out = {"layer_removal": {}, "weight_noise": {}, "sharpness": {}}
  for j, (name, res) in enumerate(results.items()):
    images = res.test.images[:rc.num_examples]
    labels = res.test.labels[:rc.num_examples]
    out["layer_removal"][name] = common.layer_removal_accuracy(
        res.apply_fn, res.variables, images, labels, model=res.model,
        batch_size=rc.batch_size)
    out["weight_noise"][name] = common.weight_noise_accuracy(
        res.apply_fn, res.variables, images, labels, jax.random.fold_in(key, j),
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

  A config with an `imagenet` section (setup "imagenet") evaluates pretrained checkpoints on
  streamed ImageNet instead: see `xsens.studies.robustness_imagenet`.
  """
  if "imagenet" in config:
    from xsens.studies import robustness_imagenet  # pylint: disable=g-import-not-at-top
    return robustness_imagenet.run(config, workdir, overwrite=overwrite)
  rc = config.robustness
  experiments = compare.validate_runs(config)
  common.validate_robustness_config(rc, list(experiments), config.train.data.normalize)
  validate_patch_size(config, experiments)
  results = compare.train_runs(config, workdir, overwrite=overwrite, experiments=experiments)
  key = jax.random.key(rc.seed)
  normalize = config.train.data.normalize
  timings = {}
  with common.timed(timings, "corruptions"):
    corr = corruption_section(results, rc, normalize)
  with common.timed(timings, "adversarial"):
    advs = adversarial_section(results, rc, normalize, jax.random.fold_in(key, 1))
  with common.timed(timings, "perturbations"):
    perts = perturbation_section(results, rc, jax.random.fold_in(key, 2))
  with common.timed(timings, "representations"):
    reps = representation_section(results, rc)
  rows = _rows(results, rc, corr, advs, perts)
  plot_files = _plots(workdir, rc, corr, advs, perts, reps)
  md = tables.write_results(
      workdir, f"Robustness on {config.train.data.name}", rows, notes=_notes(rc, advs, perts),
      plots=plot_files, extra={**_extra(corr, advs, perts, reps), "timings_s": timings})
  return {"rows": rows, "markdown": md, "corruptions": corr, "adversarial": advs,
          "perturbations": perts, "representations": reps}


def _rows(results, rc, corr, advs, perts) -> list[dict]:
  rows = []
  main = rc.adversarial.epsilons.index(rc.adversarial.main_epsilon)
  for name, res in results.items():
    s = corr["summary"][name]
    removal = perts["layer_removal"][name]
    row = {"run": name, "params": res.summary["num_params"],
           "test_accuracy": s["clean"], "mCA": s["mca"], "mCE": corr["mce"][name]["mce"],
           "rel_mCE": corr["mce"][name]["relative_mce"],
           **{f"acc_{c}": v for c, v in s["per_category"].items()},
           f"FGSM@{rc.adversarial.main_epsilon:g}": advs["fgsm"][name][main],
           f"PGD@{rc.adversarial.main_epsilon:g}": advs["pgd"][name][main],
           "low_freq_share": advs["low_freq_share"][name],
           "patch_alignment": advs["patch_alignment"][name],
           "worst_removal_acc": min(removal["accuracy"].values()),
           "worst_weight_noise_acc": min(perts["weight_noise"][name]["per_layer"].values()),
           "sharpness_l1": perts["sharpness"][name]["sharpness_l1"],
           "sharpness_flip": perts["sharpness"][name]["sharpness_flip"]}
    rows.append(row)
  return rows


def _plots(workdir, rc, corr, advs, perts, reps) -> list[str]:
  names = list(corr["summary"])
  sev = [int(s) for s in rc.corruptions.severities]
  eps = [float(e) for e in rc.adversarial.epsilons]
  files = [
      plots.line_plot(os.path.join(workdir, "corruption_severity.png"), sev,
                      corr["by_severity"], xlabel="severity",
                      ylabel="accuracy (mean over corruptions)",
                      title="Accuracy vs corruption severity"),
      plots.line_plot(os.path.join(workdir, "adversarial_epsilon.png"), eps,
                      {**{f"{n} FGSM": advs["fgsm"][n] for n in names},
                       **{f"{n} PGD": advs["pgd"][n] for n in names}},
                      xlabel="ε (pixel units in [0, 1])", ylabel="accuracy",
                      title=f"{rc.adversarial.norm} attacks"),
      plots.heatmap_grid(os.path.join(workdir, "perturbation_patch_energy.png"),
                         advs["patch_energy"],
                         title=f"PGD perturbation energy per {rc.patch_size}×{rc.patch_size} "
                               f"patch (ε={rc.adversarial.main_epsilon:g})",
                         cbar_label="energy share"),
      plots.heatmap_grid(os.path.join(workdir, "cka_layers.png"),
                         {**reps["cka"], **reps["cross_cka"]},
                         title="Linear CKA between layers", cbar_label="CKA"),
  ]
  for name in names:
    removal = perts["layer_removal"][name]["accuracy"]
    labels = [f"{layer}:{part}" for layer, part in removal]
    files.append(plots.bar_plot(
        os.path.join(workdir, f"layer_removal_{name}.png"), labels, list(removal.values()),
        ylabel="test accuracy", title=f"{name}: one part removed "
        f"(intact {perts['layer_removal'][name]['baseline']:.3f})"))
  files.append(plots.line_plot(
      os.path.join(workdir, "linear_probes.png"),
      list(range(1, 1 + max(len(p) for p in reps["probes"].values()))),
      {n: list(p.values()) + [np.nan] * (max(len(q) for q in reps["probes"].values()) - len(p))
       for n, p in reps["probes"].items()},
      xlabel="layer", ylabel="probe test accuracy", title="Linear probe per layer"))
  return files


def _notes(rc, advs, perts) -> str:
  transfer = ", ".join(f"{k}: {v:.3f}" for k, v in advs["transfer"].items())
  return (
      f"Accuracies on the first {rc.num_examples} test examples. Corruptions: "
      f"{len(rc.corruptions.names)} × severities {list(rc.corruptions.severities)} "
      f"(`acc_<category>` = mean over its corruptions and severities); mCE relative to "
      f"`{rc.baseline_run}`. Attacks: {rc.adversarial.norm}, ε in [0, 1] pixel units, PGD "
      f"{rc.adversarial.pgd_steps} steps of ε·{rc.adversarial.step_size_fraction:g} with a "
      f"random start. Transfer (PGD at ε={rc.adversarial.main_epsilon:g}, target accuracy): "
      f"{transfer}. `low_freq_share`: share of the PGD perturbation's energy below "
      f"{rc.adversarial.low_freq_cutoff:g}× Nyquist; `patch_alignment` 0.5 = no preference "
      f"for the {rc.patch_size}-pixel patch grid, 1 = constant within patches. "
      f"`worst_removal_acc`: accuracy with the most harmful single block / attention / MLP "
      f"removed; `worst_weight_noise_acc`: with N(0, ({rc.perturbations.relative_scale:g}·"
      f"‖W‖/√numel)²) noise on the most fragile layer's kernels "
      f"({rc.perturbations.num_draws} draws). Sharpness: the sensitivity paper's code metric (θ + N(0, "
      f"{rc.perturbations.sharpness_sigma:g}²), {rc.perturbations.num_draws} draws, train set).")


def _extra(corr, advs, perts, reps) -> dict:
  def keyed(d):
    return {f"{k[0]}:{k[1]}" if isinstance(k, tuple) else str(k): v for k, v in d.items()}
  return {
      "corruption_accuracy": {n: keyed(a) for n, a in corr["accuracy"].items()},
      "corruption_summary": corr["summary"], "mce": corr["mce"],
      "adversarial": {k: advs[k] for k in ("fgsm", "pgd", "transfer", "low_freq_share",
                                           "patch_alignment")},
      "patch_energy": {n: m.tolist() for n, m in advs["patch_energy"].items()},
      "layer_removal": {n: {"baseline": r["baseline"], "accuracy": keyed(r["accuracy"])}
                        for n, r in perts["layer_removal"].items()},
      "weight_noise": {n: {"baseline": w["baseline"], "per_layer": w["per_layer"]}
                       for n, w in perts["weight_noise"].items()},
      "sharpness": perts["sharpness"],
      "cka": {n: m.tolist() for n, m in {**reps["cka"], **reps["cross_cka"]}.items()},
      "layers": reps["layers"], "probes": reps["probes"],
  }
