"""Objectives as named, weighted terms; augmentations as input transforms.

The training loss is a weighted sum over terms, in the order the config gives them:

  L(θ) = Σ_i w_i · term_i(apply_fn, θ, batch, key_i, state_i)

Each term is a pure function `(apply_fn, params, batch, key, state) -> (loss, aux)`:
  apply_fn(params, inputs) -> logits [B, K]   the model in train mode (this step's dropout
                                              key; BatchNorm statistics from the clean pass)
  batch   {"image" [B, ...], "label" [B], "logits" [B, K] (the clean forward pass, shared
          by all terms and differentiable), "teacher_logits" [B, K] (distillation),
          "soft_label" [B, K] (mixup only; "label" is then the dominant original label)}
  key     the term's own PRNG key (None for deterministic terms)
  state   the term's state (None for stateless terms): a pytree kept in the train state
          under `state["objective"][name]`, checkpointed and resumed with it
  loss    a scalar; aux: scalars for the metrics, and "state" (the new state) if stateful.
The train step (`xsens.train.trainer.make_train_step`) has no branch on term names.

Config, new form (`config.objective`, a ConfigDict of terms, summed in the given order):
  objective = {"task": {"kind": "cross_entropy", "weight": 0.7},
               "penalty": {"kind": "sensitivity", "weight": 0.3, "sigma": 1.0,
                           "patch_size": 4, "grid_aligned": False}}
Old fields (used when `config.objective` is absent or None) map onto terms exactly, with the
same numbers as before:
  loss = L                          -> task: {kind: L, weight: 1}
  distill = {...}                   -> task: {kind: "distillation", weight: 1} (the teacher
                                       and α, τ, margins from config.distill)
  regularizer.name = "sensitivity"  -> task weight 1 − p, penalty: {kind: "sensitivity",
                                       weight: p, sigma, patch_size, grid_aligned}
  regularizer.name = "min_entropy"  -> task weight 1, penalty: {kind: "min_entropy",
                                       weight: λ}
  augment.gaussian_std > 0          -> the input transform "gaussian" (std, prob)

Keys: the step key k = fold_in(key, step); dropout uses fold_in(k, 0), the input transforms
fold_in(k, 1) and the stochastic terms fold_in(k, 2) (the j-th of each kind, j ≥ 1, folds
j into that key once more), which reproduces the keys of the trainer before terms existed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from xsens.errors import ConfigError, check_kind_block, is_finite_number
from xsens.train import distill as distill_lib
from xsens.train import dro
from xsens.train import interventions, losses

TermFn = Callable[..., tuple]


@dataclasses.dataclass(frozen=True)
class Term:
  """One weighted term of the objective."""
  name: str
  kind: str
  weight: float
  fn: TermFn
  needs_key: bool = False
  init_state: Callable[[], Any] | None = None


@dataclasses.dataclass(frozen=True)
class Transform:
  """An input transform applied to the training inputs before the forward pass."""
  name: str
  fn: Callable[[jax.Array, jax.Array], jax.Array]  # (inputs, key) -> inputs


# ----------------------------------------------------------------------------- term kinds


def _per_example_loss_term(loss_fn, soft_fn=None):
  """The mean loss on the labels; on `batch["soft_label"]` [B, K] (mixup) if the batch has
  them, with `soft_fn` (`losses.SOFT_LOSSES`; configs with mixup are refused without it)."""
  def term(apply_fn, params, batch, key, state):
    del apply_fn, params, key, state
    if "soft_label" in batch:
      if soft_fn is None:
        raise ValueError("this loss takes no soft labels (mixup)")
      return soft_fn(batch["logits"], batch["soft_label"]).mean(), {}
    return loss_fn(batch["logits"], batch["label"]).mean(), {}
  return term


def _sensitivity_term(sigma: float, patch_size: int, grid_aligned: bool):
  """p·MSE(f(x̃), f(x)) of `xsens.train.interventions` (the sensitivity paper's §6.1)."""
  def term(apply_fn, params, batch, key, state):
    del state
    noisy = interventions.patch_noise(batch["image"], key, sigma=sigma, patch_size=patch_size,
                                      grid_aligned=grid_aligned)
    return interventions.sensitivity_penalty(batch["logits"], apply_fn(params, noisy)), {}
  return term


def _entropy_term(apply_fn, params, batch, key, state):
  del apply_fn, params, key, state
  return interventions.entropy_penalty(batch["logits"]), {}


def _distillation_term(spec: distill_lib.DistillSpec, base_loss):
  def term(apply_fn, params, batch, key, state):
    del apply_fn, params, key, state
    return distill_lib.distill_loss(batch["logits"], batch["teacher_logits"], batch["label"],
                                    base_loss, spec).mean(), {}
  return term


_ADVERSARIAL_FIELDS = ("epsilon", "num_steps", "step_size", "clip_min", "clip_max")


def _adversarial_term(epsilon: float, num_steps: int, step_size: float, clip_min, clip_max):
  """Adversarial training (Madry et al. 2018): the mean cross-entropy on L∞ PGD examples
  of `xsens.measures.adversarial.pgd` (random start), crafted on the current parameters
  (not differentiated through) in the term's train-mode forward pass."""
  from xsens.measures import adversarial  # Local: measures import the train package.

  def term(apply_fn, params, batch, key, state):
    del state
    adv = adversarial.pgd(apply_fn, jax.lax.stop_gradient(params), batch["image"],
                          labels=batch["label"], key=key, epsilon=epsilon,
                          num_steps=num_steps, step_size=step_size, clip_min=clip_min,
                          clip_max=clip_max)["adv_inputs"]
    logits = apply_fn(params, jax.lax.stop_gradient(adv))
    return losses.get_loss("cross_entropy")(logits, batch["label"]).mean(), {}
  return term


def _adversarial_options(options: dict, path: str) -> dict:
  out = {"epsilon": options.get("epsilon", 0.1), "num_steps": options.get("num_steps", 7),
         "step_size": options.get("step_size", None), "clip_min": options.get("clip_min", 0.0),
         "clip_max": options.get("clip_max", 1.0)}
  if not is_finite_number(out["epsilon"]) or out["epsilon"] < 0:
    raise ConfigError(f"{path}.epsilon", f"must be a finite number >= 0, got {out['epsilon']!r}")
  n = out["num_steps"]
  if not isinstance(n, int) or isinstance(n, bool) or n < 1:
    raise ConfigError(f"{path}.num_steps", f"must be an int >= 1, got {n!r}")
  if out["step_size"] is None:
    out["step_size"] = 2.5 * out["epsilon"] / n
  if not is_finite_number(out["step_size"]) or out["step_size"] <= 0:
    raise ConfigError(f"{path}.step_size", f"must be a number > 0, got {out['step_size']!r}")
  return out


def _masked_lm_term(apply_fn, params, batch, key, state):
  """Masked-LM cross-entropy: the mean over the labelled positions of −log p(label), with
  `batch["logits"]` [..., V] and `batch["label"]` [...] int (−1: not predicted; e.g.
  [B, L, V] and [B, L] for a masked LM). Aux "accuracy": argmax accuracy on them."""
  del apply_fn, params, key, state
  labels = batch["label"]
  valid = (labels >= 0).astype(jnp.float32)
  logp = jax.nn.log_softmax(batch["logits"].astype(jnp.float32), axis=-1)
  safe = jnp.maximum(labels, 0)[..., None]
  nll = -jnp.take_along_axis(logp, safe, axis=-1)[..., 0]
  count = jnp.maximum(valid.sum(), 1.0)
  hits = (jnp.argmax(logp, axis=-1) == labels).astype(jnp.float32)
  return (nll * valid).sum() / count, {"accuracy": (hits * valid).sum() / count}


_FIELDS = {"cross_entropy": (), "multi_margin": (), "min_entropy": (), "distillation": (),
           "sensitivity": ("sigma", "patch_size", "grid_aligned"), "masked_lm": (),
           **dro.FIELDS,  # Label shift (xsens.train.dro): DRO over π and its baselines.
           "adversarial": _ADVERSARIAL_FIELDS}
KINDS = tuple(_FIELDS)


def make_term(name: str, kind: str, weight: float, options: dict, *, loss_fn=None,
              distill_spec: distill_lib.DistillSpec | None = None) -> Term:
  """A `Term` of `kind` (see KINDS) with its options (validated by `terms_from_config`)."""
  if kind in losses.LOSSES:
    return Term(name, kind, weight, _per_example_loss_term(losses.get_loss(kind),
                                                           losses.SOFT_LOSSES.get(kind)))
  if kind == "sensitivity":
    return Term(name, kind, weight, _sensitivity_term(
        float(options["sigma"]), int(options["patch_size"]), bool(options["grid_aligned"])),
                needs_key=True)
  if kind == "min_entropy":
    return Term(name, kind, weight, _entropy_term)
  if kind == "masked_lm":
    return Term(name, kind, weight, _masked_lm_term)
  if kind == "distillation":
    return Term(name, kind, weight, _distillation_term(distill_spec, loss_fn))
  if kind == "adversarial":
    return Term(name, kind, weight, _adversarial_term(**options), needs_key=True)
  if kind in dro.KINDS:  # Options from `dro.validate_options` (with "train_prior").
    fn, init_state = dro.make_fns(kind, options)
    return Term(name, kind, weight, fn, init_state=init_state)
  raise ValueError(f"unknown term kind {kind!r}")


# ----------------------------------------------------------------------------- from a config


def uses_new_form(config) -> bool:
  return config.get("objective") is not None


def terms_from_config(config, image_shape, loss_fn,
                      distill_spec: distill_lib.DistillSpec | None = None,
                      class_counts=None) -> list[Term]:
  """The objective's terms from `config.objective`, or from the old fields (module doc).

  `class_counts` [K]: training examples per class (None: unknown, e.g. streamed data), for
  the label-shift terms (`xsens.train.dro`).
  Raises ConfigError naming `objective.<name>.<field>` for a bad term.
  """
  if not uses_new_form(config):
    return _legacy_terms(config, loss_fn, distill_spec)
  objective = config.objective
  if not len(objective):
    raise ConfigError("objective", "has no terms; e.g. {'task': {'kind': 'cross_entropy', "
                      "'weight': 1.0}}")
  for old in ("regularizer",):
    if config.get(old) is not None and config[old].get("name", "none") != "none":
      raise ConfigError(f"{old}.name", "set the regulariser as a term of config.objective "
                        f"(or leave config.objective None), not both; got {config[old].name!r}")
  terms = []
  for name, tc in objective.items():
    path = f"objective.{name}"
    kind = check_kind_block(tc, path, {k: ("weight",) + f for k, f in _FIELDS.items()},
                            "term kind")
    weight = tc.get("weight", 1.0)
    if not is_finite_number(weight) or weight < 0:
      raise ConfigError(f"{path}.weight", f"must be a finite number >= 0, got {weight!r}")
    options = {k: tc[k] for k in _FIELDS[kind] if k in tc}
    if kind == "sensitivity":
      options = _sensitivity_options(options, path, image_shape)
    if kind in dro.KINDS:
      options = dro.validate_options(kind, options, path, class_counts)
    if kind == "adversarial":
      options = _adversarial_options(options, path)
    if kind == "distillation" and distill_spec is None:
      raise ConfigError(f"{path}.kind", "a distillation term needs config.distill (teacher, "
                        "alpha, temperature)")
    terms.append(make_term(name, kind, float(weight), options, loss_fn=loss_fn,
                           distill_spec=distill_spec))
  return terms


def _sensitivity_options(options: dict, path: str, image_shape) -> dict:
  out = {"sigma": options.get("sigma", 1.0), "patch_size": options.get("patch_size", 4),
         "grid_aligned": options.get("grid_aligned", False)}
  if not is_finite_number(out["sigma"]) or out["sigma"] < 0:
    raise ConfigError(f"{path}.sigma", f"must be >= 0, got {out['sigma']!r}")
  h, w = image_shape[0], image_shape[1]
  q = out["patch_size"]
  if len(image_shape) != 3 or not isinstance(q, int) or not 0 < q <= min(h, w) or (
      out["grid_aligned"] and (h % q or w % q)):
    raise ConfigError(f"{path}.patch_size", f"{q!r} must be an int in [1, {min(h, w)}]"
                      + (f" dividing {h}x{w} when grid_aligned" if out["grid_aligned"] else "")
                      + " (images only)")
  return out


def _legacy_terms(config, loss_fn, distill_spec) -> list[Term]:
  reg = config.get("regularizer")
  reg_name = "none" if reg is None else reg.name
  p = float(reg.weight) if reg_name == "sensitivity" else 0.0
  task_kind = "distillation" if distill_spec is not None else config.get("loss",
                                                                         "cross_entropy")
  task_weight = 1.0 - p if reg_name == "sensitivity" else 1.0
  # Named as the metrics of the trainer before terms existed: train/task_loss, /penalty.
  terms = [make_term("task_loss", task_kind, task_weight, {}, loss_fn=loss_fn,
                     distill_spec=distill_spec)]
  if reg_name == "sensitivity":
    terms.append(make_term("penalty", "sensitivity", p, {
        "sigma": reg.sigma, "patch_size": reg.patch_size, "grid_aligned": reg.grid_aligned}))
  elif reg_name == "min_entropy":
    terms.append(make_term("penalty", "min_entropy", float(reg.weight), {}))
  return terms


def transforms_from_config(config) -> list[Transform]:
  """Input transforms: `augment.gaussian_std > 0` (and prob > 0) adds Gaussian pixel noise."""
  aug = config.get("augment")
  if aug is None or not (aug.gaussian_std > 0 and aug.gaussian_prob > 0):
    return []
  std, prob = float(aug.gaussian_std), float(aug.gaussian_prob)
  return [Transform("gaussian", lambda x, key: interventions.gaussian_augment(
      x, key, std=std, prob=prob))]


# ----------------------------------------------------------------------------- in the step


def stream_keys(base: jax.Array, count: int) -> list[jax.Array]:
  """`count` keys of one stream: the base key itself, then fold_in(base, j) for j ≥ 1."""
  return [base if j == 0 else jax.random.fold_in(base, j) for j in range(count)]


def init_states(terms: list[Term]) -> dict:
  """{name: initial state} of the stateful terms ({} when none is stateful)."""
  return {t.name: t.init_state() for t in terms if t.init_state is not None}


def apply_transforms(transforms: list[Transform], inputs: jax.Array, key: jax.Array):
  for t, k in zip(transforms, stream_keys(key, len(transforms))):
    inputs = t.fn(inputs, k)
  return inputs


def total_loss(terms: list[Term], apply_fn, params, batch: dict, key: jax.Array,
               states: dict) -> tuple[jax.Array, dict, dict]:
  """(Σ w_i·term_i, {name: term value} (+ the terms' aux), {name: new state})."""
  keys = iter(stream_keys(key, sum(t.needs_key for t in terms)))
  loss, aux, new_states = None, {}, {}
  for t in terms:
    value, term_aux = t.fn(apply_fn, params, batch, next(keys) if t.needs_key else None,
                           states.get(t.name))
    term_aux = dict(term_aux)
    if t.init_state is not None:
      new_states[t.name] = term_aux.pop("state")
    weighted = value if t.weight == 1.0 else t.weight * value
    loss = weighted if loss is None else loss + weighted
    aux[t.name] = value
    aux.update({f"{t.name}/{k}": v for k, v in term_aux.items()})
  return loss, aux, new_states
