"""ViT vs ResNet robustness: corruptions, adversarial attacks, layer removal, weight noise,
sharpness, CKA and linear probes ("Understanding Robustness of Transformers for Image
Classification", Bhojanapalli et al., ICCV 2021, arXiv 2103.14586).

  xsens --config=mlcollections_configs/robustness.py --workdir=workdirs/robustness
  xsens --config=mlcollections_configs/robustness.py:smoke --workdir=/tmp/rob_smoke
  xsens --config=mlcollections_configs/robustness.py:scale --workdir=workdirs/rob_scale
  xsens --config=mlcollections_configs/robustness.py:setup=cifar10 \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/rob_c10
  xsens --config=mlcollections_configs/robustness.py:imagenet \
        --config.imagenet.data_dir=/path/to/tensorflow_datasets \
        --config.runs.vit_b16.pretrained.path=/path/to/ViT-B_16.npz \
        --config.runs.bit_m_r50x1.pretrained.path=/path/to/BiT-M-R50x1-ILSVRC2012.npz \
        --workdir=workdirs/rob_imagenet
  xsens --config=mlcollections_configs/robustness.py:imagenet,scale \
        --config.imagenet.data_dir=/path/to/tensorflow_datasets \
        --config.runs.vit_b16_i1k.pretrained.path=/path/to/ViT-B_16-i1k.npz \
        --config.runs.vit_b16_i21k.pretrained.path=/path/to/ViT-B_16.npz \
        --config.runs.bit_s_r50x1.pretrained.path=/path/to/BiT-S-R50x1-ILSVRC2012.npz \
        --config.runs.bit_m_r50x1.pretrained.path=/path/to/BiT-M-R50x1-ILSVRC2012.npz \
        --workdir=workdirs/rob_imagenet_scale

Set-ups: `mnist5k` (default, embedded, CPU: a 4-block ViT and a narrow ResNet-18);
`cifar10` (ViT and ResNet-18 trained from scratch; GPU/TPU-sized; corrupted images read from
TFDS `cifar10_corrupted` (CIFAR-10-C) in `train.data.data_dir` when all needed sets are
prepared there, else synthesised: `robustness.corruptions.source` auto | tfds | synthesize);
`imagenet` (`:imagenet` or `:setup=imagenet`; no training: public ViT-B/16 and BiT-M-R50x1
checkpoints fine-tuned on ImageNet, evaluated on streamed TFDS imagenet2012 validation and
imagenet2012_corrupted, see `xsens.studies.robustness_imagenet`; GPU-sized;
`:imagenet,smoke` is a tiny variant for tests).
Data scale: `:imagenet,scale` compares ViT-B/16 and BiT ResNet-50x1 checkpoints pre-trained on
ImageNet-1k (ViT-B/16 i1k, BiT-S) and on ImageNet-21k (ViT-B/16 i21k, BiT-M), all fine-tuned
on ImageNet-1k (`SCALE_RUNS`); `:scale` trains the mnist5k ViT and ResNet-18 from scratch on
10 %, 30 % and 100 % of the training split (`data.num_train`; 6 runs, about 3x the default
study's CPU time, without CKA / probes; `:scale,smoke` for tests) and reports the measures
per training-set size.
Seeds: `seeds=N` trains every run N times (training seeds shifted, same data; run ids
`<run>_seed<i>`); results.md adds the mean ± s.e. over seeds and the data-scale section
averages them, e.g. `:scale,seeds=3` (docs/results.md).
Corruptions: the 15 of Hendrycks & Dietterich (2019), which include defocus blur; Gaussian
blur is one of their 4 extra validation corruptions (not synthesised here; see
`xsens.data.corrupted`).
Shows: results.md with clean accuracy, mean corruption accuracy, mCE (vs the ResNet),
accuracy per corruption category, FGSM/PGD accuracy, perturbation structure (low-frequency
share, patch alignment), the worst single-layer removal and sharpness per model; plots of
accuracy vs severity and vs ε, layer-removal bars, PGD patch-energy maps, CKA heat maps and
per-layer probe accuracy.
"""

import ml_collections

from mlcollections_configs import common
from mlcollections_configs import train as train_configs
from xsens import choices
from xsens.config_utils import parse_arg
from xsens.errors import ConfigError, is_finite_number, is_int, require

SETUPS = ("mnist5k", "cifar10", "imagenet")


def robustness_config() -> ml_collections.ConfigDict:
  """Every `config.robustness` field with its CPU default."""
  return ml_collections.ConfigDict({
      "seed": 0,
      "num_examples": 500,          # test examples for every measurement
      "batch_size": 250,
      "patch_size": 4,              # the ViT's patch grid, for perturbation structure
      "baseline_run": "resnet18",   # mCE is relative to this run
      # Where the corrupted test images come from: `tfds_name` (pre-computed sets
      # `<tfds_name>/<corruption>_<severity>` in train.data.data_dir, e.g. CIFAR-10-C) read
      # when all are prepared ("auto") or always ("tfds"), else synthesised ("synthesize");
      # mnist5k has no pre-computed set.
      "corruptions": {"names": choices.CORRUPTION_NAMES, "severities": (1, 2, 3, 4, 5),
                      "source": "auto",
                      "tfds_name": ml_collections.FieldReference(None, field_type=str)},
      "adversarial": {"norm": "linf", "epsilons": (0.01, 0.02, 0.05, 0.1),
                      "main_epsilon": 0.05, "pgd_steps": 10, "step_size_fraction": 0.25,
                      "low_freq_cutoff": 0.25},
      "perturbations": {"relative_scale": 0.5, "num_draws": 3, "sharpness_sigma": 0.05,
                        "sharpness_examples": 500},
      "representations": {"num_examples": 500},
      "skip_sections": (),          # optional sections not measured (OPTIONAL_SECTIONS)
  })


def validate_robustness(rc) -> None:
  """ConfigError naming `robustness.<field>` for a bad field of `config.robustness`; its
  `baseline_run` is checked against the runs measured (`xsens.lab.robustness`)."""
  unknown = [n for n in rc.corruptions.names if n not in choices.CORRUPTION_NAMES]
  if unknown:
    raise ConfigError("robustness.corruptions.names",
                      f"unknown {unknown}; allowed: {', '.join(choices.CORRUPTION_NAMES)}")
  if any(s not in choices.CORRUPTION_SEVERITIES for s in rc.corruptions.severities):
    raise ConfigError("robustness.corruptions.severities",
                      f"must be within 1..5, got {list(rc.corruptions.severities)}")
  ac = rc.adversarial
  if not ac.epsilons or not all(is_finite_number(e) and e > 0 for e in ac.epsilons):
    raise ConfigError("robustness.adversarial.epsilons",
                      f"must be a non-empty list of finite ε > 0, got {list(ac.epsilons)}")
  if ac.main_epsilon not in ac.epsilons:
    raise ConfigError("robustness.adversarial.main_epsilon",
                      f"must be one of {list(ac.epsilons)}")
  if ac.norm not in choices.ADVERSARIAL_NORMS:
    raise ConfigError("robustness.adversarial.norm",
                      f"got {ac.norm!r}; allowed: {', '.join(choices.ADVERSARIAL_NORMS)}")
  require(is_int(ac.pgd_steps) and ac.pgd_steps > 0, "robustness.adversarial.pgd_steps",
          f"must be an int > 0, got {ac.pgd_steps!r}")
  for field in ("step_size_fraction", "low_freq_cutoff"):
    require(is_finite_number(ac[field]) and ac[field] > 0, f"robustness.adversarial.{field}",
            f"must be a finite number > 0, got {ac[field]!r}")
  for field in ("num_examples", "batch_size", "patch_size"):
    require(is_int(rc[field]) and rc[field] > 0, f"robustness.{field}",
            f"must be an int > 0, got {rc[field]!r}")
  pc = rc.perturbations  # None in the ImageNet setup.
  if pc is not None:
    for field in ("relative_scale", "sharpness_sigma"):
      require(is_finite_number(pc[field]) and pc[field] >= 0,
              f"robustness.perturbations.{field}",
              f"must be a finite number >= 0, got {pc[field]!r}")
    for field in ("num_draws", "sharpness_examples"):
      require(is_int(pc[field]) and pc[field] > 0, f"robustness.perturbations.{field}",
              f"must be an int > 0, got {pc[field]!r}")
  reps = rc.representations
  if reps is not None:
    require(is_int(reps.num_examples) and reps.num_examples > 0,
            "robustness.representations.num_examples",
            f"must be an int > 0, got {reps.num_examples!r}")


# `:imagenet,scale`: the same architectures pre-trained on ImageNet-1k and on ImageNet-21k
# (then fine-tuned on ImageNet-1k), {run: (model block, pre-training data)}. Public files:
# vit_jax (google-research/vision_transformer): ImageNet-1k only, e.g. the AugReg
# `augreg/B_16-i1k-300ep-...--imagenet2012-...-res_224.npz` or the SAM `sam/ViT-B_16.npz`;
# ImageNet-21k, `imagenet21k+imagenet2012/ViT-B_16.npz` (or an AugReg i21k one); big_transfer
# (google-research/big_transfer): `BiT-S-R50x1-ILSVRC2012.npz` (ImageNet-1k) and
# `BiT-M-R50x1-ILSVRC2012.npz` (ImageNet-21k).
SCALE_RUNS = {
    "vit_b16_i1k": ({"name": "vit"}, "ImageNet-1k"),
    "vit_b16_i21k": ({"name": "vit"}, "ImageNet-21k"),
    "bit_s_r50x1": ({"name": "bit_resnet", "num_groups": 32}, "ImageNet-1k"),
    "bit_m_r50x1": ({"name": "bit_resnet", "num_groups": 32}, "ImageNet-21k"),
}


def imagenet_config(smoke: bool = False, scale: bool = False) -> ml_collections.ConfigDict:
  """Setup `imagenet`: pretrained checkpoints on streamed ImageNet; no `train` block.

  `runs.<run>.model` names the model kind; its other fields (if set) override the ones read
  off the checkpoint (e.g. BiT's num_groups, which the `.npz` does not record).
  `runs.<run>.pretraining` names the pre-training data (reported; the `scale` variant
  compares ViT vs ResNet per pre-training set, `SCALE_RUNS`).
  """
  path = lambda: ml_collections.FieldReference(None, field_type=str)
  config = ml_collections.ConfigDict()
  config.study = "robustness"
  config.imagenet = common.imagenet_stream_config(
      corrupted_name="imagenet2012_corrupted", corrupted_split="validation",
      corruption_source="auto",             # auto | tfds | synthesize
      limit=ml_collections.FieldReference(10000, field_type=int),  # None: all 50k
      # image_size: model resolution (ViT posemb is resized); crop: ImageNet-C's central crop.
      normalize="half",                     # [-1, 1], as vit_jax and big_transfer
      batch_size=250)
  config.robustness = rc = robustness_config()
  # Not measured in this setup (see xsens.studies.robustness_imagenet): weight noise,
  # sharpness, CKA and probes; the corrupted images' source is `imagenet.corruption_source`.
  del rc["perturbations"], rc["representations"], rc["skip_sections"]
  del rc.corruptions["source"], rc.corruptions["tfds_name"]
  rc.perturbations = rc.representations = None
  rc.num_examples = 500                     # adversarial and layer-removal subset
  rc.batch_size = 50
  rc.patch_size = 16                        # ViT-B/16's patch grid
  rc.baseline_run = "bit_m_r50x1"
  rc.adversarial.epsilons = (0.5 / 255, 1 / 255, 2 / 255, 4 / 255)
  rc.adversarial.main_epsilon = 2 / 255
  config.runs = ml_collections.ConfigDict({
      "vit_b16": {"model": {"name": "vit"}, "pretrained": {"path": path()},
                  "pretraining": "ImageNet-21k"},
      "bit_m_r50x1": {"model": {"name": "bit_resnet", "num_groups": 32},
                      "pretrained": {"path": path()}, "pretraining": "ImageNet-21k"}})
  if scale:
    config.runs = ml_collections.ConfigDict({
        name: {"model": dict(model), "pretrained": {"path": path()}, "pretraining": data}
        for name, (model, data) in SCALE_RUNS.items()})
  if smoke:
    ic = config.imagenet
    ic.limit, ic.image_size, ic.batch_size, ic.num_workers = 12, 32, 8, 2
    rc.num_examples, rc.batch_size, rc.patch_size = 6, 4, 8
    rc.corruptions.names = ("gaussian_noise", "fog")
    rc.corruptions.severities = (1, 5)
    rc.adversarial.epsilons = (2 / 255, 8 / 255)
    rc.adversarial.main_epsilon = 8 / 255
    rc.adversarial.pgd_steps = 2
  return config


CORRUPTION_SOURCES = ("auto", "tfds", "synthesize")


def _positive_int(value, field: str) -> None:
  if not (is_int(value) and value >= 1):
    raise ConfigError(field, f"must be a positive int, got {value!r}")


def validate_imagenet(config) -> None:
  """The fields of the ImageNet set-up: `config.imagenet`, `config.robustness` and
  `config.runs` (their checkpoint files are checked by the study)."""
  ic, rc = config.imagenet, config.robustness
  if not config.runs:
    raise ConfigError("runs", "needs at least one run (a vit or bit_resnet checkpoint)")
  for name, run in config.runs.items():
    data = run.pretraining
    if data is not None and not (isinstance(data, str) and data.strip()):
      raise ConfigError(f"runs.{name}.pretraining", "must be None or the name of the "
                        f"pre-training data (e.g. 'ImageNet-21k'), got {data!r}")
  if ic.normalize not in choices.PIXEL_SCALE:
    raise ConfigError("imagenet.normalize", f"got {ic.normalize!r}; allowed: "
                      f"{', '.join(choices.PIXEL_SCALE)} (vit_jax and big_transfer "
                      "use 'half', [-1, 1])")
  if rc.baseline_run not in config.runs:
    raise ConfigError("robustness.baseline_run", f"{rc.baseline_run!r} is not a run; "
                      f"allowed: {', '.join(config.runs)}")
  validate_robustness(rc)
  if ic.corruption_source not in CORRUPTION_SOURCES:
    raise ConfigError("imagenet.corruption_source", f"got {ic.corruption_source!r}; allowed: "
                      f"{', '.join(CORRUPTION_SOURCES)}")
  _positive_int(ic.image_size, "imagenet.image_size")
  if ic.limit is not None:
    _positive_int(ic.limit, "imagenet.limit")
  if ic.image_size % rc.patch_size:
    raise ConfigError("robustness.patch_size", f"{rc.patch_size} must divide "
                      f"imagenet.image_size={ic.image_size} (perturbation energy per patch)")
  if ic.limit is not None and rc.num_examples > ic.limit:
    raise ConfigError("robustness.num_examples", f"{rc.num_examples} exceeds imagenet.limit="
                      f"{ic.limit}; the adversarial / layer-removal subset is the first "
                      "robustness.num_examples of the evaluated examples")


# From-scratch data-scale sweep (`:scale`): share of the mnist5k training split (4000
# examples) per run, and the training-set sizes of its smoke variant (of the 256 smoke
# examples).
SCALE_FRACTIONS = (0.1, 0.3, 1.0)
MNIST5K_TRAIN = 4000
SMOKE_TRAIN = 320  # 10 % = 32 = the smoke batch size.


def _scale_runs(runs: ml_collections.ConfigDict, total: int | None
                ) -> ml_collections.ConfigDict:
  """Each run once per `SCALE_FRACTIONS` share of the training split, named
  `<run>_<percent>pct`, with `data.num_train` set (None for 100 % of the full split)."""
  out = {}
  for name, run in runs.items():
    for f in SCALE_FRACTIONS:
      n = None if (f == 1.0 and total is None) else round(f * (total or MNIST5K_TRAIN))
      out[f"{name}_{round(100 * f)}pct"] = {
          "model": run.model, "data": {"num_train": ml_collections.FieldReference(
              n, field_type=int)}}
  return ml_collections.ConfigDict(out)


def get_config(arg=None):
  arg = parse_arg(arg, setup="mnist5k", smoke=False, imagenet=False, scale=False, seeds=1)
  if arg.imagenet or arg.setup == "imagenet":
    if arg.seeds != 1:
      raise ValueError("`seeds` sets training seeds; the imagenet set-up trains nothing "
                       "(pretrained checkpoints)")
    return imagenet_config(arg.smoke, scale=arg.scale)
  if arg.scale and arg.setup != "mnist5k":
    raise ValueError("the from-scratch data-scale sweep (`scale`) is defined on mnist5k; "
                     "use `:scale` or `:imagenet,scale` (pretrained checkpoints)")
  config = common.multi_run_config("robustness", arg.setup, SETUPS)
  config.num_seeds = arg.seeds  # Training seeds per run (xsens.lab.multirun.run_ids).
  c = config.train
  config.robustness = rc = robustness_config()
  if arg.setup == "mnist5k":
    c.data.name = "mnist5k"
    c.total_steps = 1500
    vit = dict(train_configs.MODEL_PRESETS["vit"], depth=4)
    config.runs = ml_collections.ConfigDict({
        "vit": {"model": common.model_config(**vit)},
        "resnet18": {"model": common.model_config(name="resnet18", width_multiplier=0.125)}})
  else:
    c.data.name = "cifar10"
    rc.corruptions.tfds_name = "cifar10_corrupted"  # CIFAR-10-C, see xsens.data.corrupted.
    c.total_steps = None
    c.total_epochs = 100.0
    c.batch_size = 256
    c.optimizer.schedule = "cosine"
    c.optimizer.warmup_steps = 1000
    c.eval_every = 2000
    c.eval_train_examples = 10000
    c.checkpoint_every = 2000
    rc.num_examples = 5000
    rc.batch_size = 500
    rc.adversarial.epsilons = (0.5 / 255, 1 / 255, 2 / 255, 4 / 255)
    rc.adversarial.main_epsilon = 2 / 255
    rc.representations.num_examples = 5000
    config.runs = ml_collections.ConfigDict({
        "vit": {"model": common.model_config(name="vit", patch_size=4, width=384, depth=8,
                                             num_heads=6, mlp_dim=1536)},
        "resnet18": {"model": common.model_config(name="resnet18")}})
  if arg.smoke:
    train_configs.smoke(c)
    c.target_train_accuracy = None
    c.eval_train_examples = None
    for run in config.runs.values():
      run.model.update(train_configs.SMOKE_PRESETS[run.model.name])
    config.runs.vit.model.depth = 2
    rc.patch_size = 7
    rc.num_examples = 64
    rc.batch_size = 32
    rc.corruptions.names = ("gaussian_noise", "defocus_blur", "fog", "contrast")
    rc.corruptions.severities = (1, 5)
    rc.adversarial.epsilons = (0.05, 0.1)
    rc.adversarial.pgd_steps = 3
    rc.perturbations.num_draws = 2
    rc.perturbations.sharpness_examples = 64
    rc.representations.num_examples = 64
  if arg.scale:
    config.runs = _scale_runs(config.runs, SMOKE_TRAIN if arg.smoke else None)
    rc.baseline_run = "resnet18_100pct"
    # The sweep reports the corruption, adversarial and layer-removal measures per scale;
    # CKA / probes (15 cross-run CKA pairs for 6 runs) are left to the default study.
    rc.skip_sections = ("representations",)
    if arg.smoke:  # The smoke models and batch shapes, so compiled programs are shared.
      rc.skip_sections = ("perturbations", "representations")
      rc.num_examples = 32
      rc.corruptions.names, rc.corruptions.severities = ("gaussian_noise", "fog"), (5,)
      rc.adversarial.epsilons = (rc.adversarial.main_epsilon,)
  return config


def validate(config) -> None:
  """ConfigError for a bad field: `config.robustness`, and in the ImageNet set-up
  `config.imagenet` and the runs. The trained runs (their models, data and
  `data.normalize`, the patch size of the ViTs) and the checkpoint files are checked by the
  study."""
  if "imagenet" in config:
    validate_imagenet(config)
  else:
    validate_robustness(config.robustness)
