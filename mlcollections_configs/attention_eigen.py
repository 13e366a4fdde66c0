"""Eigen-analysis of attention and its reconstruction from partial computation.

Bhojanapalli, Chakrabarti, Jain, Kumar, Lukasik, Veit, "Eigen analysis of self-attention
and its reconstruction from partial computation", arXiv 2106.08823 (study
`xsens.studies.attention_eigen`; results: docs/results.md).

  xsens --config=mlcollections_configs/attention_eigen.py --workdir=workdirs/attention_eigen
  xsens --config=mlcollections_configs/attention_eigen.py:smoke --workdir=workdirs/ae_smoke
  xsens --config=mlcollections_configs/attention_eigen.py:setup=language --workdir=workdirs/ae_lang
  xsens --config=mlcollections_configs/attention_eigen.py:setup=cifar10 \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/ae_c10

Set-ups (`setup=`):
- `mnist5k` (default, embedded, CPU): ViT depth 4, width 64, 4 heads, patch 4 on 28×28
  (T = 49 patches + CLS = 50), 200 steps of Adam (batch 128), 3 seeds (`num_seeds`), and
  an EigenViT (layers >= 1 compute scores on m = 10 keys, rank-8 learned basis; `long`
  adds m = 25) trained the same way; the eigen statistics on 500 training images,
  reconstruction on 500 test images.
- `cifar10`: ViT depth 6, width 192, 6 heads, patch 4 (T = 65), 30 epochs (GPU-sized), TFDS
  data from `train.data.data_dir`.
- `language`: the RoBERTa encoder of `sensitivity_language.py` (width 64, depth 2, 4 heads)
  on the synthetic sentiment language (T = the padded length); no EigenViT runs and no
  frozen-accuracy grid (those are ViT-only).
- `imagenet`: no training; the public ViT-B/16 (vit_jax `.npz`, e.g. ViT-B_16.npz of
  google-research/vision_transformer; T = 197 at 224²) on 2 × 256 streamed TFDS
  imagenet2012 validation images from `imagenet.data_dir` (statistics on the first 256,
  errors and top-1 on the other 256); the control is ViT-B/16 at random init; a second
  checkpoint in `runs.vit_b16_compare` (e.g. an ImageNet-1k-only fine-tuning) adds overlaps
  across models (xsens.studies.attention_eigen_imagenet; GPU-sized):
    xsens --config=mlcollections_configs/attention_eigen.py:setup=imagenet \
          --config.imagenet.data_dir=/path/to/tensorflow_datasets \
          --config.runs.vit_b16.pretrained.path=/path/to/ViT-B_16.npz \
          [--config.runs.vit_b16_compare.pretrained.path=/path/to/other_ViT-B_16.npz] \
          --workdir=workdirs/ae_imagenet

Variants: `seeds=N` training seeds per run (default 3), `steps=N` training steps of every run,
`long` (400 steps and EigenViTs with m ∈ {10, 25}: 9 runs, about 3 x the default's time;
one step of batch 128 takes about 0.30 / 0.34 / 0.53 s for the ViT / m = 10 / m = 25 on
2 CPU cores), `target=A` (every run, ViT and EigenViTs alike, trains until its accuracy on
2,000 training examples, checked every 100 steps, reaches A, at most 3,000 steps or
`steps=`; test accuracy is recorded at every check, so the report also compares the runs
at equal steps; `target=0.99` takes about 13 min on 2 cores), `random_basis` (each EigenViT
also trained from a random orthonormal initial basis instead of the DCT one), `smoke`. CPU
time of the default: see docs (measured on a shared machine).

Shows: per layer the dimension explaining 99 % of the variance of score rows and of score
matrices, overlaps across layers / heads / seeds vs random-init and random-subspace
controls, reconstruction error vs (m, k) per subset rule, frozen-model accuracy vs (m, k),
and the trained EigenViTs' accuracy, FLOPs, memory and step time vs the ViT. The paper's
claims: a low-dimensional eigenspace; overlap across layers and models; partial
computation close to full accuracy.
"""

import ml_collections

from mlcollections_configs import common
from mlcollections_configs import train as train_configs
from xsens import choices
from xsens.config_utils import parse_arg
from xsens.data import text_config as text
from xsens.errors import ConfigError, is_finite_number

SETUPS = ("mnist5k", "cifar10", "language", "imagenet")
# `target=A`: every run trains until its accuracy on TARGET_EVAL_TRAIN_EXAMPLES training
# examples, checked every TARGET_EVAL_EVERY steps, reaches A (at most `steps=`, default
# TARGET_MAX_STEPS); test accuracy is recorded at every check (the accuracy-vs-steps table).
TARGET_EVAL_EVERY = 100
TARGET_EVAL_TRAIN_EXAMPLES = 2000
TARGET_MAX_STEPS = 3000


def eigen_config() -> ml_collections.ConfigDict:
  ec = ml_collections.ConfigDict()
  ec.analysed_run = "vit"
  ec.seed = 0                      # random-init model, random keys, random subspaces
  ec.num_examples = 500            # training examples (statistics) / test examples (errors)
  ec.batch_size = 100
  ec.matrix_tokens = ml_collections.FieldReference(25, field_type=int)  # t² matrix dims
  ec.levels = (0.9, 0.99)
  ec.overlap_rank = 8
  ec.key_counts = (8, 12, 20, 30, 50)    # m
  ec.ranks = (2, 4, 8)             # k <= min(m)
  ec.subset_rules = ("strided", "random", "pivoted_qr")
  ec.accuracy_rule = "pivoted_qr"
  ec.cost_batch_size = 128
  ec.timing_repeats = 5
  return ec


def _positive_int(value, field: str) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ConfigError(field, f"must be a positive int; got {value!r}")


def validate_eigen(ec, num_tokens: int | None = None) -> None:
  """ConfigError naming `eigen.<field>` for a bad value of `config.eigen`; `num_tokens` T
  (known once the analysed model is built) bounds m and the overlap rank."""
  for field in ("num_examples", "batch_size", "overlap_rank", "cost_batch_size",
                "timing_repeats"):
    _positive_int(ec[field], f"eigen.{field}")
  keys, ranks = tuple(ec.key_counts), tuple(ec.ranks)
  if not keys or not ranks:
    raise ConfigError("eigen.key_counts" if not keys else "eigen.ranks", "must not be empty")
  for m in keys:
    _positive_int(m, "eigen.key_counts")
    if num_tokens is not None and m > num_tokens:
      raise ConfigError("eigen.key_counts", f"m={m} exceeds the T={num_tokens} tokens; "
                        f"use 1 <= m <= {num_tokens}")
  for k in ranks:
    _positive_int(k, "eigen.ranks")
    if k > min(keys):
      raise ConfigError("eigen.ranks", f"k={k} exceeds the smallest m={min(keys)} of "
                        "eigen.key_counts (least squares needs k <= m)")
  for rule in tuple(ec.subset_rules) + (ec.accuracy_rule,):
    if rule not in choices.SUBSET_RULES:
      field = "eigen.accuracy_rule" if rule == ec.accuracy_rule and rule not in tuple(
          ec.subset_rules) else "eigen.subset_rules"
      raise ConfigError(field, f"unknown subset rule {rule!r}; allowed: "
                        f"{', '.join(choices.SUBSET_RULES)}")
  if num_tokens is not None and ec.overlap_rank > num_tokens:
    raise ConfigError("eigen.overlap_rank", f"{ec.overlap_rank} exceeds T={num_tokens}")
  levels = ec.levels
  if (not isinstance(levels, (tuple, list)) or not levels
      or not all(is_finite_number(v) and 0 < v <= 1 for v in levels)):
    raise ConfigError("eigen.levels", f"must be a non-empty tuple of numbers in (0, 1]; "
                      f"got {levels!r}")
  if ec.matrix_tokens is not None:
    _positive_int(ec.matrix_tokens, "eigen.matrix_tokens")


def imagenet_config(smoke: bool = False) -> ml_collections.ConfigDict:
  """Set-up `imagenet`: pretrained ViT-B/16 checkpoints (vit_jax `.npz`) on streamed
  ImageNet validation images, no training and no `train` block
  (xsens.studies.attention_eigen_imagenet). `runs.vit_b16` is analysed; the optional
  `runs.vit_b16_compare` (path unset: skipped), e.g. a ViT-B/16 of another pre-training,
  adds overlaps across models."""
  path = lambda: ml_collections.FieldReference(None, field_type=str)
  config = ml_collections.ConfigDict()
  config.study = "attention_eigen_imagenet"
  config.imagenet = common.imagenet_stream_config()
  ec = config.eigen = eigen_config()
  ec.analysed_run = "vit_b16"
  ec.num_examples, ec.batch_size = 256, 32       # statistics on 256 images, errors on 256
  ec.overlap_rank = 16
  ec.key_counts = (16, 32, 64, 128, 197)         # m of T = 197
  ec.ranks = (4, 8, 16)
  config.runs = ml_collections.ConfigDict({
      "vit_b16": {"model": {"name": "vit"}, "pretrained": {"path": path()}},
      "vit_b16_compare": {"model": {"name": "vit"}, "pretrained": {"path": path()}}})
  if smoke:
    config.imagenet.image_size, config.imagenet.num_workers = 32, 2
    ec.num_examples, ec.batch_size, ec.overlap_rank = 4, 4, 2   # ViT-B/16 at 32²: T = 5
    ec.key_counts, ec.ranks, ec.matrix_tokens = (2, 5), (2,), 8
    ec.subset_rules = ("pivoted_qr",)
  return config


def get_config(arg=None):
  arg = parse_arg(arg, setup="mnist5k", smoke=False, seeds=3, steps=0, long=False,
                  target=0.0, random_basis=False)
  if arg.setup == "imagenet":
    return imagenet_config(arg.smoke)
  config = common.multi_run_config("attention_eigen", arg.setup, SETUPS,
                                   target_train_accuracy=None)
  config.num_seeds = arg.seeds
  c = config.train
  ec = config.eigen = eigen_config()
  if arg.setup == "language":
    c.data = text.default_text_data_config()
    c.data.name = text.SYNTHETIC
    c.data.max_length = text.synthetic_max_tokens(c.data.synthetic.max_clauses)
    c.optimizer.name = "adamw"
    c.optimizer.weight_decay = 0.01
    c.optimizer.learning_rate = 1e-3
    c.batch_size = 32
    c.total_steps = 600
    c.eval_every = 300
    c.checkpoint_every = 300
    length = c.data.max_length
    ec.analysed_run = "roberta"
    ec.matrix_tokens = None if length <= 25 else 25
    ec.key_counts = tuple(sorted({min(m, length) for m in (8, 12, 20, length)}))
    ec.overlap_rank = min(8, length)
    config.runs = ml_collections.ConfigDict({"roberta": {"model": common.model_config(
        name="roberta", vocab_size=text.SYNTHETIC_VOCAB, max_length=length, width=64,
        depth=2, num_heads=4, mlp_dim=128)}})
  else:
    if arg.setup == "mnist5k":
      vit = dict(patch_size=4, width=64, depth=4, num_heads=4, mlp_dim=128)
      c.data.name = "mnist5k"
      # The CPU default fits 10 minutes on 2 quiet cores: 200 steps, one EigenViT (m = 10);
      # `long`: 400 steps and a second EigenViT (m = 25), about 3 x longer.
      c.total_steps = 400 if arg.long else 200
      c.batch_size = 128
      c.eval_every = c.checkpoint_every = c.total_steps
      train_keys = (10, 25) if arg.long else (10,)
    else:
      vit = dict(patch_size=4, width=192, depth=6, num_heads=6, mlp_dim=384)
      c.data.name = "cifar10"
      c.total_steps = None
      c.total_epochs = 30.0
      c.batch_size = 128
      c.optimizer.schedule = "cosine"
      c.optimizer.warmup_steps = 500
      c.eval_every = 1000
      c.checkpoint_every = 2000
      ec.key_counts = (8, 16, 32, 48, 65)
      ec.num_examples = 1000
      train_keys = (16, 32)
    rank = 8
    if arg.smoke:
      train_configs.smoke(c)
      vit.update(train_configs.SMOKE_PRESETS["vit"])
      vit.update(depth=2, num_heads=2)          # patch 7: T = 16 + 1
      ec.num_examples, ec.batch_size = 40, 20
      ec.key_counts, ec.ranks, ec.overlap_rank = (4, 17), (2,), 4
      ec.matrix_tokens = None
      ec.cost_batch_size, ec.timing_repeats = 16, 1
      ec.subset_rules = ("pivoted_qr",)
      train_keys, rank = (6,), 4
    runs = {"vit": {"model": common.model_config(name="vit", **vit)}}
    for m in train_keys:
      runs[f"eigen_m{m}"] = {"model": common.model_config(
          name="eigen_vit", keys_kept=m, basis_rank=rank, **vit)}
      if arg.random_basis:   # The control: the same EigenViT from a random basis.
        runs[f"eigen_m{m}_random_basis"] = {"model": common.model_config(
            name="eigen_vit", keys_kept=m, basis_rank=rank, basis_init="random", **vit)}
    config.runs = ml_collections.ConfigDict(runs)
  if arg.smoke and arg.setup == "language":
    train_configs.smoke(c)
    c.data.num_train = None
    c.eval_batch_size = 128
    c.data.max_length = text.synthetic_max_tokens(2)
    c.data.synthetic.update({"num_train": 128, "num_test": 64, "max_clauses": 2})
    config.runs.roberta.model.update(max_length=c.data.max_length, width=8, depth=1,
                                     num_heads=2, mlp_dim=16)
    ec.num_examples, ec.batch_size, ec.overlap_rank = 32, 16, 2
    ec.key_counts, ec.ranks, ec.matrix_tokens = (4, 8), (2,), None
  if arg.steps:              # e.g. `steps=200`: a shorter run of every model.
    c.total_steps = arg.steps
    c.eval_every = c.checkpoint_every = arg.steps
  if arg.target:             # e.g. `target=0.99`: every run to one train-accuracy rule.
    if not 0 < arg.target <= 1:
      raise ValueError(f"target={arg.target} must be in (0, 1]")
    c.target_train_accuracy = arg.target
    c.total_steps = arg.steps or TARGET_MAX_STEPS
    c.eval_every = TARGET_EVAL_EVERY
    c.eval_train_examples = TARGET_EVAL_TRAIN_EXAMPLES
    c.checkpoint_every = 5 * TARGET_EVAL_EVERY
  if arg.smoke:
    config.num_seeds = 1
  return config


def validate(config) -> None:
  """ConfigError for a bad field of `config.eigen` (its bounds by the tokens T are checked
  by the study once the model is built) and, in the ImageNet set-up, of
  `config.imagenet`; the runs and the checkpoint files are checked by the study."""
  if config.eigen.analysed_run not in config.runs:
    raise ConfigError("eigen.analysed_run", f"{config.eigen.analysed_run!r} is not a run; "
                      f"runs: {', '.join(config.runs)}")
  if "imagenet" in config:
    size = config.imagenet.image_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
      raise ConfigError("imagenet.image_size", f"must be a positive int, got {size!r}")
  validate_eigen(config.eigen)
