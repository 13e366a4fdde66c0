"""Set-up `imagenet` of study `sensitivity_vision`: pretrained ConvNeXt vs ViT-B/16, no training.

"Transformers Learn Low Sensitivity Functions" (ICLR 2025, arXiv 2403.06925) reports that
the small-scale ordering holds for large pretrained models on ImageNet-1k: ConvNeXt 0.0342
vs ViT-B/16 0.0191 (submitted version, as quoted by a reviewer; the σ, the token size and
the number of examples are not known). This set-up measures the same token-wise Gaussian
sensitivity as the small set-ups (`xsens.lab.sensitivity`, docs/papers/sensitivity.md §2.1) on
public checkpoints fine-tuned on ImageNet-1k, with nothing trained:

  - `runs.<run>.pretrained.path`: a local checkpoint of a registry entry with a loader
    (`xsens.models.pretrained`), the architecture read off the file: a vit_jax `.npz`
    (e.g. imagenet21k+imagenet2012/ViT-B_16-224.npz of google-research/vision_transformer)
    or a timm ConvNeXt `.safetensors` (e.g. model.safetensors of timm/convnext_tiny.fb_in1k);
  - the examples: the first `sensitivity.num_examples` of a seeded permutation of TFDS
    imagenet2012 `validation`, streamed from `imagenet.data_dir` by `xsens.data.streaming`
    (the geometry of study `robustness`'s ImageNet set-up: the central
    `imagenet.crop_fraction` of the shorter side, bicubic to `imagenet.image_size`²);
  - the noise: N(0, σ²) on one `sensitivity.patch_size`² patch at a time (all patches of
    the grid, `sensitivity.num_draws` draws each; 16 = ViT-B/16's tokens), and optionally on
    all patches at once (`sensitivity.global_noise`), added to the [0, 1] RGB pixels; each
    model then applies its own release's input normalisation ([-1, 1] for vit_jax,
    ImageNet mean / std for timm), so σ is in the same pixel units for both models (in the
    ViT's [-1, 1] inputs it is 2σ, in ConvNeXt's about σ / 0.226);
  - reported: clean top-1 on the same examples, S(σ) ± the standard error over examples at
    every σ, the global variant, σ as noise-to-signal σ·√(p·p·3) / RMS patch norm of the
    [0, 1] images, per-patch maps at the main σ, and bar / σ-curve / heat-map plots.

Keys: run j uses fold_in(key(sensitivity.seed), j), then the σ index and the batch number,
as `xsens.lab.sensitivity.measure_model` does (global: first folded with len(σ) + 1).
"""

from __future__ import annotations

import os
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mlcollections_configs import sensitivity_vision as configs
from xsens import models as models_lib
from xsens import paths
from xsens.data import streaming
from xsens.errors import ConfigError
from xsens.lab import pretrained_runs
from xsens.lab import sensitivity as lab_sens
from xsens.models import pretrained
from xsens.models import vit as vit_lib
from xsens.report import plots, tables
from xsens.train import evaluators, sharding
from xsens.train.progress import progress

# The paper's ImageNet numbers (submitted version, reviewer quote; docs/papers/sensitivity.md
# "Facts from the full paper text" §3): {model kind: sensitivity}.
PAPER = {"convnext": 0.0342, "vit": 0.0191}


class Normalized(nn.Module):
  """`model` on [0, 1] pixels: the release's input normalisation, then the model.

  Its variables are {"params": {"model": <the model's params>}}.
  """
  model: nn.Module
  normalization: str = "half"

  @nn.compact
  def __call__(self, x, train: bool = False):
    return self.model(pretrained.normalize_input(x, self.normalization), train=train)


def loaders() -> dict[str, pretrained.Format]:
  """{model name: checkpoint format} this set-up evaluates (every registry loader of
  images: one with an input normalisation)."""
  return {name: fmt for name, fmt in models_lib.pretrained_formats().items()
          if fmt.input_normalization is not None}


def validate(config) -> None:
  """Checks of `config.imagenet`, `config.sensitivity` and `config.runs` before any image
  is read: the config file's `validate`, then each run's checkpoint file and the patch
  size against the images."""
  configs.validate(config)
  pretrained_runs.validate_checkpoint_runs(config.runs, loaders())
  size = config.imagenet.image_size
  lab_sens.validate_patch_size(config.sensitivity, (size, size, 3))


def _open(ic, sc, batch_size: int) -> streaming.Stream:
  """The evaluated examples as a stream of [0, 1] images; ConfigError naming
  `imagenet.data_dir` when the dataset is not prepared there."""
  try:
    return streaming.open_stream(
        ic.name, split=ic.split, data_dir=ic.data_dir, image_size=int(ic.image_size),
        crop="center", crop_fraction=ic.crop_fraction, resample="bicubic",
        normalize="zero_one", limit=int(sc.num_examples), seed=ic.seed,
        batch_size=batch_size, num_workers=ic.num_workers, image_key=ic.image_key,
        label_key=ic.label_key, field="imagenet.name", split_field="imagenet.split")
  except ConfigError as e:
    if e.field != "imagenet.name" or streaming.is_prepared(ic.name, ic.data_dir):
      raise
    data_dir = streaming._resolve_data_dir(ic.data_dir)  # pylint: disable=protected-access
    raise ConfigError("imagenet.data_dir", f"no prepared TFDS {ic.name!r} in {data_dir!r}; "
                      "set --config.imagenet.data_dir to a TFDS data_dir holding it as "
                      "array_record (xsens never downloads; `tfds build imagenet2012 "
                      "--file_format=array_record` needs TensorFlow and the ImageNet tars)"
                      ) from None


def load_runs(config, image_shape, num_classes):
  """{run: (Normalized model, variables, num_params, path)}, via
  `pretrained_runs.load_run` (architecture read off each checkpoint)."""
  sc = config.sensitivity
  out = {}
  for name, run_cfg in config.runs.items():
    run = pretrained_runs.load_run(name, run_cfg, image_shape, num_classes)
    if isinstance(run.model, vit_lib.ViT) and run.model.patch_size != sc.patch_size:
      raise ConfigError("sensitivity.patch_size", f"{sc.patch_size} differs from the patch "
                        f"size {run.model.patch_size} of run {name!r} (a ViT: its tokens are "
                        "the measured ones)")
    fmt = loaders()[run_cfg.model.name]
    model = Normalized(run.model, fmt.input_normalization)
    out[name] = (model, {"params": {"model": run.variables["params"]}}, run.num_params,
                 run.path)
  return out


def _numbered(stream, mesh):
  """Global batches {"image", "label", "mask", "number" [B] (the batch number)} of the
  stream (each process reads its share of every batch)."""
  for i, batch in enumerate(progress(stream.batches(), desc="sensitivity", unit="batch")):
    yield sharding.global_batch({
        "image": batch["image"], "label": batch["label"].astype(np.int32),
        "mask": batch["mask"].astype(np.float32),
        "number": np.full(len(batch["mask"]), i, np.int32)}, mesh)


def _batch_fn(model, sc):
  """`fn(batch, variables, model_key) -> per-example outputs` of one run for
  `evaluators.over_split` (reduce "concat"): "correct" [B] (clean top-1), "token" (one [B]
  per σ), "map" [B, H/p, W/p] at the main σ, "sq" [B] (Σ x² of each example, for the
  noise-to-signal ratio) and, with `sensitivity.global_noise`, "global" (one [B] per σ). Keys: fold_in(fold_in(model_key, σ index), batch number) (global: the
  model key first folded with len(σ) + 1)."""
  sigmas = [float(s) for s in sc.sigmas]
  with_global = lab_sens.enabled(sc, "global_noise")

  def fn(batch, variables, model_key):
    x, m, i = batch["image"], batch["mask"], batch["number"][0]
    pred = jnp.argmax(model.apply(variables, x, train=False), axis=-1)
    out = {"correct": pred == batch["label"], "token": [], "global": [],
           "sq": jnp.sum(jnp.square(x), axis=tuple(range(1, x.ndim)))}
    for s_idx, sigma in enumerate(sigmas):
      k = jax.random.fold_in(jax.random.fold_in(model_key, s_idx), i)
      pe, pm = lab_sens.patch_batch(
          variables, x, m, k, jnp.float32(sigma), model=model, patch_size=sc.patch_size,
          num_draws=sc.num_draws, chunk_size=sc.chunk_size)
      out["token"].append(pe)
      if sigma == float(sc.main_sigma):
        out["map"] = pm
      if with_global:
        gk = jax.random.fold_in(jax.random.fold_in(
            jax.random.fold_in(model_key, len(sigmas) + 1), s_idx), i)
        out["global"].append(lab_sens.global_batch(
            variables, x, m, gk, jnp.float32(sigma), model=model, patch_size=sc.patch_size,
            num_draws=sc.global_noise.num_draws, chunk_size=sc.chunk_size))
    return out
  return fn


def measure(runs, sc, stream, mesh) -> dict:
  """Per run, one pass over the stream (`evaluators.over_split`): clean hits, per-example
  flips at every σ (and globally), per-patch maps at the main σ; plus Σ x² for the
  noise-to-signal ratio. Every count is of the gathered outputs, so all processes report
  the same numbers."""
  sigmas = [float(s) for s in sc.sigmas]
  key = jax.random.key(sc.seed)
  measured, sq = {}, None
  for j, (name, (model, variables, _, _)) in enumerate(runs.items()):
    t0 = time.time()
    out = evaluators.over_split(_batch_fn(model, sc), _numbered(stream, mesh),
                                args=(variables, jax.random.fold_in(key, j)),
                                reduce="concat")
    total = len(out["correct"])
    sq = out["sq"] if sq is None else sq   # Clean pixels: the same for every run.
    per_patch = None
    for start in range(0, total, stream.batch_size):  # Summed batch by batch, in float32.
      pm = out["map"][start:start + stream.batch_size].sum(axis=0)
      per_patch = pm if per_patch is None else per_patch + pm
    summary = lambda pe: (float(pe.mean()), lab_sens.stderr(pe))
    measured[name] = {"accuracy": float(np.sum(out["correct"])) / total,
                      "sigmas": {s: summary(pe) for s, pe in zip(sigmas, out["token"])},
                      "per_patch_map": per_patch / total,
                      "measure_s": round(time.time() - t0, 1)}
    if lab_sens.enabled(sc, "global_noise"):
      measured[name]["global"] = {s: summary(pe) for s, pe in zip(sigmas, out["global"])}
  n_pixels = len(sq) * int(np.prod(stream.image_shape))
  rms = float(np.sqrt(sc.patch_size ** 2 * 3 * np.sum(sq, dtype=np.float64) / n_pixels))
  return {"runs": measured, "num_examples": len(sq), "token_rms": rms}


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Loads the checkpoints, streams ImageNet validation, measures, writes the report.

  Nothing is trained or checkpointed, so `overwrite` has no effect.
  """
  del overwrite
  validate(config)
  ic, sc = config.imagenet, config.sensitivity
  mesh = sharding.data_mesh()
  batch_size = sharding.round_to_devices(sc.batch_size, mesh.size)
  stream = _open(ic, sc, batch_size)  # Missing dataset -> ConfigError before any work.
  image_shape = (int(ic.image_size), int(ic.image_size), 3)
  runs = load_runs(config, image_shape, stream.num_classes)
  out = measure(runs, sc, stream, mesh)
  measured = out["runs"]
  sigmas = [float(s) for s in sc.sigmas]
  main = float(sc.main_sigma)
  nsr = {s: lab_sens.noise_to_signal(s, sc.patch_size, 3, out["token_rms"]) for s in sigmas}
  rows = []
  for name, (model, _, num_params, path) in runs.items():
    m = measured[name]
    kind = config.runs[name].model.name
    row = {"run": name, "model": type(model.model).__name__, "params": num_params,
           "checkpoint": os.path.basename(path), "top1": m["accuracy"]}
    for s, (mean, se) in m["sigmas"].items():
      row[f"S(σ={s:g})"], row[f"s.e.(σ={s:g})"] = mean, se
    for s, (mean, se) in m.get("global", {}).items():
      row[f"S_global(σ={s:g})"], row[f"s.e._global(σ={s:g})"] = mean, se
    row["paper_S"] = PAPER.get(kind)
    row["measure_s"] = m["measure_s"]
    rows.append(row)
  names = list(runs)
  paths.makedirs(workdir)
  plot_files = [
      plots.bar_plot(os.path.join(workdir, "sensitivity_bar.png"), names,
                     [measured[n]["sigmas"][main][0] for n in names],
                     errors=[measured[n]["sigmas"][main][1] for n in names],
                     ylabel="sensitivity, ImageNet val (flip probability)", xlabel="model",
                     title=f"Token-wise sensitivity, σ={main:g}"),
      plots.sigma_plot(os.path.join(workdir, "sensitivity_vs_sigma.png"), measured, nsr),
      plots.heatmap_grid(os.path.join(workdir, "sensitivity_patches.png"),
                         {n: measured[n]["per_patch_map"] for n in names},
                         title=f"Per-patch sensitivity (σ={main:g}, p={sc.patch_size})",
                         cbar_label="flip probability", xlabel="patch column",
                         ylabel="patch row"),
  ]
  extra = {"checkpoints": {n: runs[n][3] for n in names},
           "per_patch_maps": {n: measured[n]["per_patch_map"].tolist() for n in names},
           "sensitivity": lab_sens.config_summary(sc),
           "noise_to_signal": {"token_rms": out["token_rms"],
                               "token_dim": sc.patch_size ** 2 * 3,
                               "num_examples": out["num_examples"],
                               "by_sigma": {f"{s:g}": v for s, v in nsr.items()}},
           "paper": PAPER}
  md = tables.write_results(
      workdir, f"Token-wise sensitivity of pretrained models on {ic.name} ({ic.split})",
      rows, notes=_notes(ic, sc, rows, main, out, nsr), plots=plot_files, extra=extra)
  return {"rows": rows, "markdown": md, "measured": measured, "noise_to_signal": nsr}


def _notes(ic, sc, rows, main, out, nsr) -> str:
  key = f"S(σ={main:g})"
  order = " < ".join(f"{r['run']} ({r[key]:.3g})" for r in sorted(rows, key=lambda r: r[key]))
  text = (
      f"Pretrained checkpoints, no training. {out['num_examples']} {ic.name} {ic.split} "
      f"images (the first of a seeded permutation, seed {ic.seed}), central "
      f"{ic.crop_fraction:.3g} crop, bicubic to {ic.image_size}², pixels in [0, 1]. "
      f"Sensitivity: label-flip probability (against the clean prediction) when one "
      f"{sc.patch_size}×{sc.patch_size} patch gets N(0, σ²) noise in [0, 1] pixel units, "
      f"before each model's own input normalisation; mean over the patches, "
      f"{sc.num_draws} draws per patch and the examples; ± is the standard error over "
      f"examples. top1: clean accuracy on the same examples.\n\n"
      f"Ordering at σ={main:g}: {order}. paper_S: the paper's ImageNet numbers (ConvNeXt "
      f"0.0342, ViT-B/16 0.0191; submitted version, reviewer quote; its σ and token size "
      f"are not known), so compare the ordering, not the values.")
  if lab_sens.enabled(sc, "global_noise"):
    text += (f"\n\nS_global: N(0, σ²) on every pixel at once (App. A.2), "
             f"{sc.global_noise.num_draws} draws per example and σ.")
  text += (f"\n\nσ as noise-to-signal σ·√D / RMS‖x_i‖ (D = {sc.patch_size ** 2 * 3}, "
           f"RMS‖x_i‖ = {out['token_rms']:.4g} over the [0, 1] patches): " +
           ", ".join(f"σ={s:g} → {v:.3g}" for s, v in nsr.items()) + ".")
  return text
