"""Label shift: priors over classes, KL balls around the training prior, re-weighted risk.

"Coping with label shift via distributionally robust optimisation" (Zhang, Menon, Veit,
Bhojanapalli, Kumar, Sra; ICLR 2021, arXiv 2010.12230; docs/papers/google_papers.md §I). Under a
label shift the class-conditionals p(x | y) stay and the prior moves from the training
prior p to a test prior π, so every class-averaged quantity is re-weighted:

  acc_π = Σ_y π_y · acc_y,      L_π = Σ_y π_y · L_y,

with acc_y, L_y the per-class accuracy and loss on a (balanced) test split. The ambiguity
set of the paper is the KL ball {π ∈ Δ_K : KL(π‖p) ≤ r}, KL(π‖p) = Σ_y π_y log(π_y / p_y)
(0 log 0 = 0). Two exact solutions on that ball, both one-dimensional bisections:

- `project_to_kl_ball(q, p, r)`: the KL projection argmin_{KL(π‖p) ≤ r} KL(π‖q). Its
  Lagrangian gives π_t ∝ q^(1−t) · p^t, t ∈ [0, 1] (geometric interpolation toward p), and
  KL(π_t‖p) falls monotonically in t, so t is the smallest value that lands in the ball.
  The paper's α-step of Algorithm 1, (π ⊙ p^α)^(1/(1+α)), is this family at t = α/(1+α).
- `worst_case_prior(losses, p, ρ)`: argmax_{KL(π‖p) ≤ ρ} Σ_y π_y · losses_y. The
  Lagrangian gives exponential tilting π_η ∝ p · exp(η · losses), η ≥ 0, with KL(π_η‖p)
  rising monotonically in η (to −log Σ_{argmax} p_y as η → ∞: the worst class), so η is
  the largest value that stays in the ball.

Everything here is pure and jittable; priors are float [..., K] on the simplex.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
BISECTION_STEPS = 60


def kl_divergence(pi: Array, p: Array) -> Array:
  """KL(π‖p) = Σ_y π_y log(π_y / p_y) over the last axis. pi, p [..., K] -> [...]."""
  safe = jnp.where(pi > 0, pi, 1.0)
  return jnp.sum(jnp.where(pi > 0, pi * (jnp.log(safe) - jnp.log(p)), 0.0), -1)


def normalize_log(log_weights: Array) -> Array:
  """softmax over the last axis: the prior ∝ exp(log_weights). [..., K] -> [..., K]."""
  return jax.nn.softmax(log_weights, -1)


def tilted_prior(p: Array, exponent: float | Array) -> Array:
  """π ∝ p^λ: λ = 1 is p, 0 uniform, λ > 1 toward the head, λ < 0 toward the tail. [K]."""
  return normalize_log(exponent * jnp.log(p))


def _bisect(feasible, lo: Array, hi: Array, steps: int) -> Array:
  """The end `lo` of [lo, hi] after `steps` halvings that keep feasible(lo) (a monotone
  predicate, True at lo); the caller makes sure the answer lies in [lo, hi]."""
  def body(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)
    ok = feasible(mid)
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)
  return jax.lax.fori_loop(0, steps, body, (lo, hi))[0]


def project_to_kl_ball(q: Array, p: Array, radius: float | Array,
                       steps: int = BISECTION_STEPS) -> Array:
  """The KL projection of q [K] onto {π : KL(π‖p) ≤ radius}: q itself when inside, else
  π_t ∝ q^(1−t) p^t with the smallest t (found by bisection) that lands inside. [K]."""
  log_q, log_p = jnp.log(q), jnp.log(p)
  mix = lambda t: normalize_log((1.0 - t) * log_q + t * log_p)
  # Bisection on s = 1 − t from the feasible end s = 0 (π = p).
  inside = lambda s: kl_divergence(mix(1.0 - s), p) <= radius
  s = _bisect(inside, jnp.zeros(()), jnp.ones(()), steps)
  # Radius 0 is the single point p (float rounding would otherwise let a little of q in).
  s = jnp.where(radius > 0, s, 0.0)
  return jnp.where(kl_divergence(q, p) <= radius, q, mix(1.0 - s))


def worst_case_prior(losses: Array, p: Array, radius: float | Array,
                     steps: int = BISECTION_STEPS) -> dict[str, Array]:
  """The prior in {π : KL(π‖p) ≤ radius} that maximises Σ_y π_y · losses_y, by exponential
  tilting π_η ∝ p·exp(η·losses) and bisection on η (module doc).

  losses [K] (e.g. per-class error rates), p [K] -> {"prior" [K], "value" (the maximum),
  "kl" KL(prior‖p)}. The tilt is bisected as η = u/(1−u), u ∈ [0, 1), on the losses
  rescaled to [0, 1] (a radius beyond the worst class's −log p gives the worst class).
  """
  spread = jnp.max(losses) - jnp.min(losses)
  scaled = (losses - jnp.max(losses)) / jnp.where(spread > 0, spread, 1.0)
  tilt = lambda u: normalize_log(jnp.log(p) + u / jnp.maximum(1.0 - u, 1e-7) * scaled)
  inside = lambda u: kl_divergence(tilt(u), p) <= radius
  u = jnp.where(radius > 0, _bisect(inside, jnp.zeros(()), jnp.ones(()), steps), 0.0)
  prior = tilt(u)
  return {"prior": prior, "value": prior @ losses, "kl": kl_divergence(prior, p)}


def class_sums(apply_fn, variables, inputs: Array, labels: Array, mask: Array | None = None,
                   *, num_classes: int) -> dict[str, Array]:
  """Per-class sums over the real examples of a batch: {"correct", "loss", "count"}, each
  [K] float32 (cross-entropy loss); add over batches, then divide."""
  logits = apply_fn(variables, inputs).astype(jnp.float32)
  onehot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  if mask is not None:
    onehot = onehot * mask[:, None]
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  loss = -jnp.sum(jax.nn.log_softmax(logits, -1) * jax.nn.one_hot(labels, logits.shape[-1]), -1)
  return {"correct": correct @ onehot, "loss": loss @ onehot, "count": onehot.sum(0)}


def reweighted_metrics(per_class_accuracy: Array, per_class_loss: Array,
                       priors: Array) -> dict[str, Array]:
  """Accuracy and loss under each target prior: priors [M, K] -> {"accuracy" [M],
  "loss" [M]} (per_class_* [K], from a test split)."""
  return {"accuracy": priors @ per_class_accuracy, "loss": priors @ per_class_loss}


def label_shift_accuracy(apply_fn, variables, inputs: Array, *, labels: Array,
                         key: Array | None = None, mask: Array | None = None,
                         priors: Array) -> dict[str, Array]:
  """Accuracy and cross-entropy of the model under label shift to each of `priors`.

  inputs [B, ...], labels [B], mask [B] (1 = real example), priors [M, K] (K = the model's
  classes) -> {"per_class_accuracy" [K], "per_class_loss" [K] (NaN for a class without
  examples), "accuracy" [M], "loss" [M]} (the re-weighted sums of the per-class values;
  a class absent from the batch counts as 0 there).
  """
  del key
  sums = class_sums(apply_fn, variables, inputs, labels, mask, num_classes=priors.shape[-1])
  count = sums["count"]
  acc = jnp.where(count > 0, sums["correct"] / jnp.maximum(count, 1.0), jnp.nan)
  loss = jnp.where(count > 0, sums["loss"] / jnp.maximum(count, 1.0), jnp.nan)
  out = reweighted_metrics(jnp.nan_to_num(acc), jnp.nan_to_num(loss), priors)
  return {"per_class_accuracy": acc, "per_class_loss": loss, **out}
