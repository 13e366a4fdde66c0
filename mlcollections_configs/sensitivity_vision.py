"""The main job: token-wise sensitivity of vision models trained to matched train accuracy.

"Transformers Learn Low Sensitivity Functions" (ICLR 2025, arXiv 2403.06925), §4.

  xsens --config=mlcollections_configs/sensitivity_vision.py --workdir=workdirs/sensitivity_vision
  xsens --config=mlcollections_configs/sensitivity_vision.py:smoke --workdir=/tmp/sv_smoke
  xsens --config=mlcollections_configs/sensitivity_vision.py:setup=cifar10 \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/sv_cifar10

Variants: `seeds=N` trains every model with N training seeds (init, batch order) on the
same data and reports the mean ± s.e. over seeds beside the per-seed rows
(docs/results.md uses `seeds=3`); `smoke`: seconds, what the tests run.

Set-ups (`setup=`):
- `mnist5k` (default, embedded, < 10 min on 2 CPU cores): ViT, the small CNN, MLP(relu),
  MLP(tanh) and a narrow ResNet-18.
- `cifar10`: ResNet-18, DenseNet (densenet121 layout), ConvMixer and two ViTs (the paper's
  App. Fig. 13 set; GPU/TPU-sized), plus the ViT with shifted patch tokens and locality
  self-attention (`vit_spt_lsa`).
- `svhn`: ResNet-18 vs ViT (svhn_cropped). `fashion_mnist`: ViT, 3-layer CNN, MLP(relu),
  MLP(tanh). `mnist_binary`: ViT vs MLP on MNIST digits 3 vs 8 (the paper's pair is not
  known; 3/8 is our choice).
- `imagenet`: no training; pretrained ConvNeXt-T (timm `.safetensors`) and ViT-B/16
  (vit_jax `.npz`) on streamed TFDS imagenet2012 validation, the paper's ImageNet
  comparison (xsens.studies.sensitivity_imagenet; GPU-sized):
    xsens --config=mlcollections_configs/sensitivity_vision.py:setup=imagenet \
          --config.imagenet.data_dir=/path/to/tensorflow_datasets \
          --config.runs.convnext_t.pretrained.path=/path/to/convnext_tiny/model.safetensors \
          --config.runs.vit_b16.pretrained.path=/path/to/ViT-B_16-224.npz \
          --workdir=workdirs/sv_imagenet
The TFDS set-ups read their data from `data_dir` and never download.

Shows: results.md with, per model, params, steps, train/test accuracy and the train-set
sensitivity ± s.e. at each σ (and the official code's scattered-pixel estimate), the global
sensitivity (noise on every patch at once, App. A.2) at each σ, the sharpness (N(0, 0.05²)
weight noise; ± s.e. over draws) and its Spearman ρ with the sensitivity across the models,
each σ as noise-to-signal σ·√(p·p·C) / RMS patch norm, plus sensitivity_bar.png,
sensitivity_vs_sigma.png (token-wise solid, global dashed), sharpness_vs_sensitivity.png and
sensitivity_patches.png. `sensitivity.*` fields change only the measurement, never a run's
training fingerprint, so a finished workdir is re-measured without retraining. The paper's
claim: transformers have lower sensitivity than CNNs and MLPs at comparable accuracy.
"""

import ml_collections

from mlcollections_configs import common
from mlcollections_configs import train as train_configs
from xsens import choices
from xsens.config_utils import parse_arg
from xsens.errors import ConfigError, is_finite_number, is_int

SETUPS = ("mnist5k", "cifar10", "svhn", "fashion_mnist", "mnist_binary", "imagenet")


def _runs(**models) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
      {name: {"model": common.model_config(**m)} for name, m in models.items()})


def _paper_runs(setup: str) -> ml_collections.ConfigDict:
  vit = dict(name="vit", patch_size=4, width=192, depth=6, num_heads=6, mlp_dim=384)
  simple_vit = dict(name="vit", patch_size=4, width=256, depth=6, num_heads=8, mlp_dim=512,
                    pooling="mean", posemb="sincos")
  mlps = dict(mlp_relu=dict(name="mlp", hidden_dims=(512, 128), activation="relu"),
              mlp_tanh=dict(name="mlp", hidden_dims=(512, 128), activation="tanh"))
  if setup == "cifar10":
    return _runs(resnet18=dict(name="resnet18"), densenet=dict(name="densenet"),
                 convmixer=dict(name="convmixer", width=256, depth=8, kernel_size=3,
                                patch_size=2),
                 vit=vit, simple_vit=simple_vit,
                 # The official code's small-dataset ViT: shifted patch tokens + locality
                 # self-attention (Lee et al. 2021; xsens/models/vit.py).
                 vit_spt_lsa=dict(vit, tokenizer="spt", attention="lsa"))
  if setup == "svhn":
    return _runs(resnet18=dict(name="resnet18"), vit=vit)
  if setup == "fashion_mnist":
    return _runs(vit=dict(vit, patch_size=4, width=128, depth=4, num_heads=4, mlp_dim=256),
                 cnn=dict(name="cnn"), **mlps)
  return _runs(vit=dict(vit, patch_size=4, width=128, depth=4, num_heads=4, mlp_dim=256),
               mlp_relu=mlps["mlp_relu"])


def imagenet_config(smoke: bool = False) -> ml_collections.ConfigDict:
  """Setup `imagenet`: pretrained ConvNeXt-T and ViT-B/16 on streamed ImageNet validation, no
  training and no `train` block (xsens.studies.sensitivity_imagenet).

  `runs.<run>.model` names the model kind; its other fields (if set) override the ones read
  off the checkpoint. σ is in [0, 1] pixel units, before each model's input normalisation.
  """
  path = lambda: ml_collections.FieldReference(None, field_type=str)
  config = ml_collections.ConfigDict()
  config.study = "sensitivity_imagenet"
  config.imagenet = common.imagenet_stream_config()
  sc = config.sensitivity = ml_collections.ConfigDict()
  sc.seed = 0
  sc.patch_size = 16                        # ViT-B/16's tokens: 14 x 14 patches at 224²
  sc.sigmas = (0.05, 0.1, 0.25, 0.5)
  sc.main_sigma = 0.1
  sc.num_draws = 1
  sc.num_examples = 1000                    # the first of the seeded validation order
  sc.batch_size = 50
  sc.chunk_size = ml_collections.FieldReference(14, field_type=int)
  sc.noise_scale = "absolute"
  sc.scattered = ml_collections.ConfigDict(  # Not measured here.
      {"enabled": False, "sigma": 0.1, "num_pixels": 16, "num_draws": 5})
  sc.global_noise = ml_collections.ConfigDict({"enabled": True, "num_draws": 4})
  sc.sharpness = None                       # Not measured here (no training runs).
  sc.streams = ml_collections.FieldReference(None, field_type=int)  # batches at once
  config.runs = ml_collections.ConfigDict({
      "convnext_t": {"model": {"name": "convnext"}, "pretrained": {"path": path()}},
      "vit_b16": {"model": {"name": "vit"}, "pretrained": {"path": path()}}})
  if smoke:
    config.imagenet.image_size, config.imagenet.num_workers = 32, 2
    sc.patch_size, sc.sigmas, sc.main_sigma = 8, (0.1, 1.0), 1.0
    sc.num_examples, sc.batch_size, sc.chunk_size = 6, 4, None
    sc.global_noise.num_draws = 2
  return config


def get_config(arg=None):
  arg = parse_arg(arg, setup="mnist5k", smoke=False, seeds=1)
  if arg.setup == "imagenet":
    return imagenet_config(arg.smoke)
  config = common.multi_run_config("sensitivity_vision", arg.setup, SETUPS)
  # Training seeds per model (xsens.lab.multirun.run_ids): >1 adds a table of the mean
  # ± s.e. over seeds; the data and the measured examples stay the same.
  config.num_seeds = arg.seeds
  c = config.train

  sc = config.sensitivity = ml_collections.ConfigDict()
  sc.seed = 0
  sc.patch_size = 4
  # On mnist5k (pixels in [-1, 1]) one 4x4 patch rarely flips a label below σ=1.
  sc.sigmas = (1.0, 2.0, 4.0, 8.0)
  sc.main_sigma = 4.0
  sc.num_draws = 2
  sc.num_examples = 512
  sc.batch_size = 128
  sc.chunk_size = ml_collections.FieldReference(16, field_type=int)
  # Batches measured at once (host threads, xsens.train.streams): None = auto (one per
  # core on a single CPU device, 1 otherwise). Same numbers for any value.
  sc.streams = ml_collections.FieldReference(None, field_type=int)
  # "absolute": σ in pixels (the paper's); "token_rms": σ in units of the RMS pixel of the
  # measured examples, i.e. σ is the noise-to-signal ratio (xsens.measures.sensitivity).
  sc.noise_scale = "absolute"
  # The official code's estimator (docs/papers/sensitivity.md §2.2): 16 scattered pixels, 5 draws,
  # σ=0.1 on CIFAR-10 (paper set-ups); on mnist5k σ=0.1 never flips a label, so it uses main σ.
  sc.scattered = ml_collections.ConfigDict(
      {"enabled": True, "sigma": 4.0, "num_pixels": 16, "num_draws": 5})
  # Global noise (App. A.2): every patch noised at once, same examples and σ grid.
  sc.global_noise = ml_collections.ConfigDict({"enabled": True, "num_draws": 8})
  # Sharpness (the official `check_sharpness`, docs/papers/sensitivity.md §4): N(0, 0.05²) on every
  # parameter.
  sc.sharpness = ml_collections.ConfigDict({"enabled": True, "sigma": 0.05, "num_draws": 5})

  if arg.setup == "mnist5k":
    c.data.name = "mnist5k"
    c.total_steps = 1000
    c.batch_size = 128
    config.runs = _runs(
        vit=train_configs.MODEL_PRESETS["vit"],
        cnn=dict(name="cnn", features=(16, 32, 32), dense_dim=64),
        mlp_relu=dict(name="mlp", hidden_dims=(512, 128), activation="relu"),
        mlp_tanh=dict(name="mlp", hidden_dims=(512, 128), activation="tanh"),
        resnet18=dict(name="resnet18", width_multiplier=0.125))
  else:
    # Paper-sized set-ups (GPU/TPU). Adam 1e-3 with the code's StepLR(8 epochs, γ 0.5);
    # the official lr 0.01 was never applied (its optimizer never stepped,
    # docs/papers/sensitivity.md §8).
    c.data.name = {"cifar10": "cifar10", "svhn": "svhn_cropped",
                   "fashion_mnist": "fashion_mnist", "mnist_binary": "mnist"}[arg.setup]
    if arg.setup == "mnist_binary":
      c.data.classes = (3, 8)
    c.batch_size = 128
    c.total_steps = None
    c.total_epochs = 50.0
    c.optimizer.schedule = "step"
    c.optimizer.step_every = 8 * (50000 // 128)
    c.eval_every = 1000
    c.eval_train_examples = 10000
    c.checkpoint_every = 2000
    sc.sigmas = (0.05, 0.1, 0.25, 0.5, 1.0)
    sc.main_sigma = 0.1
    sc.scattered.sigma = 0.1
    sc.num_draws = 4
    sc.num_examples = 2048
    sc.batch_size = 256
    config.runs = _paper_runs(arg.setup)

  if arg.smoke:
    train_configs.smoke(c)
    c.target_train_accuracy = None
    c.eval_train_examples = None
    # Patches that tile the images (28 or 32 pixels): the ViT's tokens are the measured ones.
    patch = 7 if arg.setup in ("mnist5k", "fashion_mnist", "mnist_binary") else 8
    for name, run in config.runs.items():
      run.model.update(train_configs.SMOKE_PRESETS[run.model.name])
      if run.model.name in ("vit", "convmixer"):
        run.model.patch_size = patch
    sc.sigmas = (1.0, 4.0)
    sc.main_sigma = 4.0
    sc.num_draws = 1
    sc.num_examples = 40
    sc.batch_size = 32
    sc.patch_size = patch
    sc.scattered.num_draws = 2
    sc.global_noise.num_draws = 2
    sc.sharpness.num_draws = 2
  return config


def validate_sensitivity(sc) -> None:
  """ConfigError naming `sensitivity.<field>` for a bad field of `config.sensitivity`; its
  `patch_size` is checked against the runs' images (`xsens.lab.sensitivity`)."""
  if not sc.sigmas or not all(is_finite_number(s) and s >= 0 for s in sc.sigmas):
    raise ConfigError("sensitivity.sigmas", f"must be a non-empty list of finite σ >= 0, got "
                      f"{list(sc.sigmas)}")
  if sc.main_sigma not in sc.sigmas:
    raise ConfigError("sensitivity.main_sigma",
                      f"{sc.main_sigma} must be one of sensitivity.sigmas {list(sc.sigmas)}")
  for field in ("num_draws", "num_examples", "batch_size"):
    if not (is_int(sc[field]) and sc[field] > 0):
      raise ConfigError(f"sensitivity.{field}", f"must be an int > 0, got {sc[field]!r}")
  if sc.chunk_size is not None and not (is_int(sc.chunk_size) and sc.chunk_size > 0):
    raise ConfigError("sensitivity.chunk_size", f"must be an int > 0 or None, got "
                      f"{sc.chunk_size!r}")
  choices.check_streams("sensitivity.streams", sc.streams)
  noise_scale = sc.noise_scale
  if noise_scale not in choices.NOISE_SCALES:
    raise ConfigError("sensitivity.noise_scale", f"unknown value {noise_scale!r}; allowed: "
                      f"{', '.join(choices.NOISE_SCALES)}")
  validate_scattered_config(sc.scattered)
  validate_global_config(sc.global_noise)
  validate_sharpness_config(sc.sharpness)


def _check_enabled(block, path: str) -> None:
  if not isinstance(block.enabled, bool):
    raise ConfigError(f"{path}.enabled", f"must be True or False, got {block.enabled!r}")


def validate_global_config(block) -> None:
  """Checks `config.sensitivity.global_noise` (App. A.2; None: not measured)."""
  if block is None:
    return
  path = "sensitivity.global_noise"
  _check_enabled(block, path)
  if not (is_int(block.num_draws) and block.num_draws > 0):
    raise ConfigError(f"{path}.num_draws", f"must be an int > 0 (noise draws per example "
                      f"and σ), got {block.num_draws!r}")


def validate_sharpness_config(block) -> None:
  """Checks `config.sensitivity.sharpness` (docs/papers/sensitivity.md §4; None: not measured)."""
  if block is None:
    return
  path = "sensitivity.sharpness"
  _check_enabled(block, path)
  if not (is_finite_number(block.sigma) and block.sigma >= 0):
    raise ConfigError(f"{path}.sigma", f"must be a finite σ >= 0 (absolute weight noise), "
                      f"got {block.sigma!r}")
  if not (is_int(block.num_draws) and block.num_draws > 1):
    raise ConfigError(f"{path}.num_draws", f"must be an int > 1 (the standard error is "
                      f"over the draws), got {block.num_draws!r}")


def validate_scattered_config(scattered) -> None:
  """Checks `config.sensitivity.scattered` (the official code's estimator,
  docs/papers/sensitivity.md §2.2)."""
  path = "sensitivity.scattered"
  if not isinstance(scattered.enabled, bool):
    raise ConfigError(f"{path}.enabled", f"must be True or False, got {scattered.enabled!r}")
  if not (is_finite_number(scattered.sigma) and scattered.sigma >= 0):
    raise ConfigError(f"{path}.sigma", f"must be a finite σ >= 0, got {scattered.sigma!r}")
  if not (is_int(scattered.num_draws) and scattered.num_draws > 0):
    raise ConfigError(f"{path}.num_draws", f"must be an int > 0, got {scattered.num_draws!r}")
  if not (is_int(scattered.num_pixels) and scattered.num_pixels > 0):
    raise ConfigError(f"{path}.num_pixels", f"must be an int > 0 (positions drawn with "
                      f"replacement per mask), got {scattered.num_pixels!r}")


def validate(config) -> None:
  """ConfigError for a bad field of `config.sensitivity` and, in the ImageNet set-up, of
  `config.imagenet` and the runs. The patch size against the runs' images, the runs'
  models and data and the checkpoint files are checked by the study."""
  sc = config.sensitivity
  if "imagenet" in config:
    if not config.runs:
      raise ConfigError("runs", "needs at least one run (a pretrained checkpoint)")
    size = config.imagenet.image_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
      raise ConfigError("imagenet.image_size", f"must be a positive int, got {size!r}")
  validate_sensitivity(sc)
  if "imagenet" in config and sc.noise_scale != "absolute":
    raise ConfigError("sensitivity.noise_scale", f"the imagenet set-up takes σ in [0, 1] "
                      f"pixel units ('absolute'; its noise-to-signal ratio is reported); "
                      f"got {sc.noise_scale!r}")
