"""Prediction churn between retrainings, and two ways to lower it.

Bhojanapalli, Wilber, Veit, Rawat, Kim, Menon, Kumar, "On the reproducibility of neural
network predictions", arXiv 2102.03349 (results: docs/results.md).

  xsens --config=mlcollections_configs/churn.py --workdir=workdirs/churn
  xsens --config=mlcollections_configs/churn.py:smoke --workdir=/tmp/churn_smoke
  xsens --config=mlcollections_configs/churn.py:setup=digits --workdir=workdirs/churn_digits
  xsens --config=mlcollections_configs/churn.py:setup=digits,methods=baseline+min_entropy \
        --workdir=workdirs/churn_digits_me
  xsens --config=mlcollections_configs/churn.py:setup=cifar10 \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/churn_c10

Set-ups (`setup=`): `mnist5k` (default: a CNN (16, 32) with 64 dense units, 300 steps of
Adam 1e-3, batch 128, Gaussian pixel-noise augmentation σ = 0.3 on half the images);
`digits` (the same on 8×8 digits); `mnist5k_lt` / `digits_lt` (long-tailed train split,
ρ = 10); `cifar10` / `cifar100` (ResNet-18, 100 epochs, SGD+momentum, cosine; GPU-sized,
TFDS data from `data_dir`).

Methods (`churn.methods`): `baseline` (CE), `min_entropy` (CE + λ·H(p), λ = 0.2 or 0.5:
`min_entropy_l0p5`) and `codistill` (two models trained jointly, L_i = CE + β·KL(sg(p_j) ‖
p_i), β = 0.5 or 1: `codistill_b1`; model a is the one compared across runs);
`methods=a+b` keeps only those. For each method and each source of randomness in
`churn.sources` (default init), `churn.num_seeds` runs differ in that seed only; churn is
measured on disjoint pairs of them (`churn.pairing`). The test split is cut into `val` and
`eval`: in each `churn.select` group (the settings of one method) the member with the
lowest val churn is reported; every number is on `eval`.
Shows: results.md (churn mean ± s.e. over pairs and accuracy per method × source; the
chosen settings; the paired eval churn reduction vs the baseline, ± s.e.; churn by
confidence bin), churn_by_source.png and churn_by_confidence.png. Results:
docs/results.md, "Prediction churn".
"""

import ml_collections

from mlcollections_configs import common
from mlcollections_configs import train as train_configs
from xsens.config_utils import parse_arg
from xsens.data.long_tail import long_tail_fractions
from xsens.errors import ConfigError

SETUPS = ("mnist5k", "digits", "mnist5k_lt", "digits_lt", "cifar10", "cifar100")
# The training seeds `churn.sources` may vary (init, mini-batch order, step key).
SEED_SOURCES = ("init", "order", "augment")
PAIRINGS = ("disjoint", "all")


def _min_entropy(weight: float) -> dict:
  """The `min_entropy` method: CE + weight·H(p)."""
  return {"objective": {"ce": {"kind": "cross_entropy", "weight": 1.0},
                        "penalty": {"kind": "min_entropy", "weight": weight}}}


def churn_config() -> ml_collections.ConfigDict:
  """Every `config.churn` field with its default."""
  return ml_collections.ConfigDict({
      "sources": ("init",),     # or any of "init", "order", "augment"
      "num_seeds": 10,          # runs per source: seeds base_seed .. base_seed + n - 1
      "base_seed": 0,           # the value of the seeds that are held fixed
      "pairing": "disjoint",    # pairs 0-1, 2-3, ... (independent); or "all" (shared runs)
      "methods": {
          "baseline": {},
          "min_entropy": _min_entropy(0.2),
          "min_entropy_l0p5": _min_entropy(0.5),
          "codistill": {"codistill": common.codistill_config(beta=0.5).to_dict()},
          "codistill_b1": {"codistill": common.codistill_config(beta=1.0).to_dict()},
      },
      "baseline": "baseline",   # the method the reductions are measured against
      # Groups of settings of one method; the member with the lowest mean `val` churn is
      # the one reported (its eval churn) against the baseline.
      "select": {"min_entropy": ("min_entropy", "min_entropy_l0p5"),
                 "codistill": ("codistill", "codistill_b1")},
      "val_fraction": 0.5,      # share of the test split that chooses (the rest: eval)
      "split_seed": 0,          # which test examples are `val`
      "confidence_edges": (0.0, 0.5, 0.7, 0.9, 0.99, 1.0),
  })


def validate_churn(cc) -> None:
  """ConfigError naming `churn.<field>` for a bad value of `config.churn`."""
  sources = list(cc.sources)
  if not sources or len(set(sources)) != len(sources) or any(s not in SEED_SOURCES for s in sources):
    raise ConfigError("churn.sources", f"must be distinct names from {', '.join(SEED_SOURCES)}, "
                      f"got {sources}")
  if not (isinstance(cc.num_seeds, int) and cc.num_seeds >= 2):
    raise ConfigError("churn.num_seeds", f"must be an int >= 2 (a pair), got {cc.num_seeds!r}")
  if not (isinstance(cc.base_seed, int) and cc.base_seed >= 0):
    raise ConfigError("churn.base_seed", f"must be an int >= 0, got {cc.base_seed!r}")
  if not cc.methods:
    raise ConfigError("churn.methods", "must name at least one method")
  for name in cc.methods:
    if not name.replace("_", "").isalnum():
      raise ConfigError("churn.methods", f"method names must be identifiers, got {name!r}")
  if cc.pairing not in PAIRINGS:
    raise ConfigError("churn.pairing", f"got {cc.pairing!r}; allowed: {', '.join(PAIRINGS)}")
  if cc.pairing == "disjoint" and cc.num_seeds % 2:
    raise ConfigError("churn.num_seeds", f"must be even with churn.pairing='disjoint' "
                      f"(pairs 0-1, 2-3, ...), got {cc.num_seeds}")
  if cc.baseline not in cc.methods:
    raise ConfigError("churn.baseline", f"{cc.baseline!r} is not a method; methods: "
                      f"{', '.join(cc.methods)}")
  for group, members in cc.select.items():
    members = list(members)
    bad = [m for m in members if m not in cc.methods]
    if not members or bad or len(set(members)) != len(members):
      raise ConfigError(f"churn.select.{group}", f"must be distinct method names from "
                        f"{', '.join(cc.methods)}, got {members}")
  if not 0 < cc.val_fraction < 1:
    raise ConfigError("churn.val_fraction", f"must be in (0, 1), got {cc.val_fraction}")
  if not (isinstance(cc.split_seed, int) and cc.split_seed >= 0):
    raise ConfigError("churn.split_seed", f"must be an int >= 0, got {cc.split_seed!r}")
  edges = list(cc.confidence_edges)
  if len(edges) < 2 or edges[0] != 0 or edges[-1] != 1 or any(
      b <= a for a, b in zip(edges, edges[1:])):
    raise ConfigError("churn.confidence_edges", f"must increase from 0 to 1 (every "
                      f"confidence falls in one bin), got {edges}")


def get_config(arg=None):
  arg = parse_arg(arg, setup="mnist5k", methods="", smoke=False)
  config = common.multi_run_config("churn", arg.setup, SETUPS, target_train_accuracy=None)
  c = config.train
  dataset = arg.setup.removesuffix("_lt")
  c.data.name = dataset
  if arg.setup.endswith("_lt"):
    c.data.class_fractions = long_tail_fractions(10, 10.0)
  config.churn = churn_config()
  c.augment.gaussian_std = 0.3
  c.augment.gaussian_prob = 0.5
  if dataset in ("mnist5k", "digits"):
    c.model = common.model_config(name="cnn", features=(16, 32), dense_dim=64)
    c.total_steps = 300
    c.batch_size = 128
    c.eval_every = 0
    c.checkpoint_every = 0
  else:
    c.model = common.model_config(name="resnet18")
    common.cifar_resnet_recipe(c, total_epochs=100)
  if arg.methods:
    _keep_methods(config.churn, arg.methods.split("+"))
  if arg.smoke:
    train_configs.smoke(c, "cnn")
    c.model.features = (4, 8)
    c.eval_every = 0
    c.checkpoint_every = 0
    config.churn.num_seeds = 2
    config.churn.sources = ("init",)
    config.churn.methods = {k: config.churn.methods[k].to_dict()
                            for k in ("baseline", "min_entropy", "min_entropy_l0p5",
                                      "codistill")}
    config.churn.select = {"min_entropy": ("min_entropy", "min_entropy_l0p5")}
  return config


def _keep_methods(cc, names: list[str]) -> None:
  """Keeps only `names` of `cc.methods` (and of each `cc.select` group; empty groups go)."""
  unknown = [n for n in names if n not in cc.methods]
  if unknown:
    raise ValueError(f"unknown methods {unknown}; allowed: {', '.join(cc.methods)}")
  cc.methods = {n: cc.methods[n].to_dict() for n in names}
  cc.select = {g: tuple(m for m in members if m in names)
               for g, members in cc.select.items() if any(m in names for m in members)}


def validate(config) -> None:
  """ConfigError for a bad `config.churn`; the runs it trains are checked by the study
  (their models and data, `xsens.lab.multirun.validate_runs`)."""
  validate_churn(config.churn)
