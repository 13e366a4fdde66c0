"""Coping with label shift via distributionally robust optimisation (Zhang, Menon, Veit,
Bhojanapalli, Kumar, Sra; ICLR 2021, arXiv 2010.12230; results in docs/results.md).

  xsens --config=mlcollections_configs/label_shift.py --workdir=workdirs/label_shift
  xsens --config=mlcollections_configs/label_shift.py:smoke --workdir=/tmp/label_shift_smoke
  xsens --config=mlcollections_configs/label_shift.py:setup=digits,ratio=10 \
        --workdir=workdirs/label_shift_digits
  xsens --config=mlcollections_configs/label_shift.py:sweep --workdir=workdirs/ls_sweep
  xsens --config=mlcollections_configs/label_shift.py:setup=cifar100_lt \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/ls_c100

Set-ups (`setup=`; `ratio=` is the imbalance ρ: class c keeps ρ^(−c/(K−1)) of its
training examples, `xsens.data.long_tail`; the test split stays balanced):
- `mnist5k` (default, ρ = 100: 400 → 4 training examples per class, 994 in all) and
  `digits` (8×8 digits, 355 examples at ρ = 100): a small CNN (8, 16; 32 dense units),
  Adam 1e-3, batch 128, 400 steps (50 epochs at ρ = 100); `ratio=1`, `10`, `100` are
  the imbalances of the DRO label-shift paper (arXiv 2010.12230);
- `cifar100_lt` (ρ = 100, the usual CIFAR-100-LT): a ResNet-18, 200 epochs, SGD + momentum,
  cosine (GPU-sized; TFDS data from `data_dir`).

Runs (objective terms of `xsens.train.dro`, one loop; 3 training seeds each,
`num_seeds`): `erm`; `balanced` (re-weighting to the uniform prior); `agnostic` (DRO over
the whole simplex: the worst class); `fixed` (re-weighting to the fixed prior
π ∝ p_train^(1/2), halfway to uniform); `logit_adjust` (Menon et al. 2021, τ = 1);
`oracle` (re-weighting to the headline test prior, the reversed long tail π ∝ p_train^−1);
`dro` (KL ball r = 0.1, β = 0.999, clip 2, ε = 1e-3, η_π = 0.01).
`sweep`: ERM, BALANCED and the DRO term at r ∈ {0.1, 1, 1e3 (AGNOSTIC)} × η_π ∈
{0.01, 0.1, 1} (`dro_r<r>_eta<η>`), 3 seeds each.
Shows: results.md with accuracy (mean ± s.e. over seeds) on the training prior, the
uniform prior, head/tail tilts π ∝ p_train^λ, Dirichlet test priors and the worst case in
KL balls of radius ρ around p_train; accuracy_vs_kl.png, worst_case.png and dro_prior.png
(DRO's final π against the class frequencies).
The paper's claim: DRO improves accuracy under label shift over the baselines while
keeping the in-distribution accuracy.

Measured (docs/results.md), mnist5k
ρ = 100, 3 seeds: in-distribution accuracy ERM 0.949, DRO 0.949; reversed tail (λ = −1)
ERM 0.408 ± 0.024, DRO 0.417 ± 0.012, logit adjustment 0.541 ± 0.012: DRO keeps the
in-distribution accuracy but does not beat the baselines under shift here.
"""

import ml_collections

from mlcollections_configs import common
from mlcollections_configs import train as train_configs
from xsens.config_utils import parse_arg
from xsens.data.long_tail import long_tail_fractions
from xsens.errors import ConfigError, is_finite_number, is_int

SETUPS = ("mnist5k", "digits", "cifar100_lt")
_NUM_CLASSES = {"mnist5k": 10, "digits": 10, "cifar100": 100}


def label_shift_config() -> ml_collections.ConfigDict:
  """Every `config.label_shift` field (the evaluation under label shift) with its default."""
  return ml_collections.ConfigDict({
      "tilts": (2.0, 0.5, 0.0, -0.5, -1.0),      # π ∝ p_train^λ (1: p_train, 0: uniform)
      "dirichlet_concentrations": (0.3, 1.0, 10.0),  # symmetric Dirichlet(c·1) test priors
      "num_dirichlet": 20,                        # samples per concentration
      "radii": (0.1, 0.5, 1.0, 2.0),              # ρ of the worst-case priors
      "seed": 0,                                  # of the Dirichlet samples
      "eval_batch_size": 500,
      "headline_tilt": -1.0,                      # the oracle's test prior
  })


def methods(radius: float, headline_tilt: float) -> dict:
  """{run name: objective} of the compared methods."""
  term = lambda kind, **o: {"objective": {"task": {"kind": kind, "weight": 1.0, **o}}}
  return {
      "erm": term("cross_entropy"),
      "balanced": term("reweighted_cross_entropy", tilt=0.0),
      "agnostic": term("dro_label_shift", radius=1e3),
      "fixed": term("reweighted_cross_entropy", tilt=0.5),
      "logit_adjust": term("logit_adjusted_cross_entropy", tau=1.0),
      "oracle": term("reweighted_cross_entropy", tilt=headline_tilt),
      "dro": term("dro_label_shift", radius=radius, step_size=0.01, ema_rate=0.999,
                  loss_clip=2.0, epsilon=1e-3),
  }


# The π step sizes and radii of the `sweep` variant (η_π and r are not known from the paper).
SWEEP_STEP_SIZES = (0.01, 0.1, 1.0)
SWEEP_RADII = (0.1, 1.0, 1e3)   # 1e3: the whole simplex (AGNOSTIC).


def sweep_methods() -> dict:
  """{run name: objective}: ERM and BALANCED, and the DRO term at every (r, η_π) of
  SWEEP_RADII × SWEEP_STEP_SIZES (`dro_r<r>_eta<η>`; r = 1e3 is AGNOSTIC)."""
  out = {k: v for k, v in methods(0.1, -1.0).items() if k in ("erm", "balanced")}
  for r in SWEEP_RADII:
    for eta in SWEEP_STEP_SIZES:
      out[f"dro_r{r:g}_eta{eta:g}".replace(".", "p")] = {"objective": {"task": {
          "kind": "dro_label_shift", "weight": 1.0, "radius": r, "step_size": eta,
          "ema_rate": 0.999, "loss_clip": 2.0, "epsilon": 1e-3}}}
  return out


def get_config(arg=None):
  arg = parse_arg(arg, setup="mnist5k", ratio=0.0, smoke=False, sweep=False)
  config = common.multi_run_config("label_shift", arg.setup, SETUPS,
                                   target_train_accuracy=None)
  c = config.train
  dataset = arg.setup.removesuffix("_lt")
  ratio = arg.ratio or 100.0
  c.data.name = dataset
  c.data.class_fractions = long_tail_fractions(_NUM_CLASSES[dataset], ratio)
  config.num_seeds = 3
  config.label_shift = ls = label_shift_config()
  if dataset in ("mnist5k", "digits"):
    c.model = common.model_config(name="cnn", features=(8, 16), dense_dim=32)
    c.total_steps = 400
    c.batch_size = 128
    c.eval_every = 0
    c.log_every = 100
    c.checkpoint_every = 0
    c.progress = False
  else:
    common.cifar_resnet_recipe(c, total_epochs=200)
    c.model = common.model_config(name="resnet18")
  config.runs = ml_collections.ConfigDict(
      sweep_methods() if arg.sweep else methods(0.1, ls.headline_tilt))
  if arg.smoke:
    train_configs.smoke(c)
    c.data.num_train = None        # The long-tailed subset is already small.
    if c.model.name == "cnn":
      c.model.update(features=(4,), dense_dim=8)
    else:
      c.model.update(train_configs.SMOKE_PRESETS[c.model.name])
    c.total_epochs = None
    c.total_steps = 6
    c.optimizer.warmup_steps = 0
    c.eval_every = 0
    c.checkpoint_every = 3
    config.num_seeds = 1
    ls.num_dirichlet = 3
  return config


LABEL_SHIFT_FIELDS = ("tilts", "dirichlet_concentrations", "num_dirichlet", "radii", "seed",
                      "eval_batch_size", "headline_tilt")


def _require(ok: bool, field: str, message: str, value) -> None:
  if not ok:
    raise ConfigError(f"label_shift.{field}", f"{message}, got {value!r}")


def _numbers(values, ok) -> bool:
  return (isinstance(values, (tuple, list)) and len(values) > 0
          and all(is_finite_number(v) and ok(v) for v in values))


def validate(config) -> None:
  """Checks `config.label_shift` (ConfigError naming `label_shift.<field>`); the runs are
  checked by the study (their models and data)."""
  ls = config.get("label_shift")
  if ls is None:
    raise ConfigError("label_shift", "is missing; see mlcollections_configs/label_shift.py")
  unknown = sorted(set(ls.keys()) - set(LABEL_SHIFT_FIELDS))
  _require(not unknown, unknown[0] if unknown else "", "unknown field; allowed: "
           + ", ".join(LABEL_SHIFT_FIELDS), unknown[:1])
  _require(_numbers(ls.tilts, lambda v: True), "tilts",
           "must be a non-empty tuple of finite numbers λ (π ∝ p_train^λ)", ls.tilts)
  _require(_numbers(ls.dirichlet_concentrations, lambda v: v > 0), "dirichlet_concentrations",
           "must be a non-empty tuple of numbers > 0", ls.dirichlet_concentrations)
  _require(is_int(ls.num_dirichlet) and ls.num_dirichlet >= 0, "num_dirichlet",
           "must be an int >= 0", ls.num_dirichlet)
  _require(_numbers(ls.radii, lambda v: v >= 0), "radii",
           "must be a non-empty tuple of finite numbers >= 0 (KL radii ρ)", ls.radii)
  _require(is_int(ls.seed) and ls.seed >= 0, "seed", "must be an int >= 0", ls.seed)
  _require(is_int(ls.eval_batch_size) and ls.eval_batch_size > 0, "eval_batch_size",
           "must be an int > 0", ls.eval_batch_size)
  _require(is_finite_number(ls.headline_tilt), "headline_tilt", "must be a finite number",
           ls.headline_tilt)
  oracle = config.get("runs", {}).get("oracle", {}).get("objective", {}).get("task", {})
  _require(oracle.get("tilt", ls.headline_tilt) == ls.headline_tilt, "headline_tilt",
           f"must equal runs.oracle.objective.task.tilt ({oracle.get('tilt')!r}, the prior "
           "the oracle trains for; set both)", ls.headline_tilt)
