"""Teacher's pet: does distillation hurt the weakest classes, and do mitigations help?

Lukasik, Bhojanapalli, Menon, Kumar, "Teacher's pet: understanding and mitigating biases
in distillation", TMLR 2022, arXiv 2106.10494 (results: docs/results.md).

  xsens --config=mlcollections_configs/distillation.py --workdir=workdirs/distillation
  xsens --config=mlcollections_configs/distillation.py:smoke --workdir=/tmp/distill_smoke
  xsens --config=mlcollections_configs/distillation.py:setup=digits_lt,ratio=10 \
        --workdir=workdirs/distillation_digits
  xsens --config=mlcollections_configs/distillation.py:setup=cifar100_lt \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/kd_c100

Set-ups (`setup=`; `ratio=` sets the imbalance ρ of the `_lt` ones, class c keeps
ρ^(−c/(K−1)) of its training examples, `xsens.data.long_tail`):
- `mnist5k_lt` (default; ρ = 20: 400 → 20 train examples per class, 1363 in all): teacher
  a CNN (32, 64, 64) trained 600 steps; candidate students (`config.students`) a small CNN
  (8, 16) with 32 dense units and an MLP with 64 hidden units, 1500 steps each, Adam 1e-3,
  batch 128; `mnist5k` is the balanced version;
- `digits_lt` / `digits` (8×8 digits, ρ = 10 by default), the same models;
- `cifar10_lt` / `cifar100_lt` (ρ = 100, the usual CIFAR-LT): teacher a ResNet-18, student
  a width-1/4 ResNet-18, 200 epochs, SGD+momentum, cosine (GPU-sized; TFDS data from
  `data_dir`).

Runs: one teacher per seed in `distillation.seeds` (init, batch-order and step seeds; the
long-tailed subset is fixed by `train.seed`); the held-out data are half of the test split
(`val`), every reported number is on the other half (`eval`). On `val` only, at
`distillation.select_seed`: the student model, α ∈ `alphas` and τ ∈ `temperatures` with the
best `kd` val accuracy, then the margin scale ∈ `margin_scales` with the best `kd_margin`
val worst-class accuracy. Then per seed the students `onehot` (CE only), `kd`,
`kd_class_alpha` (per-class α from the teacher's val per-class accuracy) and `kd_margin`
(per-class margins from the teacher's val margins). Shows: results.md (overall /
worst-class / worst-3 / head / tail accuracy, mean ± s.e. over seeds; the selection tables;
a per-class table), per_class_accuracy.png, gain_vs_teacher.png (teacher per-class accuracy
and margin vs the distilled student's per-class gain over the one-hot student) and
subgroup_summary.png. Results: docs/results.md, "Distillation per class".
"""

import ml_collections

from mlcollections_configs import common
from mlcollections_configs import train as train_configs
from xsens import choices
from xsens.config_utils import parse_arg
from xsens.data.long_tail import long_tail_fractions
from xsens.errors import ConfigError

SETUPS = ("mnist5k_lt", "mnist5k", "digits_lt", "digits", "cifar10_lt", "cifar100_lt")
_NUM_CLASSES = {"mnist5k": 10, "digits": 10, "cifar10": 10, "cifar100": 100}
_DEFAULT_RATIO = {"mnist5k": 20.0, "digits": 10.0, "cifar10": 100.0, "cifar100": 100.0}
VARIANTS = ("onehot", "kd", "kd_class_alpha", "kd_margin")


def distillation_config() -> ml_collections.ConfigDict:
  """Every `config.distillation` field with its default."""
  return ml_collections.ConfigDict({
      # Candidates chosen on `val` (one value: fixed). The student model (`students`), α
      # and τ: the best `val` accuracy of the `kd` student at `select_seed`; the margin
      # scale: the best `val` worst-class accuracy of `kd_margin` (the chosen α, τ).
      "alphas": (0.5, 0.9),      # α: a mix of the CE and distillation terms (Hinton)
      "temperatures": (1.0, 4.0),  # τ
      "margin_scales": (0.5, 2.0),  # m_c = scale·clip(1 − γ_T(c)/mean γ_T, 0, 1), logits
      "select_seed": 100,        # training seed of the selection runs (not in `seeds`)
      "teacher_mode": "precomputed",   # or "in_step"
      "variants": VARIANTS,
      "seeds": (0, 1, 2),        # students per variant, each with its own teacher (seed)
      "val_fraction": 0.5,       # share of the test split that chooses and sets mitigations
      "split_seed": 0,           # which test examples are `val`
      "worst_k": 3,              # "mean of the worst k classes"
      "head_fraction": 0.5,      # head = this share of classes, most frequent in train
  })


def get_config(arg=None):
  arg = parse_arg(arg, setup="mnist5k_lt", ratio=0.0, smoke=False)
  config = common.multi_run_config("distillation", arg.setup, SETUPS)
  c = config.train
  dataset = arg.setup.removesuffix("_lt")
  long_tailed = arg.setup.endswith("_lt")
  ratio = arg.ratio or _DEFAULT_RATIO[dataset]
  c.data.name = dataset
  if long_tailed:
    c.data.class_fractions = long_tail_fractions(_NUM_CLASSES[dataset], ratio)
  c.target_train_accuracy = None   # Every student trains the same number of steps.
  c.eval_train_examples = None
  config.distillation = dc = distillation_config()
  config.teacher = ml_collections.ConfigDict()
  # Candidate students (name -> overrides of `train`), one chosen on `val`.
  config.students = ml_collections.ConfigDict()

  if dataset in ("mnist5k", "digits"):
    c.total_steps = 1500
    c.batch_size = 128
    c.eval_every = 0
    c.checkpoint_every = 0
    config.teacher.model = common.model_config(name="cnn")
    config.teacher.total_steps = 600
    config.students.cnn = {"model": common.model_config(name="cnn", features=(8, 16),
                                                        dense_dim=32)}
    config.students.mlp = {"model": common.model_config(name="mlp", hidden_dims=(64,))}
  else:
    common.cifar_resnet_recipe(c, total_epochs=200)
    config.teacher.model = common.model_config(name="resnet18")
    config.students.resnet18_q = {"model": common.model_config(name="resnet18",
                                                               width_multiplier=0.25)}
    dc.worst_k = 10 if dataset == "cifar100" else 3

  if arg.smoke:
    train_configs.smoke(c)
    c.data.num_train = None       # The long-tailed subset is already small.
    c.total_steps = 6
    c.eval_every = 0
    c.checkpoint_every = 0
    config.teacher.model.update(train_configs.SMOKE_PRESETS["cnn"])
    config.teacher.total_steps = 8
    config.students.cnn.model.update(features=(4,), dense_dim=8)
    config.students.mlp.model.update(hidden_dims=(8,))
    dc.temperatures = (4.0,)
    dc.seeds = (0,)
  return config


def validate(config) -> None:
  """ConfigError for a bad `config.distillation` or a teacher / student without a model;
  the runs are checked by the study (their models and data, and the teacher's files)."""
  dc = config.distillation
  if "teacher" not in config or "model" not in config.teacher or (
      "name" not in config.teacher.model):
    raise ConfigError("teacher.model", "missing; a model block with a name "
                      "(mlcollections_configs.common.model_config)")
  if "students" not in config or not config.students:
    raise ConfigError("students", "must name at least one candidate student "
                      "({name: {model: ...}}; one is chosen on the val split)")
  for name, block in config.students.items():
    if not name.replace("_", "").isalnum():
      raise ConfigError("students", f"names must be identifiers, got {name!r}")
    if "model" not in block or "name" not in block.model:
      raise ConfigError(f"students.{name}.model", "missing; a model block with a name "
                        "(mlcollections_configs.common.model_config)")
  for field, ok, allowed in (("alphas", lambda a: 0 <= a <= 1, "in [0, 1]"),
                             ("temperatures", lambda t: t > 0, "> 0"),
                             ("margin_scales", lambda m: m >= 0, ">= 0")):
    values = list(dc[field])
    if not values or len(set(values)) != len(values) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and ok(v) for v in values):
      raise ConfigError(f"distillation.{field}", f"must be distinct numbers {allowed} "
                        f"(candidates chosen on the val split), got {values}")
  if dc.teacher_mode not in choices.TEACHER_MODES:
    raise ConfigError("distillation.teacher_mode", f"got {dc.teacher_mode!r}; allowed: "
                      f"{', '.join(choices.TEACHER_MODES)}")
  variants = list(dc.variants)
  bad = [v for v in variants if v not in VARIANTS]
  if bad or not variants or len(set(variants)) != len(variants):
    raise ConfigError("distillation.variants", f"must be distinct names from "
                      f"{', '.join(VARIANTS)}, got {variants}")
  if "onehot" not in variants:
    raise ConfigError("distillation.variants", "must include 'onehot' (the reference "
                      "for per-class gains)")
  seeds = list(dc.seeds)
  if not seeds or len(set(seeds)) != len(seeds) or not all(
      isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
    raise ConfigError("distillation.seeds", f"must be distinct ints >= 0, got {seeds}")
  if not (isinstance(dc.select_seed, int) and dc.select_seed >= 0) or dc.select_seed in seeds:
    raise ConfigError("distillation.select_seed", f"must be an int >= 0 not in "
                      f"distillation.seeds {seeds} (selection runs apart from the reported "
                      f"ones), got {dc.select_seed!r}")
  if not 0 < dc.val_fraction < 1:
    raise ConfigError("distillation.val_fraction", f"must be in (0, 1), got "
                      f"{dc.val_fraction}")
  if not (isinstance(dc.worst_k, int) and dc.worst_k >= 1):
    raise ConfigError("distillation.worst_k", f"must be an int >= 1, got {dc.worst_k!r}")
  if not 0 < dc.head_fraction < 1:
    raise ConfigError("distillation.head_fraction", f"must be in (0, 1), got "
                      f"{dc.head_fraction}")
