"""Reuse Transformers: a ViT vs ViTs that reuse attention of the previous layer.

Bhojanapalli et al. 2021, "Leveraging redundancy in attention with Reuse
Transformers", arXiv 2110.06821 (results: docs/results.md).

  xsens --config=mlcollections_configs/reuse.py --workdir=workdirs/reuse
  xsens --config=mlcollections_configs/reuse.py:smoke --workdir=/tmp/reuse_smoke
  xsens --config=mlcollections_configs/reuse.py:setup=digits --workdir=workdirs/reuse_digits
  xsens --config=mlcollections_configs/reuse.py:setup=cifar10 \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/reuse_c10

Set-ups (`setup=`):
- `mnist5k` (default, embedded): ViT depth 4, width 64, 4 heads, patch 4 (T = 50 tokens), 500
  steps of Adam (batch 128); runs `vit` (baseline) and
  `reuse_p{P}_k{K}` for P in {H/2, H} = {2, 4} and K in {L/2, L-1} = {2, 3}.
- `digits` (8×8 digits, embedded; CPU-cheap): the same ViT and grid with patch 2 (T = 17).
- `cifar10`: the same grid on a ViT depth 6, width 192, 6 heads, patch 4 (T = 65),
  P in {3, 6}, K in {3, 5}, 30 epochs (GPU-sized); TFDS data read from `data_dir`.

Shows: results.md with, per run, params, test accuracy, forward and attention FLOPs
(XLA cost analysis), peak temp memory and time of one training step, plus
accuracy_vs_flops.png, similarity_layers.png (layer x layer attention similarity of
the trained baseline, its two controls, the same ViT at random init and the same ViT
trained on randomly labelled data (run `vit_random_labels`, `data.random_labels=1`: the
paper's "trained on random data" control), and the full-reuse run) and
similarity_kth_best.png. The paper's claim: reuse matches or beats the baseline's
accuracy at lower compute and memory.

Model choice: the test split is cut into `val` and `eval` (`reuse.val_fraction`); the reuse
run with the best seed-0 `val` accuracy is chosen, and the baseline, its random-label
control and the chosen run are trained at `reuse.num_seeds` seeds: eval accuracy and the
adjacent-layer attention similarity (trained / random init / random labels) as mean ± s.e.
"""

import ml_collections

from mlcollections_configs import common
from mlcollections_configs import train as train_configs
from xsens.config_utils import parse_arg
from xsens.errors import ConfigError

SETUPS = ("mnist5k", "digits", "cifar10")


RANDOM_LABELS_RUN = "vit_random_labels"


def _runs(vit: dict, heads: tuple[int, ...], layers: tuple[int, ...]
          ) -> ml_collections.ConfigDict:
  runs = {"vit": {"model": common.model_config(name="vit", **vit)},
          # The similarity control: the baseline ViT trained on randomly labelled data
          # (every train label drawn uniformly, `data.random_labels`; test labels true).
          RANDOM_LABELS_RUN: {"model": common.model_config(name="vit", **vit),
                              "data": {"random_labels": 1.0}}}
  for p in heads:
    for k in layers:
      runs[f"reuse_p{p}_k{k}"] = {"model": common.model_config(
          name="reuse_vit", reuse_heads=p, reuse_layers=k, **vit)}
  return ml_collections.ConfigDict(runs)


def _grid(vit: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
  h, depth = vit["num_heads"], vit["depth"]
  heads = tuple(sorted({max(h // 2, 1), h}))
  layers = tuple(sorted({max(depth // 2, 1), depth - 1}))
  return heads, layers


def get_config(arg=None):
  arg = parse_arg(arg, setup="mnist5k", smoke=False)
  # Every run trains the same fixed number of steps (no target accuracy).
  config = common.multi_run_config("reuse", arg.setup, SETUPS, target_train_accuracy=None)
  c = config.train

  rc = config.reuse = ml_collections.ConfigDict()
  rc.seed = 0                 # random-init model for the similarity baseline
  rc.baseline = "vit"
  rc.num_examples = 500       # test images for the attention similarity
  rc.batch_size = 100
  rc.cost_batch_size = 128    # batch of the FLOPs / memory / step-time measurements
  rc.timing_repeats = 5
  rc.similarity_runs = ()     # more trained runs in the similarity heat map
  rc.val_fraction = 0.5       # share of the test split that chooses the reuse run
  rc.split_seed = 0           # which test examples are `val` (the rest: `eval`)
  # Training seeds of the baseline, its random-label control and the reuse run chosen on
  # `val` (seed 0 trains every run; accuracy and similarity are reported as mean ± s.e.).
  rc.num_seeds = 3
  # Similarity controls of the trained baseline: the same ViT at random init (`seed`) and
  # trained on random labels (this run; None: no such control).
  rc.random_labels_run = ml_collections.FieldReference(RANDOM_LABELS_RUN, field_type=str)

  if arg.setup in ("mnist5k", "digits"):
    vit = dict(patch_size=4 if arg.setup == "mnist5k" else 2, width=64, depth=4,
               num_heads=4, mlp_dim=128)
    c.data.name = arg.setup
    c.total_steps = 500
    c.batch_size = 128
    c.eval_every = 250
    c.checkpoint_every = 250
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
    rc.num_examples = 1000
  heads, layers = _grid(vit)

  if arg.smoke:
    train_configs.smoke(c)
    vit.update(train_configs.SMOKE_PRESETS["vit"])
    vit.update(depth=2, num_heads=2)
    heads, layers = (1, 2), (1,)
    rc.num_examples = 40
    rc.batch_size = 20
    rc.cost_batch_size = 16
    rc.timing_repeats = 2
    rc.num_seeds = 2
  config.num_seeds = 1   # Training seeds per run (xsens.lab.multirun.run_ids).
  config.runs = _runs(vit, heads, layers)
  full = f"reuse_p{max(heads)}_k{max(layers)}"
  rc.similarity_runs = (full,)
  return config


def validate(config) -> None:
  """ConfigError for a bad `config.reuse` field; its runs (`reuse.baseline`,
  `reuse.random_labels_run`) are checked by the study against the runs it builds."""
  rc = config.reuse
  for field in ("num_examples", "batch_size", "cost_batch_size", "timing_repeats",
                "num_seeds"):
    if not (isinstance(rc[field], int) and rc[field] > 0):
      raise ConfigError(f"reuse.{field}", f"must be a positive int, got {rc[field]!r}")
  if not 0 < rc.val_fraction < 1:
    raise ConfigError("reuse.val_fraction", f"must be in (0, 1), got {rc.val_fraction}")
  if not (isinstance(rc.split_seed, int) and rc.split_seed >= 0):
    raise ConfigError("reuse.split_seed", f"must be an int >= 0, got {rc.split_seed!r}")
