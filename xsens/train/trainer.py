"""The one trainer: `train_and_evaluate(config, workdir)`.

Data-parallel over all devices (`jax.sharding`), jitted step with donated state and a
stateless step key (`fold_in(key, step)`, as in big_vision's train.py), orbax checkpoints
that resume automatically from `workdir`, metrics to JSON lines and TensorBoard, an
optional stop at a target train accuracy, and a hard stop on a non-finite loss that keeps
the last good checkpoint.

Every bad config field is refused by `validate_config` / `build_experiment` before any
compile and before anything is written to `workdir`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from xsens import choices
from xsens import model_defaults
from xsens import models as models_lib
from xsens import paths
from xsens.data import pipeline, streaming, train_stream
from xsens.errors import ConfigError, is_finite_number, require
from xsens.train import distill as distill_lib
from xsens.train import evaluators, interventions, legacy_fields, loop, losses, objectives, optim
from xsens.train import sharding
from xsens.train.workdir import MAY_CHANGE_ON_RESUME, Workdir

SUMMARY_FILE = "train_summary.json"


@dataclasses.dataclass
class Experiment:
  """Everything a run needs, built and validated before any compile."""
  config: Any
  train: pipeline.Split
  test: pipeline.Split
  model: nn.Module
  tx: optax.GradientTransformation
  loss_fn: Callable
  total_steps: int
  distill: distill_lib.DistillSetup | None = None  # From config.distill, if set.
  terms: list = dataclasses.field(default_factory=list)       # objectives.Term
  transforms: list = dataclasses.field(default_factory=list)  # objectives.Transform
  evaluators: list = dataclasses.field(default_factory=list)  # evaluators.Evaluator
  # Streaming (`data.stream`): `train` is a `train_stream.TrainStream`, `test` and this (the
  # train split with the evaluation crop) are `streaming.Stream`s.
  train_eval: Any = None


@dataclasses.dataclass
class TrainResult:
  """A finished (or resumed-and-finished) run."""
  model: nn.Module
  variables: dict            # {"params": ..., "batch_stats": ...?}, replicated (FSDP: sharded).
  train: pipeline.Split
  test: pipeline.Split
  summary: dict              # steps, stop_reason, train/test accuracy and loss, wall_s.
  # The final states of the stateful objective terms ({name: pytree}, host arrays; e.g.
  # the DRO prior π of `xsens.train.dro`), {} when no term keeps state.
  objective_state: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    # One object per run, so `jax.jit(measure, static_argnums=0)(res.apply_fn, ...)` and
    # closures over it compile once, however often they are called.
    self.apply_fn = eval_apply_fn(self.model)

  def predict_fn(self) -> Callable[[jax.Array], jax.Array]:
    """`inputs -> logits [B,K]` in eval mode, closed over the variables (a new closure per
    call: prefer `apply_fn(variables, inputs)` in jitted code)."""
    apply_fn, variables = self.apply_fn, self.variables
    return lambda x: apply_fn(variables, x)


def eval_apply_fn(model: nn.Module) -> Callable[[dict, jax.Array], jax.Array]:
  """`apply_fn(variables, inputs) -> logits` of `model` in eval mode (train=False)."""
  return functools.partial(model.apply, train=False)


def validate_config(config, num_devices: int | None = None) -> None:
  """Cheap checks of the training fields (no data read, no compile)."""
  legacy_fields.refuse_legacy_fields(config)
  require(config.batch_size > 0, "batch_size", f"must be > 0, got {config.batch_size}")
  n_dev = jax.device_count() if num_devices is None else num_devices
  require(config.batch_size % n_dev == 0, "batch_size",
           f"{config.batch_size} is not divisible by the device count {n_dev}; "
           f"use a multiple of {n_dev}")
  validate_scaling_config(config, n_dev)
  validate_mixup_config(config)
  steps, epochs = config.get("total_steps"), config.get("total_epochs")
  require((steps is None) != (epochs is None), "total_steps",
           "set exactly one of total_steps and total_epochs")
  if steps is not None:
    require(steps > 0, "total_steps", f"must be > 0, got {steps}")
  else:
    require(epochs > 0, "total_epochs", f"must be > 0, got {epochs}")
  for field in ("eval_every", "log_every", "checkpoint_every"):
    require(config[field] >= 0, field, f"must be >= 0 (0: only at the end), got {config[field]}")
  require(config.keep_checkpoints >= 1, "keep_checkpoints",
           f"must be >= 1, got {config.keep_checkpoints}")
  require(config.eval_batch_size > 0, "eval_batch_size",
           f"must be > 0, got {config.eval_batch_size}")
  target = config.get("target_train_accuracy")
  require(target is None or 0 < target <= 1, "target_train_accuracy",
           f"must be in (0, 1] or None, got {target}")
  losses.get_loss(config.loss)
  for field in SEED_FIELDS:
    value = config.get(field)
    require(value is None or (isinstance(value, int) and not isinstance(value, bool)
                               and value >= 0), field,
             f"must be None (use config.seed) or an int >= 0, got {value!r}")
  require(config.model.name in models_lib.MODELS, "model.name",
           f"unknown model {config.model.name!r}; allowed: {', '.join(sorted(models_lib.MODELS))}")
  streaming.validate_data_config(config.data)


def _is_int(value) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def scaling_options(config) -> dict[str, Any]:
  """`accum_steps` and the `sharding` block with their defaults: a config without them
  reads as one full-batch step, replicated state."""
  block = dict(SHARDING_DEFAULTS, **(config.get("sharding") or {}))
  return {"accum_steps": config.get("accum_steps", 1), **block}


# `config.sharding`: FSDP over the `data` axis of a (data, model) mesh (see sharding.py).
SHARDING_DEFAULTS = {"fsdp": False, "min_size": 2 ** 20, "model_axis_size": 1}


def validate_scaling_config(config, n_dev: int) -> None:
  """Checks `accum_steps` and `config.sharding` against the batch and the device count."""
  opts = scaling_options(config)
  k = opts["accum_steps"]
  require(_is_int(k) and k >= 1, "accum_steps", f"must be an int >= 1, got {k!r}")
  require(config.batch_size % (k * n_dev) == 0, "accum_steps",
           f"{k} micro-batches of a batch_size {config.batch_size} over {n_dev} devices: "
           f"batch_size must be a multiple of accum_steps × devices = {k * n_dev}")
  extra = sorted(set(config.get("sharding") or {}) - set(SHARDING_DEFAULTS))
  require(not extra, f"sharding.{extra[0] if extra else ''}",
           f"unknown field; allowed: {', '.join(SHARDING_DEFAULTS)}")
  require(isinstance(opts["fsdp"], bool), "sharding.fsdp",
           f"must be True or False, got {opts['fsdp']!r}")
  require(_is_int(opts["min_size"]) and opts["min_size"] >= 0, "sharding.min_size",
           f"must be an int >= 0 (elements), got {opts['min_size']!r}")
  m = opts["model_axis_size"]
  require(_is_int(m) and m >= 1 and n_dev % m == 0, "sharding.model_axis_size",
           f"must be an int >= 1 dividing the device count {n_dev}, got {m!r}")


# `config.mixup`: mixup of the training batches (`losses.mixup`); alpha 0 (the default) is
# off, as is a config without the block.
MIXUP_DEFAULTS = {"alpha": 0.0}


def mixup_alpha(config) -> float:
  """`config.mixup.alpha` (0.0, off, when the block is absent)."""
  return float(dict(MIXUP_DEFAULTS, **(config.get("mixup") or {}))["alpha"])


def validate_mixup_config(config) -> None:
  """Checks the fields of `config.mixup` (no data read)."""
  block = config.get("mixup") or {}
  extra = sorted(set(block) - set(MIXUP_DEFAULTS))
  require(not extra, f"mixup.{extra[0] if extra else ''}",
          f"unknown field; allowed: {', '.join(MIXUP_DEFAULTS)}")
  alpha = dict(MIXUP_DEFAULTS, **block)["alpha"]
  require(is_finite_number(alpha) and alpha >= 0, "mixup.alpha",
          f"must be a finite number >= 0 (0: no mixup), got {alpha!r}")


def check_mixup_fits(config, terms: Sequence[objectives.Term], input_dtype) -> None:
  """Refuses mixup where it has no meaning: a term whose kind refuses it (a loss without
  soft labels, distillation; `objectives.Kind.mixup_error`), or inputs that are not floats
  (token ids, raw uint8 pixels)."""
  if mixup_alpha(config) == 0:
    return
  for t in terms:
    error = objectives.KINDS[t.kind].mixup_error
    require(error is None, "mixup.alpha", error)
  require(np.issubdtype(np.dtype(input_dtype), np.floating), "mixup.alpha",
          f"mixup mixes float inputs, but this data gives {np.dtype(input_dtype).name} "
          "(token ids or data.stream.normalize='uint8'); set mixup.alpha=0")


# Seeds of one source of randomness each; None (the default) means `config.seed`.
# `config.seed` alone also seeds the data subsampling and split order
# (`pipeline.load_split`), which these never change.
SEED_FIELDS = ("init_seed", "order_seed", "augment_seed")


def run_seeds(config) -> dict[str, int]:
  """{"init_seed": parameter init, "order_seed": mini-batch order, "augment_seed": the
  step key (augmentation, dropout, regulariser noise)}, each defaulting to `config.seed`."""
  return {f: int(config.seed if config.get(f) is None else config.get(f))
          for f in SEED_FIELDS}


def resolve_total_steps(config, num_train: int) -> int:
  """Training length in steps from `total_steps` or `total_epochs` (big_vision style)."""
  if config.get("total_steps") is not None:
    return int(config.total_steps)
  per_epoch = pipeline.num_steps_per_epoch(num_train, config.batch_size)
  return max(1, int(round(config.total_epochs * per_epoch)))


def model_kwargs(model_config) -> dict:
  """The model's constructor fields: everything in `config.model` except `name`."""
  return {k: v for k, v in model_config.items() if k != "name"}


def build_experiment(config, num_devices: int | None = None, *,
                     check_teacher: bool = True) -> Experiment:
  """Validates `config`, loads the data and builds model and optimizer. Compiles nothing.

  `check_teacher=False` skips the checks of `config.distill`'s teacher files (for a study
  that validates its students before it trains their teacher).
  """
  validate_config(config, num_devices)
  train_eval = None
  if streaming.is_streaming(config.data):
    train, test, train_eval = open_streams(config, num_devices)
  else:
    train = pipeline.load_split(config.data, config.data.train_split, seed=config.seed)
    test = pipeline.load_split(config.data, config.data.test_split, seed=config.seed)
  require(config.batch_size <= len(train), "batch_size",
           f"{config.batch_size} exceeds the {len(train)} training examples")
  model = models_lib.get_model(config.model.name, train.num_classes, train.input_shape,
                               **model_kwargs(config.model))
  if train.vocab_size is not None:  # Text: token ids must index the embedding table.
    require(getattr(model, "vocab_size", 0) >= train.vocab_size, "model.vocab_size",
             f"{getattr(model, 'vocab_size', None)} is smaller than the data's vocabulary "
             f"({train.vocab_size} token ids); use model.vocab_size >= {train.vocab_size}")
  if "augment" in config:
    interventions.validate_augment_config(config)
  _validate_pretrained(config)
  total_steps = resolve_total_steps(config, len(train))
  tx = optim.make_optimizer(config.optimizer, total_steps)
  setup = None
  if config.get("distill") is not None:
    setup = distill_lib.validate_distill_config(
        config.distill, train.num_classes, train.input_shape, config.data, len(train),
        check_teacher=check_teacher)
  loss_fn = losses.get_loss(config.loss)
  class_counts = (None if train_eval is not None else
                  np.bincount(train.labels, minlength=train.num_classes))
  terms = objectives.terms_from_config(config, train.input_shape, loss_fn,
                                       setup.spec if setup is not None else None,
                                       class_counts=class_counts)
  check_mixup_fits(config, terms, _input_dtype(train))
  evals = evaluators.build(
      default_evals(config), apply_fn=eval_apply_fn(model), loss_fn=loss_fn,
      default_every=config.eval_every, num_classes=train.num_classes,
      train_class_counts=class_counts,
      load_peer=functools.partial(load_peer, config.data, train.num_classes,
                                  train.input_shape))
  if config.get("target_train_accuracy") is not None:
    require(any(e.name == "train" and e.kind == "classification" and e.split == "train"
                for e in evals), "target_train_accuracy",
            "needs a classification evaluator named 'train' on the train split in "
            "config.evals")
  return Experiment(config, train, test, model, tx, loss_fn, total_steps, setup, terms,
                    objectives.transforms_from_config(config), evals, train_eval)


def open_streams(config, num_devices: int | None = None):
  """(train `TrainStream`, test `Stream`, train-split `Stream`) of a `data.stream` config.

  The training stream's order is seeded by `order_seed`, its augmentations by `order_seed`
  and `augment_seed` (`run_seeds`); evaluation streams read in stored order, in batches of
  `eval_batch_size` rounded up to the device count.
  """
  seeds = run_seeds(config)
  for field in ("distill", "codistill"):
    require(config.get(field) is None, field,
            "is not available with a streamed dataset (data.stream); remove one of them")
  eval_bs = sharding.round_to_devices(config.eval_batch_size,
                      jax.device_count() if num_devices is None else num_devices)
  train = train_stream.open_training_stream(config.data, batch_size=config.batch_size,
                                            order_seed=seeds["order_seed"],
                                            augment_seed=seeds["augment_seed"])
  require(train.num_classes is not None, "data.label_key",
          f"{config.data.label_key!r} of {config.data.name!r} is not a ClassLabel feature")
  test = streaming.open_eval_stream(config.data, "test", batch_size=eval_bs)
  train_eval = streaming.open_eval_stream(config.data, "train", batch_size=eval_bs)
  return train, test, train_eval


def load_peer(data_config, num_classes: int, input_shape, workdir: str, flag: str):
  """`(apply_fn, variables)` of the finished run in `workdir` (latest checkpoint, host
  arrays), checked against this run's data and classes; ConfigError naming `flag`."""
  model = distill_lib.build_teacher(workdir, num_classes, input_shape, data_config, flag)
  variables = distill_lib.load_teacher_variables(workdir, model, input_shape, flag)
  return eval_apply_fn(model), jax.device_get(variables)


def _validate_pretrained(config) -> None:
  """Refuses a `pretrained.path` for a model without a loader, or one that is not a file."""
  path = config.get("pretrained", {}).get("path")
  if path is None:
    return
  formats = models_lib.pretrained_formats()
  if config.model.name not in formats:
    raise ConfigError("pretrained.path", f"pretrained weights load into models "
                      f"{', '.join(formats)}, not {config.model.name!r}")
  if not paths.isfile(path if paths.is_remote(path) else os.path.expanduser(path)):
    fmt = formats[config.model.name]
    raise ConfigError("pretrained.path", f"no checkpoint at {path!r} (a {fmt.name} "
                      f"{fmt.suffix} file, local or remote such as gs://bucket/file)")


def load_pretrained(config, model, image_shape, key) -> dict | None:
  """Params from `config.pretrained.path` (the model entry's release, e.g. a vit_jax or
  big_transfer `.npz`), or None.

  The head is re-initialised when `pretrained.reinit_head` (fine-tuning to new classes).
  """
  path = config.get("pretrained", {}).get("path")
  if path is None:
    return None
  entry = models_lib.get_entry(config.model.name)
  try:
    return entry.load_pretrained(path, model, image_shape,
                                 reinit_head=config.pretrained.reinit_head, key=key)["params"]
  except models_lib.pretrained.CheckpointError as e:
    raise ConfigError("pretrained.path", f"{path!r} does not fit the model: "
                      f"{models_lib.pretrained.one_line(e)}") from None
  except (OSError, ValueError) as e:   # Not an .npz (numpy: "pickled data", "not a zip").
    raise ConfigError("pretrained.path", f"{path!r} cannot be read as a checkpoint "
                      f"{entry.pretrained.suffix}: "
                      f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


# ----------------------------------------------------------------------------- jitted parts


def init_state(model: nn.Module, tx, input_shape, key: jax.Array, dtype=jnp.float32,
               terms: Sequence[objectives.Term] = ()) -> dict:
  """The train state pytree `{"params", "batch_stats", "opt", "step"[, "objective"]}`.

  `input_shape` and `dtype` are those of one input: (H, W, C) float32 images, or (L,) int32
  token ids for the text models. "objective" holds the states of stateful `terms`.
  """
  dummy = jnp.zeros((1, *input_shape), dtype)
  variables = model.init({"params": key, "dropout": key}, dummy, train=False)
  params = variables["params"]
  state = {
      "params": params,
      "batch_stats": variables.get("batch_stats", {}),
      "opt": tx.init(params),
      "step": jnp.zeros((), jnp.int32),
  }
  term_states = objectives.init_states(list(terms))
  if term_states:
    state["objective"] = term_states
  return state


def eval_variables(state: dict) -> dict:
  """Model variables (params and BatchNorm statistics, if any) from a train state."""
  variables = {"params": state["params"]}
  if state["batch_stats"]:
    variables["batch_stats"] = state["batch_stats"]
  return variables


def make_train_step(model: nn.Module, tx, terms: Sequence[objectives.Term],
                    transforms: Sequence[objectives.Transform] = (),
                    teacher_model: nn.Module | None = None, accum_steps: int = 1,
                    mesh: jax.sharding.Mesh | None = None, input_dtype=None,
                    mixup_alpha: float = 0.0, num_classes: int | None = None) -> Callable:
  """`(state, batch, key[, teacher_variables]) -> (state, metrics)`; metrics are batch means.

  The loss is the weighted sum of `terms` (`xsens.train.objectives`) on the inputs after
  `transforms`; stateful terms read and write `state["objective"]`. With `teacher_model`
  (distillation in the step) the teacher's eval-mode logits on the same inputs, under
  stop_gradient, are `batch["teacher_logits"]`. Metrics: loss, accuracy, grad_norm,
  param_norm, and each term's value when there is more than one term.

  Precision: params, gradients and optimizer state stay float32 whatever the model's
  compute dtype (`model.dtype`, cast inside the model); the inputs are cast to
  `input_dtype` (that of the data the state was initialised with; None: as given) and the
  logits to float32, so every loss term is computed in float32.

  `accum_steps` k > 1: gradient accumulation. The transforms and the teacher run on the
  whole batch [B, ...]; it is then split into k micro-batches [k, B/k, ...] (micro-batch j
  holds examples j, j+k, ..., so each keeps the batch's device split over `mesh`), and a
  `lax.scan` sums their gradients and metrics; the mean gradient makes one optimizer
  update. Micro-batch j draws dropout and term noise from `fold_in(key, j)` of the step's
  keys. BatchNorm normalises with each micro-batch's statistics and its running averages,
  like the states of stateful terms, are threaded through the micro-batches in order (k
  updates per step, as k small steps would make). Without BatchNorm, dropout and stateful
  terms the step equals the full-batch step up to float rounding.

  `mixup_alpha` > 0 (`config.mixup.alpha`): the whole (global) batch is mixed by
  `losses.mixup` with the key fold_in(step key, 3), before the transforms, the teacher and
  the micro-batch split; `num_classes` K sizes the soft labels `batch["soft_label"]` [B, K]
  the loss terms read, and the accuracy is measured against the dominant original label.
  """
  terms, transforms = list(terms), list(transforms)

  def micro_grads(params, batch_stats, term_states, batch, dropout_key, term_key):
    """Loss, logits, new batch_stats, term aux and states, and grads on one (micro-)batch."""
    has_bn = bool(batch_stats)

    def objective(params):
      def apply(p, x):  # BatchNorm statistics come from the clean pass.
        variables = {"params": p}
        if has_bn:
          variables["batch_stats"] = batch_stats
        logits, new_vars = model.apply(variables, x, train=True,
                                       rngs={"dropout": dropout_key}, mutable=["batch_stats"])
        return logits.astype(jnp.float32), new_vars
      logits, new_vars = apply(params, batch["image"])
      loss, aux, new_states = objectives.total_loss(
          terms, lambda p, x: apply(p, x)[0], params, dict(batch, logits=logits), term_key,
          term_states)
      return loss, (logits, new_vars, aux, new_states)

    (loss, (logits, new_vars, aux, new_states)), grads = jax.value_and_grad(
        objective, has_aux=True)(params)
    new_stats = new_vars.get("batch_stats", {}) if has_bn else {}
    return loss, logits, new_stats, aux, new_states, grads

  def accumulate(params, batch_stats, term_states, batch, dropout_key, term_key):
    """`micro_grads` summed over `accum_steps` micro-batches (means of the metrics)."""
    micro = jax.tree.map(functools.partial(split_micro_batches, k=accum_steps, mesh=mesh),
                         batch)

    def body(carry, xs):
      grad_sum, stats, states = carry
      j, mb = xs
      loss, logits, stats, aux, states, grads = micro_grads(
          params, stats, states, mb, jax.random.fold_in(dropout_key, j),
          jax.random.fold_in(term_key, j))
      out = dict(aux, loss=loss, accuracy=jnp.mean(jnp.argmax(logits, -1) == mb["label"]))
      return (jax.tree.map(jnp.add, grad_sum, grads), stats, states), out

    init = (jax.tree.map(jnp.zeros_like, params), batch_stats, term_states)
    (grad_sum, stats, states), outs = jax.lax.scan(
        body, init, (jnp.arange(accum_steps), micro))
    grads = jax.tree.map(lambda g: g / accum_steps, grad_sum)
    means = jax.tree.map(lambda m: jnp.mean(m, 0), outs)
    loss, accuracy = means.pop("loss"), means.pop("accuracy")
    return loss, accuracy, stats, means, states, grads

  def train_step(state, batch, key, teacher_variables=None):
    step_key = jax.random.fold_in(key, state["step"])
    dropout_key, transform_key, term_key = (jax.random.fold_in(step_key, i) for i in range(3))
    inputs = batch["image"] if input_dtype is None else batch["image"].astype(input_dtype)
    if mixup_alpha > 0:  # Its own key: the other keys stay those of a run without mixup.
      inputs, soft_label, label = losses.mixup(jax.random.fold_in(step_key, 3), inputs,
                                               batch["label"], num_classes, mixup_alpha)
      batch = dict(batch, label=label, soft_label=soft_label)
    inputs = objectives.apply_transforms(transforms, inputs, transform_key)
    batch = dict(batch, image=inputs)
    if teacher_model is not None:
      batch["teacher_logits"] = jax.lax.stop_gradient(
          teacher_model.apply(teacher_variables, inputs, train=False))
    args = (state["params"], state["batch_stats"], state.get("objective", {}), batch,
            dropout_key, term_key)
    if accum_steps == 1:
      loss, logits, new_stats, aux, term_states, grads = micro_grads(*args)
      accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    else:
      loss, accuracy, new_stats, aux, term_states, grads = accumulate(*args)
    updates, opt = tx.update(grads, state["opt"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    new_state = {
        "params": params,
        "batch_stats": new_stats,
        "opt": opt,
        "step": state["step"] + 1,
    }
    if "objective" in state:
      new_state["objective"] = term_states
    metrics = {
        "loss": loss,
        "accuracy": accuracy,
        "grad_norm": optax.global_norm(grads),
        # Non-finite weights (e.g. from a too-large step) are caught with the loss.
        "param_norm": optax.global_norm(params),
    }
    # Each term's value when there are several; a term's own extras (`<term>/<name>`, e.g.
    # the KL of DRO's π) always.
    metrics.update({k: v for k, v in aux.items() if len(terms) > 1 or "/" in k})
    return new_state, metrics

  return train_step


def split_micro_batches(x: jax.Array, k: int, mesh: jax.sharding.Mesh | None = None):
  """[B, ...] -> [k, B/k, ...], micro-batch j = examples j, j+k, j+2k, ... With `mesh`, the
  B/k axis keeps the batch's split over the mesh (B divisible by k × devices)."""
  out = jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)
  if mesh is not None:
    out = jax.lax.with_sharding_constraint(out, jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(None, sharding.batch_axes(mesh))))
  return out


def make_eval_step(model: nn.Module, loss_fn) -> Callable:
  """`(batch, variables) -> {"correct", "loss", "count"}` sums over unmasked examples, for
  `evaluators.over_split` (reduce "batch_sum"); make it once per run, so it compiles once."""
  apply_fn = eval_apply_fn(model)
  return lambda batch, variables: evaluators.classification_sums(apply_fn, loss_fn,
                                                                 variables, batch)


# ----------------------------------------------------------------------------- evaluation


def evaluate(eval_step, variables, split, batch_size, mesh, limit=None) -> dict:
  """Accuracy and mean loss over `split` (first `limit` examples), sums divided on host.

  `split`: an in-memory `pipeline.Split`, or a `streaming.Stream` (its own batch size)."""
  totals = evaluators.over_split(eval_step, eval_batches(split, batch_size, mesh, limit),
                                args=(variables,), reduce="batch_sum")
  return {"accuracy": totals["correct"] / totals["count"],
          "loss": totals["loss"] / totals["count"]}


def eval_batches(split, batch_size, mesh, limit=None):
  """`evaluators.batches` of an in-memory split, or `evaluators.stream_batches` of a
  `streaming.Stream` (whose batch size is its own)."""
  if isinstance(split, streaming.Stream):
    return evaluators.stream_batches(split, mesh, limit)
  return evaluators.batches(split.inputs, split.labels, batch_size, mesh, limit)


def default_evals(config) -> dict:
  """`config.evals`, or the default: classification on the train split (first
  `eval_train_examples`) and on the test split, every `eval_every` steps."""
  if config.get("evals") is not None:
    return config.evals
  return {"train": {"kind": "classification", "split": "train",
                    "limit": config.get("eval_train_examples")},
          "test": {"kind": "classification", "split": "test"}}


# ----------------------------------------------------------------------------- the run


LENGTH_FIELDS = ("total_steps", "total_epochs")


def make_workdir(path: str, config) -> Workdir:
  """The run's (unchecked) `Workdir`. The run's length may change on a resume (a finished
  run is extended) when the learning-rate schedule does not depend on it."""
  extendable = () if optim.schedule_depends_on_total_steps(config.optimizer) else LENGTH_FIELDS
  return Workdir(path, keep_checkpoints=config.keep_checkpoints,
                 may_change=MAY_CHANGE_ON_RESUME + extendable,
                 hints={f: EXTEND_HINT for f in LENGTH_FIELDS},
                 added_defaults={**model_field_defaults(config.get("model")),
                                 **SCALING_FIELD_DEFAULTS, **OPTIMIZER_FIELD_DEFAULTS})


# Training fields a saved config may lack (`Workdir`'s `added_defaults`), at their defaults.
SCALING_FIELD_DEFAULTS = {"accum_steps": 1, "sharding": SHARDING_DEFAULTS,
                          "mixup": MIXUP_DEFAULTS}
OPTIMIZER_FIELD_DEFAULTS = {f"optimizer.{k}": v for k, v in choices.OPTIMIZER_DEFAULTS.items()}


def model_field_defaults(model_config) -> dict[str, Any]:
  """`{"model.<field>": default}` for every config field of the named model: a model field
  at its default reproduces a run whose saved config does not hold it, so such a run resumes
  under a config that holds the default."""
  name = (model_config or {}).get("name")
  return {f"model.{field}": default
          for field, default in model_defaults.MODEL_DEFAULTS.get(name, {}).items()}


EXTEND_HINT = ("to train a finished run longer, its learning rate must not depend on the "
               "length: use a constant or step schedule, or set optimizer.decay_steps to "
               "the old decay length (the rate then stays at its final value)")


def open_workdir(workdir: str, config, overwrite: bool = False) -> Workdir:
  """The run's `Workdir`: refuses one written by another config, then prepares it."""
  wd = make_workdir(workdir, config)
  wd.check(config, overwrite=overwrite)
  wd.prepare(config, overwrite=overwrite)
  return wd


def train_and_evaluate(config, workdir: str, *, overwrite: bool = False,
                       mesh: jax.sharding.Mesh | None = None) -> TrainResult:
  """Trains `config.model` on `config.data`; resumes from `workdir` if it holds a checkpoint.

  `mesh` defaults to a 1-D `data` mesh over all devices. Returns the final variables and
  a summary (also written to `workdir/train_summary.json`). Raises ConfigError for bad
  input (nothing written) and `loop.TrainingDivergedError` on a NaN/inf loss or weights.
  """
  sharding.maybe_initialize_distributed()
  mesh = config_mesh(config, mesh)
  exp = build_experiment(config, mesh.size)
  return run_experiment(exp, open_workdir(workdir, config, overwrite), mesh)


def config_mesh(config, mesh: jax.sharding.Mesh | None = None) -> jax.sharding.Mesh:
  """The run's mesh over `mesh`'s devices (default: all): 1-D `data`, or (data, model)
  when `sharding.model_axis_size` > 1 (a mesh that already has that shape is kept)."""
  m = scaling_options(config)["model_axis_size"]
  if mesh is not None and (m == 1 or dict(mesh.shape).get(sharding.MODEL_AXIS) == m):
    return mesh
  devices = None if mesh is None else list(mesh.devices.flat)
  return sharding.data_mesh(devices, model_axis_size=m)


def state_shardings(abstract, mesh, *, fsdp: bool = False, min_size: int = 0):
  """Shardings of every leaf of the train state: replicated, or with `fsdp` the leaves of
  at least `min_size` elements split over the `data` axis (`sharding.fsdp_shardings`)."""
  if fsdp:
    return sharding.fsdp_shardings(abstract, mesh, min_size)
  repl = sharding.replicated(mesh)
  return jax.tree.map(lambda _: repl, abstract)


def run_experiment(exp: Experiment, workdir: str | Workdir,
                   mesh: jax.sharding.Mesh | None = None, *,
                   hooks: Sequence[Callable[[int, dict], dict | None]] = ()) -> TrainResult:
  """Trains a validated experiment through the one loop (`xsens.train.loop`).

  `workdir` is a prepared `Workdir` (or its path, already prepared). Each hook is called
  as `hook(step, variables)` once before the first step of a fresh run (step 0) and after
  every step; the scalars it returns (if any) are written to the metrics at that step
  (e.g. a measure taken every k steps). A hook must finish with the variables before it
  returns (the state is donated to the next step).
  """
  config = exp.config
  t_start = time.time()
  wd = workdir if isinstance(workdir, Workdir) else make_workdir(workdir, config)
  mesh = config_mesh(config, mesh)
  repl = sharding.replicated(mesh)
  seeds = run_seeds(config)
  scaling = scaling_options(config)
  # With all seeds equal to config.seed these are the keys of split(key(seed)).
  init_key = jax.random.split(jax.random.key(seeds["init_seed"]))[0]
  step_key = jax.random.split(jax.random.key(seeds["augment_seed"]))[1]

  init_fn = lambda k: init_state(exp.model, exp.tx, exp.train.input_shape, k,
                                 _input_dtype(exp.train), exp.terms)
  abstract = jax.eval_shape(init_fn, init_key)
  shardings = state_shardings(abstract, mesh, fsdp=scaling["fsdp"],
                              min_size=scaling["min_size"])

  def init():
    state = jax.jit(init_fn, out_shardings=shardings)(init_key)
    loaded = load_pretrained(config, exp.model, exp.train.input_shape, init_key)
    if loaded is not None:  # Fine-tune from a public checkpoint: fresh optimizer state.
      params = jax.device_put(loaded, shardings["params"])
      opt = jax.jit(exp.tx.init, out_shardings=shardings["opt"])(params)
      state = dict(state, params=params, opt=opt)
    return state

  batch_sh = sharding.batch_sharding(mesh)
  teacher_logits, extra_args = None, ()
  if exp.distill is not None:
    teacher_vars, teacher_logits = distill_lib.prepare(exp.distill, exp.train.inputs,
                                                       exp.train.num_classes)
    if teacher_vars is not None:  # In-step teacher: replicated, an argument of the step.
      extra_args = (jax.device_put(teacher_vars, repl),)
  train_step = jax.jit(
      make_train_step(exp.model, exp.tx, exp.terms, exp.transforms,
                      exp.distill.spec.teacher_model if exp.distill is not None else None,
                      accum_steps=scaling["accum_steps"], mesh=mesh,
                      input_dtype=_input_dtype(exp.train), mixup_alpha=mixup_alpha(config),
                      num_classes=exp.train.num_classes),
      in_shardings=(shardings, batch_sh, repl) + (repl,) * len(extra_args),
      out_shardings=(shardings, repl), donate_argnums=0)
  eval_step = jax.jit(make_eval_step(exp.model, exp.loss_fn))
  eval_bs = sharding.round_to_devices(config.eval_batch_size, mesh.size)
  n_train = len(exp.train)
  pi, pc = jax.process_index(), jax.process_count()

  feed = train_stream.TrainFeed(exp.train) if exp.train_eval is not None else None

  def advance(state, step, length):
    del length  # One step per call (schedule.max_chunk = 1).
    if feed is not None:  # The next batch of this process's grain stream.
      state, metrics = train_step(state, sharding.global_batch(feed.next(), mesh), step_key,
                                  *extra_args)
      return state, metrics, None
    idx = pipeline.batch_indices(n_train, config.batch_size, step, seeds["order_seed"], pi,
                                 pc)
    local = {"image": exp.train.inputs[idx], "label": exp.train.labels[idx]}
    if teacher_logits is not None:
      local["teacher_logits"] = teacher_logits[idx]
    state, metrics = train_step(state, sharding.global_batch(local, mesh), step_key,
                                *extra_args)
    return state, metrics, None

  def evaluate_during(state, step):
    variables = eval_variables(state)
    last = step >= exp.total_steps
    scalars = {}
    for ev in exp.evaluators:
      if ev.due(step, last):
        if exp.train_eval is not None:  # Streamed splits.
          split = exp.train_eval if ev.split == "train" else exp.test
          scalars.update(ev.run(variables, None, None, eval_bs, mesh, step,
                                batch_iter=eval_batches(split, eval_bs, mesh, ev.limit)))
          continue
        split = exp.train if ev.split == "train" else exp.test
        scalars.update(ev.run(variables, split.inputs, split.labels, eval_bs, mesh, step))
    return scalars

  def should_stop(step, scalars):
    del step
    target = config.get("target_train_accuracy")
    if target is not None and scalars.get("eval/train_accuracy", -1.0) >= target:
      return "target_train_accuracy"
    return None

  schedule_fn = optim.make_schedule(config.optimizer, exp.total_steps)
  program = loop.Program(
      init=init, abstract_state=sharding.abstract_with_shardings(abstract, shardings),
      advance=advance, evaluate=evaluate_during, should_stop=should_stop,
      log_scalars=lambda step: {"learning_rate": float(schedule_fn(step - 1))},
      data_state=feed.get_state if feed is not None else None,
      set_data_state=(functools.partial(_set_feed_state, feed, wd)
                      if feed is not None else None))
  schedule = loop.Schedule(exp.total_steps, log_every=config.log_every,
                           eval_every=evaluators.schedule_every(exp.evaluators),
                           checkpoint_every=config.checkpoint_every)
  summary_name = SUMMARY_FILE
  finished_at = lambda s: _finished_summary(wd.file(summary_name), s, exp.total_steps)
  try:
    out = loop.run(wd, program, schedule,
                   hooks=[lambda step, state, h=h: h(step, eval_variables(state))
                          for h in hooks],
                   finished_reason=lambda s: finished_at(s).get("stop_reason"),
                   progress=bool(config.get("progress", True)), desc=config.model.name)
  finally:
    if feed is not None:  # Stops grain's worker processes.
      feed.close()
  state, step = out.state, out.step
  finished = finished_at(out.restored_step) if out.new_steps == 0 else {}

  variables = eval_variables(state)
  if exp.train_eval is not None:  # Streamed: the first eval_train_examples of the split.
    tr = evaluate(eval_step, variables, exp.train_eval, eval_bs, mesh,
                  config.get("eval_train_examples"))
  else:
    tr = evaluate(eval_step, variables, exp.train, eval_bs, mesh)
  te = evaluate(eval_step, variables, exp.test, eval_bs, mesh)
  summary = {
      "model": config.model.name, "steps": step, "stop_reason": out.stop_reason,
      "train_accuracy": tr["accuracy"], "train_loss": tr["loss"],
      "test_accuracy": te["accuracy"], "test_loss": te["loss"],
      "num_params": int(sum(np.prod(p.shape) for p in jax.tree.leaves(state["params"]))),
      # A finished run that is only re-evaluated keeps its training time.
      "wall_s": finished.get("wall_s", time.time() - t_start),
  }
  wd.write_json(summary_name, summary)
  return TrainResult(exp.model, variables, exp.train, exp.test, summary,
                     objective_state=jax.device_get(state.get("objective", {})))


def _input_dtype(train) -> np.dtype:
  """The dtype of one training input: an in-memory split's, or a stream's."""
  return train.dtype if isinstance(train, train_stream.TrainStream) else train.inputs.dtype


def _set_feed_state(feed: train_stream.TrainFeed, wd: Workdir, state: bytes | None) -> None:
  """Restores the training stream's position saved with the restored checkpoint."""
  if state is None:
    raise ConfigError("workdir", f"the checkpoint restored from {wd.path!r} holds no "
                      "training-data iterator state (written without data.stream?); pass "
                      "--overwrite to start again there, or choose another --workdir")
  feed.set_state(state)


def _finished_summary(summary_path: str, step: int | None, total_steps: int) -> dict:
  """The summary of a run that already finished at `step` (a rerun trains no more), or {}.

  A run that stopped at its old `total_steps` is not finished when `total_steps` grew (an
  extended run, see `extendable_fields`)."""
  if step is None or not paths.exists(summary_path):
    return {}
  summary = json.loads(paths.read_text(summary_path))
  if summary.get("steps") != step:
    return {}
  if summary.get("stop_reason") == "max_steps" and step < total_steps:
    return {}
  return summary
