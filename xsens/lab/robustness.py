"""Robustness evaluation of finished runs over a split held in memory.

Config checks of `config.robustness`, the pixel range of each `data.normalize`, a section
timer, and the split-level scores built on `xsens.train.evaluators.over_split` (fixed-size
padded batches, so every jitted function compiles once per model and shape): top-1
accuracy (`split_accuracy`), and the correct counts of `xsens.measures.layer_removal_accuracy`
and `weight_noise_accuracy` summed over a split (`pooled_correct`). The variables are
traced arguments of the jitted batch functions; the model's `apply_fn` is static (one
stable object per run, e.g. `TrainResult.apply_fn`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from xsens import choices
from xsens import measures
from xsens.errors import ConfigError
from xsens.measures import perturbations as pert
from xsens.train import evaluators

# Pixel-range scale of each `data.normalize`: ε is given in [0, 1] pixel units.
PIXEL_SCALE = choices.PIXEL_SCALE
PIXEL_RANGE = {"zero_one": (0.0, 1.0), "half": (-1.0, 1.0)}


def validate_robustness_config(rc, run_names, normalize) -> None:
  """Checks `config.robustness` against the runs (`run_names`: the run ids measured) and
  their `data.normalize`; its fields are checked by the config file
  (`mlcollections_configs.robustness.validate_robustness`)."""
  if rc.baseline_run not in run_names:
    raise ConfigError("robustness.baseline_run",
                      f"{rc.baseline_run!r} is not a run; allowed: {', '.join(run_names)}")
  if normalize not in PIXEL_SCALE:
    raise ConfigError("train.data.normalize", f"the robustness study needs pixel-range "
                      f"inputs; allowed: {', '.join(PIXEL_SCALE)}, got {normalize!r}")


@contextlib.contextmanager
def timed(timings: dict, name: str):
  """Records the wall time of the block in `timings[name]` (seconds, 0.1 s); logs the
  stage's start and end (INFO, `xsens` logger)."""
  log = logging.getLogger("xsens.studies")
  log.info("Stage %s: started", name)
  t0 = time.time()
  yield
  timings[name] = round(time.time() - t0, 1)
  log.info("Stage %s: done in %.1f s", name, timings[name])


# ------------------------------------------------------------------------------ accuracy


@functools.lru_cache(maxsize=64)  # Jitted functions per model, bounded.
def correct_fn(apply_fn) -> Callable[[dict, object], jax.Array]:
  """`fn(batch {"image" [B, ...], "label" [B]}, variables) -> correct [B] bool` of
  `xsens.measures.accuracy`, one function object per `apply_fn` (so `over_split` compiles
  it once per model and shape)."""
  def fn(batch, variables):
    return measures.accuracy(apply_fn, variables, batch["image"],
                             labels=batch["label"])["correct"]
  return fn


def split_accuracy(apply_fn, variables, images, labels, batch_size: int, *, mesh=None,
                   streams: int | None = None) -> float:
  """Top-1 accuracy over a split: correct examples (`correct_fn`, summed by
  `evaluators.over_split`) over N. images [N, ...], labels [N] int; `batch_size` global
  examples per batch (rounded up to the mesh), `mesh` default all devices, `streams`
  batches at once (see `over_split`)."""
  correct = evaluators.over_split(correct_fn(apply_fn), {"image": images, "label": labels},
                                  args=(variables,), reduce="sum", batch_size=batch_size,
                                  mesh=mesh, streams=streams)
  return float(correct) / len(images)


def pooled_correct(measure, variables, images, labels, *, batch_size: int,
                   **kwargs) -> dict[str, np.ndarray]:
  """Counts of correct real examples of a per-batch measure, summed over a split.

  Args:
    measure: `(variables, inputs [B, ...], labels=[B], **kwargs) -> dict` with bool
      entries "baseline_correct" [B] and "correct" [..., B] (e.g.
      `xsens.measures.layer_removal_accuracy` or `weight_noise_accuracy` with its
      options bound); jitted here by `evaluators.over_split`.
    variables: the model's variables.
    images: [N, ...] inputs; labels: [N] int.
    batch_size: examples per call (the last batch padded, its padding rows not counted).
    **kwargs: array arguments of `measure` (e.g. `key`), traced.

  Returns:
    {"baseline_correct": int64 [], "correct": int64 [...]}: correct examples out of N.
  """
  if len(images) != len(labels) or not len(images):
    raise ValueError(f"need as many labels as images (at least one); got "
                     f"{len(images)} images and {len(labels)} labels.")
  names = tuple(kwargs)

  def fn(batch, variables, *values):
    out = measure(variables, batch["image"], labels=batch["label"],
                  **dict(zip(names, values)))
    return {"baseline_correct": out["baseline_correct"],
            "correct": jnp.moveaxis(out["correct"], -1, 0)}  # Examples first: [B, ...].
  sums = evaluators.over_split(fn, {"image": images, "label": labels},
                               args=(variables, *kwargs.values()), reduce="sum",
                               batch_size=batch_size)
  return {k: np.rint(v).astype(np.int64) for k, v in sums.items()}


def split_layer_removal(run, images, labels, *, batch_size: int, layers=None) -> dict:
  """`xsens.measures.layer_removal_accuracy` of one run pooled over a split.

  Args:
    run: has `apply_fn`, `variables` and `model` (a `TrainResult` or a pretrained run).
    images: [N, ...]; labels: [N] int.
    batch_size: examples per call.
    layers: (layer, part) pairs; default every removable branch of the model
      (`perturbations.removable_layers`).

  Returns:
    {"baseline": accuracy of the intact model, "accuracy": {(layer, part): accuracy with
    that one branch removed}}.
  """
  if layers is None:
    layers = pert.removable_layers(run.model)
  layers = tuple((int(i), str(p)) for i, p in layers)
  fn = functools.partial(measures.layer_removal_accuracy, run.apply_fn, model=run.model,
                         layers=layers)
  c = pooled_correct(fn, run.variables, images, labels, batch_size=batch_size)
  n = len(images)
  return {"baseline": int(c["baseline_correct"]) / n,
          "accuracy": {layer: int(k) / n for layer, k in zip(layers, c["correct"])}}


def split_weight_noise(run, images, labels, key, *, relative_scale: float,
                       num_draws: int = 3, layers=None, batch_size: int) -> dict:
  """`xsens.measures.weight_noise_accuracy` of one run pooled over a split.

  Args:
    run: has `apply_fn` and `variables`.
    images: [N, ...]; labels: [N] int.
    key: PRNG key of the draws (the same noisy weights for every batch).
    relative_scale: noise norm relative to each kernel's norm.
    num_draws: noise draws per layer.
    layers: top-level parameter names; default `perturbations.weight_layers`.
    batch_size: examples per call.

  Returns:
    {"baseline": accuracy without noise, "per_layer": {layer: mean accuracy over the
    draws}, "per_layer_draws": {layer: (accuracy of draw 0, ..., draw R-1)}}.
  """
  params = run.variables["params"]
  layers = pert.weight_layers(params) if layers is None else tuple(layers)
  fn = functools.partial(measures.weight_noise_accuracy, run.apply_fn,
                         relative_scale=relative_scale, num_draws=num_draws, layers=layers)
  c = pooled_correct(fn, run.variables, images, labels, batch_size=batch_size, key=key)
  n = len(images)
  per_draw = {name: tuple(int(k) / n for k in row) for name, row in zip(layers, c["correct"])}
  return {"baseline": int(c["baseline_correct"]) / n,
          "per_layer": {name: float(np.mean(d)) for name, d in per_draw.items()},
          "per_layer_draws": per_draw}
