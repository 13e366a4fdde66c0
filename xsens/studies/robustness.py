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

import contextlib
import functools
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from xsens.errors import ConfigError
from xsens.measures import adversarial as adv
from xsens.measures import corruption_eval, corruptions
from xsens.measures import perturbations as pert
from xsens.measures import similarity
from xsens.report import plots, tables
from xsens.studies import compare

# Pixel-range scale of each `data.normalize`: ε is given in [0, 1] pixel units.
PIXEL_SCALE = {"zero_one": 1.0, "half": 2.0}
PIXEL_RANGE = {"zero_one": (0.0, 1.0), "half": (-1.0, 1.0)}


def validate_robustness_config(rc, run_names, normalize) -> None:
  """Checks `config.robustness` (no compile, nothing written)."""
  if rc.baseline_run not in run_names:
    raise ConfigError("robustness.baseline_run",
                      f"{rc.baseline_run!r} is not a run; allowed: {', '.join(run_names)}")
  unknown = [n for n in rc.corruptions.names if n not in corruptions.CORRUPTIONS]
  if unknown:
    raise ConfigError("robustness.corruptions.names",
                      f"unknown {unknown}; allowed: {', '.join(corruptions.NAMES)}")
  if any(s not in corruptions.SEVERITIES for s in rc.corruptions.severities):
    raise ConfigError("robustness.corruptions.severities",
                      f"must be within 1..5, got {list(rc.corruptions.severities)}")
  if normalize not in PIXEL_SCALE:
    raise ConfigError("train.data.normalize", f"the robustness study needs pixel-range "
                      f"inputs; allowed: {', '.join(PIXEL_SCALE)}, got {normalize!r}")
  if not rc.adversarial.epsilons or any(e <= 0 for e in rc.adversarial.epsilons):
    raise ConfigError("robustness.adversarial.epsilons",
                      f"must be a non-empty list of ε > 0, got {list(rc.adversarial.epsilons)}")
  if rc.adversarial.main_epsilon not in rc.adversarial.epsilons:
    raise ConfigError("robustness.adversarial.main_epsilon",
                      f"must be one of {list(rc.adversarial.epsilons)}")
  for field in ("num_examples", "batch_size"):
    if not rc[field] > 0:
      raise ConfigError(f"robustness.{field}", f"must be > 0, got {rc[field]}")


def _batched(fn, *arrays, batch_size):
  """Applies `fn` to equal-size host batches (last one padded) and concatenates."""
  n = len(arrays[0])
  outs = []
  for start in range(0, n, batch_size):
    idx = np.minimum(np.arange(start, start + batch_size), n - 1)
    out = fn(*(a[idx] for a in arrays))
    outs.append(jax.tree.map(lambda o: np.asarray(o)[: min(batch_size, n - start)], out))
  return jax.tree.map(lambda *o: np.concatenate(o), *outs)


@contextlib.contextmanager
def _timed(timings: dict, name: str):
  t0 = time.time()
  yield
  timings[name] = round(time.time() - t0, 1)


# --------------------------------------------------------------------------- corruptions


def corruption_section(results, rc, normalize) -> dict:
  """Accuracy per (corruption, severity) of every run, summaries and mCE."""
  acc, summary = {}, {}
  for name, res in results.items():
    images = res.test.images[:rc.num_examples]
    labels = res.test.labels[:rc.num_examples]
    predict = jax.jit(res.predict_fn())
    acc[name] = corruption_eval.corruption_accuracy(
        predict, images, labels, normalize=normalize, names=list(rc.corruptions.names),
        severities=list(rc.corruptions.severities), seed=rc.seed, batch_size=rc.batch_size)
    clean = corruption_eval.accuracy(predict, images, labels, rc.batch_size)
    summary[name] = corruption_eval.summarize(acc[name], clean)
  errs = {n: corruption_eval.errors(a) for n, a in acc.items()}
  mce = corruption_eval.mce_table(errs, rc.baseline_run,
                                  {n: 1 - s["clean"] for n, s in summary.items()})
  by_severity = {n: [float(np.mean([a[(c, s)] for c in rc.corruptions.names]))
                     for s in rc.corruptions.severities] for n, a in acc.items()}
  return {"accuracy": acc, "summary": summary, "mce": mce, "by_severity": by_severity}


# --------------------------------------------------------------------------- adversarial


def adversarial_section(results, rc, normalize, key) -> dict:
  """FGSM/PGD accuracy vs ε per run, transfer at the main ε, and perturbation structure."""
  ac = rc.adversarial
  lo, hi = PIXEL_RANGE[normalize]
  scale = PIXEL_SCALE[normalize]
  pgd_kw = lambda eps: dict(epsilon=eps * scale, num_steps=ac.pgd_steps,
                            step_size=eps * scale * ac.step_size_fraction, norm=ac.norm,
                            clip_min=lo, clip_max=hi)
  out = {"fgsm": {}, "pgd": {}, "transfer": {}, "patch_energy": {}, "low_freq_share": {},
         "patch_alignment": {}}
  deltas = {}
  predicts = {name: res.predict_fn() for name, res in results.items()}
  for j, (name, res) in enumerate(results.items()):
    images = res.test.images[:rc.num_examples]
    labels = res.test.labels[:rc.num_examples]
    predict = predicts[name]
    out["fgsm"][name], out["pgd"][name] = [], []
    for e_idx, eps in enumerate(ac.epsilons):
      x_f = _batched(lambda x, y: adv.fgsm(predict, x, y, epsilon=eps * scale, norm=ac.norm,
                                           clip_min=lo, clip_max=hi),
                     images, labels, batch_size=rc.batch_size)
      k = jax.random.fold_in(jax.random.fold_in(key, j), e_idx)
      x_p = _batched(lambda x, y: adv.pgd(predict, x, y, k, **pgd_kw(eps)),
                     images, labels, batch_size=rc.batch_size)
      out["fgsm"][name].append(_accuracy(predict, x_f, labels, rc.batch_size))
      out["pgd"][name].append(_accuracy(predict, x_p, labels, rc.batch_size))
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
        out["transfer"][f"{source}->{target}"] = _accuracy(
            predicts[target], x_adv, labels, rc.batch_size)
  return out


def _accuracy(predict, images, labels, batch_size) -> float:
  pred = _batched(_label_fn(predict), images, batch_size=batch_size)
  return float(np.mean(pred == labels))


_LABEL_FNS = {}


def _label_fn(predict):
  """A jitted `images -> argmax labels`, one per predict_fn (cached: compiled once)."""
  if predict not in _LABEL_FNS:
    _LABEL_FNS[predict] = jax.jit(lambda x: jnp.argmax(predict(x), -1))
  return _LABEL_FNS[predict]


# ------------------------------------------------------------------ model perturbations


def perturbation_section(results, rc, key) -> dict:
  """Layer removal, per-layer relative weight noise and sharpness of every run."""
  out = {"layer_removal": {}, "weight_noise": {}, "sharpness": {}}
  for j, (name, res) in enumerate(results.items()):
    images = res.test.images[:rc.num_examples]
    labels = res.test.labels[:rc.num_examples]
    out["layer_removal"][name] = pert.layer_removal_accuracy(
        res.model, res.variables, images, labels, batch_size=rc.batch_size)
    out["weight_noise"][name] = pert.weight_noise_accuracy(
        res.model, res.variables, images, labels, jax.random.fold_in(key, j),
        relative_scale=rc.perturbations.relative_scale,
        num_draws=rc.perturbations.num_draws, batch_size=rc.batch_size)
    train_x = jnp.asarray(res.train.images[:rc.perturbations.sharpness_examples])
    sharpness = jax.jit(functools.partial(
        pert.sharpness, res.model.apply, sigma=rc.perturbations.sharpness_sigma,
        num_draws=rc.perturbations.num_draws))
    s = sharpness(res.variables, train_x, jax.random.fold_in(key, 1000 + j))
    out["sharpness"][name] = {k: float(v) for k, v in s.items()}
  return out


# ---------------------------------------------------------------------- representations


def representation_section(results, rc) -> dict:
  """Layer-by-layer linear CKA within and across runs, and per-layer linear probes."""
  feats, probes, cka = {}, {}, {}
  for name, res in results.items():
    n = rc.representations.num_examples
    features = jax.jit(functools.partial(similarity.layer_features, res.model))
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
  validate_robustness_config(rc, list(experiments), config.train.data.normalize)
  results = compare.train_runs(config, workdir, overwrite=overwrite, experiments=experiments)
  key = jax.random.key(rc.seed)
  normalize = config.train.data.normalize
  timings = {}
  with _timed(timings, "corruptions"):
    corr = corruption_section(results, rc, normalize)
  with _timed(timings, "adversarial"):
    advs = adversarial_section(results, rc, normalize, jax.random.fold_in(key, 1))
  with _timed(timings, "perturbations"):
    perts = perturbation_section(results, rc, jax.random.fold_in(key, 2))
  with _timed(timings, "representations"):
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
