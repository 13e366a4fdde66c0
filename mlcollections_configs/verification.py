"""Verification by the nonconvex reformulation of the triangle relaxation (Bunel, Hinder,
Bhojanapalli, Dvijotham, NeurIPS 2020, arXiv 2010.14322).

  xsens --config=mlcollections_configs/verification.py --workdir=workdirs/verification
  xsens --config=mlcollections_configs/verification.py:smoke --workdir=workdirs/verification_smoke
  xsens --config=mlcollections_configs/verification.py:seeds=3 --workdir=workdirs/verification_s3
  xsens --config=mlcollections_configs/verification.py:setup=cifar10 \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/ver_c10

Runs: MLPs 784-100-100-10 and 784-256-256-256-10 and a small CNN (one 3×3 conv with 16
channels, dense 100; no max-pool, so the network is affine layers and ReLUs), each trained
on mnist5k plainly and with PGD adversarial training (ε = 0.05, 5 steps; an objective term
of `xsens.train.objectives`). Shows: verified accuracy vs ε ∈ {0.005, 0.01, 0.02, 0.05}
for IBP, the backward triangle bounds, the nonconvex reformulation solved by projected
gradient and by FISTA, and the LP (HiGHS, on the small MLPs and the first examples only);
falsified (PGD attack) and open rates; the duality gap vs iterations and wall time. The
paper's claims: small duality gaps in a few gradient steps; faster than off-the-shelf
solvers (its numbers are not known).
"""

import ml_collections

from mlcollections_configs import common
from mlcollections_configs import train as train_configs
from xsens.config_utils import parse_arg
from xsens.errors import is_finite_number, is_int, require

SETUPS = ("mnist5k", "cifar10")
METHODS = ("ibp", "triangle", "pgd", "fista", "lp")


def verification_config() -> ml_collections.ConfigDict:
  """The `config.verification` block read by `xsens.studies.verification` (the solver's
  defaults: docs/papers/google_papers.md §H)."""
  return ml_collections.ConfigDict({
      "epsilons": (0.005, 0.01, 0.02, 0.05),
      "methods": ("ibp", "triangle", "pgd", "fista", "lp"),
      "num_examples": 100,           # first test examples
      "bounds_method": "triangle",   # intermediate bounds of the relaxation
      "max_iters": 100,              # nonconvex solver iterations per property
      "tol": 1e-2,                   # duality-gap stopping rule
      # The kink-aware step's continuation τ_1 > ... ≥ 0 in [0, 1] (xsens.verify.nonconvex,
      # e.g. its KINK_SMOOTHING); (): plain FISTA / PGD, what docs/results.md's runs used.
      "smoothing": (),
      "attack_steps": 20,            # PGD attack for the falsified / open split
      "lp_runs": ("mlp_small", "mlp_small_adv"),
      "lp_num_examples": 10,
      "trace_runs": ("mlp_small",),
      "trace_examples": 5,
      "trace_iters": 200,
      "trace_epsilon": 0.02,
      "seed": 0,
  })


def _adversarial(epsilon: float, num_steps: int) -> dict:
  return {"task": {"kind": "adversarial", "weight": 1.0, "epsilon": epsilon,
                   "num_steps": num_steps, "clip_min": 0.0, "clip_max": 1.0}}


def get_config(arg=None):
  arg = parse_arg(arg, setup="mnist5k", smoke=False, seeds=1)
  config = common.multi_run_config("verification", arg.setup, SETUPS,
                                   target_train_accuracy=None)
  config.num_seeds = arg.seeds       # `seeds=3`: every run trained with 3 seeds
  train = config.train
  train.data.name = arg.setup
  train.data.normalize = "zero_one"
  train.total_steps = 600
  train.eval_every = 300
  train.checkpoint_every = 300
  train.progress = False
  models = {
      "mlp_small": common.model_config(name="mlp", hidden_dims=(100, 100)),
      "mlp_large": common.model_config(name="mlp", hidden_dims=(256, 256, 256)),
      "cnn": common.model_config(name="cnn", features=(16,), kernel_size=3, dense_dim=100),
  }
  runs = {}
  for name, model in models.items():
    runs[name] = {"model": model}
    runs[f"{name}_adv"] = {"model": model, "objective": _adversarial(0.05, 5)}
  config.runs = ml_collections.ConfigDict(runs)
  config.verification = verification_config()
  if arg.setup == "cifar10":
    config.verification.epsilons = (0.5 / 255, 1 / 255, 2 / 255, 8 / 255)
    for name in ("mlp_small_adv", "mlp_large_adv", "cnn_adv"):
      config.runs[name].objective = _adversarial(2 / 255, 5)
    train.total_steps = 2000
  if arg.smoke:
    train_configs.smoke(train)
    config.runs = ml_collections.ConfigDict({  # One run covers the CNN, PGD training, LP.
        "cnn_adv": {"model": common.model_config(name="cnn", features=(2,), kernel_size=3,
                                                 dense_dim=8),
                    "objective": _adversarial(0.05, 2)}})
    vc = config.verification
    vc.epsilons = (0.01, 0.05)
    vc.num_examples, vc.max_iters, vc.attack_steps = 4, 10, 2
    vc.lp_runs, vc.lp_num_examples = ("cnn_adv",), 1
    vc.trace_runs, vc.trace_examples, vc.trace_iters = ("cnn_adv",), 2, 5
  return config


def validate(config) -> None:
  """ConfigError for a bad field of the `verification` block; the ε values
  (`xsens.verify.bounds.check_epsilon`) and the runs are checked by the study."""
  vc = config.verification
  require(len(tuple(vc.epsilons)) > 0, "verification.epsilons", "must list at least one ε")
  bad = [m for m in vc.methods if m not in METHODS]
  require(not bad and len(vc.methods) > 0, "verification.methods",
          f"unknown {bad!r}; allowed: {', '.join(METHODS)}")
  for field in ("num_examples", "max_iters", "trace_iters", "trace_examples",
                "lp_num_examples"):
    require(is_int(vc[field]) and vc[field] >= 1, f"verification.{field}",
            f"must be an int >= 1, got {vc[field]!r}")
  require(is_int(vc.attack_steps) and vc.attack_steps >= 0, "verification.attack_steps",
          f"must be an int >= 0, got {vc.attack_steps!r}")
  smoothing = tuple(vc.smoothing)
  require(all(is_finite_number(t) and 0 <= t <= 1 for t in smoothing), "verification.smoothing",
          f"must list numbers in [0, 1] (e.g. (1.0, 0.1, 0.01, 0.0); () for plain FISTA), "
          f"got {smoothing!r}")
  require(is_finite_number(vc.tol) and vc.tol > 0, "verification.tol",
          f"must be a number > 0, got {vc.tol!r}")
  require(vc.bounds_method in ("ibp", "triangle"), "verification.bounds_method",
          f"must be 'ibp' or 'triangle', got {vc.bounds_method!r}")
  require(is_finite_number(vc.trace_epsilon) and vc.trace_epsilon >= 0,
          "verification.trace_epsilon", f"must be a number >= 0, got {vc.trace_epsilon!r}")
  for field in ("lp_runs", "trace_runs"):
    unknown = [r for r in vc[field] if r not in config.runs]
    require(not unknown, f"verification.{field}",
            f"unknown runs {unknown!r}; allowed: {', '.join(config.runs)}")
