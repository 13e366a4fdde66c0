"""Accuracy under common corruptions, mCE and relative mCE (CIFAR-10-C / ImageNet-C protocol).

Reference: D. Hendrycks and T. Dietterich, "Benchmarking Neural Network Robustness to
Common Corruptions and Perturbations", ICLR 2019, arXiv 1903.12261.

  * `corruption_accuracy(predict_fn, images, labels, normalize=...)` corrupts a split held
    in the model's input space (xsens `Split.images`, normalised by `data.normalize`) with
    `xsens.measures.corruptions` and returns {(name, severity): accuracy}.
  * Aggregates: `per_corruption` (mean over severities), `per_category`,
    `mean_corruption_accuracy` (mCA), `errors` (1 - accuracy).
  * Corruption error of model f on corruption c relative to a baseline b (e.g. AlexNet for
    ImageNet-C): CE_c = sum_s E(f, c, s) / sum_s E(b, c, s); mCE = mean_c CE_c (`mce`).
    Relative: sum_s (E(f, c, s) - E_clean(f)) / sum_s (E(b, c, s) - E_clean(b)), averaged
    over c (`relative_mce`); `mce_table` for several models against a named baseline.
  * `load_cifar10_corrupted(data_config, name, severity)` reads the pre-computed TFDS
    `cifar10_corrupted/<name>_<severity>` (test split) through `xsens.data.pipeline`.

Corruptions are applied in [0, 1] pixel space: `to_unit_range` undoes `data.normalize`,
`from_unit_range` redoes it.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
import copy

import numpy as np

from xsens.data import pipeline
from xsens.measures import corruptions

Key = tuple[str, int]  # (corruption name, severity)

CORRUPT_CHUNK = 1000  # Images corrupted per call; chunk k uses seed (seed, k).

# xsens / Hendrycks corruption names -> TFDS `cifar10_corrupted` config names.
TFDS_NAMES = {"glass_blur": "frosted_glass_blur", "elastic_transform": "elastic"}


# ------------------------------------------------------------------------------------------------
# Normalisation.


def _stats(normalize: str, stats) -> tuple[np.ndarray, np.ndarray] | None:
  if normalize not in pipeline.NORMALIZE:
    raise ValueError(f"normalize must be one of {', '.join(pipeline.NORMALIZE)}, "
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


def _check_names(names: Iterable[str]) -> list[str]:
  names = list(names)
  unknown = [n for n in names if n not in corruptions.CORRUPTIONS]
  if unknown:
    raise ValueError(f"unknown corruption {unknown[0]!r}; allowed: "
                     f"{', '.join(corruptions.NAMES)}")
  return names


def _check_severities(severities: Iterable[int]) -> list[int]:
  severities = list(severities)
  if not severities or any(s not in corruptions.SEVERITIES for s in severities):
    raise ValueError(f"severities must be in 1..5, got {severities}")
  return [int(s) for s in severities]


def predict_labels(predict_fn: Callable, images: np.ndarray, batch_size: int) -> np.ndarray:
  """argmax of `predict_fn` over fixed-size batches (the last one padded, so a jitted
  predict_fn compiles once). [N, H, W, C] -> [N] int."""
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  n = len(images)
  out = np.empty((n,), np.int64)
  for start in range(0, n, batch_size):
    idx = np.minimum(np.arange(start, start + batch_size), n - 1)
    logits = np.asarray(predict_fn(images[idx]))
    take = min(batch_size, n - start)
    out[start:start + take] = logits[:take].argmax(-1)
  return out


def accuracy(predict_fn: Callable, images: np.ndarray, labels: np.ndarray,
             batch_size: int = 256) -> float:
  """Top-1 accuracy on uncorrupted images (model space), e.g. the clean error of relative mCE."""
  return float(np.mean(predict_labels(predict_fn, images, batch_size) == np.asarray(labels)))


def corrupt_normalized(images: np.ndarray, name: str, severity: int, *, normalize: str,
                       stats=None, seed: int = 0) -> np.ndarray:
  """Corrupts images held in model space: to [0, 1] (clipped), `corrupt`, back to model space.

  Chunk k of `CORRUPT_CHUNK` images is corrupted with seed (seed, k), so the result does not
  depend on any batch size. [N, H, W, C] -> [N, H, W, C] float32.
  """
  x01 = np.clip(to_unit_range(images, normalize, stats), 0, 1)
  out = np.empty_like(x01)
  for k, start in enumerate(range(0, len(x01), CORRUPT_CHUNK)):
    chunk = x01[start:start + CORRUPT_CHUNK]
    out[start:start + len(chunk)] = corruptions.corrupt(chunk, name, severity, seed=(seed, k))
  return from_unit_range(out, normalize, stats)


def corruption_accuracy(predict_fn: Callable, images: np.ndarray, labels: np.ndarray, *,
                        normalize: str, stats=None,
                        names: Sequence[str] = corruptions.NAMES,
                        severities: Sequence[int] = corruptions.SEVERITIES, seed: int = 0,
                        batch_size: int = 256) -> dict[Key, float]:
  """Top-1 accuracy of `predict_fn` on every (corruption, severity) of a split.

  Args:
    predict_fn: `images [B, H, W, C] (model space) -> logits [B, K]`, e.g.
      `TrainResult.predict_fn()` (optionally jitted).
    images: [N, H, W, C] in model space (a `Split.images`), C in {1, 3}.
    labels: [N] int.
    normalize: how `images` were normalised ("zero_one" | "half" | "standardize").
    stats: (mean [C], std [C]) for "standardize".
    names: corruptions to run (default all 15).
    severities: subset of 1..5.
    seed: corruption seed (see `corrupt_normalized`).
    batch_size: prediction batch size.

  Returns:
    {(name, severity): accuracy in [0, 1]}.
  """
  names = _check_names(names)
  severities = _check_severities(severities)
  labels = np.asarray(labels)
  if len(labels) != len(images) or len(labels) == 0:
    raise ValueError(f"need as many labels as images (> 0), got {len(labels)} and "
                     f"{len(images)}")
  out = {}
  for name in names:
    for severity in severities:
      x = corrupt_normalized(images, name, severity, normalize=normalize, stats=stats,
                             seed=seed)
      pred = predict_labels(predict_fn, x, batch_size)
      out[(name, severity)] = float(np.mean(pred == labels))
  return out


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

  Measures the degradation relative to clean data, normalised by the baseline's.
  """
  model, base = _matched(errors_model, errors_baseline)
  ratios = []
  for name, sev in model.items():
    denom = sum(v - clean_error_baseline for v in base[name].values())
    if denom == 0:
      raise ValueError(f"baseline degradation on {name!r} is 0; relative CE is undefined")
    ratios.append(sum(v - clean_error_model for v in sev.values()) / denom)
  return float(np.mean(ratios))


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


# ------------------------------------------------------------------------------------------------
# The pre-computed CIFAR-10-C (TFDS `cifar10_corrupted`).


def tfds_name(name: str, severity: int) -> str:
  """TFDS name of a CIFAR-10-C set: ("glass_blur", 3) -> "cifar10_corrupted/frosted_glass_blur_3".

  Accepts the xsens names (`corruptions.NAMES`) and the TFDS spellings.
  """
  if severity not in corruptions.SEVERITIES:
    raise ValueError(f"severity must be in 1..5, got {severity!r}")
  return f"cifar10_corrupted/{TFDS_NAMES.get(name, name)}_{int(severity)}"


def load_cifar10_corrupted(data_config, name: str, severity: int, *, split: str = "test",
                           stats=None, seed: int = 0) -> pipeline.Split:
  """Loads one CIFAR-10-C corruption from `data.data_dir`, preprocessed like `data_config`.

  The dataset (TFDS `cifar10_corrupted/<name>_<severity>`) holds only a "test" split, and
  `xsens.data.pipeline.load_split` wants two different splits, so the copy of `data_config`
  used here reads `split` as its test split and `test[:1]` as a (never returned) train split;
  train-only fields (`num_train`, `class_fractions`) are dropped. `classes` applies.
  Images are read in [0, 1] and then normalised with `data_config.normalize`; for
  "standardize" the statistics are `stats` if given, else those of the clean train split of
  `data_config` (so clean and corrupted images share one normalisation). `image_size`
  resizes last, as in `load_split`.

  Args:
    data_config: the `data` ConfigDict of the clean dataset (e.g. name "cifar10").
    name: corruption (xsens or TFDS spelling).
    severity: 1..5.
    split: TFDS split string of the corrupted dataset.
    stats: (mean [C], std [C]) for "standardize".
    seed: passed to `load_split`.

  Returns:
    The corrupted split in model space.
  """
  normalize = data_config["normalize"]
  if normalize == "standardize" and stats is None:
    clean = copy.deepcopy(data_config)
    clean.normalize = "zero_one"
    clean.image_size = None
    stats = pipeline.channel_stats(pipeline.load_split(clean, "train", seed=seed).images)
  cfg = copy.deepcopy(data_config)
  cfg.name = tfds_name(name, severity)
  cfg.test_split = split
  cfg.train_split = "test[:1]" if split != "test[:1]" else "test[:2]"
  cfg.num_train = None
  cfg.class_fractions = None
  cfg.normalize = "zero_one"
  cfg.image_size = None
  raw = pipeline.load_split(cfg, "test", seed=seed)
  x = from_unit_range(raw.images, normalize, stats)
  if data_config["image_size"] is not None:
    x = pipeline.resize(x, data_config["image_size"])
  return pipeline.Split(images=np.ascontiguousarray(x, np.float32), labels=raw.labels,
                        num_classes=raw.num_classes)
