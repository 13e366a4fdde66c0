"""Common corruptions of finished runs: accuracy per (corruption, severity), mCE.

The corrupted test images are synthesised on the host (`host_corruption_accuracy`, every
corruption of `xsens.measures.corruptions`) or read from a pre-computed TFDS set such as
CIFAR-10-C (`corruption_source`, `xsens.data.corrupted`); `corruption_section` scores
every run on them and summarises (Hendrycks and Dietterich, ICLR 2019, arXiv 1903.12261).
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import logging
import numpy as np

from xsens.data import corrupted
from xsens.data import splits
from xsens.errors import ConfigError
from xsens.lab import robustness
from xsens.measures import corruption_eval, corruptions
from xsens.train.progress import progress
from xsens.train import streams as streams_lib

CORRUPTION_SOURCES = ("auto", "tfds", "synthesize")
# Data fields that only select or relabel training examples: the test split (and so its
# pre-computed corruptions) does not depend on them.
_TRAIN_ONLY_DATA_FIELDS = ("num_train", "class_fractions", "random_labels", "train_split")


def corruption_source(rc, data_config) -> str:
  """"tfds" or "synthesize": where the corrupted test images come from.

  `robustness.corruptions.source` "synthesize" (or no `tfds_name`): `xsens.measures.corruptions`
  on the clean test images; "tfds": the pre-computed sets `<tfds_name>/<corruption>_<severity>`
  (e.g. CIFAR-10-C, `xsens.data.corrupted`) from `train.data.data_dir`, refused
  (ConfigError) unless every needed set is there; "auto" (default): "tfds" when every needed
  set is there, else "synthesize". A `tfds_name` of None means "synthesize".
  """
  cc = rc.corruptions
  source, dataset = cc.source, cc.tfds_name
  if source not in CORRUPTION_SOURCES:
    raise ConfigError("robustness.corruptions.source", f"got {source!r}; allowed: "
                      f"{', '.join(CORRUPTION_SOURCES)}")
  if source == "synthesize":
    return source
  if dataset is None:
    if source == "tfds":
      raise ConfigError("robustness.corruptions.tfds_name", "must name the TFDS dataset of "
                        "pre-computed corruptions (e.g. 'cifar10_corrupted') when "
                        "robustness.corruptions.source='tfds'")
    return "synthesize"
  wanted = [(c, s) for c in rc.corruptions.names for s in rc.corruptions.severities]
  missing = [(c, s) for c, s in wanted
             if not corrupted.is_prepared(data_config, c, s, dataset=dataset)]
  if not missing:
    return "tfds"
  if source == "tfds":
    c, s = missing[0]
    raise ConfigError("robustness.corruptions.source", f"{len(missing)} of the {len(wanted)} "
                      f"{dataset} sets are not prepared in "
                      f"{splits.resolve_data_dir(data_config)!r}, e.g. "
                      f"{corrupted.tfds_name(c, s, dataset)!r} (xsens never downloads: "
                      f"`tfds build {dataset} --file_format=array_record` elsewhere), or set "
                      "robustness.corruptions.source='synthesize' or 'auto'")
  return "synthesize"


def _test_data_key(data_config) -> str:
  """Runs whose data configs differ only in train-only fields share one test split."""
  d = data_config.to_dict()
  for field in _TRAIN_ONLY_DATA_FIELDS:
    d.pop(field, None)
  return repr(sorted(d.items()))


def corruption_section(results, rc, normalize, *, source: str = "synthesize",
                       data_configs=None, data_seeds=None) -> dict:
  """Accuracy per (corruption, severity) of every run, summaries and mCE.

  `source` "synthesize": the first `robustness.num_examples` clean test images of each run,
  corrupted by `xsens.measures.corruptions` (seed `robustness.seed`). "tfds": the first
  `robustness.num_examples` images of each pre-computed set
  `<robustness.corruptions.tfds_name>/<corruption>_<severity>`, read with
  `xsens.data.corrupted.load_cifar10_corrupted` and preprocessed like the run's data
  (`data_configs[run]`; split order seeded by `data_seeds[run]`, default 0, the run's
  `seed`, as its clean split): a random sample of the same size, not the same images as
  the clean one (TFDS stores each set in its own order). One set is held at a time, shared
  by the runs whose test data are the same.
  """
  acc, summary = {}, {}
  names, sevs = list(rc.corruptions.names), list(rc.corruptions.severities)
  if source == "tfds":
    acc = {name: {} for name in results}
    for c, sev in progress([(c, s) for c in names for s in sevs], desc="corruptions",
                           unit="set"):
      loaded = {}  # {(test-data key, seed): first num_examples of the set}
      for name in results:
        dc, seed = data_configs[name], int((data_seeds or {}).get(name, 0))
        key = (_test_data_key(dc), seed)
        if key not in loaded:
          split = corrupted.load_cifar10_corrupted(dc, c, sev, seed=seed,
                                                   dataset=rc.corruptions.tfds_name)
          loaded[key] = (split.images[:rc.num_examples], split.labels[:rc.num_examples])
        res = results[name]
        acc[name][(c, sev)] = robustness.split_accuracy(res.apply_fn, res.variables,
                                                        *loaded[key], rc.batch_size)
  for name, res in results.items():
    images = res.test.images[:rc.num_examples]
    labels = res.test.labels[:rc.num_examples]
    if source != "tfds":
      acc[name] = host_corruption_accuracy(
          res.apply_fn, res.variables, images, labels, normalize=normalize, names=names,
          severities=sevs, seed=rc.seed, batch_size=rc.batch_size)
    clean = robustness.split_accuracy(res.apply_fn, res.variables, images, labels,
                                      rc.batch_size)
    summary[name] = corruption_eval.summarize(acc[name], clean)
  errs = {n: corruption_eval.errors(a) for n, a in acc.items()}
  mce = corruption_eval.mce_table(errs, rc.baseline_run,
                                  {n: 1 - s["clean"] for n, s in summary.items()})
  by_severity = {n: [float(np.mean([a[(c, s)] for c in rc.corruptions.names]))
                     for s in rc.corruptions.severities] for n, a in acc.items()}
  warning = corruption_eval.relative_mce_warning(
      errs[rc.baseline_run], 1 - summary[rc.baseline_run]["clean"])
  if warning:
    logging.warning("%s", warning)
  return {"accuracy": acc, "summary": summary, "mce": mce, "by_severity": by_severity,
          "source": source, "rel_mce_warning": warning}


def host_corruption_accuracy(apply_fn, variables, images: np.ndarray, labels: np.ndarray, *,
                             normalize: str, stats=None,
                             names: Sequence[str] = corruptions.NAMES,
                             severities: Sequence[int] = corruptions.SEVERITIES,
                             seed: int = 0, batch_size: int = 256,
                             streams: int | None = None) -> dict[tuple[str, int], float]:
  """Top-1 accuracy on every (corruption, severity) of a split, NumPy corruptions on the host.

  Every corruption of `corruptions.NAMES` (the `HOST_ONLY` ones too), corrupted in chunks
  by `corruption_eval.corrupt_normalized`, scored by `xsens.measures.accuracy`
  (`robustness.split_accuracy`, one batch at a time within a set).

  Up to `streams` (corruption, severity) sets are corrupted and predicted at once, one host
  thread each (`xsens.train.streams`; None: one per core on a CPU); each set's corruption
  has its own seed, so the accuracies do not depend on it.

  Args:
    apply_fn: `(variables, inputs [B, H, W, C] (model space)) -> logits [B, K]`, eval
      mode; one stable object per model (it is static to the jitted batch function).
    variables: the model's variables.
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
    return robustness.split_accuracy(apply_fn, variables, x, labels, batch_size, streams=1)

  accs = streams_lib.ordered_map(one, progress(sets, desc="corruptions", unit="set"),
                                 streams_lib.resolve(streams))
  return dict(zip(sets, accs))


# Hendrycks & Dietterich (ICLR 2019) AlexNet top-1 errors on ImageNet-C, mean over the five
# severities, as listed in github.com/hendrycks/robustness (ImageNet-C/test.py); mCE relative
# to AlexNet is mean_c [mean_s E(c, s) / ALEXNET_ERRORS[c]].
ALEXNET_ERRORS = {
    "gaussian_noise": 0.886428, "shot_noise": 0.894468, "impulse_noise": 0.922640,
    "defocus_blur": 0.819880, "glass_blur": 0.826268, "motion_blur": 0.785948,
    "zoom_blur": 0.798360, "snow": 0.866816, "frost": 0.826572, "fog": 0.819324,
    "brightness": 0.564592, "contrast": 0.853204, "elastic_transform": 0.646056,
    "pixelate": 0.717840, "jpeg_compression": 0.606500}


def alexnet_mce(errors) -> float:
  """Hendrycks' ImageNet-C mCE: mean_c [sum_s E(c, s) / sum_s E_AlexNet(c, s)].

  Args:
    errors: {(corruption, severity): top-1 error} for all 15 corruptions × severities 1..5.
  """
  names = {c for c, _ in errors}
  if names != set(ALEXNET_ERRORS) or len(errors) != 5 * len(ALEXNET_ERRORS):
    raise ValueError("the AlexNet-normalised mCE needs all 15 corruptions at severities 1..5")
  return float(np.mean([np.mean([errors[(c, s)] for s in corruptions.SEVERITIES])
                        / ALEXNET_ERRORS[c] for c in ALEXNET_ERRORS]))
