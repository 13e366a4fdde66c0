"""Objectives as named, weighted terms; augmentations as input transforms.

The training loss is a weighted sum over terms, in the order `config.objective.items()`
gives them (a ConfigDict sorts its keys by name):

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

Term kinds register themselves: `@register("kind", fields=(...))` on a builder
`(options, ctx: TermContext) -> fn` (or `-> (fn, init_state)` for a stateful term) adds
the kind to `KINDS`, which `terms_from_config` and the trainer read. A new kind is one
decorated builder in any imported module; nothing else is edited.

Config (`config.objective`, a ConfigDict of terms):
  objective = {"ce": {"kind": "cross_entropy", "weight": 0.5},
               "penalty": {"kind": "sensitivity", "weight": 0.5, "sigma": 1.0,
                           "patch_size": 4, "grid_aligned": False}}
Without `config.objective` (None or absent) the objective is one term "task_loss" of kind
`config.loss`, or "distillation" when `config.distill` is set. Gaussian pixel noise
(`augment.gaussian_std > 0`) is the input transform "gaussian" (std, prob).

Keys: the step key k = fold_in(key, step); dropout uses fold_in(k, 0), the input transforms
fold_in(k, 1) and the stochastic terms fold_in(k, 2) (the j-th of each kind, j ≥ 1, folds
j into that key once more).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from xsens.errors import ConfigError, check_kind_block, is_finite_number
from xsens.measures import adversarial
from xsens.train import distill as distill_lib
from xsens.train import dro
from xsens.train import interventions, legacy_fields, losses

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


@dataclasses.dataclass(frozen=True)
class TermContext:
  """What a term builder may read besides its options."""
  loss_fn: Callable | None = None                       # losses.get_loss(config.loss)
  distill_spec: distill_lib.DistillSpec | None = None   # From config.distill, if set.
  image_shape: tuple | None = None                      # One training input's shape.
  class_counts: Any = None                              # [K] training examples per class.


@dataclasses.dataclass(frozen=True)
class Kind:
  """A registered term kind.

  build: `(options, ctx) -> fn` or `(fn, init_state)`; validate: `(options, path, ctx) ->
  options` with defaults (ConfigError naming `<path>.<field>`), None to take them as
  given; mixup_error: why the kind does not train on mixup's soft labels (None: it does).
  """
  name: str
  fields: tuple[str, ...]
  build: Callable
  needs_key: bool = False
  validate: Callable | None = None
  mixup_error: str | None = None


KINDS: dict[str, Kind] = {}


def register(name: str, fields: tuple[str, ...] = (), *, needs_key: bool = False,
             validate: Callable | None = None, mixup_error: str | None = None):
  """Decorator: registers the builder it wraps as term kind `name` (see `Kind`)."""
  def wrap(build):
    if name in KINDS:
      raise ValueError(f"term kind {name!r} is already registered")
    KINDS[name] = Kind(name, tuple(fields), build, needs_key, validate, mixup_error)
    return build
  return wrap


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


def _register_loss(kind: str) -> None:
  soft = losses.SOFT_LOSSES.get(kind)
  register(kind, mixup_error=None if soft is not None else (
      f"mixup trains on soft labels, which the loss {kind!r} does not take; use "
      f"{', '.join(losses.SOFT_LOSSES)} or mixup.alpha=0"))(
          lambda options, ctx: _per_example_loss_term(losses.get_loss(kind), soft))


for _loss_kind in losses.LOSSES:
  _register_loss(_loss_kind)


def _sensitivity_options(options: dict, path: str, ctx: TermContext) -> dict:
  out = {"sigma": options.get("sigma", 1.0), "patch_size": options.get("patch_size", 4),
         "grid_aligned": options.get("grid_aligned", False)}
  if not is_finite_number(out["sigma"]) or out["sigma"] < 0:
    raise ConfigError(f"{path}.sigma", f"must be >= 0, got {out['sigma']!r}")
  image_shape = ctx.image_shape
  h, w = image_shape[0], image_shape[1]
  q = out["patch_size"]
  if len(image_shape) != 3 or not isinstance(q, int) or not 0 < q <= min(h, w) or (
      out["grid_aligned"] and (h % q or w % q)):
    raise ConfigError(f"{path}.patch_size", f"{q!r} must be an int in [1, {min(h, w)}]"
                      + (f" dividing {h}x{w} when grid_aligned" if out["grid_aligned"] else "")
                      + " (images only)")
  return out


@register("sensitivity", ("sigma", "patch_size", "grid_aligned"), needs_key=True,
          validate=_sensitivity_options)
def _sensitivity_term(options, ctx):
  """MSE(f(x̃), f(x)) of `xsens.train.interventions` (the sensitivity paper's §6.1; weigh
  it p and the task 1 − p for the paper's (1 − p)·CE + p·MSE)."""
  del ctx
  sigma, patch_size = float(options["sigma"]), int(options["patch_size"])
  grid_aligned = bool(options["grid_aligned"])

  def term(apply_fn, params, batch, key, state):
    del state
    noisy = interventions.patch_noise(batch["image"], key, sigma=sigma, patch_size=patch_size,
                                      grid_aligned=grid_aligned)
    return interventions.sensitivity_penalty(batch["logits"], apply_fn(params, noisy)), {}
  return term


@register("min_entropy")
def _entropy_term(options, ctx):
  """λ·mean_i H(p(x_i)) (`interventions.entropy_penalty`; λ the term's weight)."""
  del options, ctx

  def term(apply_fn, params, batch, key, state):
    del apply_fn, params, key, state
    return interventions.entropy_penalty(batch["logits"]), {}
  return term


def _distillation_options(options: dict, path: str, ctx: TermContext) -> dict:
  if ctx.distill_spec is None:
    raise ConfigError(f"{path}.kind", "a distillation term needs config.distill (teacher, "
                      "alpha, temperature)")
  return options


@register("distillation", validate=_distillation_options,
          mixup_error="mixup does not combine with distillation; set mixup.alpha=0")
def _distillation_term(options, ctx):
  del options
  spec, base_loss = ctx.distill_spec, ctx.loss_fn

  def term(apply_fn, params, batch, key, state):
    del apply_fn, params, key, state
    return distill_lib.distill_loss(batch["logits"], batch["teacher_logits"], batch["label"],
                                    base_loss, spec).mean(), {}
  return term


def _adversarial_options(options: dict, path: str, ctx: TermContext) -> dict:
  del ctx
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


@register("adversarial", ("epsilon", "num_steps", "step_size", "clip_min", "clip_max"),
          needs_key=True, validate=_adversarial_options)
def _adversarial_term(options, ctx):
  """Adversarial training (Madry et al. 2018): the mean cross-entropy on L∞ PGD examples
  of `xsens.measures.adversarial.pgd` (random start), crafted on the current parameters
  (not differentiated through) in the term's train-mode forward pass."""
  del ctx

  def term(apply_fn, params, batch, key, state):
    del state
    adv = adversarial.pgd(apply_fn, jax.lax.stop_gradient(params), batch["image"],
                          labels=batch["label"], key=key, **options)["adv_inputs"]
    logits = apply_fn(params, jax.lax.stop_gradient(adv))
    return losses.get_loss("cross_entropy")(logits, batch["label"]).mean(), {}
  return term


@register("masked_lm")
def _masked_lm_term(options, ctx):
  """Masked-LM cross-entropy: the mean over the labelled positions of −log p(label), with
  `batch["logits"]` [..., V] and `batch["label"]` [...] int (−1: not predicted; e.g.
  [B, L, V] and [B, L] for a masked LM). Aux "accuracy": argmax accuracy on them."""
  del options, ctx

  def term(apply_fn, params, batch, key, state):
    del apply_fn, params, key, state
    labels = batch["label"]
    valid = (labels >= 0).astype(jnp.float32)
    logp = jax.nn.log_softmax(batch["logits"].astype(jnp.float32), axis=-1)
    safe = jnp.maximum(labels, 0)[..., None]
    nll = -jnp.take_along_axis(logp, safe, axis=-1)[..., 0]
    count = jnp.maximum(valid.sum(), 1.0)
    hits = (jnp.argmax(logp, axis=-1) == labels).astype(jnp.float32)
    return (nll * valid).sum() / count, {"accuracy": (hits * valid).sum() / count}
  return term


def _register_dro(kind: str) -> None:
  """Label shift (`xsens.train.dro`): DRO over π and its baselines (stateful)."""
  register(kind, dro.FIELDS[kind],
           validate=lambda options, path, ctx: dro.validate_options(kind, options, path,
                                                                    ctx.class_counts))(
      lambda options, ctx: dro.make_fns(kind, options))


for _dro_kind in dro.KINDS:
  _register_dro(_dro_kind)


def make_term(name: str, kind: str, weight: float, options: dict,
              ctx: TermContext = TermContext()) -> Term:
  """A `Term` of the registered `kind` with its validated options."""
  if kind not in KINDS:
    raise ValueError(f"unknown term kind {kind!r}; registered: {', '.join(KINDS)}")
  k = KINDS[kind]
  built = k.build(options, ctx)
  fn, init_state = built if isinstance(built, tuple) else (built, None)
  return Term(name, kind, weight, fn, needs_key=k.needs_key, init_state=init_state)


# ----------------------------------------------------------------------------- from a config


def terms_from_config(config, image_shape, loss_fn,
                      distill_spec: distill_lib.DistillSpec | None = None,
                      class_counts=None) -> list[Term]:
  """The objective's terms from `config.objective` (module doc).

  `class_counts` [K]: training examples per class (None: unknown, e.g. streamed data), for
  the label-shift terms (`xsens.train.dro`).
  Raises ConfigError naming `objective.<name>.<field>` for a bad term.
  """
  legacy_fields.refuse_legacy_fields(config)
  ctx = TermContext(loss_fn, distill_spec, tuple(image_shape), class_counts)
  if config.get("objective") is None:
    kind = "distillation" if distill_spec is not None else config.get("loss", "cross_entropy")
    return [make_term("task_loss", kind, 1.0, {}, ctx)]
  objective = config.objective
  if not len(objective):
    raise ConfigError("objective", "has no terms; e.g. {'task': {'kind': 'cross_entropy', "
                      "'weight': 1.0}}")
  terms = []
  fields = {name: ("weight",) + k.fields for name, k in KINDS.items()}
  for name, tc in objective.items():
    path = f"objective.{name}"
    kind = check_kind_block(tc, path, fields, "term kind")
    weight = tc.get("weight", 1.0)
    if not is_finite_number(weight) or weight < 0:
      raise ConfigError(f"{path}.weight", f"must be a finite number >= 0, got {weight!r}")
    options = {k: tc[k] for k in KINDS[kind].fields if k in tc}
    if KINDS[kind].validate is not None:
      options = KINDS[kind].validate(options, path, ctx)
    terms.append(make_term(name, kind, float(weight), options, ctx))
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
