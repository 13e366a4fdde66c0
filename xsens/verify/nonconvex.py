"""Verification by the nonconvex reformulation of the triangle relaxation.

Bunel, Hinder, Bhojanapalli, Dvijotham, "An efficient nonconvex reformulation of stagewise
convex optimization problems", NeurIPS 2020, arXiv 2010.14322. The stagewise problem

  min_{s ∈ S, z} f(s, z)  s.t.  μ_i(s, z_{<i}) ≤ z_i ≤ η_i(s, z_{<i})     (μ_i convex, η_i concave)

becomes, with z_i = μ_i + θ_i (η_i − μ_i) and θ ∈ [0, 1]^n, a problem with box constraints
only (nonconvex, with the same global optimum). For a ReLU network (layers and bounds of
`xsens.verify.bounds`; after the public google-deepmind/jax_verify
`jax_verify/src/nonconvex/nonconvex.py`, re-written here):

  x_0 = l_0 + (u_0 − l_0) ⊙ θ_0
  ẑ_k = A_k x_{k-1} + b_k,  x_k = relu(ẑ_k) + θ_k ⊙ (chord_k(ẑ_k) − relu(ẑ_k))
  f(θ) = c ᵀ (A_L x_{L-1} + b_L),  c = e_y − e_j  (the margin f_y − f_j)

with chord_k(ẑ) = u(ẑ − l)/(u − l) on ambiguous units (l < 0 < u) and relu(ẑ) on stable
ones. Every θ is a point of the triangle relaxation, so f(θ) is a primal value ≥ the LP
optimum p*.

The dual bound, read off the gradient. With multipliers μ_k for ẑ_k = A_k x_{k-1} + b_k,
weak duality gives for every μ

  p* ≥ g(μ) = cᵀb_L + Σ_k μ_kᵀ b_k + Σ_i min(ν_0,i l_0,i, ν_0,i u_0,i)
              + Σ_{k,i} min_{ẑ ∈ {l, clip(0, l, u), u}} (ν_k,i relu(ẑ) − μ_k,i ẑ),

ν_k = A_{k+1}ᵀ μ_{k+1} (μ_L = c), because the triangle is the convex hull of those three
points. We take μ_k = ∂f/∂ẑ_k at the current θ (the backpropagated gradient); at a
non-degenerate optimum these are the optimal multipliers and the gap closes. So every
iterate has a primal value and a dual bound, the duality gap is the stopping rule, and a
property is verified when the dual bound is > 0.

Kinks. Where the LP optimum puts a unit at the kink of its triangle (ẑ = 0 on the lower
face), the optimal multiplier is a fraction a ∈ [0, 1] of ν, which the gradient (a ∈ {0, 1}
on either side of the kink) never gives, and the primal itself stalls: f is not smooth
there (relu's kink, composed through the layers), so the backtracking steps shrink and
FISTA crawls along the kink (after 5,000 iterations 74 of 108 properties of random
20-20-10 / 20-20-20-10 nets at ε ∈ {0.02, 0.1} were within 1e-4 of the LP, docs/results.md).
Two remedies, one per side. `polish_dual` runs
projected ascent on g over the fractions a of the units with |ẑ| ≤ kink_tol (u − l), the
others held at the gradient's 0 / 1; every a gives a valid bound, so this only tightens it.
`solve_margin` is `solve` (which may stop early on a stalled primal: `patience`) followed
by that polish when the gap is still open.

The kink-aware primal step (ours: the paper's modified step that escapes spurious
stationary points is not known beyond its abstract, docs/papers/google_papers.md §H).
`smoothing` = (τ_1 > ... > τ_S) replaces relu, on ambiguous units, by the Huber-type

  r_τ(ẑ) = (ẑ + w)² / (4w) on |ẑ| < w,  relu(ẑ) elsewhere,   w = τ min(−l, u),

so x_k = r_τ(ẑ_k) + θ_k (chord_k(ẑ_k) − r_τ(ẑ_k)). For τ ≤ 1, r_τ is convex with
r_τ(l) = 0 and r_τ(u) = u, so relu ≤ r_τ ≤ chord on [l, u]: every θ is still a point of
the triangle relaxation and f(θ) a valid primal value ≥ p*, while f is smooth near the
kink (it only misses a corner of area O(w²) of each triangle). `solve_margin` minimises
for τ_1, then warm-starts τ_2 from the best θ, ..., the last τ usually 0 (relu itself),
the iterations split evenly (continuation; Nesterov-style smoothing). The gradient's
multiplier at a unit is r_τ'(ẑ) ∈ [0, 1]: a fraction a, so the dual bound read off the
gradient (`dual_from_fractions`) closes on kinks too. We chose smoothing over a step
recovered from the dual's fractions because it needs no LP-side information, keeps every
iterate feasible (the primal stays a certificate) and is one more argument of the same
FISTA loop; `smoothing=()` is the plain FISTA of the paper's code. Measured
(docs/benchmarks.md, "Hard instances"): 108/108 random 20-wide properties within 1e-4 of
HiGHS after 300 iterations (plain FISTA 94/108); worse than plain FISTA at ≤ 100
iterations, and slower on easy instances (each smoothed stage uses its whole share).

Solvers (`solve`): projected gradient and FISTA (Beck & Teboulle 2009, textbook momentum
t_{k+1} = (1 + √(1 + 4t_k²))/2 from t_1 = 1; jax_verify's LinesearchFistaOptimizer uses
t ← 1 + √(1 + t²)/2 from t_0 = 0 instead), both with backtracking on the step (shrink 0.5,
grow 1.5 after a step that needed no backtracking, within [1e-5, 100], the jax_verify
defaults of docs/papers/google_papers.md §H), each one `lax.while_loop` (or `lax.scan` to record
the trace).
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from xsens.verify import bounds as bounds_lib
from xsens.verify.bounds import Affine, Bounds, affine, linear_t, relu_relaxation

Array = jax.Array

METHODS = ("pgd", "fista")
# docs/papers/google_papers.md §H defaults (jax_verify LinesearchFistaOptimizer).
DEFAULTS = dict(max_step=100.0, min_step=1e-5, shrink=0.5, grow=1.5, tol=1e-2)
# `polish_dual` (ours, not from the spec): ascent steps, kink width, first step.
DEFAULTS.update(polish_steps=100, kink_tol=1e-3, polish_step=1.0)
# The kink-aware step's continuation (ours; module doc): τ_1 .. τ_S, ending at relu.
KINK_SMOOTHING = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001, 0.0)


# ----------------------------------------------------------------------------- the problem


def init_theta(bounds: Bounds, value: float = 0.5) -> list[Array]:
  """θ_0 [n_0] and θ_k [n_k] for every hidden layer, all `value`."""
  return [jnp.full_like(b[0], value) for b in bounds[:-1]]


def _vertex_min(mu: Array, nu: Array, lo: Array, hi: Array) -> Array:
  """Σ_i min over the triangle's vertices ẑ ∈ {l, clip(0, l, u), u} of ν relu(ẑ) − μ ẑ."""
  mid = jnp.clip(0.0, lo, hi)
  vals = [nu * jax.nn.relu(z) - mu * z for z in (lo, mid, hi)]
  return jnp.sum(jnp.minimum(jnp.minimum(vals[0], vals[1]), vals[2]))


def smoothed_relu(z: Array, lo: Array, hi: Array, smoothing) -> tuple[Array, Array]:
  """(r_τ(ẑ), r_τ'(ẑ)) [n] of the module doc: relu with its kink rounded off over
  |ẑ| < w = τ min(−l, u) on ambiguous units (relu ≤ r_τ ≤ chord for τ ∈ [0, 1]); relu and
  its derivative 1[ẑ > 0] where w = 0 (τ = 0 or a stable unit). z, lo, hi: [n]; τ: scalar."""
  ambiguous = (lo < 0) & (hi > 0)
  w = jnp.where(ambiguous, smoothing * jnp.minimum(-lo, hi), 0.0)
  inside = jnp.abs(z) < w
  w_safe = jnp.where(inside, w, 1.0)
  value = jnp.where(inside, (z + w) ** 2 / (4 * w_safe), jax.nn.relu(z))
  slope = jnp.where(inside, (z + w) / (2 * w_safe), (z > 0).astype(z.dtype))
  return value, slope


def _forward(layers: Sequence[Affine], bounds: Bounds, theta: list[Array], smoothing=0.0
             ) -> tuple[Array, list[tuple[Array, Array, Array, Array]]]:
  """x_{L-1} and, per hidden layer, (ẑ_k, chord slope s_k, chord(ẑ_k) − r_τ(ẑ_k),
  r_τ'(ẑ_k)) (r_0 = relu)."""
  lo0, hi0 = bounds[0]
  x = lo0 + (hi0 - lo0) * theta[0]
  saved = []
  for k, layer in enumerate(layers[:-1], start=1):
    z = affine(layer, x)
    lo, hi = bounds[k]
    _, s, t, _ = relu_relaxation(lo, hi)
    r, slope = smoothed_relu(z, lo, hi, smoothing)
    h = s * z + t - r
    x = r + theta[k] * h
    saved.append((z, s, h, slope))
  return x, saved


def evaluate(layers: Sequence[Affine], bounds: Bounds, c: Array, theta: list[Array],
             smoothing=0.0) -> tuple[Array, list[Array], Array]:
  """(f(θ), ∂f/∂θ, g(μ)) of the module doc, μ the backpropagated gradient; with
  smoothing τ > 0, of the smoothed lower function r_τ (f(θ) still a primal value, g(μ) with
  the fractions r_τ'(ẑ) still a lower bound).

  Args:
    layers: the network's L affine layers.
    bounds: [(l_0, u_0), ..., (l_{L-1}, u_{L-1})] (input box, hidden pre-activations; a
      trailing logits entry is ignored).
    c: [K] objective weights on the logits.
    theta: θ_0 [n_0], θ_1 [n_1], ..., θ_{L-1}.
    smoothing: τ ∈ [0, 1] of `smoothed_relu` (scalar; 0: relu).
  """
  lo0, hi0 = bounds[0]
  x, saved = _forward(layers, bounds, theta, smoothing)
  value = c @ affine(layers[-1], x)
  nu = linear_t(layers[-1], c)
  grads = [None] * len(theta)
  for k in range(len(layers) - 1, 0, -1):
    _, s, h, slope = saved[k - 1]
    grads[k] = nu * h
    nu = linear_t(layers[k - 1], nu * ((1 - theta[k]) * slope + theta[k] * s))
  grads[0] = nu * (hi0 - lo0)
  return value, grads, dual_from_fractions(layers, bounds, c, [sv[3] for sv in saved])


def dual_bound(layers: Sequence[Affine], bounds: Bounds, c: Array, zs: list[Array]) -> Array:
  """g(μ) of the module doc with μ_k = max(ν_k, 0) relu'(ẑ_k) + min(ν_k, 0) s_k.

  ν_k = ∂f/∂x_k is backpropagated; a positive ν_k pushes x_k down to its lower bound
  relu(ẑ_k), a negative one up to the chord (slope s_k), as in the Wolfe dual of
  jax_verify's `nonconvex/duals.py`. zs: the current pre-activations ẑ_1..ẑ_{L-1}.
  """
  return dual_from_fractions(layers, bounds, c, [(z > 0).astype(c.dtype) for z in zs])


def dual_from_fractions(layers: Sequence[Affine], bounds: Bounds, c: Array,
                        fractions: list[Array]) -> Array:
  """g(μ) with μ_k = max(ν_k, 0) a_k + min(ν_k, 0) s_k, for any a_k ∈ [0, 1] [n_k]
  (`dual_bound`: a_k = relu'(ẑ_k)); a lower bound of the LP optimum for every a."""
  dual = c @ layers[-1].bias
  nu = linear_t(layers[-1], c)
  for k in range(len(layers) - 1, 0, -1):
    _, s, _, _ = relu_relaxation(*bounds[k])
    mu = jnp.maximum(nu, 0) * fractions[k - 1] + jnp.minimum(nu, 0) * s
    dual = dual + mu @ layers[k - 1].bias + _vertex_min(mu, nu, *bounds[k])
    nu = linear_t(layers[k - 1], mu)
  lo0, hi0 = bounds[0]
  return dual + jnp.sum(jnp.minimum(nu * lo0, nu * hi0))


def polish_dual(layers: Sequence[Affine], bounds: Bounds, c: Array, theta: list[Array], *,
                primal: Array, dual: Array, tol: float = DEFAULTS["tol"],
                steps: int = DEFAULTS["polish_steps"], kink_tol: float = DEFAULTS["kink_tol"],
                step_scale: float = DEFAULTS["polish_step"],
                stop_on_sign: bool = False) -> Array:
  """A tighter dual bound at θ: max(dual, g(a)) over projected ascent on the fractions a.

  The units at a kink at θ (ambiguous, |ẑ| ≤ kink_tol (u − l)) get a free a ∈ [0, 1],
  starting at relu'(ẑ); the others keep relu'(ẑ) (module doc, "Kinks"). Supergradient
  steps with Polyak's step size, step_scale (primal − g(a)) / ‖∂g/∂a‖² (the primal value
  as the target: it is ≥ max g), step_scale halved after every step that does not raise
  the best g (the target overshoots by the primal's own gap); at most `steps` (a
  `lax.while_loop`: none when no unit is at a kink or primal − dual ≤ tol already).

  Args:
    theta: the primal point (e.g. `solve`'s best θ); primal, dual: its value and the best
      dual bound so far (scalars).
    stop_on_sign: also stop once the bound is > 0 (verified) or the primal < 0.
  """
  zs = [sv[0] for sv in _forward(layers, bounds, theta)[1]]
  kinks = [(jnp.abs(z) <= kink_tol * (hi - lo)) & (lo < 0) & (hi > 0)
           for z, (lo, hi) in zip(zs, bounds[1:len(zs) + 1])]
  any_kink = jnp.any(jnp.stack([m.any() for m in kinks])) if kinks else jnp.array(False)
  value_and_grad = jax.value_and_grad(functools.partial(dual_from_fractions, layers, bounds,
                                                        c))

  def body(state):
    t, a, best, scale = state
    value, grad = value_and_grad(a)
    grad = [jnp.where(m, g, 0.0) for g, m in zip(grad, kinks)]
    norm2 = sum(jnp.vdot(g, g) for g in grad)
    scale = jnp.where(value > best, scale, scale / 2)
    step = scale * (primal - value) / jnp.maximum(norm2, jnp.finfo(c.dtype).tiny)
    a = [jnp.clip(ai + step * g, 0.0, 1.0) for ai, g in zip(a, grad)]
    return t + 1, a, jnp.maximum(best, value), scale

  def running(state):
    t, _, best, _ = state
    go = (t < steps) & (primal - best > tol) & any_kink
    return go & (best <= 0) & (primal >= 0) if stop_on_sign else go

  start = (jnp.zeros((), jnp.int32), [(z > 0).astype(c.dtype) for z in zs], dual,
           jnp.asarray(2 * step_scale, c.dtype))
  return jax.lax.while_loop(running, body, start)[2]


# ----------------------------------------------------------------------------- the solvers


def _vdot(a, b) -> Array:
  return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _where(cond, a, b):
  return jax.tree.map(lambda x, y: jnp.where(cond, x, y), a, b)


def solve(fn: Callable, theta0, *, method: str = "fista", max_iters: int = 100,
          tol: float = DEFAULTS["tol"], stop_on_sign: bool = False, step0: float = 1.0,
          max_step: float = DEFAULTS["max_step"], min_step: float = DEFAULTS["min_step"],
          shrink: float = DEFAULTS["shrink"], grow: float = DEFAULTS["grow"],
          patience: int | None = None, trace: bool = False, incumbent: dict | None = None
          ) -> dict:
  """Minimises fn over θ ∈ [0, 1] (a pytree) by projected gradient or FISTA.

  One iteration tries the step y − η∇f(y) projected on the box; it is accepted when
  f(cand) ≤ f(y) + ⟨∇f(y), cand − y⟩ + ‖cand − y‖²/(2η) (or η is at min_step), else η
  shrinks and the next iteration retries. Every candidate is feasible, so the best f seen
  is a primal value; the best dual bound seen is kept too.

  Args:
    fn: θ -> (value, grad (pytree like θ), dual bound); pure and jittable.
    theta0: the start (inside the box).
    method: "pgd" (no momentum: one fn call per iteration) or "fista" (two: the candidate
      and the momentum point).
    max_iters: iterations (static; with trace, exactly this many).
    tol: stop when best primal − best dual ≤ tol (absolute).
    stop_on_sign: also stop once the sign of the optimum is known (dual > 0: verified;
      primal < 0: the relaxation cannot verify).
    patience: also stop after this many iterations without the best primal falling by
      more than tol / 10 (a stalled primal: the gap is the dual's, see `polish_dual`);
      None: never.
    trace: run all `max_iters` iterations in a `lax.scan` and return the history.
    incumbent: an earlier run's dict (theta, primal, dual): its best values count from the
      start (the gap test included); e.g. the previous stage of a continuation.

  Returns:
    dict with theta (the iterate of the best primal value), primal, dual, gap,
    iterations (scalars);
    with trace also primal_trace, dual_trace [max_iters] (best so far after each iteration).
  """
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")
  momentum = method == "fista"
  clip = functools.partial(jax.tree.map, lambda v: jnp.clip(v, 0.0, 1.0))
  f0, g0, d0 = fn(theta0)
  dtype = f0.dtype
  best, primal, dual = theta0, f0, d0
  if incumbent is not None:
    better = incumbent["primal"] < f0
    best = _where(better, incumbent["theta"], theta0)
    primal = jnp.minimum(f0, incumbent["primal"])
    dual = jnp.maximum(d0, incumbent["dual"])
  state = dict(x=theta0, y=theta0, f_y=f0, g_y=g0, t=jnp.ones((), dtype), best=best,
               step=jnp.asarray(step0, dtype), clean=jnp.array(True), primal=primal,
               dual=dual, it=jnp.zeros((), jnp.int32), mark=primal,
               mark_it=jnp.zeros((), jnp.int32))

  def body(s):
    y, step = s["y"], s["step"]
    cand = clip(jax.tree.map(lambda a, g: a - step * g, y, s["g_y"]))
    f_c, g_c, d_c = fn(cand)
    diff = jax.tree.map(jnp.subtract, cand, y)
    quad = s["f_y"] + _vdot(s["g_y"], diff) + _vdot(diff, diff) / (2 * step)
    slack = 8 * jnp.finfo(dtype).eps * (1 + jnp.abs(quad))   # rounding in f and quad
    accept = (f_c <= quad + slack) | (step <= min_step)
    new = dict(s)
    if momentum:
      t_next = (1 + jnp.sqrt(1 + 4 * s["t"] ** 2)) / 2
      beta = (s["t"] - 1) / t_next
      y_acc = jax.tree.map(lambda a, b: a + beta * (a - b), cand, s["x"])
      new["y"] = _where(accept, y_acc, y)
      new["t"] = jnp.where(accept, t_next, s["t"])
      new["f_y"], new["g_y"], d_y = fn(new["y"])
    else:
      new["y"] = _where(accept, cand, y)
      new["f_y"], new["g_y"] = _where(accept, (f_c, g_c), (s["f_y"], s["g_y"]))
      d_y = d_c
    new["x"] = _where(accept, cand, s["x"])
    grown = jnp.where(s["clean"], jnp.minimum(step * grow, max_step), step)
    new["step"] = jnp.where(accept, grown, jnp.maximum(step * shrink, min_step))
    new["clean"] = accept
    new["best"] = _where(f_c < s["primal"], cand, s["best"])
    new["primal"] = jnp.minimum(s["primal"], f_c)
    new["dual"] = jnp.maximum(s["dual"], jnp.maximum(d_c, d_y))
    new["it"] = s["it"] + 1
    moved = new["primal"] < s["mark"] - tol / 10
    new["mark"] = jnp.where(moved, new["primal"], s["mark"])
    new["mark_it"] = jnp.where(moved, new["it"], s["mark_it"])
    return new

  def running(s):
    go = (s["it"] < max_iters) & (s["primal"] - s["dual"] > tol)
    if stop_on_sign:
      go = go & (s["dual"] <= 0) & (s["primal"] >= 0)
    if patience is not None:
      go = go & (s["it"] - s["mark_it"] < patience)
    return go

  if trace:
    def scan_body(s, _):
      s = body(s)
      return s, (s["primal"], s["dual"])
    state, (primals, duals) = jax.lax.scan(scan_body, state, None, length=max_iters)
    extra = dict(primal_trace=primals, dual_trace=duals)
  else:
    state, extra = jax.lax.while_loop(running, body, state), {}
  return dict(theta=state["best"], primal=state["primal"], dual=state["dual"],
              gap=state["primal"] - state["dual"], iterations=state["it"], **extra)


# ----------------------------------------------------------------------------- verification


def relaxation_bounds(layers: Sequence[Affine], x: Array, epsilon, *, clip_min=None,
                      clip_max=None, bounds_method: str = "triangle") -> Bounds:
  """Bounds of the input box (x flat [n_0]) and of every ẑ_k ("ibp" or "triangle")."""
  lo, hi = bounds_lib.input_box(x, epsilon, clip_min, clip_max)
  if bounds_method == "ibp":
    return bounds_lib.interval_bounds(layers, lo, hi)
  if bounds_method == "triangle":
    return bounds_lib.triangle_bounds(layers, lo, hi)
  raise ValueError(f"bounds_method must be 'ibp' or 'triangle', got {bounds_method!r}")


def smoothed_solve(layers: Sequence[Affine], bounds: Bounds, c: Array, theta0, *,
                   smoothing: Sequence[float] = (), max_iters: int = 100,
                   **solver_options) -> dict:
  """`solve` on f_τ for τ = smoothing[0], smoothing[1], ... (module doc, the kink-aware
  step), each stage warm-started at the best θ so far and given max_iters // S iterations
  (the last one the rest; max_iters may be traced, without trace); () or (0,): plain
  `solve` on f. Same dict as `solve` (iterations summed; a trace [max_iters] is the best
  so far across the stages)."""
  taus = tuple(smoothing) or (0.0,)
  if any(not 0.0 <= t <= 1.0 for t in taus):
    raise ValueError(f"smoothing values must lie in [0, 1], got {taus!r}")
  per = [max_iters // len(taus)] * (len(taus) - 1)
  per.append(max_iters - sum(per))
  out, traces, iters = None, [], 0
  for tau, n in zip(taus, per):
    if isinstance(n, int) and n == 0:
      continue
    fn = functools.partial(evaluate, layers, bounds, c, smoothing=tau)
    out = solve(fn, theta0 if out is None else out["theta"], max_iters=n, incumbent=out,
                **solver_options)
    iters = iters + out["iterations"]
    if "primal_trace" in out:
      traces.append((out.pop("primal_trace"), out.pop("dual_trace")))
  out["iterations"] = iters
  if traces:
    out["primal_trace"] = jnp.concatenate([p for p, _ in traces])
    out["dual_trace"] = jnp.concatenate([d for _, d in traces])
  return out


def solve_margin(layers: Sequence[Affine], bounds: Bounds, c: Array, *,
                 theta_init: float = 0.5, polish_steps: int = DEFAULTS["polish_steps"],
                 kink_tol: float = DEFAULTS["kink_tol"], smoothing: Sequence[float] = (),
                 **solver_options) -> dict:
  """min cᵀ logits over the relaxation: `solve` from θ = theta_init (`smoothed_solve`
  with a continuation `smoothing`, e.g. KINK_SMOOTHING: the kink-aware step; (): plain
  FISTA / PGD), then, if the gap is still > tol (and, with stop_on_sign, the sign
  unknown), `polish_dual` at the best θ.

  Returns `solve`'s dict; dual and gap include the polish (a trace does not).
  """
  out = smoothed_solve(layers, bounds, c, init_theta(bounds, theta_init), smoothing=smoothing,
                       **solver_options)
  if polish_steps:
    out["dual"] = polish_dual(layers, bounds, c, out["theta"], primal=out["primal"],
                              dual=out["dual"], tol=solver_options.get("tol", DEFAULTS["tol"]),
                              steps=polish_steps, kink_tol=kink_tol,
                              stop_on_sign=solver_options.get("stop_on_sign", False))
    out["gap"] = out["primal"] - out["dual"]
  return out


def margin_bounds(layers: Sequence[Affine], x: Array, label: Array, epsilon, *,
                  clip_min=None, clip_max=None, bounds_method: str = "triangle",
                  theta_init: float = 0.5, **solver_options) -> dict:
  """Primal values and dual bounds of min f_y − f_j over the relaxation, for every j.

  Args:
    layers: the network.
    x: one flat input [n_0]; label: its int class; epsilon: the L∞ radius.
    solver_options: of `solve_margin` and `solve` (method, max_iters, tol, stop_on_sign,
      patience, polish_steps, trace, ...).

  Returns:
    `solve`'s dict with a leading [K] axis (j = y: primal = dual = +inf, gap 0,
    iterations 0); theta dropped.
  """
  bounds = relaxation_bounds(layers, x, epsilon, clip_min=clip_min, clip_max=clip_max,
                             bounds_method=bounds_method)
  num_classes = layers[-1].num_out
  cs = bounds_lib.margin_matrix(label, num_classes, x.dtype)

  def one(c):
    out = solve_margin(layers, bounds, c, theta_init=theta_init, **solver_options)
    out.pop("theta")
    return out

  out = jax.vmap(one)(cs)
  is_label = jnp.arange(num_classes) == label
  for name in ("primal", "dual", "primal_trace", "dual_trace"):
    if name in out:
      mask = is_label.reshape((-1,) + (1,) * (out[name].ndim - 1))
      out[name] = jnp.where(mask, jnp.inf, out[name])
  out["gap"] = jnp.where(is_label, 0.0, out["gap"])
  out["iterations"] = jnp.where(is_label, 0, out["iterations"])
  return out
