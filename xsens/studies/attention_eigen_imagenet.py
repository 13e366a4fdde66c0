"""Set-up `imagenet` of study `attention_eigen`: pretrained ViT-B/16, no training.

Bhojanapalli et al. (2021), arXiv 2106.08823 (docs/papers/google_papers.md §C). The analysis of
`xsens.lab.eigen_analysis.analyse_runs` (eigen statistics of the score rows and
matrices, overlaps across layers / heads, partial-reconstruction errors and the frozen
model's accuracy vs (m, k)) on public checkpoints instead of trained runs:

  - `runs.<run>.pretrained.path`: a local vit_jax `.npz` (e.g. ViT-B_16.npz of
    google-research/vision_transformer, fine-tuned on ImageNet-1k; T = 14² + 1 = 197 at
    224²), the architecture read off the file (`xsens.lab.pretrained_runs.load_run`); the
    first run is analysed in full, and with two or more runs (e.g. the ImageNet-1k and the
    ImageNet-21k pre-trained fine-tunings) the "seed" overlaps become overlaps across
    models;
  - the images: `2 * eigen.num_examples` of a seeded permutation of TFDS imagenet2012
    `validation`, streamed from `imagenet.data_dir` (`xsens.data.streaming`, the central
    `imagenet.crop_fraction` crop, bicubic to `imagenet.image_size`², the release's [-1, 1]
    pixels): the first half gives the statistics, the second half the errors and top-1;
  - the control: the first run's architecture at random init (`eigen.seed`).
"""

from __future__ import annotations

import types

import numpy as np

from mlcollections_configs import attention_eigen as configs
from xsens.data import streaming
from xsens.errors import ConfigError
from xsens.lab import eigen_analysis, pretrained_runs
from xsens.models import eigen_vit

# The checkpoint formats this set-up reads: vit_jax only (the analysis and the frozen
# EigenViT are ViT-specific).
FORMATS = ("vit",)


def formats() -> dict:
  from xsens import models as models_lib  # pylint: disable=import-outside-toplevel
  return {k: v for k, v in models_lib.pretrained_formats().items() if k in FORMATS}


def used_runs(config) -> dict:
  """{name: run} of `config.runs`: the analysed run, then every other run whose
  `pretrained.path` is set (an unset one is skipped)."""
  first = config.eigen.analysed_run
  out = {first: config.runs[first]} if first in config.runs else {}
  out.update({n: r for n, r in config.runs.items()
              if n != first and r.pretrained.path is not None})
  return out


def validate(config) -> None:
  """Checks before any image is read: the config file's `validate` (`runs`, `imagenet`,
  `eigen`; m is bounded once T is known from the checkpoint), then the checkpoint files."""
  configs.validate(config)
  pretrained_runs.validate_checkpoint_runs(used_runs(config), formats())


def read_images(ic, count: int, batch_size: int):
  """([n, s, s, 3] float32 in [-1, 1], [n] int32) of the first `count` examples of the
  seeded validation order; ConfigError naming `imagenet.data_dir` when it is absent."""
  try:
    stream = streaming.open_stream(
        ic.name, split=ic.split, data_dir=ic.data_dir, image_size=int(ic.image_size),
        crop="center", crop_fraction=ic.crop_fraction, resample="bicubic", normalize="half",
        limit=count, seed=ic.seed, batch_size=batch_size, num_workers=ic.num_workers,
        image_key=ic.image_key, label_key=ic.label_key, field="imagenet.name",
        split_field="imagenet.split")
  except ConfigError as e:
    if e.field != "imagenet.name" or streaming.is_prepared(ic.name, ic.data_dir):
      raise
    raise ConfigError("imagenet.data_dir", f"no prepared TFDS {ic.name!r} in "
                      f"{ic.data_dir!r}; set --config.imagenet.data_dir to a TFDS data_dir "
                      "holding it (xsens never downloads)") from None
  images, labels = [], []
  for b in stream.batches():
    keep = np.asarray(b["mask"]) > 0
    images.append(np.asarray(b["image"], np.float32)[keep])
    labels.append(np.asarray(b["label"], np.int32)[keep])
  return np.concatenate(images), np.concatenate(labels), stream.num_classes


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Loads the checkpoints, streams the validation images, analyses, writes the report.
  Nothing is trained, so `overwrite` has no effect."""
  del overwrite
  validate(config)
  ec, ic = config.eigen, config.imagenet
  images, labels, num_classes = read_images(ic, 2 * ec.num_examples, ec.batch_size)
  half = min(ec.num_examples, len(images) // 2)
  if half < 1:
    raise ConfigError("imagenet.split", f"{ic.split!r} has {len(images)} images; need 2")
  fit = types.SimpleNamespace(images=images[:half], labels=labels[:half])
  test = types.SimpleNamespace(images=images[half:2 * half], labels=labels[half:2 * half])
  shape = (int(ic.image_size),) * 2 + (3,)
  names = list(used_runs(config))
  runs = []
  for name in names:
    loaded = pretrained_runs.load_run(name, config.runs[name], shape, num_classes)
    top1 = eigen_analysis.top1_accuracy(loaded.model, loaded.variables, test.images,
                                        test.labels, ec.batch_size)
    runs.append(types.SimpleNamespace(
        name=name, model=loaded.model, variables=loaded.variables, apply_fn=loaded.apply_fn,
        train=fit, test=test, summary={"test_accuracy": top1}))
  num_tokens = eigen_vit.num_tokens(runs[0].model, shape)
  configs.validate_eigen(ec, num_tokens)
  for r in runs[1:]:
    if eigen_vit.num_tokens(r.model, shape) != num_tokens:
      raise ConfigError(f"runs.{r.name}.pretrained.path", "has a different number of "
                        f"tokens than run {names[0]!r} (T={num_tokens}); the overlaps "
                        "across models need the same T")
  out = eigen_analysis.analyse_runs(
      runs, ec, workdir, num_tokens=num_tokens,
      title=f"Eigen-analysis of attention: pretrained {', '.join(names)} on {ic.name}",
      data=f"{half} {ic.name} {ic.split} images (errors and top-1 on {half} others)",
      unit="model")
  out["models"] = names
  out["top1"] = {r.name: r.summary["test_accuracy"] for r in runs}
  return out
