"""Flip counts of the sensitivity estimators -> means, standard errors, (flips, count).

`summarize` aggregates every hard estimator (`xsens.measures.sensitivity`,
`xsens.measures.text_sensitivity`); `num_draws_for_stderr` sizes the number of draws.
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp

from xsens.measures import planning

Array = jax.Array


def summarize(counts: Array, unit_mask: Array, num_draws: int,
              example_mask: Optional[Array]) -> dict[str, Array]:
  """Aggregates flip counts into means, standard errors and (flips, count).

  Notation: example b has n_b valid units (tokens; 1 for the global and
  scattered-pixel variants), unit u flips k_bu times in R draws,
  p_bu = k_bu / R, per-example mean s_b = sum_u p_bu / n_b, normalised
  weights w_b (example_mask, zero for examples with no valid unit),
  mean m = sum_b w_b s_b, and N = number of examples with w_b > 0.

  stderr (examples and noise both random; the quantity estimated is
  S_sigma(f) = E_X ..., with the N examples a sample of the data set):
    stderr^2 = N / (N - 1) * sum_b w_b^2 (s_b - m)^2,
  i.e. sample std of per_example / sqrt(N) for equal weights. By the law of
  total variance, Var(s_b) = Var_X(s(X)) + E_X Var(s_b | X), so this single
  two-stage (ultimate-cluster) estimator already includes the within-example
  binomial term; adding that term again would double count it. Needs N >= 2;
  for N = 1 it falls back to stderr_noise.

  stderr_noise (only the Gaussian draws random, examples fixed):
    stderr_noise^2 = sum_b w_b^2 V_b,
    V_b = (1 / n_b^2) sum_u p_bu (1 - p_bu) / (R - 1)          if R >= 2,
  unbiased for Var(s_b | X) because the R draws of a unit are i.i.d.
  Bernoulli(p_bu). For R = 1 the per-unit variances are not identifiable and
  we use the binomial bound V_b = s_b (1 - s_b) / (n_b - 1) (n_b >= 2; NaN
  when n_b = 1), which over-covers since sum_u p_u(1 - p_u) <= n s(1 - s).

  Args:
    counts: [B, U] int flips per unit, in [0, num_draws].
    unit_mask: [B, U] bool, valid units.
    num_draws: R.
    example_mask: [B] bool/float weights, or None for all ones.

  Returns:
    dict with per_unit [B, U], per_example [B], mean, stderr, stderr_noise,
    flips, count.
  """
  r = num_draws
  m = unit_mask.astype(jnp.float32)
  p = counts.astype(jnp.float32) / r * m                         # [B, U]
  n_units = m.sum(-1)                                            # [B]
  safe_n = jnp.maximum(n_units, 1.0)
  per_example = p.sum(-1) / safe_n                               # [B]

  w = jnp.ones_like(per_example) if example_mask is None else (
      jnp.asarray(example_mask).astype(jnp.float32))
  w = w * (n_units > 0)
  valid = w > 0
  wn = w / jnp.maximum(w.sum(), jnp.finfo(jnp.float32).tiny)
  mean = jnp.sum(wn * per_example)
  num_valid = valid.sum()

  if r >= 2:
    var_b = jnp.sum(p * (1.0 - p) * m, -1) / (r - 1) / safe_n**2
  else:
    var_b = jnp.where(
        n_units >= 2,
        per_example * (1.0 - per_example) / jnp.maximum(n_units - 1.0, 1.0),
        jnp.nan)
  stderr_noise = jnp.sqrt(jnp.sum(jnp.where(valid, wn**2 * var_b, 0.0)))

  dev2 = jnp.where(valid, wn**2 * (per_example - mean)**2, 0.0)
  n_f = num_valid.astype(jnp.float32)
  between = n_f / jnp.maximum(n_f - 1.0, 1.0) * jnp.sum(dev2)
  stderr = jnp.where(num_valid >= 2, jnp.sqrt(between), stderr_noise)

  flips = jnp.sum(jnp.where(valid[:, None] & unit_mask, counts, 0),
                  dtype=jnp.int32)
  count = r * jnp.sum(jnp.where(valid, n_units, 0.0)).astype(jnp.int32)
  return dict(per_unit=p, per_example=per_example, mean=mean, stderr=stderr,
              stderr_noise=stderr_noise, flips=flips, count=count)


def token_result(flips_bp: Array, unit_mask: Array, num_draws: int,
                 example_mask: Optional[Array]) -> dict[str, Array]:
  """flips [B, T * R] (pair q = t * R + r) -> token_sensitivity's dict."""
  b, t = unit_mask.shape
  counts = flips_bp.reshape(b, t, num_draws).sum(-1, dtype=jnp.int32)
  out = summarize(counts, unit_mask, num_draws, example_mask)
  out["per_token"] = out.pop("per_unit")
  return out


def draw_result(flips: Array, unit_mask: Array, num_draws: int,
                example_mask: Optional[Array]) -> dict[str, Array]:
  """flips [B, R] of one unit per example -> per_example, mean, ... dict."""
  counts = flips.sum(-1, dtype=jnp.int32)[:, None]
  out = summarize(counts, unit_mask, num_draws, example_mask)
  del out["per_unit"]
  return out


def num_draws_for_stderr(target_stderr: float, pilot_mean: float,
                         num_examples: int, num_tokens: int) -> int:
  """Smallest R with sqrt(s (1 - s) / (N * T * R)) <= target_stderr.

  This is the within-example (noise-only) binomial bound for N examples of T
  tokens: it bounds `stderr_noise` (since sum_t p_t (1 - p_t) <= T s (1 - s))
  but not the between-example spread in `stderr`, which more draws cannot
  reduce. Plain Python, for planning outside jit.

  Args:
    target_stderr: > 0.
    pilot_mean: s in [0, 1], e.g. the `mean` of a small pilot run.
    num_examples: N.
    num_tokens: T (1 for the global and scattered-pixel variants).
  """
  if not target_stderr > 0:
    raise ValueError(f"target_stderr must be > 0, got {target_stderr}.")
  if not 0.0 <= pilot_mean <= 1.0:
    raise ValueError(f"pilot_mean must be in [0, 1], got {pilot_mean}.")
  planning.check_positive_int("num_examples", num_examples)
  planning.check_positive_int("num_tokens", num_tokens)
  var = pilot_mean * (1.0 - pilot_mean)
  trials = num_examples * num_tokens
  r = max(1, math.ceil(var / (trials * target_stderr**2)))
  while r > 1 and math.sqrt(var / (trials * (r - 1))) <= target_stderr:
    r -= 1  # Guards against float round-up in the ceil above.
  return r
