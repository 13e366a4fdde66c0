"""`xsens.verify`: bounds, the nonconvex reformulation's certificates against HiGHS,
isotonic regression against PAVA, the verification measure and bad input."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens import measures
from xsens.errors import ConfigError
from xsens.models.cnn import CNN
from xsens.models.mlp import MLP
from xsens.models.vit import ViT
from xsens.train import objectives
from xsens.verify import bounds as B
from xsens.verify import isotonic, lp, nonconvex as N


def _mlp(dims, seed=0):
  keys = jax.random.split(jax.random.key(seed), 2 * len(dims))
  return tuple(B.Affine(jax.random.normal(keys[2 * i], (dims[i], dims[i + 1])) / np.sqrt(dims[i]),
                        0.1 * jax.random.normal(keys[2 * i + 1], (dims[i + 1],)))
               for i in range(len(dims) - 1))


def _conv_net(seed=0):
  """A 6×6×1 input, a 3×3 conv to 2 channels, dense 8, 4 classes (flax parameters)."""
  model = CNN(num_classes=4, features=(2,), kernel_size=3, dense_dim=8)
  variables = model.init(jax.random.key(seed), jnp.zeros((1, 6, 6, 1)))
  return model, variables


@pytest.fixture(scope="module")
def small():
  layers = _mlp([12, 10, 10, 4])
  x = jax.random.uniform(jax.random.key(7), (12,))
  label = int(jnp.argmax(B.forward(layers, x)))
  bounds = N.relaxation_bounds(layers, x, 0.1, clip_min=0.0, clip_max=1.0)
  return layers, x, label, bounds, lp.margin_values(layers, bounds, label)


def _hidden_preacts(layers, x):
  out = []
  for layer in layers:
    z = B.affine(layer, x)
    out.append(z)
    x = jax.nn.relu(z)
  return out


def test_conv_layers_match_the_flax_model_and_transpose_is_the_adjoint():
  model, variables = _conv_net()
  layers = B.network_from_model(model, variables)
  x = jax.random.uniform(jax.random.key(1), (3, 6, 6, 1))
  np.testing.assert_allclose(B.forward(layers, x.reshape(3, -1)),
                             model.apply(variables, x), rtol=1e-5, atol=1e-5)
  u, v = jax.random.normal(jax.random.key(2), (36,)), jax.random.normal(jax.random.key(3), (72,))
  np.testing.assert_allclose(v @ B.linear(layers[0], u), B.linear_t(layers[0], v) @ u,
                             rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ibp", "triangle"])
def test_bounds_hold_for_random_points_of_the_ball(method):
  model, variables = _conv_net()
  for layers, n in ((_mlp([12, 16, 16, 3]), 12),
                    (B.network_from_model(model, variables), 36)):
    x = jax.random.uniform(jax.random.key(4), (n,))
    bounds = N.relaxation_bounds(layers, x, 0.1, clip_min=0.0, clip_max=1.0,
                                 bounds_method=method)
    pts = x + jax.random.uniform(jax.random.key(5), (2000, n), minval=-0.1, maxval=0.1)
    pts = jnp.clip(pts, 0.0, 1.0)
    for z, (lo, hi) in zip(_hidden_preacts(layers, pts), bounds[1:]):
      assert bool(jnp.all(z >= lo - 1e-5)) and bool(jnp.all(z <= hi + 1e-5))
    # Points of the relaxation (random θ) stay inside the bounds too.
    theta = [jax.random.uniform(jax.random.key(6), (2000,) + b[0].shape) for b in bounds[:-1]]
    lo0, hi0 = bounds[0]
    a = lo0 + (hi0 - lo0) * theta[0]
    for k, layer in enumerate(layers[:-1], start=1):
      z = B.affine(layer, a)
      lo, hi = bounds[k]
      assert bool(jnp.all(z >= lo - 1e-5)) and bool(jnp.all(z <= hi + 1e-5))
      _, s, t, _ = B.relu_relaxation(lo, hi)
      a = jax.nn.relu(z) + theta[k] * (s * z + t - jax.nn.relu(z))


def test_triangle_bounds_are_inside_ibp_and_margin_bounds_below_the_lp(small):
  layers, x, label, bounds, lp_opt = small
  ibp = N.relaxation_bounds(layers, x, 0.1, clip_min=0.0, clip_max=1.0, bounds_method="ibp")
  for (lo, hi), (ilo, ihi) in zip(bounds[1:], ibp[1:]):
    assert bool(jnp.all(lo >= ilo - 1e-6)) and bool(jnp.all(hi <= ihi + 1e-6))
  others = np.arange(4) != label
  tri = np.asarray(B.margin_lower_bounds(layers, bounds, label, "triangle"))
  ibp_m = np.asarray(B.margin_lower_bounds(layers, bounds, label, "ibp"))
  assert np.all(tri[others] <= lp_opt[others] + 1e-5)
  assert np.all(ibp_m[others] <= lp_opt[others] + 1e-5)


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_gradient_of_the_reformulation_matches_autodiff(small, smoothing):
  layers, _, label, bounds, _ = small
  c = B.margin_matrix(label, 4)[(label + 1) % 4]
  theta = [jax.random.uniform(jax.random.key(i), b[0].shape) for i, b in enumerate(bounds[:-1])]
  _, grads, _ = N.evaluate(layers, bounds, c, theta, smoothing)
  ref = jax.grad(lambda t: N.evaluate(layers, bounds, c, t, smoothing)[0])(theta)
  for g, r in zip(grads, ref):
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pgd", "fista"])
def test_every_iterate_brackets_the_lp_and_the_gap_shrinks(small, method):
  layers, x, label, bounds, lp_opt = small
  out = N.margin_bounds(layers, x, label, 0.1, clip_min=0.0, clip_max=1.0, method=method,
                        max_iters=60, trace=True)
  others = np.arange(4) != label
  primal = np.asarray(out["primal_trace"])[others]
  dual = np.asarray(out["dual_trace"])[others]
  opt = lp_opt[others][:, None]
  assert np.all(dual <= opt + 1e-5) and np.all(opt <= primal + 1e-5)
  gap = primal - dual
  assert np.all(np.diff(gap, axis=1) <= 1e-7)          # best-so-far: never grows
  assert np.all(gap[:, -1] < 0.5 * gap[:, 0])           # and it does shrink
  c = B.margin_matrix(label, 4)[int(np.flatnonzero(others)[0])]
  theta = N.solve(functools.partial(N.evaluate, layers, bounds, c), N.init_theta(bounds),
                  method=method, max_iters=30)["theta"]
  for t in theta:
    assert float(t.min()) >= 0.0 and float(t.max()) <= 1.0


def test_nonconvex_optimum_equals_highs(small):
  layers, x, label, _, lp_opt = small
  out = N.margin_bounds(layers, x, label, 0.1, clip_min=0.0, clip_max=1.0, method="fista",
                        max_iters=3000, tol=1e-7)
  others = np.arange(4) != label
  np.testing.assert_allclose(np.asarray(out["primal"])[others], lp_opt[others], rtol=1e-4,
                             atol=1e-5)


def test_a_unit_at_the_kink_stalls_the_gradient_dual_and_the_polish_closes_it():
  """min relu(x) + relu(−x) = |x| over x ∈ [−1, 2]: the LP optimum 0 is at x = 0, the
  kink of both units, where the gradient's multipliers (0 or 1) bound it by −1 only; the
  fractions a = (½, ½) give the optimum."""
  one = jnp.ones((1, 1))
  layers = (B.Affine(jnp.concatenate([one, -one], 1), jnp.zeros(2)),
            B.Affine(jnp.ones((2, 1)), jnp.zeros(1)))
  bounds = [(jnp.array([-1.0]), jnp.array([2.0])),                 # x
            (jnp.array([-1.0, -2.0]), jnp.array([2.0, 1.0])),      # (x, −x)
            (jnp.array([0.0]), jnp.array([3.0]))]                  # the logit
  c = jnp.ones(1)
  assert lp.solve_margin(lp.build(layers, bounds), np.ones(1))["value"] == pytest.approx(0)
  optimum = [jnp.array([1 / 3 + 1e-6]), jnp.zeros(2)]   # x = 3e-6, both units on relu
  primal, _, dual = N.evaluate(layers, bounds, c, optimum)
  assert float(primal) == pytest.approx(0, abs=1e-5) and float(dual) == pytest.approx(-1)
  polished = N.polish_dual(layers, bounds, c, optimum, primal=primal, dual=dual, tol=1e-4)
  assert -1e-4 <= float(polished) <= 1e-6
  a = [jnp.array([0.5, 0.5])]
  assert float(N.dual_from_fractions(layers, bounds, c, a)) == pytest.approx(0, abs=1e-6)
  for frac in np.linspace(0, 1, 5):                      # every fraction is a lower bound
    a = [jnp.array([frac, 1 - frac / 2])]
    assert float(N.dual_from_fractions(layers, bounds, c, a)) <= 1e-6
  # Through the solver (whose primal is slow on this degenerate toy): the gradient's dual
  # stays at −1; the polish at the best θ lifts it, still a lower bound of the optimum 0.
  fn = functools.partial(N.evaluate, layers, bounds, c)
  plain = N.solve(fn, N.init_theta(bounds), max_iters=300, tol=1e-4)
  out = N.solve_margin(layers, bounds, c, max_iters=300, tol=1e-4)
  assert int(plain["iterations"]) == 300 and float(plain["dual"]) == pytest.approx(-1)
  assert -1e-2 <= float(out["dual"]) <= 1e-6      # the target (primal 0.45) overshoots
  # `patience`: the primal falls by < tol / 10 in 10 iterations: stop, gap still > tol.
  slow = N.solve(fn, N.init_theta(bounds), max_iters=300, tol=1.0, patience=10)
  assert int(slow["iterations"]) < 50 and float(slow["gap"]) > 1.0


def _kink_toy():
  """min relu(x) + relu(−x) = |x| over x ∈ [−1, 2] (LP optimum 0 at the kink of both)."""
  one = jnp.ones((1, 1))
  layers = (B.Affine(jnp.concatenate([one, -one], 1), jnp.zeros(2)),
            B.Affine(jnp.ones((2, 1)), jnp.zeros(1)))
  bounds = [(jnp.array([-1.0]), jnp.array([2.0])),
            (jnp.array([-1.0, -2.0]), jnp.array([2.0, 1.0])),
            (jnp.array([0.0]), jnp.array([3.0]))]
  return layers, bounds, jnp.ones(1)


def test_smoothed_relu_lies_between_relu_and_the_chord():
  lo = -jax.random.uniform(jax.random.key(0), (50,), minval=0.1, maxval=2.0)
  hi = jax.random.uniform(jax.random.key(1), (50,), minval=0.1, maxval=2.0)
  frac = jnp.linspace(0.0, 1.0, 41)[:, None]
  z = lo + frac * (hi - lo)                                    # [41, 50] over [l, u]
  _, s, t, _ = B.relu_relaxation(lo, hi)
  for tau in (0.0, 0.01, 0.5, 1.0):
    value, slope = N.smoothed_relu(z, lo, hi, tau)
    assert bool(jnp.all(value >= jax.nn.relu(z) - 1e-6))
    assert bool(jnp.all(value <= s * z + t + 1e-6))
    assert bool(jnp.all((slope >= 0) & (slope <= 1)))
  np.testing.assert_array_equal(N.smoothed_relu(z, lo, hi, 0.0)[0], jax.nn.relu(z))
  # τ = 1, l = −1, u = 2: w = 1, r(0) = w / 4, r(−1) = 0, r(1) = 1, slope ½ at 0.
  value, slope = N.smoothed_relu(jnp.array([-1.0, 0.0, 1.0]), -jnp.ones(3), 2 * jnp.ones(3), 1.0)
  np.testing.assert_allclose(value, [0.0, 0.25, 1.0])
  np.testing.assert_allclose(slope, [0.0, 0.5, 1.0])
  # A stable unit is never smoothed.
  assert float(N.smoothed_relu(jnp.array(0.5), jnp.array(0.1), jnp.array(1.0), 1.0)[0]) == 0.5


def test_the_kink_step_reaches_the_optimum_at_a_kink_where_fista_stalls():
  layers, bounds, c = _kink_toy()
  run = jax.jit(functools.partial(N.solve_margin, layers, bounds, c, max_iters=300, tol=1e-9,
                                  polish_steps=0), static_argnames="smoothing")
  plain = run(smoothing=())
  kink = run(smoothing=N.KINK_SMOOTHING)
  assert float(plain["primal"]) > 0.1                  # FISTA still far from 0
  assert 0.0 <= float(kink["primal"]) <= 1e-6          # a primal value: ≥ the optimum 0
  assert float(kink["dual"]) <= 1e-6                   # and a lower bound
  assert float(kink["dual"]) > float(plain["dual"])    # the smoothed fractions lift it


@pytest.mark.slow
def test_the_kink_step_matches_highs_and_brackets_it_on_random_nets():
  for seed, dims in ((1, [8, 12, 12, 5]), (2, [10, 16, 5])):
    layers = _mlp(dims, seed)
    x = jax.random.uniform(jax.random.key(10 + seed), (dims[0],))
    label = int(jnp.argmax(B.forward(layers, x)))
    bounds = N.relaxation_bounds(layers, x, 0.1, clip_min=0.0, clip_max=1.0)
    opt = lp.margin_values(layers, bounds, label)
    out = jax.jit(functools.partial(N.margin_bounds, layers, x, label, 0.1, clip_min=0.0,
                                    clip_max=1.0, max_iters=800, tol=1e-7, trace=True,
                                    smoothing=(1.0, 0.1, 0.01, 0.001, 0.0)))()
    others = np.arange(dims[-1]) != label
    primal = np.asarray(out["primal_trace"])[others]
    dual = np.asarray(out["dual_trace"])[others]
    ref = opt[others][:, None]
    assert np.all(dual <= ref + 1e-5) and np.all(ref <= primal + 1e-5)   # every iterate
    np.testing.assert_allclose(primal[:, -1], opt[others], atol=1e-4)
    np.testing.assert_allclose(np.asarray(out["dual"])[others], opt[others], atol=1e-3)


def test_smoothing_outside_the_unit_interval_is_refused(small):
  layers, _, label, bounds, _ = small
  c = B.margin_matrix(label, 4)[(label + 1) % 4]
  with pytest.raises(ValueError, match="smoothing"):
    N.solve_margin(layers, bounds, c, smoothing=(2.0, 0.0))


def test_while_loop_stops_on_the_gap_and_on_the_sign(small):
  layers, x, label, bounds, _ = small
  c = B.margin_matrix(label, 4)[(label + 1) % 4]
  fn = functools.partial(N.evaluate, layers, bounds, c)
  loose = N.solve(fn, N.init_theta(bounds), max_iters=500, tol=1.0)
  assert int(loose["iterations"]) < 500 and float(loose["gap"]) <= 1.0
  signed = N.solve(fn, N.init_theta(bounds), max_iters=500, tol=1e-9, stop_on_sign=True)
  unsigned = N.solve(fn, N.init_theta(bounds), max_iters=500, tol=1e-9)
  assert float(signed["dual"]) > 0 or float(signed["primal"]) < 0      # the sign is known
  assert int(signed["iterations"]) < int(unsigned["iterations"])       # and it stopped


def test_isotonic_regression_is_exact_against_pava():
  y = np.random.default_rng(0).normal(size=25) + np.linspace(0, 2, 25)
  with jax.enable_x64(True):
    out = isotonic.fit(jnp.asarray(y, jnp.float64), max_iters=20000, tol=1e-14)
    z = np.asarray(out["z"])
  ref = isotonic.pava(y)
  assert np.all(np.diff(ref) >= -1e-12)
  np.testing.assert_allclose(z, ref, atol=1e-6)
  assert float(out["dual"]) <= 0.5 * np.sum((ref - y) ** 2) + 1e-9


@pytest.mark.slow
def test_verified_accuracy_classifies_every_property():
  model = MLP(num_classes=3, hidden_dims=(8, 8))
  variables = model.init(jax.random.key(0), jnp.zeros((1, 4, 4, 1)))
  apply_fn = functools.partial(model.apply, train=False)
  x = jax.random.uniform(jax.random.key(1), (6, 4, 4, 1))
  y = jnp.argmax(apply_fn(variables, x), -1).at[0].set(0)
  for method in ("triangle", "fista"):   # ibp below; pgd shares fista's code path
    out = jax.jit(functools.partial(measures.verified_accuracy, apply_fn, method=method,
                                    max_iters=20, attack_steps=3))(variables, x, labels=y,
                                                   key=jax.random.key(2), epsilon=0.02)
    assert np.all(np.asarray(out["lower"]) <= np.asarray(out["upper"]) + 1e-5)
    assert not np.any(np.asarray(out["verified"]) & np.asarray(out["falsified"]))
    total = out["verified_accuracy"] + out["falsified_rate"] + out["open_rate"]
    np.testing.assert_allclose(total, 1.0, rtol=1e-6)
  zero = measures.verified_accuracy(apply_fn, variables, x, labels=y, epsilon=0.0,
                                    method="ibp")
  correct = np.asarray(jnp.argmax(apply_fn(variables, x), -1) == y)
  np.testing.assert_array_equal(np.asarray(zero["verified"]), correct)


def test_bad_input_is_a_one_line_config_error():
  with pytest.raises(ConfigError, match="verification.epsilons") as e:
    B.check_epsilon((0.01, -0.1))
  assert "\n" not in str(e.value)
  cnn = CNN(num_classes=4, features=(2, 4))
  with pytest.raises(ConfigError, match="model.features.*max-pool"):
    B.check_model(cnn)
  with pytest.raises(ConfigError, match="model.activation"):
    B.check_model(MLP(num_classes=3, activation="gelu"))
  with pytest.raises(ConfigError, match="model.name"):
    B.check_model(ViT(num_classes=3))


def test_adversarial_objective_term_and_its_errors():
  from ml_collections import ConfigDict
  term = {"kind": "adversarial", "weight": 1.0, "epsilon": 0.1, "num_steps": 2}
  cfg = ConfigDict({"objective": {"adv": term}})
  (t,) = objectives.terms_from_config(cfg, (4, 4, 1), None)
  model = MLP(num_classes=3, hidden_dims=(8,))
  params = model.init(jax.random.key(0), jnp.zeros((1, 4, 4, 1)))
  x = jax.random.uniform(jax.random.key(1), (5, 4, 4, 1))
  batch = {"image": x, "label": jnp.array([0, 1, 2, 0, 1])}
  loss, _ = t.fn(model.apply, params, batch, jax.random.key(2), None)
  clean = objectives.losses.get_loss("cross_entropy")(model.apply(params, x),
                                                      batch["label"]).mean()
  assert float(loss) >= float(clean) - 1e-6          # PGD raises the loss
  bad = ConfigDict({"objective": {"adv": dict(term, epsilon=-1.0)}})
  with pytest.raises(ConfigError, match="objective.adv.epsilon"):
    objectives.terms_from_config(bad, (4, 4, 1), None)
