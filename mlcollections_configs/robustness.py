"""ViT vs ResNet robustness: corruptions, adversarial attacks, layer removal, weight noise,
sharpness, CKA and linear probes ("Understanding Robustness of Transformers for Image
Classification", Bhojanapalli et al., ICCV 2021, arXiv 2103.14586).

  xsens --config=mlcollections_configs/robustness.py --workdir=workdirs/robustness
  xsens --config=mlcollections_configs/robustness.py:smoke --workdir=/tmp/rob_smoke
  xsens --config=mlcollections_configs/robustness.py:setup=cifar10 \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/rob_c10
  xsens --config=mlcollections_configs/robustness.py:imagenet \
        --config.imagenet.data_dir=/path/to/tensorflow_datasets \
        --config.runs.vit_b16.pretrained.path=/path/to/ViT-B_16.npz \
        --config.runs.bit_m_r50x1.pretrained.path=/path/to/BiT-M-R50x1-ILSVRC2012.npz \
        --workdir=workdirs/rob_imagenet

Set-ups: `mnist5k` (default, embedded, CPU: a 4-block ViT and a narrow ResNet-18);
`cifar10` (ViT and ResNet-18 trained from scratch; GPU/TPU-sized); `imagenet` (`:imagenet`
or `:setup=imagenet`; no training: public ViT-B/16 and BiT-M-R50x1 checkpoints fine-tuned on
ImageNet, evaluated on streamed TFDS imagenet2012 validation and imagenet2012_corrupted, see
`xsens.studies.robustness_imagenet`; GPU-sized; `:imagenet,smoke` is a tiny variant for tests).
Shows: results.md with clean accuracy, mean corruption accuracy, mCE (vs the ResNet),
accuracy per corruption category, FGSM/PGD accuracy, perturbation structure (low-frequency
share, patch alignment), the worst single-layer removal and sharpness per model; plots of
accuracy vs severity and vs ε, layer-removal bars, PGD patch-energy maps, CKA heat maps and
per-layer probe accuracy.
"""

import ml_collections

from mlcollections_configs import common
from mlcollections_configs import train as train_configs
from xsens.config_utils import parse_arg
from xsens.measures import corruptions

SETUPS = ("mnist5k", "cifar10", "imagenet")


def robustness_config() -> ml_collections.ConfigDict:
  """Every `config.robustness` field with its CPU default."""
  return ml_collections.ConfigDict({
      "seed": 0,
      "num_examples": 500,          # test examples for every measurement
      "batch_size": 250,
      "patch_size": 4,              # the ViT's patch grid, for perturbation structure
      "baseline_run": "resnet18",   # mCE is relative to this run
      "corruptions": {"names": tuple(corruptions.NAMES), "severities": (1, 2, 3, 4, 5)},
      "adversarial": {"norm": "linf", "epsilons": (0.01, 0.02, 0.05, 0.1),
                      "main_epsilon": 0.05, "pgd_steps": 10, "step_size_fraction": 0.25,
                      "low_freq_cutoff": 0.25},
      "perturbations": {"relative_scale": 0.5, "num_draws": 3, "sharpness_sigma": 0.05,
                        "sharpness_examples": 500},
      "representations": {"num_examples": 500},
  })


def imagenet_config(smoke: bool = False) -> ml_collections.ConfigDict:
  """Setup `imagenet`: pretrained checkpoints on streamed ImageNet; no `train` block.

  `runs.<run>.model` names the model kind; its other fields (if set) override the ones read
  off the checkpoint (e.g. BiT's num_groups, which the `.npz` does not record).
  """
  path = lambda: ml_collections.FieldReference(None, field_type=str)
  config = ml_collections.ConfigDict()
  config.study = "robustness"
  config.imagenet = ml_collections.ConfigDict({
      "name": "imagenet2012", "split": "validation",
      "data_dir": path(),                   # None: $TFDS_DATA_DIR or ~/tensorflow_datasets
      "image_key": "image", "label_key": "label",
      "corrupted_name": "imagenet2012_corrupted", "corrupted_split": "validation",
      "corruption_source": "auto",          # auto | tfds | synthesize
      "limit": ml_collections.FieldReference(10000, field_type=int),  # None: all 50k
      "seed": 0,                            # order / subset of the validation images
      "image_size": 224,                    # model resolution (ViT posemb is resized)
      "crop_fraction": 224 / 256,           # ImageNet-C's central crop
      "normalize": "half",                  # [-1, 1], as vit_jax and big_transfer
      "batch_size": 250, "num_workers": 8,
  })
  config.robustness = rc = robustness_config()
  # Not measured in this setup (see xsens.studies.robustness_imagenet): weight noise,
  # sharpness, CKA and probes.
  del rc["perturbations"], rc["representations"]
  rc.num_examples = 500                     # adversarial and layer-removal subset
  rc.batch_size = 50
  rc.patch_size = 16                        # ViT-B/16's patch grid
  rc.baseline_run = "bit_m_r50x1"
  rc.adversarial.epsilons = (0.5 / 255, 1 / 255, 2 / 255, 4 / 255)
  rc.adversarial.main_epsilon = 2 / 255
  config.runs = ml_collections.ConfigDict({
      "vit_b16": {"model": {"name": "vit"}, "pretrained": {"path": path()}},
      "bit_m_r50x1": {"model": {"name": "bit_resnet", "num_groups": 32},
                      "pretrained": {"path": path()}}})
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


def get_config(arg=None):
  arg = parse_arg(arg, setup="mnist5k", smoke=False, imagenet=False)
  if arg.imagenet or arg.setup == "imagenet":
    return imagenet_config(arg.smoke)
  config = common.multi_run_config("robustness", arg.setup, SETUPS)
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
  return config
