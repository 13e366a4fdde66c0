"""The ImageNet variant of study `robustness`: public ViT and BiT checkpoints, no training.

Bhojanapalli et al., "Understanding Robustness of Transformers for Image Classification",
ICCV 2021, arXiv 2103.14586 (docs/papers/google_papers.md §E) compare ViT-B/16 and BiT ResNets
pre-trained on ImageNet-21k and fine-tuned on ImageNet. This variant evaluates such
checkpoints (vit_jax `.npz`, e.g. imagenet21k+imagenet2012/ViT-B_16.npz, and big_transfer
`.npz`, e.g. BiT-M-R50x1-ILSVRC2012.npz; `runs.<run>.pretrained.path`, loaded by
`xsens.models.pretrained` with the architecture read off the checkpoint) on TFDS imagenet2012
validation, streamed by `xsens.data.streaming` (nothing the size of the split is held):

  - clean top-1 on the first `imagenet.limit` examples of a seeded permutation;
  - the common corruptions (`robustness.corruptions`, default 15 × 5) on the same examples:
    read from TFDS `imagenet2012_corrupted/<name>_<severity>` when every needed config is
    prepared in the data_dir (`imagenet.corruption_source` "auto" or "tfds"), else
    synthesised per batch with `xsens.measures.corruptions` ("synthesize");
    accuracy per corruption / category / severity, mCA, mCE and relative mCE against the run
    `robustness.baseline_run`, and Hendrycks' AlexNet-normalised mCE when all 15 × 5 are run;
  - FGSM / PGD accuracy vs ε, PGD transfer between the runs and the PGD perturbations'
    structure (energy per `robustness.patch_size` patch, low-frequency share, patch
    alignment) on the first `robustness.num_examples` examples;
  - layer removal (`xsens.measures.perturbations`, no retraining) on the same subset: for a
    ViT one block / its attention / its MLP at a time, for a BiT ResNet one bottleneck unit
    with an identity shortcut at a time (every unit but the first of each block).

Pre-training scale (the paper's headline: "when pre-trained with a sufficient amount of
data, ViT models are at least as robust as the ResNet counterparts"): `runs.<run>.pretraining`
names each checkpoint's pre-training data (a report column); `pretraining_comparison` gives,
per pre-training set with one ViT and one ResNet run, both runs' measures and ViT minus ResNet
(`robustness.py:imagenet,scale`: ViT-B/16 and BiT-R50x1 from ImageNet-1k and from
ImageNet-21k).

Not in this variant (left to the mnist5k / cifar10 setups): per-layer weight noise,
sharpness, CKA and linear probes.

Geometry (our design, documented in `xsens.data.streaming`): every image is first brought to
ImageNet-C's geometry, the central 224/256 of the shorter side resized bicubically to
224 × 224 (exactly how TFDS made imagenet2012_corrupted), so clean, TFDS-corrupted and
synthesised images share one geometry; corruptions act on these 224² [0, 1] images, which are
then resized (bilinear, on the device) to `imagenet.image_size` and mapped to [-1, 1], the
input range of both the vit_jax and big_transfer models. The public releases' own eval
resizes the whole image (no crop) to the fine-tuning resolution (384 for the
imagenet21k+imagenet2012 ViT-B/16, 480 for BiT-M-ILSVRC2012), so clean accuracies here are a
little different from the published ones.

Cost: synthesised corruptions run on the host CPU at 224² (zoom and defocus blur the
costliest; `experiments/bench_corruptions.py` measures them), spread over
`imagenet.num_workers` threads (NumPy releases the GIL); a prepared imagenet2012_corrupted
(decode only) or a smaller `imagenet.limit` is much cheaper.

Memory: the streaming pass holds two batches of `imagenet.batch_size` × 224² × 3; the
adversarial / layer-removal subset is materialised in model space:
`robustness.num_examples` × image_size² × 3 × 4 bytes (500 × 224² ≈ 0.3 GB).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from mlcollections_configs import robustness as configs
from xsens import models as models_lib
from xsens import paths
from xsens.data import streaming
from xsens.errors import ConfigError
from xsens.lab import corruptions as lab_corruptions
from xsens.lab import pretrained_runs
from xsens.lab import robustness as lab_robustness
from xsens.measures import adversarial as adv
from xsens.measures import corruption_eval, corruptions
from xsens.measures import perturbations as pert
from xsens.models import vit as vit_lib
from xsens.report import plots, pretraining_scale, tables
from xsens.train import evaluators, sharding
from xsens.train.progress import progress

BASE_SIZE = 224  # ImageNet-C's resolution: corruptions act on 224 x 224 images.
# {model name: checkpoint format}: the registry entries that load pretrained weights whose
# inputs are [-1, 1] pixels (`imagenet.normalize` "half"); timm's ConvNeXt weights expect
# ImageNet mean / std inputs and are evaluated by `xsens.studies.sensitivity_imagenet`.
LOADERS = {name: fmt for name, fmt in models_lib.pretrained_formats().items()
           if fmt.input_normalization == "half"}

# ------------------------------------------------------------------------------------ validation


def validate(config) -> None:
  """Checks of `config.imagenet`, `config.robustness` and `config.runs` before any image is
  read: the config file's `validate`, then each run's checkpoint file."""
  configs.validate(config)
  pretrained_runs.validate_checkpoint_runs(config.runs, LOADERS)


def _open_clean(ic, batch_size: int) -> streaming.Stream:
  return streaming.open_stream(
      ic.name, split=ic.split, data_dir=ic.data_dir, image_size=BASE_SIZE, crop="center",
      crop_fraction=ic.crop_fraction, resample="bicubic", normalize="uint8", limit=ic.limit,
      seed=ic.seed, batch_size=batch_size, num_workers=ic.num_workers,
      image_key=ic.image_key, label_key=ic.label_key, field="imagenet.name",
      split_field="imagenet.split")


def corrupted_name(ic, name: str, severity: int) -> str:
  """TFDS name of one ImageNet-C set, e.g. "imagenet2012_corrupted/glass_blur_3" (TFDS's
  imagenet2012_corrupted uses Hendrycks' names, the same as `corruptions.NAMES`)."""
  return f"{ic.corrupted_name}/{name}_{int(severity)}"


def corruption_source(ic, rc) -> str:
  """"tfds" or "synthesize" from `imagenet.corruption_source` and what the data_dir holds."""
  if ic.corruption_source == "synthesize":
    return "synthesize"
  wanted = [corrupted_name(ic, c, s) for c in rc.corruptions.names
            for s in rc.corruptions.severities]
  missing = [w for w in wanted if not streaming.is_prepared(w, ic.data_dir)]
  if not missing:
    return "tfds"
  if ic.corruption_source == "tfds":
    data_dir = streaming._resolve_data_dir(ic.data_dir)
    raise ConfigError("imagenet.corrupted_name", f"{len(missing)} of the {len(wanted)} "
                      f"ImageNet-C sets are not prepared in {data_dir!r}, e.g. {missing[0]!r} "
                      "(xsens never downloads; `tfds build imagenet2012_corrupted "
                      "--file_format=array_record` needs TensorFlow and the ImageNet tars), "
                      "or set imagenet.corruption_source='synthesize'")
  return "synthesize"


# ---------------------------------------------------------------------------- jitted helpers


def model_input(x, image_size: int, normalize: str):
  """[B, h, w, 3] pixels (uint8, or float in [0, 1]) -> model space at image_size² (bilinear
  resize with antialiasing, then `normalize`). Traced inside the jitted helpers."""
  x = x.astype(jnp.float32)
  b, h, w, c = x.shape
  if (h, w) != (image_size, image_size):
    x = jax.image.resize(x, (b, image_size, image_size, c), "bilinear", antialias=True)
  if normalize == "half":
    x = (x - 0.5) / 0.5
  return x


@functools.partial(jax.jit, static_argnames=("image_size", "normalize"))
def _to_model(x, *, image_size: int, normalize: str):
  if x.dtype == jnp.uint8:
    x = x.astype(jnp.float32) / 255.0
  return model_input(x, image_size, normalize)


def _hits(apply_fn, variables, x, labels, mask):
  """Number of correct real rows (masked), by the common accuracy measure."""
  out = adv.accuracy(apply_fn, variables, x, labels=labels, mask=mask)
  return jnp.sum(out["correct"] * mask)


def _corruption_fn(apply_fns: tuple, num_sets: int, image_size: int, normalize: str):
  """`fn(batch, variables (one per run)) -> [B, R + 1, num_sets]` for
  `evaluators.over_split` (reduce "sum"): per example, run and set, 1 where the example
  of set `batch["set"]` is classified correctly (last row: 1 for its set), so the sums are
  the correct and the example counts per set. batch["image"]: [B, h, w, 3] uint8 or float
  in [0, 1]."""
  def fn(batch, variables):
    x = batch["image"]
    if x.dtype == jnp.uint8:
      x = x.astype(jnp.float32) / 255.0
    x = model_input(x, image_size, normalize)
    onehot = jax.nn.one_hot(batch["set"], num_sets, dtype=jnp.float32)
    hits = [adv.accuracy(f, v, x, labels=batch["label"])["correct"][:, None] * onehot
            for f, v in zip(apply_fns, variables)]
    return jnp.stack(hits + [onehot], axis=1)
  return fn


def _attack_fn(apply_fns: tuple, j: int, ac, patch_size: int, batch_size: int, main: bool):
  """`fn(batch, variables (one per run), key, ε, step, lo, hi) -> batch totals` of run j
  for `evaluators.over_split` (reduce "batch_sum"): FGSM and PGD correct counts in model
  space; at the main ε also the PGD delta's structure summed over real rows (patch energy
  [gh, gw], low-frequency share, alignment) and the correct counts of every run on
  clip(x + delta) ("transfer", [R]). The PGD key is folded with the batch number."""
  apply_fn = apply_fns[j]

  def fn(batch, variables, key, epsilon, step_size, clip_min, clip_max):
    x, labels, mask = batch["image"], batch["label"], batch["mask"]
    key = jax.random.fold_in(key, batch["index"][0] // batch_size)
    x_f = adv.fgsm(apply_fn, variables[j], x, labels=labels, epsilon=epsilon, norm=ac.norm,
                   clip_min=clip_min, clip_max=clip_max)["adv_inputs"]
    x_p = adv.pgd(apply_fn, variables[j], x, labels=labels, key=key, epsilon=epsilon,
                  num_steps=int(ac.pgd_steps), step_size=step_size, norm=ac.norm,
                  clip_min=clip_min, clip_max=clip_max)["adv_inputs"]
    out = {"fgsm": _hits(apply_fn, variables[j], x_f, labels, mask),
           "pgd": _hits(apply_fn, variables[j], x_p, labels, mask)}
    if main:
      delta = x_p - x
      structure = adv.perturbation_structure(delta, patch_size=patch_size,
                                             cutoff=float(ac.low_freq_cutoff), mask=mask)
      del structure["count"]
      x_adv = jnp.clip(x + delta, clip_min, clip_max)
      out["structure"] = structure
      out["transfer"] = jnp.stack([_hits(f, v, x_adv, labels, mask)
                                   for f, v in zip(apply_fns, variables)])
    return out
  return fn


# ------------------------------------------------------------------------------ the sections


def _pad(x: np.ndarray, size: int) -> np.ndarray:
  """Pads rows to `size` by repeating the last one."""
  if len(x) == size:
    return x
  return np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)])


def corruption_section(runs, ic, rc, source: str, batch_size: int) -> dict:
  """Clean and corrupted accuracy of every run, streamed; summaries and mCE."""
  names, sevs = list(rc.corruptions.names), [int(s) for s in rc.corruptions.severities]
  sets = ["clean"] + [(c, s) for c in names for s in sevs]
  set_index = {k: i for i, k in enumerate(sets)}
  fn = _corruption_fn(tuple(run.apply_fn for run in runs.values()), len(sets),
                      int(ic.image_size), ic.normalize)
  mesh = sharding.data_mesh()

  def labelled(x, batch, key):
    """One global batch of set `key`: its images, the batch's labels and mask."""
    return sharding.global_batch({
        "image": x, "label": batch["label"], "mask": batch["mask"].astype(np.float32),
        "set": np.full(len(batch["mask"]), set_index[key], np.int32)}, mesh)

  def batches():
    workers = int(ic.num_workers)
    pool = concurrent.futures.ThreadPoolExecutor(workers)
    clean = _open_clean(ic, batch_size)
    for b, batch in enumerate(progress(clean.batches(), desc="corruptions", unit="batch")):
      yield labelled(batch["image"], batch, "clean")
      if source == "synthesize":
        real = int(batch["mask"].sum())
        x01 = batch["image"][:real].astype(np.float32) / 255.0
        pairs = [(ci, c, s) for ci, c in enumerate(names) for s in sevs]
        corrupt = lambda p, x01=x01, b=b: corruptions.corrupt(
            x01, p[1], p[2], seed=(int(rc.seed), b, p[0], p[2]))
        # NumPy releases the GIL in its heavy ops: corrupt `num_workers` copies at a time.
        for start in range(0, len(pairs), workers):
          chunk = pairs[start:start + workers]
          for (_, c, s), xc in zip(chunk, pool.map(corrupt, chunk)):
            yield labelled(_pad(xc, len(batch["mask"])), batch, (c, s))
    pool.shutdown()
    if source == "tfds":
      for c, s in progress([(c, s) for c in names for s in sevs], desc="corruptions",
                           unit="set"):
        stream = streaming.open_stream(
            corrupted_name(ic, c, s), split=ic.corrupted_split, data_dir=ic.data_dir,
            image_size=BASE_SIZE, crop="resize", resample="bicubic", normalize="uint8",
            limit=ic.limit, seed=ic.seed, batch_size=batch_size, num_workers=ic.num_workers,
            image_key=ic.image_key, label_key=ic.label_key, field="imagenet.corrupted_name",
            split_field="imagenet.corrupted_split")
        for batch in stream.batches():
          yield labelled(batch["image"], batch, (c, s))

  variables = tuple(run.variables for run in runs.values())
  sums = evaluators.over_split(fn, batches(), args=(variables,), reduce="sum",
                               streams=1)                             # [R + 1, sets]
  correct = {r: dict(zip(sets, sums[i])) for i, r in enumerate(runs)}
  totals = dict(zip(sets, sums[-1]))
  acc = {r: {k: v / totals[k] for k, v in counts.items() if k != "clean"}
         for r, counts in correct.items()}
  clean_acc = {r: counts["clean"] / totals["clean"] for r, counts in correct.items()}
  summary = {r: corruption_eval.summarize(acc[r], clean_acc[r]) for r in runs}
  errs = {r: corruption_eval.errors(a) for r, a in acc.items()}
  mce = {}
  for r in runs:
    base = rc.baseline_run
    mce[r] = {"mce": corruption_eval.mce(errs[r], errs[base])}
    try:
      mce[r]["relative_mce"] = corruption_eval.relative_mce(
          errs[r], 1 - clean_acc[r], errs[base], 1 - clean_acc[base])
    except ValueError:  # The baseline does not degrade on some corruption: undefined.
      mce[r]["relative_mce"] = float("nan")
  alexnet = None
  if (set(names) == set(lab_corruptions.ALEXNET_ERRORS)
      and sorted(sevs) == list(corruptions.SEVERITIES)):
    alexnet = {r: lab_corruptions.alexnet_mce(e) for r, e in errs.items()}
  by_severity = {r: [float(np.mean([a[(c, s)] for c in names])) for s in sevs]
                 for r, a in acc.items()}
  warning = corruption_eval.relative_mce_warning(errs[rc.baseline_run],
                                                 1 - clean_acc[rc.baseline_run])
  if warning:
    logging.warning("%s", warning)
  counted = {k if isinstance(k, str) else f"{k[0]}:{k[1]}": int(v) for k, v in totals.items()}
  return {"rel_mce_warning": warning,
          "accuracy": acc, "summary": summary, "mce": mce, "mce_alexnet": alexnet,
          "by_severity": by_severity, "num_examples": counted,
          "source": source}


def _subset(ic, rc, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
  """The first robustness.num_examples clean examples in model space (float32 on the host)."""
  stream = _open_clean(ic, batch_size)
  stream = dataclasses.replace(stream, indices=stream.indices[:rc.num_examples])
  images, labels = [], []
  for batch in stream.batches():
    keep = batch["mask"] > 0
    x = _to_model(batch["image"], image_size=int(ic.image_size), normalize=ic.normalize)
    images.append(np.asarray(x)[keep])
    labels.append(batch["label"][keep])
  return np.concatenate(images), np.concatenate(labels)


def adversarial_section(runs, rc, normalize, images, labels, key) -> dict:
  """FGSM / PGD accuracy vs ε per run, PGD transfer at the main ε, perturbation structure."""
  ac = rc.adversarial
  lo, hi = lab_robustness.PIXEL_RANGE[normalize]
  scale = lab_robustness.PIXEL_SCALE[normalize]
  n, names = len(labels), list(runs)
  apply_fns = tuple(run.apply_fn for run in runs.values())
  variables = tuple(run.variables for run in runs.values())
  mesh = sharding.data_mesh()
  bs = sharding.round_to_devices(rc.batch_size, mesh.size)
  split = {"image": images, "label": labels}
  fgsm = {r: [0.0] * len(ac.epsilons) for r in names}
  pgd = {r: [0.0] * len(ac.epsilons) for r in names}
  transfer, structure = {}, {}
  for j, r in enumerate(names):
    fns = {main: _attack_fn(apply_fns, j, ac, int(rc.patch_size), bs, main)
           for main in (False, True)}
    for e, eps in enumerate(ac.epsilons):
      k = jax.random.fold_in(jax.random.fold_in(key, j), e)
      main = eps == ac.main_epsilon
      out = evaluators.over_split(
          fns[main], split, args=(variables, k, eps * scale,
                                  eps * scale * ac.step_size_fraction, lo, hi),
          reduce="batch_sum", batch_size=bs, mesh=mesh, streams=1)
      fgsm[r][e], pgd[r][e] = float(out["fgsm"]), float(out["pgd"])
      if main:
        structure[r] = out["structure"]
        for t, hits in zip(names, out["transfer"]):
          if t != r:
            transfer[f"{r}->{t}"] = float(hits)
  transfer = {f"{s}->{t}": transfer[f"{s}->{t}"] for s in names for t in names if s != t}
  return {"fgsm": {r: [v / n for v in fgsm[r]] for r in names},
          "pgd": {r: [v / n for v in pgd[r]] for r in names},
          "transfer": {k: v / n for k, v in transfer.items()},
          "patch_energy": {r: np.asarray(structure[r]["patch_energy"], np.float32) / n
                           for r in names},
          "low_freq_share": {r: float(structure[r]["low_freq_share"]) / n for r in names},
          "patch_alignment": {r: float(structure[r]["patch_alignment"]) / n for r in names}}


def removal_section(runs, rc, images, labels) -> dict:
  """Layer removal of every run on the subset (ViT: block / attention / MLP; BiT: whole
  units); None for a model without removable layers (e.g. a BiT with one unit per block)."""
  out = {}
  for r, run in runs.items():
    parts = pert.PARTS if isinstance(run.model, vit_lib.ViT) else ("block",)
    layers = pert.removable_layers(run.model, parts)
    out[r] = (lab_robustness.split_layer_removal(run, images, labels, layers=layers,
                                                 batch_size=int(rc.batch_size))
              if layers else None)
  return out


# ------------------------------------------------------------------------------------ report


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Loads the checkpoints, streams ImageNet(-C), measures, writes results.md/json + plots.

  Nothing is trained or checkpointed, so `overwrite` has no effect: a rerun recomputes and
  replaces the report.
  """
  del overwrite
  validate(config)
  ic, rc = config.imagenet, config.robustness
  batch_size = int(ic.batch_size)
  clean = _open_clean(ic, batch_size)  # Missing dataset -> ConfigError before any work.
  source = corruption_source(ic, rc)
  image_shape = (int(ic.image_size), int(ic.image_size), 3)
  runs = {name: pretrained_runs.load_run(name, run_cfg, image_shape, clean.num_classes)
          for name, run_cfg in config.runs.items()}
  key = jax.random.key(rc.seed)
  timings = {}
  with lab_robustness.timed(timings, "corruptions"):
    corr = corruption_section(runs, ic, rc, source, batch_size)
  with lab_robustness.timed(timings, "subset"):
    images, labels = _subset(ic, rc, batch_size)
  with lab_robustness.timed(timings, "adversarial"):
    advs = adversarial_section(runs, rc, ic.normalize, images, labels,
                               jax.random.fold_in(key, 1))
  with lab_robustness.timed(timings, "layer_removal"):
    removal = removal_section(runs, rc, images, labels)
  pretraining = {name: run_cfg.pretraining for name, run_cfg in config.runs.items()}
  rows = _rows(runs, rc, corr, advs, removal, image_shape, pretraining)
  scale = pretraining_scale.comparison(rows, {n: r.model.name for n, r in config.runs.items()})
  paths.makedirs(workdir)
  num_classes = getattr(next(iter(runs.values())).model, "num_classes", None)
  plot_files = _plots(workdir, rc, corr, advs, removal, num_classes=num_classes)
  if scale:
    plot_files.append(pretraining_scale.plot(workdir, rows))
  md = tables.write_results(
      workdir, f"Robustness of pretrained models on {ic.name} ({ic.split})", rows,
      notes=_notes(ic, rc, corr, advs, len(labels)) + pretraining_scale.note(scale),
      plots=plot_files,
      extra={**_extra(runs, corr, advs, removal), "timings_s": timings,
             "pretraining": pretraining, "pretraining_comparison": scale})
  return {"rows": rows, "markdown": md, "corruptions": corr, "adversarial": advs,
          "layer_removal": removal, "pretraining_comparison": scale}


def _rows(runs, rc, corr, advs, removal, image_shape, pretraining=None) -> list[dict]:
  main = list(rc.adversarial.epsilons).index(rc.adversarial.main_epsilon)
  eps_label = f"{rc.adversarial.main_epsilon * 255:g}/255"
  pretraining = pretraining or {}
  rows = []
  for r, run in runs.items():
    s = corr["summary"][r]
    rows.append({
        "run": r, "model": type(run.model).__name__,
        "pretraining": pretraining.get(r), "params": run.num_params,
        "image_size": image_shape[0], "clean_accuracy": s["clean"], "mCA": s["mca"],
        "mCE": corr["mce"][r]["mce"], "rel_mCE": corr["mce"][r]["relative_mce"],
        "mCE_alexnet": None if corr["mce_alexnet"] is None else corr["mce_alexnet"][r],
        **{f"acc_{c}": v for c, v in s["per_category"].items()},
        f"FGSM@{eps_label}": advs["fgsm"][r][main], f"PGD@{eps_label}": advs["pgd"][r][main],
        "low_freq_share": advs["low_freq_share"][r],
        "patch_alignment": advs["patch_alignment"][r],
        "worst_removal_acc": (None if removal[r] is None
                              else min(removal[r]["accuracy"].values()))})
  return rows


def _plots(workdir, rc, corr, advs, removal, num_classes=None) -> list[str]:
  """The study's figures (docs/results.md, "Figures"); chance lines at 1/num_classes."""
  names = list(corr["summary"])
  sev = [int(s) for s in rc.corruptions.severities]
  eps = [float(e) * 255 for e in rc.adversarial.epsilons]
  files = [
      plots.line_plot(os.path.join(workdir, "corruption_severity.png"), sev,
                      corr["by_severity"], xlabel="corruption severity (1 = mildest)",
                      ylabel="top-1 accuracy (mean over corruptions)",
                      title=f"ImageNet-C ({corr['source']}) accuracy vs severity",
                      num_classes=num_classes),
      plots.grouped_bar_plot(
          os.path.join(workdir, "corruption_categories.png"),
          list(corr["summary"][names[0]]["per_category"]),
          {n: list(corr["summary"][n]["per_category"].values()) for n in names},
          ylabel="top-1 accuracy (fraction correct)", xlabel="corruption category",
          title="Accuracy per corruption category", num_classes=num_classes),
      plots.line_plot(os.path.join(workdir, "adversarial_epsilon.png"), eps,
                      {**{f"{n} FGSM": advs["fgsm"][n] for n in names},
                       **{f"{n} PGD": advs["pgd"][n] for n in names}},
                      xlabel="ε (× 1/255 pixel units)", ylabel="top-1 accuracy",
                      title=f"{rc.adversarial.norm} attacks", num_classes=num_classes),
      plots.heatmap_grid(os.path.join(workdir, "perturbation_patch_energy.png"),
                         advs["patch_energy"],
                         title=f"PGD perturbation energy per {rc.patch_size}×{rc.patch_size} "
                               "patch", cbar_label="energy share", xlabel="patch column",
                         ylabel="patch row"),
  ]
  for n in names:
    if removal[n] is None:
      continue
    acc = removal[n]["accuracy"]
    files.append(plots.bar_plot(
        os.path.join(workdir, f"layer_removal_{n}.png"),
        [f"{layer}:{part}" for layer, part in acc], list(acc.values()),
        ylabel="top-1 accuracy (fraction correct)", xlabel="removed part (layer:part)",
        title=f"{n}: one part removed (intact {removal[n]['baseline']:.3f})",
        num_classes=num_classes))
  return files


def _notes(ic, rc, corr, advs, n_subset) -> str:
  transfer = ", ".join(f"{k}: {v:.3f}" for k, v in advs["transfer"].items())
  source = ("TFDS imagenet2012_corrupted (the same seeded positions; its stored order need "
            "not match imagenet2012's, so with a limit the two samples are independent)"
            if corr["source"] == "tfds" else
            "synthesised per batch with xsens.measures.corruptions (seed "
            "(robustness.seed, batch, corruption, severity); imagenet2012_corrupted was not "
            "fully prepared in the data_dir or corruption_source='synthesize')")
  return (
      (f"**Warning:** {corr['rel_mce_warning']}.\n\n" if corr.get("rel_mce_warning")
       else "") +
      f"Pretrained checkpoints, no training. Clean and corrupted top-1 on "
      f"{corr['num_examples']['clean']} {ic.name} {ic.split} images (a seeded random "
      f"subset when imagenet.limit < the split), ImageNet-C geometry (central 224/256 crop, "
      f"bicubic to 224), resized to {ic.image_size}² and scaled to [-1, 1]. Corruptions: "
      f"{len(rc.corruptions.names)} × severities {list(rc.corruptions.severities)}, {source}. "
      f"mCE / rel_mCE relative to `{rc.baseline_run}`; mCE_alexnet with Hendrycks' AlexNet "
      f"errors (only when all 15 × 5 are run). Attacks on the first {n_subset} images: "
      f"{rc.adversarial.norm}, ε in [0, 1] pixel units (column labels × 1/255), PGD "
      f"{rc.adversarial.pgd_steps} steps of ε·{rc.adversarial.step_size_fraction:g}, random "
      f"start. Transfer (PGD at the main ε, target accuracy): {transfer}. "
      f"`low_freq_share`: PGD energy below {rc.adversarial.low_freq_cutoff:g}× Nyquist; "
      f"`patch_alignment` on the {rc.patch_size}-pixel grid (0.5: no preference). "
      f"`worst_removal_acc`: the most harmful single removal (ViT: a block, its attention or "
      f"its MLP; BiT: one bottleneck unit with an identity shortcut, flat index).")


def _extra(runs, corr, advs, removal) -> dict:
  def keyed(d):
    return {f"{k[0]}:{k[1]}" if isinstance(k, tuple) else str(k): v for k, v in d.items()}
  return {
      "checkpoints": {r: run.path for r, run in runs.items()},
      "corruption_source": corr["source"], "num_examples": corr["num_examples"],
      "corruption_accuracy": {n: keyed(a) for n, a in corr["accuracy"].items()},
      "corruption_summary": corr["summary"], "mce": corr["mce"],
      "mce_alexnet": corr["mce_alexnet"],
      "rel_mce_warning": corr.get("rel_mce_warning"),
      "adversarial": {k: advs[k] for k in ("fgsm", "pgd", "transfer", "low_freq_share",
                                           "patch_alignment")},
      "patch_energy": {n: m.tolist() for n, m in advs["patch_energy"].items()},
      "layer_removal": {n: None if r is None else
                        {"baseline": r["baseline"], "accuracy": keyed(r["accuracy"])}
                        for n, r in removal.items()},
  }

