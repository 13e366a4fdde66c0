"""Objective terms for label shift: DRO over the label prior, and its baselines.

"Coping with label shift via distributionally robust optimisation" (Zhang, Menon, Veit,
Bhojanapalli, Kumar, Sra; ICLR 2021, arXiv 2010.12230; docs/papers/google_papers.md §I):

  min_θ max_{π ∈ Δ: KL(π‖p) ≤ r} Σ_y π_y E_{x|y}[ℓ] = E_train[(π_y / p_y) · ℓ(x, y; θ)]

Algorithm 1 (gradient descent – proximal mirror ascent), one train step on a batch of b
examples (step numbers and values as in the spec, which cites the paper's App. B, §3.5):
  1. p ← β·p + (1 − β)·(batch label frequencies), β = `ema_rate` = 0.999. p starts at the
     training set's class frequencies (known to the trainer) and π at the uniform prior
     projected into the ball (so r = 0 starts, and stays, at π = p: ERM).
  2. θ step on (1/b) Σ_i (π_{y_i} / p_{y_i}) · ℓ_i with the π and p from before the step
     (weights under stop-gradient; they are train state, not parameters).
  3. α = 0 if KL(π‖p) ≤ r, else `alpha` (= 1 from γ_c = 1/(2λ)).
  4. g_y = (1/b) Σ_{i: y_i = y} ℓ_i / p_y, clipped at `loss_clip` = 2.
  5. π ← normalise((π ⊙ p^α)^(1/(1+α)) ⊙ exp(η_π·g)), η_π = `step_size`; then the
     ε-smoothing π ← (π + ε)/(1 + Kε), ε = `epsilon` = 1e-3.
  With `project` (default) π is finally KL-projected onto the ball around the new p
  (`xsens.measures.label_shift.project_to_kl_ball`), so the constraint holds after every
  step; `project=False` is Algorithm 1 alone (the ball is then kept only on average, by
  the α-step). η_π is not known from the paper (docs/papers/google_papers.md §I gives a formula in
  an unknown λ); 0.01 is our default.

Baselines (the paper's BASELINE, BALANCED, AGNOSTIC, FIXED, and two more):
- ERM: the `cross_entropy` term.
- `reweighted_cross_entropy`: (1/b) Σ_i (π_{y_i} / p_{y_i}) ℓ_i for a fixed target prior
  π, either `target_prior` (K numbers) or π ∝ p^`tilt` (0: uniform, BALANCED; a known
  test prior: FIXED; the test prior itself: the oracle).
- AGNOSTIC (minimax over every label distribution: the worst class) is
  `dro_label_shift` with a radius beyond −log min_y p_y (the whole simplex).
- `logit_adjusted_cross_entropy`: ℓ(f(x) + τ·log p, y), the logit-adjusted loss of Menon
  et al., "Long-tail learning via logit adjustment", ICLR 2021 (arXiv 2007.07314), τ = 1.
Every term reads the training class frequencies p_train (`class_counts` from the trainer).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from xsens.errors import ConfigError, is_finite_number
from xsens.measures import label_shift
from xsens.train import losses

DRO_DEFAULTS = {"radius": 0.1, "step_size": 0.01, "ema_rate": 0.999, "loss_clip": 2.0,
                "epsilon": 1e-3, "alpha": 1.0, "project": True}
REWEIGHT_DEFAULTS = {"tilt": 0.0, "target_prior": None}
LOGIT_ADJUST_DEFAULTS = {"tau": 1.0}
DEFAULTS = {"dro_label_shift": DRO_DEFAULTS, "reweighted_cross_entropy": REWEIGHT_DEFAULTS,
            "logit_adjusted_cross_entropy": LOGIT_ADJUST_DEFAULTS}
KINDS = tuple(DEFAULTS)
FIELDS = {kind: tuple(d) for kind, d in DEFAULTS.items()}


# ----------------------------------------------------------------------------- the π step


def ema_prior(prior: jax.Array, labels: jax.Array, rate: float) -> jax.Array:
  """p ← rate·p + (1 − rate)·(label frequencies of the batch). prior [K], labels [B]."""
  freq = jax.nn.one_hot(labels, prior.shape[-1], dtype=prior.dtype).mean(0)
  return rate * prior + (1.0 - rate) * freq


def class_losses(per_example: jax.Array, labels: jax.Array, prior: jax.Array,
                 clip: float) -> jax.Array:
  """g_y = min((1/b) Σ_{i: y_i = y} ℓ_i / p_y, clip): the gradient of the objective in π.
  per_example [B], labels [B], prior [K] -> [K]."""
  onehot = jax.nn.one_hot(labels, prior.shape[-1], dtype=per_example.dtype)
  g = (per_example @ onehot) / per_example.shape[0] / prior
  return jnp.minimum(g, clip)


def pi_step(pi: jax.Array, prior: jax.Array, g: jax.Array, *, radius: float,
            step_size: float, alpha: float = 1.0, epsilon: float = 1e-3,
            project: bool = True) -> jax.Array:
  """One proximal mirror-ascent step on π (module doc, steps 3 and 5). pi, prior, g [K]
  -> the new π [K] on the simplex (in the KL ball of `radius` around `prior` if
  `project`)."""
  a = jnp.where(label_shift.kl_divergence(pi, prior) > radius, alpha, 0.0)
  log_pi = (jnp.log(pi) + a * jnp.log(prior)) / (1.0 + a) + step_size * g
  pi = label_shift.normalize_log(log_pi)
  pi = (pi + epsilon) / (1.0 + pi.shape[-1] * epsilon)
  return label_shift.project_to_kl_ball(pi, prior, radius) if project else pi


def initial_pi(prior: jax.Array, radius: float) -> jax.Array:
  """The uniform prior, KL-projected into the ball of `radius` around `prior`. [K]."""
  uniform = jnp.full(prior.shape, 1.0 / prior.shape[-1], prior.dtype)
  return label_shift.project_to_kl_ball(uniform, prior, radius)


# ----------------------------------------------------------------------------- terms


def _no_soft_labels(batch: dict) -> None:
  if "soft_label" in batch:
    raise ValueError("the label-shift terms take no soft labels (mixup)")


def _dro_term(train_prior: np.ndarray, radius: float, step_size: float, ema_rate: float,
              loss_clip: float, epsilon: float, alpha: float, project: bool):
  def term(apply_fn, params, batch, key, state):
    del apply_fn, params, key
    _no_soft_labels(batch)
    labels = batch["label"]
    per_example = losses.cross_entropy(batch["logits"], labels)
    weights = state["pi"] / state["prior"]
    loss = jnp.mean(weights[labels] * per_example)
    prior = ema_prior(state["prior"], labels, ema_rate)
    g = class_losses(jax.lax.stop_gradient(per_example), labels, prior, loss_clip)
    pi = pi_step(state["pi"], prior, g, radius=radius, step_size=step_size, alpha=alpha,
                 epsilon=epsilon, project=project)
    return loss, {"kl": label_shift.kl_divergence(pi, prior), "pi_max": pi.max(),
                  "pi_min": pi.min(), "state": {"pi": pi, "prior": prior}}

  def init_state():
    prior = jnp.asarray(train_prior, jnp.float32)
    return {"pi": initial_pi(prior, radius), "prior": prior}
  return term, init_state


def _reweighted_term(weights: np.ndarray):
  def term(apply_fn, params, batch, key, state):
    del apply_fn, params, key, state
    _no_soft_labels(batch)
    per_example = losses.cross_entropy(batch["logits"], batch["label"])
    return jnp.mean(jnp.asarray(weights, jnp.float32)[batch["label"]] * per_example), {}
  return term


def _logit_adjusted_term(log_prior: np.ndarray, tau: float):
  def term(apply_fn, params, batch, key, state):
    del apply_fn, params, key, state
    _no_soft_labels(batch)
    logits = batch["logits"] + tau * jnp.asarray(log_prior, jnp.float32)
    return losses.cross_entropy(logits, batch["label"]).mean(), {}
  return term


def target_prior(options: dict, train_prior: np.ndarray) -> np.ndarray:
  """The fixed target prior of a `reweighted_cross_entropy` term: `target_prior`
  normalised, or ∝ p_train^tilt. [K] float64."""
  if options["target_prior"] is not None:
    t = np.asarray(options["target_prior"], np.float64)
    return t / t.sum()
  t = np.exp(options["tilt"] * np.log(train_prior))
  return t / t.sum()


def make_fns(kind: str, options: dict) -> tuple[Callable, Callable[[], Any] | None]:
  """(term fn, init_state or None) of a label-shift term with validated `options`
  (`validate_options`, which adds "train_prior")."""
  p = options["train_prior"]
  if kind == "dro_label_shift":
    return _dro_term(p, **{k: options[k] for k in DRO_DEFAULTS})
  if kind == "reweighted_cross_entropy":
    return _reweighted_term(target_prior(options, p) / p), None
  if kind == "logit_adjusted_cross_entropy":
    return _logit_adjusted_term(np.log(p), float(options["tau"])), None
  raise ValueError(f"unknown label-shift term kind {kind!r}")


# ----------------------------------------------------------------------------- validation


def _check(ok: bool, field: str, message: str, value) -> None:
  if not ok:
    raise ConfigError(field, f"{message}, got {value!r}")


def validate_options(kind: str, options: dict, path: str,
                     class_counts: np.ndarray | None) -> dict:
  """The term's options with defaults and "train_prior" (the training class frequencies
  [K]); ConfigError naming `<path>.<field>` for a bad value."""
  if class_counts is None:
    raise ConfigError(f"{path}.kind", f"a {kind} term needs the training class counts, "
                      "which a streamed dataset (data.stream) does not give")
  counts = np.asarray(class_counts, np.float64)
  if not (counts > 0).all():
    missing = np.flatnonzero(counts == 0).tolist()
    raise ConfigError(f"{path}.kind", f"a {kind} term needs every class in the training "
                      f"set; {len(missing)} classes have no example (e.g. {missing[:5]})")
  out = dict(DEFAULTS[kind], **options)
  number = lambda f: is_finite_number(out[f])
  if kind == "dro_label_shift":
    _check(number("radius") and out["radius"] >= 0, f"{path}.radius",
           "must be a finite number >= 0 (the KL radius r)", out["radius"])
    _check(number("step_size") and out["step_size"] > 0, f"{path}.step_size",
           "must be a finite number > 0 (η_π)", out["step_size"])
    _check(number("ema_rate") and 0 <= out["ema_rate"] < 1, f"{path}.ema_rate",
           "must be in [0, 1) (β of the prior's moving average)", out["ema_rate"])
    _check(number("loss_clip") and out["loss_clip"] > 0, f"{path}.loss_clip",
           "must be a finite number > 0", out["loss_clip"])
    _check(number("epsilon") and 0 <= out["epsilon"] < 1, f"{path}.epsilon",
           "must be in [0, 1) (the ε-smoothing of π)", out["epsilon"])
    _check(number("alpha") and out["alpha"] >= 0, f"{path}.alpha",
           "must be a finite number >= 0", out["alpha"])
    _check(isinstance(out["project"], bool), f"{path}.project", "must be True or False",
           out["project"])
    out = {k: (v if k == "project" else float(v)) for k, v in out.items()}
  elif kind == "reweighted_cross_entropy":
    _check(number("tilt"), f"{path}.tilt", "must be a finite number (π ∝ p_train^tilt)",
           out["tilt"])
    t = out["target_prior"]
    if t is not None:
      ok = (isinstance(t, (tuple, list)) and len(t) == len(counts)
            and all(is_finite_number(v) and v >= 0 for v in t) and sum(t) > 0)
      _check(ok, f"{path}.target_prior", f"must be None or {len(counts)} numbers >= 0 "
             "with a positive sum (one per class)", t)
  else:
    _check(number("tau") and out["tau"] >= 0, f"{path}.tau", "must be a finite number >= 0",
           out["tau"])
  out["train_prior"] = counts / counts.sum()
  return out
