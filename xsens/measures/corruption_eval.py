"""Accuracy under common corruptions, mCE and relative mCE (CIFAR-10-C / ImageNet-C protocol).

Reference: D. Hendrycks and T. Dietterich, "Benchmarking Neural Network Robustness to
Common Corruptions and Perturbations", ICLR 2019, arXiv 1903.12261.

  * `corruption_accuracy(apply_fn, variables, inputs, *, labels, name, severity, key, mask,
    normalize, stats)`: accuracy of one (padded) batch held in the model's input space under
    one corruption of `corruptions_jax.JAX_CORRUPTIONS`, corrupted on the device, so it composes
    inside a caller's `jax.jit` (the measures convention of `xsens.measures`: `apply_fn
    (variables, inputs) -> logits` in eval mode, a dict of arrays back, nothing jitted here).
    The `corruptions_jax.HOST_ONLY` corruptions run on the host: `corrupt_normalized` corrupts
    model-space images with the NumPy versions, and the lab loops over the split
    (`xsens.lab.corruptions.host_corruption_accuracy`).
  * Aggregates: `per_corruption` (mean over severities), `per_category`,
    `mean_corruption_accuracy` (mCA), `errors` (1 - accuracy).
  * Corruption error of model f on corruption c relative to a baseline b (e.g. AlexNet for
    ImageNet-C): CE_c = sum_s E(f, c, s) / sum_s E(b, c, s); mCE = mean_c CE_c (`mce`).
    Relative: sum_s (E(f, c, s) - E_clean(f)) / sum_s (E(b, c, s) - E_clean(b)), averaged
    over c (`relative_mce`); `mce_table` for several models against a named baseline.
  The pre-computed CIFAR-10-C is read by `xsens.data.corrupted.load_cifar10_corrupted`.

Corruptions are applied in [0, 1] pixel space: `to_unit_range` undoes `data.normalize`,
`from_unit_range` redoes it.
"""

from collections.abc import Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from xsens.measures import corruptions
from xsens.measures import corruptions_jax

Key = tuple[str, int]  # (corruption name, severity)

CORRUPT_CHUNK = 1000  # Images corrupted per call; chunk k uses seed (seed, k).

NORMALIZE = ("zero_one", "half", "standardize")  # The `data.normalize` modes.


# ------------------------------------------------------------------------------------------------
# Normalisation.


def _stats(normalize: str, stats) -> tuple[np.ndarray, np.ndarray] | None:
  if normalize not in NORMALIZE:
    raise ValueError(f"normalize must be one of {', '.join(NORMALIZE)}, "
                     f"got {normalize!r}")
  if normalize != "standardize":
    return None
  if stats is None:
    raise ValueError("normalize='standardize' needs stats=(mean, std), the per-channel [C] "
                     "statistics of the [0, 1] train images (xsens.data.pipeline.channel_stats)")
  mean, std = stats
  return np.asarray(mean, np.float32), np.asarray(std, np.float32)


def to_unit_range(images: np.ndarray, normalize: str, stats=None) -> np.ndarray:
  """Model input space -> [0, 1] pixel space (inverse of `data.normalize`).

  "zero_one": identity; "half": (x + 1) / 2; "standardize": x * std + mean.

  Args:
    images: [N, H, W, C] normalised images.
    normalize: "zero_one" | "half" | "standardize".
    stats: (mean [C], std [C]) of the [0, 1] train images, for "standardize" only.

  Returns:
    [N, H, W, C] float32 (not clipped).
  """
  s = _stats(normalize, stats)
  x = np.asarray(images, np.float32)
  if normalize == "half":
    return (x + 1) / 2
  if normalize == "standardize":
    return x * s[1] + s[0]
  return x


def from_unit_range(images01: np.ndarray, normalize: str, stats=None) -> np.ndarray:
  """[0, 1] pixel space -> model input space (`data.normalize`). Same shapes as `to_unit_range`."""
  s = _stats(normalize, stats)
  x = np.asarray(images01, np.float32)
  if normalize == "half":
    return (x - np.float32(0.5)) / np.float32(0.5)
  if normalize == "standardize":
    return (x - s[0]) / s[1]
  return x


# ------------------------------------------------------------------------------------------------
# Evaluation.


def check_names(names: Iterable[str]) -> list[str]:
  """Validates corruption names; returns them as a list."""
  names = list(names)
  unknown = [n for n in names if n not in corruptions.CORRUPTIONS]
  if unknown:
    raise ValueError(f"unknown corruption {unknown[0]!r}; allowed: "
                     f"{', '.join(corruptions.NAMES)}")
  return names


def check_severities(severities: Iterable[int]) -> list[int]:
  """Validates severities (1..5, at least one); returns them as ints."""
  severities = list(severities)
  if not severities or any(s not in corruptions.SEVERITIES for s in severities):
    raise ValueError(f"severities must be in 1..5, got {severities}")
  return [int(s) for s in severities]


def corrupt_normalized(images: np.ndarray, name: str, severity: int, *, normalize: str,
                       stats=None, seed: int = 0) -> np.ndarray:
  """Corrupts images held in model space: to [0, 1] (clipped), `corrupt`, back to model space.

  Host NumPy (every corruption). Chunk k of `CORRUPT_CHUNK` images is corrupted with seed
  (seed, k), so the result does not depend on any batch size.
  [N, H, W, C] -> [N, H, W, C] float32.
  """
  x01 = np.clip(to_unit_range(images, normalize, stats), 0, 1)
  out = np.empty_like(x01)
  for k, start in enumerate(range(0, len(x01), CORRUPT_CHUNK)):
    chunk = x01[start:start + CORRUPT_CHUNK]
    out[start:start + len(chunk)] = corruptions.corrupt(chunk, name, severity, seed=(seed, k))
  return from_unit_range(out, normalize, stats)


def corrupt_normalized_jax(inputs, name: str, severity: int, *, normalize: str, stats=None,
                           key=None):
  """`corrupt_normalized` on the device for `corruptions_jax.JAX_CORRUPTIONS` (jittable; name,
  severity and normalize static). [B, H, W, C] -> [B, H, W, C] float32."""
  _stats(normalize, None if stats is None else (np.zeros(1), np.ones(1)))  # Validates.
  s = None if stats is None else tuple(jnp.asarray(v, jnp.float32) for v in stats)
  x = jnp.asarray(inputs, jnp.float32)
  if normalize == "half":
    x = (x + 1) / 2
  elif normalize == "standardize":
    x = x * s[1] + s[0]
  out = corruptions_jax.corrupt_jax(jnp.clip(x, 0, 1), name, severity, key)
  if normalize == "half":
    return (out - jnp.float32(0.5)) / jnp.float32(0.5)
  if normalize == "standardize":
    return (out - s[0]) / s[1]
  return out


def corruption_accuracy(apply_fn, variables, inputs, *, labels, name: str, severity: int,
                        key=None, mask=None, normalize: str = "zero_one",
                        stats=None) -> dict[str, jax.Array]:
  """Top-1 accuracy of one (padded) batch under one corruption, corrupted on the device.

  Args:
    apply_fn: (variables, inputs) -> logits [B, K] in eval mode, e.g.
      `TrainResult.apply_fn`.
    variables: the model's variables.
    inputs: [B, H, W, C] clean inputs in model space (normalised by `normalize`).
    labels: int [B].
    name: a corruption of `corruptions_jax.JAX_CORRUPTIONS` (static; `HOST_ONLY` ones raise:
      corrupt them on the host with `corrupt_normalized`).
    severity: 1..5 (static).
    key: PRNG key for the noises.
    mask: optional [B] weights (0 for padding rows).
    normalize: how `inputs` were normalised ("zero_one" | "half" | "standardize"; static).
    stats: (mean [C], std [C]) for "standardize".

  Returns:
    {"accuracy": masked mean, "correct": bool [B], "count": weighted examples}.
  """
  x = corrupt_normalized_jax(inputs, name, severity, normalize=normalize, stats=stats,
                             key=key)
  correct = jnp.argmax(apply_fn(variables, x), -1) == labels
  w = (jnp.ones(correct.shape, jnp.float32) if mask is None else
       jnp.asarray(mask).astype(jnp.float32))
  count = w.sum()
  return {"accuracy": jnp.sum(w * correct) / jnp.maximum(count, 1.0), "correct": correct,
          "count": count}


# ------------------------------------------------------------------------------------------------
# Aggregates.


def errors(accuracies: Mapping[Key, float]) -> dict[Key, float]:
  """{key: 1 - accuracy}."""
  return {k: 1.0 - float(v) for k, v in accuracies.items()}


def _by_name(values: Mapping[Key, float]) -> dict[str, dict[int, float]]:
  out: dict[str, dict[int, float]] = {}
  for (name, severity), v in values.items():
    out.setdefault(name, {})[int(severity)] = float(v)
  return out


def per_corruption(accuracies: Mapping[Key, float]) -> dict[str, float]:
  """Mean over severities, per corruption: {name: mean accuracy}."""
  return {name: float(np.mean(list(sev.values())))
          for name, sev in _by_name(accuracies).items()}


def per_category(accuracies: Mapping[Key, float]) -> dict[str, float]:
  """Mean of `per_corruption` over the corruptions of each category present."""
  means = per_corruption(accuracies)
  out = {}
  for category, names in corruptions.CATEGORIES.items():
    present = [means[n] for n in names if n in means]
    if present:
      out[category] = float(np.mean(present))
  unknown = [n for n in means if n not in corruptions.CORRUPTIONS]
  if unknown:
    raise ValueError(f"unknown corruption {unknown[0]!r}; allowed: "
                     f"{', '.join(corruptions.NAMES)}")
  return out


def mean_corruption_accuracy(accuracies: Mapping[Key, float]) -> float:
  """mCA: mean over corruptions of the mean over severities."""
  if not accuracies:
    raise ValueError("no accuracies")
  return float(np.mean(list(per_corruption(accuracies).values())))


def _matched(model: Mapping[Key, float], baseline: Mapping[Key, float]):
  if set(model) != set(baseline):
    missing = sorted(set(model) ^ set(baseline))
    raise ValueError(f"model and baseline must cover the same (name, severity) keys; "
                     f"differ at {missing[:3]}")
  if not model:
    raise ValueError("no errors")
  return _by_name(model), _by_name(baseline)


def corruption_errors(errors_model: Mapping[Key, float],
                      errors_baseline: Mapping[Key, float]) -> dict[str, float]:
  """CE_c = sum_s E_model(c, s) / sum_s E_baseline(c, s), per corruption c."""
  model, base = _matched(errors_model, errors_baseline)
  out = {}
  for name, sev in model.items():
    denom = sum(base[name].values())
    if denom <= 0:
      raise ValueError(f"baseline error on {name!r} sums to {denom}; CE is undefined")
    out[name] = sum(sev.values()) / denom
  return out


def mce(errors_model: Mapping[Key, float], errors_baseline: Mapping[Key, float]) -> float:
  """Hendrycks' mCE: mean over corruptions of `corruption_errors` (1 for the baseline itself).

  Args:
    errors_model, errors_baseline: {(name, severity): top-1 error}, same keys (see `errors`).
  """
  return float(np.mean(list(corruption_errors(errors_model, errors_baseline).values())))


def relative_mce(errors_model: Mapping[Key, float], clean_error_model: float,
                 errors_baseline: Mapping[Key, float], clean_error_baseline: float) -> float:
  """Relative mCE: mean_c sum_s (E_model(c,s) - E_model_clean) / sum_s (E_base(c,s) - E_base_clean).

  Measures the degradation relative to clean data, normalised by the baseline's. Undefined
  (NaN) when the baseline does not degrade on some corruption (a zero denominator, e.g. an
  untrained baseline that predicts one class whatever the input).
  """
  model, base = _matched(errors_model, errors_baseline)
  ratios = []
  for name, sev in model.items():
    denom = sum(v - clean_error_baseline for v in base[name].values())
    if denom == 0:
      return float("nan")
    ratios.append(sum(v - clean_error_model for v in sev.values()) / denom)
  return float(np.mean(ratios))


# Below this |sum_s (E_base(c, s) - E_base_clean)| the relative mCE divides by (near) zero.
REL_MCE_MIN_DEGRADATION = 0.05


def relative_mce_warning(errors_baseline: Mapping[Key, float], clean_error_baseline: float,
                         threshold: float = REL_MCE_MIN_DEGRADATION) -> str | None:
  """One line when the relative mCE's denominator is near zero, else None.

  The denominator |sum_s (E_base(c, s) - E_base_clean)| (the baseline's degradation on
  corruption c, summed over severities) below `threshold` on some c makes the relative mCE
  a ratio of noise (e.g. -1.125 from a baseline that barely degrades).
  """
  base = {}
  for (name, _), v in errors_baseline.items():
    base[name] = base.get(name, 0.0) + v - clean_error_baseline
  small = {n: d for n, d in base.items() if abs(d) < threshold}
  if not small:
    return None
  listed = ", ".join(f"{n} {d:+.3f}" for n, d in small.items())
  return (f"rel_mCE is unreliable: the baseline's degradation sum_s (E(c, s) - E_clean) is "
          f"below {threshold:g} in absolute value on {len(small)} of {len(base)} "
          f"corruptions ({listed})")


def mce_table(errors_by_model: Mapping[str, Mapping[Key, float]], baseline: str,
              clean_errors: Mapping[str, float] | None = None) -> dict[str, dict[str, float]]:
  """mCE (and relative mCE if `clean_errors` is given) of every model against a named one.

  Args:
    errors_by_model: {model name: {(corruption, severity): error}}, same keys for all.
    baseline: the model whose errors normalise the others (its mCE is 1).
    clean_errors: {model name: clean error}, for the relative mCE.

  Returns:
    {model name: {"mce": ..., ["relative_mce": ...]}}.
  """
  if baseline not in errors_by_model:
    raise ValueError(f"baseline {baseline!r} is not one of the models: "
                     f"{', '.join(errors_by_model)}")
  base = errors_by_model[baseline]
  out = {}
  for model, errs in errors_by_model.items():
    row = {"mce": mce(errs, base)}
    if clean_errors is not None:
      row["relative_mce"] = relative_mce(errs, clean_errors[model], base,
                                         clean_errors[baseline])
    out[model] = row
  return out


def summarize(accuracies: Mapping[Key, float], clean_accuracy: float | None = None) -> dict:
  """{"mca", "per_category", "per_corruption", ["clean"]} of one model's accuracies."""
  out = {"mca": mean_corruption_accuracy(accuracies),
         "per_category": per_category(accuracies),
         "per_corruption": per_corruption(accuracies)}
  if clean_accuracy is not None:
    out["clean"] = float(clean_accuracy)
  return out
