"""Optimizers and learning-rate schedules chosen by name from the config (optax)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from xsens import choices
from xsens.errors import ConfigError, is_finite_number

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULES = ("constant", "cosine", "step", "linear")


def validate_optimizer_config(opt_config, total_steps: int) -> None:
  """Checks a `config.optimizer` block (every field of `choices.OPTIMIZER_DEFAULTS`, e.g.
  from `mlcollections_configs.common.optimizer_config`); raises ConfigError naming the bad
  field."""
  missing = [f for f in ("name", "learning_rate", *choices.OPTIMIZER_DEFAULTS)
             if f not in opt_config]
  if missing:
    raise ConfigError(f"optimizer.{missing[0]}", "missing: build the block with "
                      "mlcollections_configs.common.optimizer_config (every field "
                      f"with its default); missing {missing}")
  if opt_config.name not in OPTIMIZERS:
    raise ConfigError(
        "optimizer.name",
        f"unknown optimizer {opt_config.name!r}; allowed: {', '.join(OPTIMIZERS)}")
  if not opt_config.learning_rate > 0:
    raise ConfigError("optimizer.learning_rate",
                      f"must be > 0, got {opt_config.learning_rate}")
  if opt_config.schedule not in SCHEDULES:
    raise ConfigError(
        "optimizer.schedule",
        f"unknown schedule {opt_config.schedule!r}; allowed: {', '.join(SCHEDULES)}")
  if opt_config.weight_decay < 0:
    raise ConfigError("optimizer.weight_decay",
                      f"must be >= 0, got {opt_config.weight_decay}")
  warmup = opt_config.warmup_steps
  if not 0 <= warmup <= total_steps:
    raise ConfigError("optimizer.warmup_steps",
                      f"must be in [0, total steps={total_steps}], got {warmup}")
  decay = opt_config.decay_steps
  if decay is not None and (not isinstance(decay, int) or isinstance(decay, bool) or decay < 1):
    raise ConfigError("optimizer.decay_steps", f"must be None (total steps - warmup_steps) "
                      f"or an int >= 1, got {decay!r}")
  if opt_config.schedule == "step":
    if not opt_config.step_every > 0:
      raise ConfigError("optimizer.step_every",
                        "must be > 0 steps for schedule='step'")
  for f in ("b1", "b2"):
    if not (is_finite_number(opt_config[f]) and 0 <= opt_config[f] < 1):
      raise ConfigError(f"optimizer.{f}", f"must be in [0, 1), got {opt_config[f]!r}")
  if not (is_finite_number(opt_config.eps) and opt_config.eps > 0):
    raise ConfigError("optimizer.eps", f"must be > 0, got {opt_config.eps!r}")
  if not (is_finite_number(opt_config.momentum) and opt_config.momentum >= 0):
    raise ConfigError("optimizer.momentum", f"must be >= 0, got {opt_config.momentum!r}")
  if not isinstance(opt_config.nesterov, bool):
    raise ConfigError("optimizer.nesterov", f"must be True or False, got "
                      f"{opt_config.nesterov!r}")
  clip = opt_config.grad_clip_norm
  if clip is not None and not clip > 0:
    raise ConfigError("optimizer.grad_clip_norm", f"must be > 0 or None, got {clip}")


def make_schedule(opt_config, total_steps: int) -> optax.Schedule:
  """Learning-rate schedule: warmup then constant / cosine / step decay / linear.

  Cosine and linear decay over `optimizer.decay_steps` steps after the warmup (default:
  the rest of the run, total_steps - warmup_steps) and keep their final value after it."""
  lr = float(opt_config.learning_rate)
  warmup = int(opt_config.warmup_steps)
  name = opt_config.schedule
  decay_steps = opt_config.decay_steps or max(total_steps - warmup, 1)
  if name == "constant":
    main = optax.constant_schedule(lr)
  elif name == "cosine":
    main = optax.cosine_decay_schedule(lr, decay_steps)
  elif name == "linear":
    main = optax.linear_schedule(lr, 0.0, decay_steps)
  else:  # step: multiply by gamma every `step_every` steps (PyTorch StepLR).
    main = optax.exponential_decay(
        lr, transition_steps=int(opt_config.step_every),
        decay_rate=float(opt_config.step_gamma), staircase=True)
  if warmup == 0:
    return main
  return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warmup), main], [warmup])


def optimizer_by_name(name: str, learning_rate, *, b1: float = 0.9, b2: float = 0.999,
                      eps: float = 1e-8, weight_decay: float = 0.0, momentum: float = 0.9,
                      nesterov: bool = False) -> optax.GradientTransformation:
  """The optax transformation `name` (OPTIMIZERS) at `learning_rate` (a float or an optax
  schedule): sgd, sgd with (Nesterov) momentum, adam, or adamw with decoupled
  `weight_decay` on every parameter (PyTorch's AdamW)."""
  if name == "sgd":
    return optax.sgd(learning_rate)
  if name == "momentum":
    return optax.sgd(learning_rate, momentum=momentum, nesterov=nesterov)
  if name == "adam":
    return optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
  if name == "adamw":
    return optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")


def make_optimizer(opt_config, total_steps: int) -> optax.GradientTransformation:
  """The optax transformation for `config.optimizer` (validated first): gradient clipping,
  coupled L2 (SGD family and Adam, PyTorch semantics), then `optimizer_by_name` on the
  learning-rate schedule."""
  validate_optimizer_config(opt_config, total_steps)
  lr = make_schedule(opt_config, total_steps)
  wd = float(opt_config.weight_decay)
  name = opt_config.name
  tx = optimizer_by_name(name, lr, b1=float(opt_config.b1), b2=float(opt_config.b2),
                         eps=float(opt_config.eps), weight_decay=wd,
                         momentum=float(opt_config.momentum),
                         nesterov=bool(opt_config.nesterov))
  parts = []
  clip = opt_config.grad_clip_norm
  if clip is not None:
    parts.append(optax.clip_by_global_norm(float(clip)))
  if wd and name != "adamw":  # Coupled L2 for the SGD family and Adam (PyTorch semantics).
    parts.append(optax.add_decayed_weights(wd))
  return optax.chain(*parts, tx)


def freeze(names) -> optax.GradientTransformation:
  """Zeroes the updates of the top-level params `names` (stateless): chained after an
  optimiser, those params stay exactly at their initial values."""
  names = tuple(names)

  def update_fn(updates, state, params=None):
    del params
    return {k: (jax.tree.map(jnp.zeros_like, v) if k in names else v)
            for k, v in updates.items()}, state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def schedule_depends_on_total_steps(opt_config) -> bool:
  """Whether the learning rate at a step depends on the run's length: cosine and linear
  decay without an explicit `decay_steps`. A run whose schedule does not may be extended
  (trained for more steps) on resume."""
  return (opt_config.schedule in ("cosine", "linear")
          and opt_config.decay_steps is None)
