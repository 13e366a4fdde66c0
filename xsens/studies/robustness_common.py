"""Parts shared by the robustness studies (`robustness` and its ImageNet variant).

Config checks of `config.robustness`, the pixel range of each `data.normalize`, a section
timer, and the host loops that pool the per-batch measures of `xsens.measures`
(adversarial, perturbations, corruption_eval) over a dataset held in memory: fixed-size
batches (`xsens.data.batching.padded_index_batches`: the last one padded and masked), so
every jitted function compiles once per model and shape.

Compilation. Each function jits its measure once per call with the model's `apply_fn`
static (one stable object per run, e.g. `TrainResult.apply_fn`); no module-level cache.
Where a section scores a model held fixed over many batches and attacks
(`bind`), the jitted function closes over the variables, as the study has always done:
XLA then folds computations on the weights (e.g. BatchNorm's scale / sqrt(var + eps)) at
compile time, and keeping that form keeps the published numbers bit-identical. Build it
once per run and reuse it: it compiles once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax.experimental import multihost_utils

from xsens.data import batching
from xsens.errors import ConfigError, is_finite_number, is_int, require
from xsens.measures import adversarial as adv
from xsens.measures import corruption_eval, corruptions
from xsens.measures import perturbations as pert
from xsens.train.progress import progress
from xsens.train import sharding
from xsens.train import streams as streams_lib

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


def bind(apply_fn, variables) -> Callable[[jax.Array], jax.Array]:
  """jit(`inputs -> argmax labels [B]`) of one model, closed over its variables (see the
  module docstring); build once per run."""
  return jax.jit(lambda x: jnp.argmax(apply_fn(variables, x), -1))


def predict_labels(label_fn, images: np.ndarray, batch_size: int) -> np.ndarray:
  """`label_fn` (e.g. from `bind`) over fixed-size batches. [N, ...] -> [N] int."""
  return batched(label_fn, images, batch_size=batch_size)


def accuracy(label_fn, images, labels, batch_size: int) -> float:
  """Top-1 accuracy of `label_fn` (from `bind`) over a split."""
  return float(np.mean(predict_labels(label_fn, images, batch_size) == np.asarray(labels)))


# --------------------------------------------------------------------------- corruptions


def corruption_accuracy(label_fn, images: np.ndarray, labels: np.ndarray, *,
                        normalize: str, stats=None,
                        names: Sequence[str] = corruptions.NAMES,
                        severities: Sequence[int] = corruptions.SEVERITIES, seed: int = 0,
                        batch_size: int = 256, streams: int | None = None
                        ) -> dict[tuple[str, int], float]:
  """Top-1 accuracy on every (corruption, severity) of a split, NumPy corruptions on the host.

  Up to `streams` (corruption, severity) sets are corrupted and predicted at once, one host
  thread each (`xsens.train.streams`; None: one per core on a CPU); each set's corruption
  has its own seed, so the accuracies do not depend on it.

  Args:
    label_fn: `inputs [B, H, W, C] (model space) -> labels [B]`, e.g. `bind(apply_fn,
      variables)`.
    images: [N, H, W, C] in model space (a `Split.images`), C in {1, 3}.
    labels: [N] int.
    normalize: how `images` were normalised ("zero_one" | "half" | "standardize").
    stats: (mean [C], std [C]) for "standardize".
    names: corruptions to run (default all 15).
    severities: subset of 1..5.
    seed: corruption seed (see `corruption_eval.corrupt_normalized`).
    batch_size: prediction batch size.
    streams: sets at once (see above).

  Returns:
    {(name, severity): accuracy in [0, 1]}.
  """
  names = corruption_eval.check_names(names)
  severities = corruption_eval.check_severities(severities)
  labels = np.asarray(labels)
  if len(labels) != len(images) or len(labels) == 0:
    raise ValueError(f"need as many labels as images (> 0), got {len(labels)} and "
                     f"{len(images)}")
  sets = [(n, s) for n in names for s in severities]

  def one(name_severity):
    x = corruption_eval.corrupt_normalized(images, *name_severity, normalize=normalize,
                                           stats=stats, seed=seed)
    return accuracy(label_fn, x, labels, batch_size)

  accs = streams_lib.ordered_map(one, progress(sets, desc="corruptions", unit="set"),
                                 streams_lib.resolve(streams))
  return dict(zip(sets, accs))


# ------------------------------------------------------------------ model perturbations


def _check_split(images, labels) -> None:
  if len(images) != len(labels) or not len(images):
    raise ValueError(f"need as many labels as images (at least one); got "
                     f"{len(images)} images and {len(labels)} labels.")


def layer_removal_accuracy(apply_fn, variables, images, labels, *, model,
                           layers=None, parts=pert.PARTS, batch_size: int = 256) -> dict:
  """`perturbations.layer_removal_accuracy` pooled over a split.

  Returns:
    {"baseline": accuracy of the intact model,
     "accuracy": {(layer, part): accuracy with that one branch removed}}.
  """
  _check_split(images, labels)
  if layers is None:
    layers = pert.removable_layers(model, parts)
  layers = tuple((int(i), str(p)) for i, p in layers)
  fn = jax.jit(functools.partial(pert.layer_removal_accuracy, apply_fn, model=model,
                                 layers=layers))
  base, per_layer = 0, np.zeros(len(layers), np.int64)
  for idx, mask in batching.padded_index_batches(len(images), batch_size):
    out = fn(variables, np.asarray(images)[idx], labels=np.asarray(labels)[idx])
    keep = mask > 0
    base += int(np.asarray(out["baseline_correct"])[keep].sum())
    per_layer += np.asarray(out["correct"])[:, keep].sum(axis=1)
  n = len(images)
  return {"baseline": base / n,
          "accuracy": {layer: int(c) / n for layer, c in zip(layers, per_layer)}}


def weight_noise_accuracy(apply_fn, variables, images, labels, key, *, relative_scale: float,
                          num_draws: int = 3, layers=None, batch_size: int = 256) -> dict:
  """`perturbations.weight_noise_accuracy` pooled over a split.

  Returns:
    {"baseline": accuracy without noise, "per_layer": {layer: mean accuracy over the
     draws}, "per_layer_draws": {layer: (accuracy of draw 0, ..., draw R-1)}}.
  """
  _check_split(images, labels)
  layers = (pert.weight_layers(variables["params"]) if layers is None else tuple(layers))
  fn = jax.jit(functools.partial(pert.weight_noise_accuracy, apply_fn,
                                 relative_scale=relative_scale, num_draws=num_draws,
                                 layers=layers))
  base, draws = 0, np.zeros((len(layers), num_draws), np.int64)
  for idx, mask in batching.padded_index_batches(len(images), batch_size):
    out = fn(variables, np.asarray(images)[idx], labels=np.asarray(labels)[idx], key=key)
    keep = mask > 0
    base += int(np.asarray(out["baseline_correct"])[keep].sum())
    draws += np.asarray(out["correct"])[:, :, keep].sum(axis=-1)
  n = len(images)
  per_draw = {name: tuple(int(c) / n for c in row) for name, row in zip(layers, draws)}
  return {"baseline": base / n,
          "per_layer": {name: float(np.mean(d)) for name, d in per_draw.items()},
          "per_layer_draws": per_draw}
