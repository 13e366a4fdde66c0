"""The train-set sensitivity of a finished run, and the checks of `config.sensitivity`.

"Transformers Learn Low Sensitivity Functions" (ICLR 2025, arXiv 2403.06925): the
token-wise Gaussian sensitivity S_σ(f) of a model on its training examples, for every σ of
`sensitivity.sigmas` (docs/papers/sensitivity.md §2.1), the official code's scattered-pixel
estimate (docs/papers/sensitivity.md §2.2), the global variant with noise on every patch at once
(App. A.2), and the sharpness of the weights (the official code's `check_sharpness`,
docs/papers/sensitivity.md §4), by the estimators of `xsens.measures.sensitivity` over padded
batches of the examples (`xsens.train.evaluators.over_split`). Keys: a run's key folded with the σ
index, then the batch number (global: first with len(σ) + 1; sharpness: len(σ) + 2, then the draw).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from xsens import measures
from xsens.errors import ConfigError, is_int
from xsens.lab import multirun
from xsens.measures import sensitivity as sens
from xsens.train import evaluators, sharding
from xsens.train.progress import progress


def validate_patch_size(sc, image_shape) -> None:
  """Checks `sensitivity.patch_size` against the data's image shape [H, W, C] (before any
  compile); the other fields of `config.sensitivity` are checked by the config file
  (`mlcollections_configs.sensitivity_vision.validate_sensitivity`)."""
  h, w, _ = image_shape
  p = sc.patch_size
  if not (is_int(p) and p > 0 and h % p == 0 and w % p == 0):
    allowed = [d for d in range(1, min(h, w) + 1) if h % d == 0 and w % d == 0]
    raise ConfigError("sensitivity.patch_size",
                      f"{p} must divide the image size {h}x{w}; allowed: {allowed}")


def validate_against_runs(config, experiments) -> None:
  """`config.sensitivity` against the runs: the image shape, and the ViT's patch size (the
  tokens measured are the ViT's tokens)."""
  sc = config.sensitivity
  validate_patch_size(sc, next(iter(experiments.values())).train.image_shape)
  multirun.require_vit_patch_size(config, experiments, "sensitivity.patch_size", sc.patch_size)


def enabled(sc, name: str) -> bool:
  """Whether the optional block `sensitivity.<name>` is set (not None) and enabled."""
  block = sc[name]
  return block is not None and block.enabled


def config_summary(sc) -> dict:
  """The settings of `config.sensitivity` a report records (results.json)."""
  out = {"patch_size": sc.patch_size, "sigmas": [float(s) for s in sc.sigmas],
         "num_draws": sc.num_draws, "num_examples": sc.num_examples,
         "scattered": sc.scattered.to_dict()}
  for name in ("global_noise", "sharpness"):
    if sc[name] is not None:
      out[name] = sc[name].to_dict()
  return out


@functools.partial(jax.jit, static_argnames=("model", "patch_size", "num_draws", "chunk_size"))
def patch_batch(variables, images, mask, key, sigma, *, model, patch_size, num_draws,
                chunk_size):
  """Per-example and per-patch flip rates of one padded batch (paper mode,
  docs/papers/sensitivity.md §2.1)."""
  out = sens.token_sensitivity(
      functools.partial(model.apply, train=False), variables, images, key=key, mask=mask,
      patch_size=patch_size, sigma=sigma, num_draws=num_draws, chunk_size=chunk_size,
      example_chunk_size=None)
  return out["per_example"], out["per_patch_map"]


@functools.partial(jax.jit, static_argnames=("model", "num_draws", "num_pixels"))
def _scattered_batch(variables, images, mask, key, sigma, *, model, num_draws, num_pixels):
  """Per-example flip rates of one padded batch (the official code's mode,
  docs/papers/sensitivity.md §2.2)."""
  out = sens.scattered_pixel_sensitivity(
      functools.partial(model.apply, train=False), variables, images, key=key, mask=mask,
      sigma=sigma, num_draws=num_draws, num_pixels=num_pixels, chunk_size=None,
      example_chunk_size=None)
  return out["per_example"]


@functools.partial(jax.jit, static_argnames=("model", "patch_size", "num_draws", "chunk_size"))
def global_batch(variables, images, mask, key, sigma, *, model, patch_size, num_draws,
                 chunk_size):
  """Per-example flip rates of one padded batch with noise on every patch (App. A.2)."""
  out = measures.global_sensitivity(
      functools.partial(model.apply, train=False), variables, images, key=key, mask=mask,
      patch_size=patch_size, sigma=sigma, num_draws=num_draws, chunk_size=chunk_size,
      example_chunk_size=None)
  return out["per_example"]


@functools.partial(jax.jit, static_argnames=("model",))
def _sharpness_batch(variables, images, mask, key, sigma, *, model):
  """Masked means over one padded batch of one weight-noise draw (docs/papers/sensitivity.md §4):
  {"l1": the L1 logit change, "flip": the label flips, "count": the real examples}, scalars. The
  draw depends on `key` only, not on the batch."""
  out = measures.sharpness(functools.partial(model.apply, train=False), variables, images,
                           key=key, sigma=sigma, num_draws=1, mask=mask)
  return {"l1": out["sharpness_l1"], "flip": out["sharpness_flip"], "count": jnp.sum(mask)}


_BATCH_FNS = {"patch": patch_batch, "scattered": _scattered_batch, "global": global_batch,
              "sharpness": _sharpness_batch}


@functools.lru_cache(maxsize=None)
def _keyed(kind: str, batch_size: int, fold_batch: bool, static: tuple):
  """`fn(batch, variables, key, sigma)` for `evaluators.over_split`: the batch function
  `_BATCH_FNS[kind]` (static arguments `dict(static)`) on the batch's images and mask, with
  `key` folded with the batch number (`batch["index"][0] // batch_size`) when
  `fold_batch`. One function object per argument tuple, so it compiles once per shape."""
  inner, kw = _BATCH_FNS[kind], dict(static)

  def fn(batch, variables, key, sigma):
    if fold_batch:
      key = jax.random.fold_in(key, batch["index"][0] // batch_size)
    return inner(variables, batch["image"], batch["mask"], key, sigma, **kw)
  return fn


def _map_batches(kind: str, images: np.ndarray, sc, mesh, variables, key, sigma, *,
                 fold_batch: bool = True, reduce: str = "concat", **static):
  """The outputs of the batch function `kind` over the padded batches of `images`
  (`sensitivity.batch_size`, rounded up to the mesh; up to `sensitivity.streams` at once,
  the results do not depend on it), on the host: per example ([N, ...] each) or, with
  `reduce="per_batch"`, one per batch."""
  bs = sharding.round_to_devices(sc.batch_size, mesh.size)
  fn = _keyed(kind, bs, fold_batch, tuple(sorted(static.items())))
  return evaluators.over_split(fn, {"image": images}, args=(variables, key, sigma),
                               reduce=reduce, batch_size=bs, mesh=mesh, streams=sc.streams)


def stderr(per_example: np.ndarray) -> float:
  """Standard error of the mean of [N] values (sample std / √N; NaN for N < 2)."""
  n = len(per_example)
  return float(per_example.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")


def measure_model(result, sc, key, mesh, scale: float = 1.0) -> dict:
  """Train-set sensitivity of one trained model at every σ (and the scattered-pixel mode).

  The noise's standard deviation is σ·`scale` (`sensitivity.noise_scale`). Returns
  {"sigmas": {σ: (mean, stderr)}, "per_patch_map": [H/p, W/p] at the main σ,
  "scattered": (mean, stderr) or None}. The stderr is the standard error over examples
  (sample std of per-example means / √N), which includes the Monte-Carlo noise.
  """
  images = result.train.images[:sc.num_examples]
  over_batches = functools.partial(_map_batches, images=images, sc=sc, mesh=mesh,
                                   variables=result.variables, model=result.model)
  out = {"sigmas": {}, "per_patch_map": None, "scattered": None}
  for s_idx, sigma in enumerate(progress(sc.sigmas, desc="σ sweep", unit="σ")):
    pe, pm = over_batches("patch", key=jax.random.fold_in(key, s_idx),
                          sigma=jnp.float32(sigma * scale), patch_size=sc.patch_size,
                          num_draws=sc.num_draws, chunk_size=sc.chunk_size)
    out["sigmas"][float(sigma)] = (float(pe.mean()), stderr(pe))
    if sigma == sc.main_sigma:
      out["per_patch_map"] = pm.mean(axis=0)
  if sc.scattered.enabled:
    pe = over_batches("scattered", key=jax.random.fold_in(key, len(sc.sigmas)),
                      sigma=jnp.float32(sc.scattered.sigma * scale),
                      num_draws=sc.scattered.num_draws, num_pixels=sc.scattered.num_pixels)
    out["scattered"] = (float(pe.mean()), stderr(pe))
  return out


def measure_global(result, sc, key, mesh, scale: float = 1.0) -> dict:
  """Train-set global sensitivity (noise on every patch at once, App. A.2) at every σ
  (standard deviation σ·`scale`).

  The same examples, batches and σ grid as `measure_model`, with
  `sensitivity.global_noise.num_draws` draws per example; its own keys (`key` is the
  model's key, folded with len(σ) + 1, then the σ index, then the batch), so the
  token-wise numbers do not change. Returns {σ: (mean, stderr over examples)}.
  """
  images = result.train.images[:sc.num_examples]
  key = jax.random.fold_in(key, len(sc.sigmas) + 1)
  out = {}
  for s_idx, sigma in enumerate(progress(sc.sigmas, desc="global σ sweep", unit="σ")):
    pe = _map_batches("global", images, sc, mesh, result.variables,
                      jax.random.fold_in(key, s_idx), jnp.float32(sigma * scale),
                      model=result.model, patch_size=sc.patch_size,
                      num_draws=sc.global_noise.num_draws, chunk_size=sc.chunk_size)
    out[float(sigma)] = (float(pe.mean()), stderr(pe))
  return out


def measure_sharpness(result, sc, key, mesh) -> dict:
  """Sharpness of one trained model on the evaluated training examples (docs/papers/sensitivity.md
  §4).

  Draw r adds N(0, σ²) to every parameter (`xsens.measures.sharpness` with the key
  fold_in(fold_in(key, len(σ) + 2), r), the same noisy weights for every batch); its value
  is the mean over the examples of the L1 logit change (and of the label flips). Returns
  {"sharpness_l1": (mean, stderr), "sharpness_flip": (mean, stderr)}, mean and standard
  error over the `sensitivity.sharpness.num_draws` draws (the examples are fixed).
  """
  shc = sc.sharpness
  images = result.train.images[:sc.num_examples]
  key = jax.random.fold_in(key, len(sc.sigmas) + 2)
  draws = np.zeros((shc.num_draws, 2))
  for r in range(shc.num_draws):
    batches = _map_batches("sharpness", images, sc, mesh, result.variables,
                           jax.random.fold_in(key, r), jnp.float32(shc.sigma),
                           fold_batch=False, reduce="per_batch", model=result.model)
    sums, count = np.zeros(2), 0.0   # Batch means weighted by their real examples.
    for b in batches:
      sums += float(b["count"]) * np.array([float(b["l1"]), float(b["flip"])])
      count += float(b["count"])
    draws[r] = sums / count
  return {name: (float(draws[:, j].mean()), stderr(draws[:, j]))
          for j, name in enumerate(("sharpness_l1", "sharpness_flip"))}


def token_rms(images: np.ndarray, patch_size: int) -> float:
  """RMS norm of a clean p×p patch, sqrt(mean over examples and patches of ‖x_i‖²), in
  float64 (patches tile the image, so it is sqrt(D · mean pixel²), D = p·p·C)."""
  x = np.asarray(images, np.float64)
  return math.sqrt(patch_size * patch_size * x.shape[-1] * float(np.mean(x * x)))


def noise_to_signal(sigma: float, patch_size: int, channels: int, rms: float) -> float:
  """σ relative to the tokens' scale: the RMS norm of a patch's noise, σ·√(p·p·C), over
  the RMS norm of a clean patch (`token_rms`)."""
  return sigma * math.sqrt(patch_size * patch_size * channels) / rms
