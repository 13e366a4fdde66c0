"""Defaults shared by every config: the training block of one model."""

import ml_collections

from xsens import choices
from xsens.data.config import default_data_config
from xsens.model_defaults import MODEL_DEFAULTS


def model_config(name: str, **overrides) -> ml_collections.ConfigDict:
  """`{"name": name, **every field of that model with its default, **overrides}`.

  Listing every field lets `--config....model.FIELD=VALUE` override any of them.
  """
  fields = dict(MODEL_DEFAULTS[name])
  for key in overrides:
    if key not in fields:
      raise ValueError(f"unknown field {key!r} for model {name!r}; allowed: {sorted(fields)}")
  fields.update(overrides)
  fields = {k: _overridable(v) for k, v in fields.items()}
  return ml_collections.ConfigDict({"name": name, **fields})


def optimizer_config(name: str, learning_rate: float, **overrides) -> ml_collections.ConfigDict:
  """A `config.optimizer` block (`xsens.train.optim`): `name`, `learning_rate` and every
  other field at its default (`xsens.choices.OPTIMIZER_DEFAULTS`), then `overrides`."""
  for key in overrides:
    if key not in choices.OPTIMIZER_DEFAULTS:
      raise ValueError(f"unknown optimizer field {key!r}; allowed: "
                       f"{sorted(choices.OPTIMIZER_DEFAULTS)}")
  fields = {**choices.OPTIMIZER_DEFAULTS, **overrides}
  block = {"name": name, "learning_rate": learning_rate}
  for key, value in fields.items():
    block[key] = (ml_collections.FieldReference(None, field_type=_OPTIONAL_TYPES[key])
                  if value is None else value)
  return ml_collections.ConfigDict(block)


_OPTIONAL_TYPES = {"decay_steps": int, "grad_clip_norm": float}


def _overridable(value):
  """Sequences as tuples (ml_collections overrides tuples, not lists: `--config...=(1,2)`);
  None as an int FieldReference (e.g. sizes)."""
  if value is None:
    return ml_collections.FieldReference(None, field_type=int)
  return tuple(value) if isinstance(value, list) else value


def imagenet_stream_config(**fields) -> ml_collections.ConfigDict:
  """The `config.imagenet` block of the no-training ImageNet set-ups: where the streamed
  validation split is (TFDS name, split, `data_dir`: None means $TFDS_DATA_DIR or
  ~/tensorflow_datasets; the feature keys), which seeded subset, and the 224² central
  crop; `fields` adds or overrides the set-up's own."""
  block = {"name": "imagenet2012", "split": "validation",
           "data_dir": ml_collections.FieldReference(None, field_type=str),
           "image_key": "image", "label_key": "label",
           "seed": 0,                      # order / subset of the validation images
           "image_size": 224, "crop_fraction": 224 / 256, "num_workers": 8}
  block.update(fields)
  return ml_collections.ConfigDict(block)


def train_config() -> ml_collections.ConfigDict:
  """Every field `xsens.train.trainer.train_and_evaluate` reads, with defaults."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  # One source of randomness each (None: use `seed`): parameter init, mini-batch order, and
  # the step key (augmentation, dropout, regulariser noise). `seed` also fixes the data.
  c.init_seed = ml_collections.FieldReference(None, field_type=int)
  c.order_seed = ml_collections.FieldReference(None, field_type=int)
  c.augment_seed = ml_collections.FieldReference(None, field_type=int)
  c.data = default_data_config()
  c.model = model_config("vit")
  c.loss = "cross_entropy"
  # Gaussian pixel-noise augmentation (off at std 0).
  c.augment = ml_collections.ConfigDict({"gaussian_std": 0.0, "gaussian_prob": 1.0})
  # `optimizer.decay_steps` set, the schedule does not depend on the run's length, so a
  # finished run can be extended.
  c.optimizer = optimizer_config("adam", 1e-3)
  # Start from public weights: a vit_jax (ViT) or big_transfer (bit_resnet) .npz file.
  c.pretrained = ml_collections.ConfigDict({
      "path": ml_collections.FieldReference(None, field_type=str), "reinit_head": True})
  c.batch_size = 128
  # Gradient accumulation: each step's batch in `accum_steps` micro-batches (1: one pass).
  c.accum_steps = 1
  # Parameter sharding (xsens/train/sharding.py): FSDP splits every state leaf of at least
  # `min_size` elements over the `data` axis; `model_axis_size` > 1 makes the mesh
  # (data, model). The defaults replicate the state on a 1-D mesh.
  c.sharding = ml_collections.ConfigDict({"fsdp": False, "min_size": 2 ** 20,
                                          "model_axis_size": 1})
  # Mixup of each training batch (xsens/train/losses.py `mixup`): λ ~ Beta(alpha, alpha);
  # 0 is off. Needs the cross_entropy loss and float inputs.
  c.mixup = ml_collections.ConfigDict({"alpha": 0.0})
  c.total_steps = ml_collections.FieldReference(1000, field_type=int)
  c.total_epochs = ml_collections.FieldReference(None, field_type=float)
  c.target_train_accuracy = ml_collections.FieldReference(None, field_type=float)
  c.eval_every = 200
  c.eval_batch_size = 500
  c.eval_train_examples = ml_collections.FieldReference(None, field_type=int)
  c.log_every = 50
  c.checkpoint_every = 500
  c.keep_checkpoints = 2
  c.progress = True
  return c


def multi_run_config(study: str, setup: str, setups, *,
                     target_train_accuracy: float | None = 0.99) -> ml_collections.ConfigDict:
  """The shell of a multi-run study: `config.study` and a shared `config.train` whose model
  each run names. By default every run trains to a matched 0.99 train accuracy (checked
  every 100 steps on 2000 random training examples); `target_train_accuracy=None` keeps
  `train_config()`'s fixed-length training. Refuses a `setup` not in `setups`."""
  if setup not in setups:
    raise ValueError(f"unknown setup {setup!r}; allowed: {', '.join(setups)}")
  config = ml_collections.ConfigDict()
  config.study = study
  config.train = train_config()
  config.train.model = ml_collections.ConfigDict()  # Each run names its model.
  if target_train_accuracy is not None:
    config.train.target_train_accuracy = target_train_accuracy
    config.train.eval_every = 100
    config.train.eval_train_examples = 2000
  return config


def distill_config(alpha: float = 0.5, temperature: float = 4.0, **overrides
                   ) -> ml_collections.ConfigDict:
  """A `config.distill` block (see `xsens.train.distill`): add it to a training block to
  distil from a teacher, e.g. `teacher_workdir=<a finished xsens run>`."""
  c = ml_collections.ConfigDict({
      "alpha": alpha, "temperature": temperature,
      "teacher_workdir": ml_collections.FieldReference(None, field_type=str),
      "teacher_logits": ml_collections.FieldReference(None, field_type=str),
      "teacher_mode": "precomputed",
      "per_class_alpha": ml_collections.FieldReference(None, field_type=tuple),
      "margin": ml_collections.FieldReference(None, field_type=tuple)})
  c.update({k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()})
  return c


def codistill_config(beta: float = 0.5, peer_seed_offset: int = 1000,
                     burn_in_steps: int = 0) -> ml_collections.ConfigDict:
  """A `config.codistill` block for `xsens.train.codistill` (Anil et al. 2018): model b is
  initialised from init_seed + peer_seed_offset."""
  return ml_collections.ConfigDict({"beta": beta, "peer_seed_offset": peer_seed_offset,
                                    "burn_in_steps": burn_in_steps})


def cifar_resnet_recipe(c: ml_collections.ConfigDict, total_epochs: float) -> None:
  """Sets the standard CIFAR ResNet training block on `c` in place (GPU-sized; the model
  is the caller's): SGD + momentum 0.1, weight decay 5e-4, cosine with 500 warm-up steps,
  batch 128, standardised inputs, eval and checkpoint every 2000 steps."""
  c.total_steps = None
  c.total_epochs = float(total_epochs)
  c.batch_size = 128
  c.data.normalize = "standardize"
  c.optimizer.name = "momentum"
  c.optimizer.learning_rate = 0.1
  c.optimizer.weight_decay = 5e-4
  c.optimizer.schedule = "cosine"
  c.optimizer.warmup_steps = 500
  c.eval_every = 2000
  c.checkpoint_every = 2000
