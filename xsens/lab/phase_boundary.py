"""Phase boundaries of a grid of runs: where a loss crosses a level, and power laws.

For runs on a grid N × SNR × trials (test loss [nN, nS, T]):
- `fit_boundary`: per N the SNR where the trial-mean loss crosses `cutoff` (`crossing_snr`,
  interpolated in log SNR), then least squares log N = log c − k log SNR (`fit_power_law`),
  i.e. the boundary N·SNR^k = c, with a bootstrap-over-trials 95 % interval for k.
- `fit_boundary_logistic`: a logistic fit of 1[loss < cutoff] on (log N, log SNR) over all
  runs, whose decision line gives k (`logistic_k`), with the same bootstrap.
- `power_law_fit` / `convergence_fit`: log t = a + Σ b_f log f of a time t (GD steps to a
  train-loss threshold) over the grid's factors.
Used by the phase diagram of Jiang et al., NeurIPS 2024 (arXiv 2409.19345), Fig. 1.
"""

from __future__ import annotations

import numpy as np


def crossing_snr(snrs, mean_loss, cutoff: float) -> float:
  """SNR where `mean_loss` (over increasing `snrs`) last crosses `cutoff` from above.

  Linear interpolation of the loss in log SNR between the last grid point at or above the
  cutoff and the next one; NaN if the loss is below the cutoff on the whole row or never
  gets below it.
  """
  above = np.nonzero(np.asarray(mean_loss) >= cutoff)[0]
  if len(above) == 0 or above[-1] == len(snrs) - 1:
    return float("nan")
  j = above[-1]
  l0, l1 = mean_loss[j], mean_loss[j + 1]
  s0, s1 = np.log(snrs[j]), np.log(snrs[j + 1])
  w = (l0 - cutoff) / (l0 - l1) if l0 != l1 else 0.5
  return float(np.exp(s0 + w * (s1 - s0)))


def fit_power_law(n_values, crossings) -> tuple[float, float, float]:
  """Least squares log N = log c − k log SNR* over finite crossings: (k, c, stderr of k)."""
  n_values, crossings = np.asarray(n_values, float), np.asarray(crossings, float)
  ok = np.isfinite(crossings)
  if ok.sum() < 2:
    return float("nan"), float("nan"), float("nan")
  xs, ys = np.log(crossings[ok]), np.log(n_values[ok])
  slope, intercept = np.polyfit(xs, ys, 1)
  se = float("nan")
  if ok.sum() > 2:
    resid = ys - (slope * xs + intercept)
    se = float(np.sqrt(resid @ resid / (ok.sum() - 2) / np.sum((xs - xs.mean()) ** 2)))
  return float(-slope), float(np.exp(intercept)), se


def fit_boundary(n_values, snrs, test_loss, cutoff: float, *, bootstrap: int = 200,
                 seed: int = 0) -> dict:
  """Fits N·SNR^k = c to the cutoff crossing of the trial-mean test loss.

  Args:
    n_values: [nN]; snrs: [nS] increasing; test_loss: [nN, nS, T].
    cutoff: the loss level of the boundary (0.2 in Fig. 1b).
    bootstrap: resamples of the trials (independently per cell) for a 95 % interval of k.

  Returns:
    {"k", "c", "k_stderr", "k_ci95": [lo, hi], "crossings": [nN], "num_points"}.
  """
  mean = np.nanmean(test_loss, axis=-1)
  cross = np.array([crossing_snr(snrs, row, cutoff) for row in mean])
  k, c, se = fit_power_law(n_values, cross)
  ks = []
  rng = np.random.default_rng(seed)
  t = test_loss.shape[-1]
  for _ in range(bootstrap):
    pick = rng.integers(0, t, size=test_loss.shape)
    m = np.take_along_axis(test_loss, pick, axis=-1).mean(-1)
    kb = fit_power_law(n_values, [crossing_snr(snrs, row, cutoff) for row in m])[0]
    if np.isfinite(kb):
      ks.append(kb)
  ci = [float(np.percentile(ks, 2.5)), float(np.percentile(ks, 97.5))] if len(ks) > 10 else [
      float("nan")] * 2
  return {"k": k, "c": c, "k_stderr": se, "k_ci95": ci, "crossings": cross.tolist(),
          "num_points": int(np.isfinite(cross).sum()), "bootstrap_valid": len(ks)}


def _logistic_coef(xs, ys, ridge: float) -> np.ndarray:
  """Ridge-penalised logistic regression of ys ∈ {0, 1} on [1, xs]: the coefficients."""
  from scipy import optimize  # pylint: disable=g-import-not-at-top
  design = np.concatenate([np.ones((len(xs), 1)), xs], axis=1)
  sign = 2.0 * ys - 1.0
  pen = np.array([0.0] + [ridge] * xs.shape[1])

  def f(w):
    z = sign * (design @ w)
    loss = np.logaddexp(0.0, -z).sum() + 0.5 * pen @ (w * w)
    g = -(design * (sign * np.exp(-np.logaddexp(0.0, z)))[:, None]).sum(0) + pen * w
    return loss, g

  return optimize.minimize(f, np.zeros(design.shape[1]), jac=True, method="L-BFGS-B").x


def logistic_k(n_values, snrs, test_loss, cutoff: float, *, ridge: float = 1e-3) -> tuple:
  """k from a logistic fit of 1[test loss < cutoff] on (log N, log SNR) over all runs.

  P(benign) = σ(a + b log N + c log SNR); the decision line a + b log N + c log SNR = 0 is
  N·SNR^k = C with k = c / b and C = exp(−a / b) (i.e. SNR ∝ N^{−1/k}). A small ridge keeps
  the fit finite on separable labels (it scales the coefficients, barely the ratio).

  Args:
    n_values: [nN]; snrs: [nS]; test_loss: [nN, nS, T] (NaN runs are left out).

  Returns:
    (k, C); NaN if the labels are all one class or b <= 0.
  """
  loss = np.asarray(test_loss, float)
  ln = np.broadcast_to(np.log(np.asarray(n_values, float))[:, None, None], loss.shape)
  ls = np.broadcast_to(np.log(np.asarray(snrs, float))[None, :, None], loss.shape)
  ok = np.isfinite(loss)
  lab = (loss[ok] < cutoff).astype(float)
  if lab.min() == lab.max():
    return float("nan"), float("nan")
  feats = np.stack([ln[ok], ls[ok]], axis=1)
  mu, sd = feats.mean(0), feats.std(0)
  sd = np.where(sd > 0, sd, 1.0)
  w = _logistic_coef((feats - mu) / sd, lab, ridge)
  b, c = w[1] / sd[0], w[2] / sd[1]
  a = w[0] - w[1] * mu[0] / sd[0] - w[2] * mu[1] / sd[1]
  if not b > 0:
    return float("nan"), float("nan")
  return float(c / b), float(np.exp(-a / b))


def fit_boundary_logistic(n_values, snrs, test_loss, cutoff: float, *, bootstrap: int = 200,
                          seed: int = 0) -> dict:
  """`logistic_k` with a bootstrap-over-trials 95 % interval (as `fit_boundary`)."""
  test_loss = np.asarray(test_loss, float)
  k, c = logistic_k(n_values, snrs, test_loss, cutoff)
  ks = []
  rng = np.random.default_rng(seed)
  t = test_loss.shape[-1]
  for _ in range(bootstrap):
    pick = rng.integers(0, t, size=test_loss.shape)
    kb = logistic_k(n_values, snrs, np.take_along_axis(test_loss, pick, axis=-1), cutoff)[0]
    if np.isfinite(kb):
      ks.append(kb)
  ci = [float(np.percentile(ks, 2.5)), float(np.percentile(ks, 97.5))] if len(ks) > 10 else [
      float("nan")] * 2
  return {"k": k, "c": c, "k_ci95": ci, "bootstrap_valid": len(ks)}


def power_law_fit(t, factors: dict) -> dict:
  """Least squares log t = a + Σ_f b_f log f over the entries with t ≥ 1 and finite t.

  Args:
    t: [...] positive times (GD steps); NaN marks a run to leave out.
    factors: {name: [...] positive values broadcastable to t's shape}.
  Returns:
    {"a", "b_<name>" per factor, "r2", "runs"}; NaN coefficients when fewer usable runs
    than factors + 2.
  """
  t = np.asarray(t, float)
  ok = np.isfinite(t) & (t >= 1)
  cols = [np.log(np.broadcast_to(np.asarray(v, float), t.shape)[ok]) for v in factors.values()]
  out = {"runs": int(ok.sum())}
  if ok.sum() < len(factors) + 2:
    return out | {"a": float("nan"), "r2": float("nan")} | {f"b_{k}": float("nan")
                                                            for k in factors}
  design = np.stack([np.ones(ok.sum())] + cols, 1)
  target = np.log(t[ok])
  coef, *_ = np.linalg.lstsq(design, target, rcond=None)
  resid = target - design @ coef
  r2 = 1.0 - float(resid @ resid) / max(float(((target - target.mean()) ** 2).sum()), 1e-12)
  return out | {"a": float(coef[0]), "r2": r2} | {
      f"b_{k}": float(b) for k, b in zip(factors, coef[1:])}


def convergence_fit(steps, converged, n_values, mu_norms) -> dict:
  """`power_law_fit` of the steps to train loss < ε on N and ‖μ‖ over the converged runs.

  Args:
    steps, converged: [nN, nMu, trials] GD steps to train loss < ε and the flag.
    n_values [nN], mu_norms [nMu].
  Returns:
    {"a", "b_n", "b_mu", "r2", "runs", "median_steps", "max_steps_seen"}: t ∝ N^b_n ‖μ‖^b_mu.
  """
  steps = np.where(np.asarray(converged) > 0.5, np.asarray(steps, float), np.nan)
  seen = steps[np.isfinite(steps)]
  fit = power_law_fit(steps, {"n": np.asarray(n_values, float)[:, None, None],
                              "mu": np.asarray(mu_norms, float)[None, :, None]})
  return fit | {"median_steps": float(np.median(seen)) if seen.size else float("nan"),
                "max_steps_seen": float(seen.max()) if seen.size else float("nan")}
