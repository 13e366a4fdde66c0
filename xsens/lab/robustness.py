"""Robustness evaluation of finished runs over a split held in memory.

Config checks of `config.robustness`, the pixel range of each `data.normalize`, a section
timer, and the host loops that pool the per-batch measures of `xsens.measures`
(`accuracy`, `layer_removal_accuracy`, `weight_noise_accuracy`, the attacks) over a split:
fixed-size batches (`xsens.data.batching.padded_index_batches`: the last one padded and
masked), so every jitted function compiles once per model and shape.

Compilation. Where a section scores a model held fixed over many batches and attacks
(`bind`), the jitted function closes over the variables: XLA then folds computations on
the weights (e.g. BatchNorm's scale / sqrt(var + eps)) at compile time, and keeping that
form keeps the published numbers bit-identical. Build it once per run and reuse it: it
compiles once. `pooled_correct` jits nothing: its caller jits the measure with `apply_fn`
static (one stable object per run, e.g. `TrainResult.apply_fn`) and the variables traced.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable

import jax
import numpy as np

from jax.experimental import multihost_utils

from xsens import measures
from xsens.data import batching
from xsens.errors import ConfigError, is_finite_number, is_int, require
from xsens.measures import adversarial as adv
from xsens.measures import corruptions
from xsens.measures import perturbations as pert
from xsens.train import sharding

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
  ac = rc.adversarial
  if not ac.epsilons or not all(is_finite_number(e) and e > 0 for e in ac.epsilons):
    raise ConfigError("robustness.adversarial.epsilons",
                      f"must be a non-empty list of finite ε > 0, got {list(ac.epsilons)}")
  if ac.main_epsilon not in ac.epsilons:
    raise ConfigError("robustness.adversarial.main_epsilon",
                      f"must be one of {list(ac.epsilons)}")
  if ac.norm not in adv.NORMS:
    raise ConfigError("robustness.adversarial.norm",
                      f"got {ac.norm!r}; allowed: {', '.join(adv.NORMS)}")
  require(is_int(ac.pgd_steps) and ac.pgd_steps > 0, "robustness.adversarial.pgd_steps",
          f"must be an int > 0, got {ac.pgd_steps!r}")
  for field in ("step_size_fraction", "low_freq_cutoff"):
    require(is_finite_number(ac[field]) and ac[field] > 0, f"robustness.adversarial.{field}",
            f"must be a finite number > 0, got {ac[field]!r}")
  for field in ("num_examples", "batch_size", "patch_size"):
    require(is_int(rc[field]) and rc[field] > 0, f"robustness.{field}",
            f"must be an int > 0, got {rc[field]!r}")
  pc = rc.get("perturbations")  # Not in the ImageNet setup.
  if pc is not None:
    for field in ("relative_scale", "sharpness_sigma"):
      require(is_finite_number(pc[field]) and pc[field] >= 0,
              f"robustness.perturbations.{field}",
              f"must be a finite number >= 0, got {pc[field]!r}")
    for field in ("num_draws", "sharpness_examples"):
      require(is_int(pc[field]) and pc[field] > 0, f"robustness.perturbations.{field}",
              f"must be an int > 0, got {pc[field]!r}")
  reps = rc.get("representations")
  if reps is not None:
    require(is_int(reps.num_examples) and reps.num_examples > 0,
            "robustness.representations.num_examples",
            f"must be an int > 0, got {reps.num_examples!r}")


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


# ------------------------------------------------------------------------------ batching


def batched(fn, *arrays, batch_size, mesh=None):
  """Applies `fn` to equal-size batches (last one padded) and concatenates.

  `fn(*batches) -> pytree of [B, ...]`; returns that pytree over the N real examples,
  [N, ...] (padding rows dropped), as host arrays. Each batch is split over the devices of
  `mesh` (default: all devices, `sharding.data_mesh()`), B = `batch_size` rounded up to a
  multiple of their number; with several processes each one puts its slice of the batch
  and the outputs are gathered (`process_allgather`), so every process returns the same
  arrays. On one device this is the plain host loop.
  """
  mesh = sharding.data_mesh() if mesh is None else mesh
  size = -(-batch_size // mesh.size) * mesh.size
  pc, pi = jax.process_count(), jax.process_index()
  local = slice(pi * size // pc, (pi + 1) * size // pc)
  outs = []
  for idx, mask in batching.padded_index_batches(len(arrays[0]), size):
    out = fn(*sharding.global_batch(tuple(np.asarray(a[idx[local]]) for a in arrays), mesh))
    if pc > 1:
      out = multihost_utils.process_allgather(out, tiled=True)
    keep = int(mask.sum())
    outs.append(jax.tree.map(lambda o, k=keep: np.asarray(o)[:k], out))
  return jax.tree.map(lambda *o: np.concatenate(o), *outs)


def bind(apply_fn, variables) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """jit(`(inputs [B, ...], labels [B]) -> correct [B] bool`) of one model
  (`xsens.measures.accuracy`), closed over its variables (see the module docstring);
  build once per run."""
  return jax.jit(lambda x, y: measures.accuracy(apply_fn, variables, x, labels=y)["correct"])


def split_accuracy(correct_fn, images, labels, batch_size: int) -> float:
  """Top-1 accuracy over a split: the mean of `correct_fn` (from `bind`) over fixed-size
  batches (`batched`). images [N, ...], labels [N] int."""
  return float(np.mean(batched(correct_fn, images, labels, batch_size=batch_size)))


def pooled_correct(measure, variables, images, labels, *, batch_size: int,
                   **kwargs) -> dict[str, np.ndarray]:
  """Counts of correct real examples of a per-batch measure, summed over a split.

  Args:
    measure: jitted `(variables, inputs [B, ...], labels=[B], **kwargs) -> dict` with
      bool entries "baseline_correct" [B] and "correct" [..., B] (e.g.
      `xsens.measures.layer_removal_accuracy` or `weight_noise_accuracy` with its
      options bound).
    variables: the model's variables.
    images: [N, ...] inputs; labels: [N] int.
    batch_size: examples per call (the last batch padded, its padding rows not counted).

  Returns:
    {"baseline_correct": int64 [], "correct": int64 [...]}: correct examples out of N.
  """
  if len(images) != len(labels) or not len(images):
    raise ValueError(f"need as many labels as images (at least one); got "
                     f"{len(images)} images and {len(labels)} labels.")
  sums = {}
  for idx, mask in batching.padded_index_batches(len(images), batch_size):
    out = measure(variables, np.asarray(images)[idx], labels=np.asarray(labels)[idx],
                  **kwargs)
    keep = mask > 0
    for name in ("baseline_correct", "correct"):
      count = np.asarray(out[name])[..., keep].sum(axis=-1)
      sums[name] = count if name not in sums else sums[name] + count
  return sums


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
  fn = jax.jit(functools.partial(measures.layer_removal_accuracy, run.apply_fn,
                                 model=run.model, layers=layers))
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
  fn = jax.jit(functools.partial(measures.weight_noise_accuracy, run.apply_fn,
                                 relative_scale=relative_scale, num_draws=num_draws,
                                 layers=layers))
  c = pooled_correct(fn, run.variables, images, labels, batch_size=batch_size, key=key)
  n = len(images)
  per_draw = {name: tuple(int(k) / n for k in row) for name, row in zip(layers, c["correct"])}
  return {"baseline": int(c["baseline_correct"]) / n,
          "per_layer": {name: float(np.mean(d)) for name, d in per_draw.items()},
          "per_layer_draws": per_draw}
