"""Boolean spectral bias runs (the synthetic_sensitivity study's part 2): MSE training of
a model on {±1}^n through the one loop with the exact Fourier–Walsh coefficients of the
learned function logged (`xsens.measures.boolean`), when each component is learned, and
the figure."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from xsens import paths
from xsens.measures import boolean
from xsens.train import full_batch, loop
from xsens.train.workdir import Workdir

LOGS_PER_CHUNK = 20               # One jitted chunk (and checkpoint) per 20 logs.


def boolean_trajectory(wd: Workdir, model, params, tx, tokens, target, train_mask, *,
                       steps: int, log_every: int, max_chunks: int | None = None):
  """MSE full-batch training on the masked inputs through the one loop, resumed from `wd`;
  every `log_every` steps (and at step 0) the Fourier coefficients [L + 1, 2^n] of the
  learned function on all 2^n inputs.

  Chunks (`lax.scan`s) of `log_every * LOGS_PER_CHUNK` steps, each checkpointed; the
  coefficients and losses are the workdir's array logs (per chunk, the logged points of
  its steps on the last axis). `max_chunks`: stop after that many chunks (an interruption,
  for tests). Returns (params, coefficients, train losses [L + 1], train_s).
  """
  w = train_mask / jnp.sum(train_mask)

  def predict(p):
    return model.apply({"params": p}, tokens)[:, 0]

  def loss_fn(p):
    return jnp.sum(w * jnp.square(predict(p) - target))

  def outer(carry, _):
    def inner(c, _):
      p, opt, _, _ = full_batch.optax_step(loss_fn, tx, *c)
      return (p, opt), None
    carry, _ = jax.lax.scan(inner, carry, None, length=log_every)
    f = predict(carry[0])
    return carry, (boolean.fourier_coefficients(f), jnp.sum(w * jnp.square(f - target)))

  @functools.partial(jax.jit, static_argnums=1)
  def chunk(state, num_logs):
    """`num_logs` × `log_every` steps: the state, coefficients and losses at the chunk's
    start and after each `log_every` steps ([num_logs + 1, ...])."""
    p = state["params"]
    f0 = predict(p)
    first = (boolean.fourier_coefficients(f0), jnp.sum(w * jnp.square(f0 - target)))
    (p, opt), (coeffs, losses) = jax.lax.scan(outer, (p, state["opt"]), None,
                                              length=num_logs)
    return ({"params": p, "opt": opt}, jnp.concatenate([first[0][None], coeffs]),
            jnp.concatenate([first[1][None], losses]))

  def advance(state, step, length):
    state, coeffs, losses = chunk(state, length // log_every)
    coeffs, losses = jax.device_get((coeffs, losses))
    keep = slice(0 if step == 0 else 1, None)  # The start is the previous chunk's end.
    return state, None, {"coef": np.asarray(coeffs)[keep].T, "loss": np.asarray(losses)[keep]}

  every = log_every * LOGS_PER_CHUNK
  out = full_batch.run_one_device(
      wd, lambda: {"params": params, "opt": tx.init(params)}, advance,
      loop.Schedule(steps, checkpoint_every=every, max_chunk=every), max_chunks=max_chunks)
  parts = []
  for _, end, path in wd.step_log_files():
    if end <= out.step:
      z = paths.load_npz(path)
      parts.append({k: z[k] for k in ("coef", "loss")})
  coeffs = np.concatenate([z["coef"] for z in parts], axis=-1).T
  losses = np.concatenate([z["loss"] for z in parts], axis=-1)
  return out.state["params"], coeffs, losses, full_batch.record_train_s(wd, out)


def learned_step(coef_curve: np.ndarray, target: float, fraction: float, logged_steps):
  """The first logged step at which coef / target >= fraction (None if never)."""
  hits = np.nonzero(np.asarray(coef_curve) / target >= fraction)[0]
  return int(logged_steps[hits[0]]) if len(hits) else None


def train_mask(n: int, train_fraction: float, seed: int) -> np.ndarray:
  """[2^n] float32 0/1: every input, or round(train_fraction · 2^n) (at least one) drawn by
  `np.random.default_rng(seed)`."""
  mask = np.ones(2**n, np.float32)
  if train_fraction < 1:
    keep = max(1, int(round(train_fraction * 2**n)))
    mask[:] = 0
    mask[np.random.default_rng(seed).choice(2**n, keep, replace=False)] = 1
  return mask


def target_spectrum(target) -> dict:
  """{"target_spectrum": W^k [n+1], "target_influence"} of the target function [2^n]."""
  coeffs = boolean.fourier_coefficients(jnp.asarray(target))
  return {"target_spectrum": np.asarray(boolean.degree_spectrum(coeffs)).tolist(),
          "target_influence": float(boolean.fourier_average_sensitivity(coeffs))}


def component_rows(coeffs, losses, comps, logged, learned_fraction: float, head: dict,
                   tail: dict):
  """(coef [L+1, C] of the target components, degree spectrum [L+1, n+1], total influence
  [L+1], one row per component: `head`, the component, its degree and target coefficient,
  the logged step at which it reached 50 % and `learned_fraction` of it, the final
  coefficient, train MSE and influence, then `tail`) of one trajectory (coefficients
  [L+1, 2^n], losses [L+1] at `logged` steps)."""
  coef = np.asarray(coeffs)[:, [c["index"] for c in comps]]
  spec = np.asarray(boolean.degree_spectrum(coeffs))
  infl = np.asarray(boolean.fourier_average_sensitivity(coeffs))
  rows = []
  for c, comp in enumerate(comps):
    rows.append({
        **head, "component": "x" + "·x".join(str(j) for j in comp["coords"]),
        "degree": comp["degree"], "target_coef": comp["coef"],
        "step_50%": learned_step(coef[:, c], comp["coef"], 0.5, logged),
        f"step_{int(100 * learned_fraction)}%": learned_step(
            coef[:, c], comp["coef"], learned_fraction, logged),
        "final_coef": float(coef[-1, c]), "final_train_mse": float(losses[-1]),
        "final_influence": float(infl[-1]), **tail})
  return coef, spec, infl, rows


def summary_rows(rows, models, learned_fraction: float, fmt) -> list[dict]:
  """Per model and component, `fmt` (values over seeds -> text) of the steps to 50 % and
  to `learned_fraction`, and of the final coefficient, train MSE and influence."""
  key = f"step_{int(100 * learned_fraction)}%"
  out = []
  for name in models:
    for comp in dict.fromkeys(r["component"] for r in rows):
      mine = [r for r in rows if r["model"] == name and r["component"] == comp]
      out.append({"model": name, "component": comp, "degree": mine[0]["degree"],
                  "step 50%": fmt([r["step_50%"] for r in mine], integer=True),
                  f"step {key[5:]}": fmt([r[key] for r in mine], integer=True),
                  "final coef": fmt([r["final_coef"] for r in mine]),
                  "final train MSE": fmt([r["final_train_mse"] for r in mine], 2),
                  "final influence": fmt([r["final_influence"] for r in mine])})
  return out


def learning_order(rows, comps, models, learned_fraction: float, num_seeds: int) -> dict:
  """{model: degrees of the components that every seed learned (to `learned_fraction`),
  by their mean step over seeds}."""
  key = f"step_{int(100 * learned_fraction)}%"
  order = {}
  for m in models:
    done = []
    for c in comps:
      name = "x" + "·x".join(map(str, c["coords"]))
      steps = [float(r[key]) for r in rows if r["model"] == m and r["degree"] == c["degree"]
               and r["component"] == name and r[key] is not None]
      if len(steps) == num_seeds:
        done.append((float(np.asarray(steps).mean()), c["degree"]))
    order[m] = [d for _, d in sorted(done)]
  return order
