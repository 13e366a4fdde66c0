"""Label shift (Zhang et al., ICLR 2021): the π step, the exact worst case, the DRO term and
its baselines, exact resume with π, and bad input (xsens/train/dro.py,
xsens/measures/label_shift.py)."""

import itertools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from mlcollections_configs import label_shift as ls_cfg
from xsens import measures
from xsens.config_utils import run_config
from xsens.errors import ConfigError
from xsens.measures import label_shift
from xsens.models import get_model
from xsens.studies import label_shift as ls_study
from xsens.train import dro, losses, objectives, trainer

COUNTS = np.array([60, 25, 10, 5])


def _simplex_grid(step: float) -> np.ndarray:
  """Every π on the 3-class simplex with coordinates on a grid of `step`. [N, 3]."""
  a = np.arange(0.0, 1.0 + step / 2, step)
  x, y = np.meshgrid(a, a, indexing="ij")
  keep = x + y <= 1.0 + 1e-12
  return np.stack([x[keep], y[keep], np.clip(1.0 - x[keep] - y[keep], 0, 1)], -1)


def _kl(pi, p):
  pi = np.asarray(pi, np.float64)
  return np.sum(np.where(pi > 0, pi * np.log(np.where(pi > 0, pi, 1.0) / p), 0.0), -1)


def test_pi_step_keeps_pi_in_the_simplex_and_in_the_ball():
  step = jax.jit(jax.vmap(lambda pi, p, g, r: dro.pi_step(pi, p, g, radius=r, step_size=0.5)))
  free = jax.jit(jax.vmap(lambda pi, p, g, r: dro.pi_step(pi, p, g, radius=r, step_size=0.5,
                                                          project=False)))
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.ones(6), 64).astype(np.float32)
  pi = rng.dirichlet(np.ones(6), 64).astype(np.float32)
  g = rng.uniform(0, 2, (64, 6)).astype(np.float32)
  r = rng.choice([0.0, 0.01, 0.1, 1.0], 64).astype(np.float32)
  for fn, in_ball in ((step, True), (free, False)):
    new = np.asarray(fn(pi, p, g, r))
    np.testing.assert_allclose(new.sum(-1), 1.0, atol=1e-5)
    assert (new > 0).all()
    if in_ball:
      assert (_kl(new, p) <= r + 1e-5).all()
  # Without the projection the α-step alone pulls an outside π toward p (spec step 3, 5).
  out = np.asarray(free(pi, p, np.zeros_like(g), np.zeros(64, np.float32)))
  assert (_kl(out, p) < _kl(pi, p) + 1e-6).all()


def test_pi_step_is_exponentiated_gradient_inside_the_ball():
  p = jnp.asarray([0.4, 0.3, 0.2, 0.1])
  pi, g = p, jnp.asarray([0.0, 1.0, 2.0, 0.5])
  new = dro.pi_step(pi, p, g, radius=10.0, step_size=0.1, epsilon=0.0)
  want = np.asarray(p) * np.exp(0.1 * np.asarray(g))
  np.testing.assert_allclose(new, want / want.sum(), rtol=1e-5)


def test_kl_projection_matches_brute_force_on_three_classes():
  grid = _simplex_grid(0.002)
  p, q = np.array([0.6, 0.3, 0.1]), np.array([0.1, 0.2, 0.7])
  for radius in (0.05, 0.3):
    pi = np.asarray(label_shift.project_to_kl_ball(jnp.asarray(q), jnp.asarray(p), radius))
    inside = grid[_kl(grid, p) <= radius]
    best = _kl(inside, q).min()
    assert _kl(pi, p) <= radius + 1e-5
    assert _kl(pi, q) <= best + 1e-4
  inside_q = np.asarray(label_shift.project_to_kl_ball(jnp.asarray(q), jnp.asarray(p), 5.0))
  np.testing.assert_allclose(inside_q, q, rtol=1e-6)


@pytest.mark.parametrize("radius", [0.0, 0.02, 0.2, 0.7, 3.0])
def test_worst_case_prior_matches_brute_force_on_three_classes(radius):
  grid = _simplex_grid(0.001)
  p, err = np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.45, 0.3])
  out = jax.jit(label_shift.worst_case_prior)(jnp.asarray(err), jnp.asarray(p), radius)
  brute = (grid[_kl(grid, p) <= radius] @ err).max()
  assert float(out["kl"]) <= radius + 1e-5
  np.testing.assert_allclose(np.asarray(out["prior"]).sum(), 1.0, atol=1e-5)
  assert float(out["value"]) == pytest.approx(brute, abs=2e-3)
  assert float(out["value"]) >= brute - 2e-3
  if radius >= -np.log(p[1]):   # The ball holds the worst class: all mass on it.
    assert float(out["value"]) == pytest.approx(0.45, abs=1e-4)


def test_r_zero_reduces_to_erm_with_prior_weights():
  opts = dro.validate_options("dro_label_shift", {"radius": 0.0}, "objective.t", COUNTS)
  fn, init = dro.make_fns("dro_label_shift", opts)
  state = init()
  p = COUNTS / COUNTS.sum()
  np.testing.assert_allclose(state["pi"], p, rtol=1e-5)   # π = p: the ball is {p}.
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(32, 4)), jnp.float32)
  for t in range(3):
    labels = jnp.asarray(rng.integers(0, 4, 32))
    loss, aux = fn(None, None, {"logits": logits, "label": labels}, None, state)
    erm = losses.cross_entropy(logits, labels).mean()
    assert float(loss) == pytest.approx(float(erm), rel=1e-5)
    state = aux["state"]
    np.testing.assert_allclose(state["pi"], state["prior"], rtol=1e-4)


def test_r_zero_trains_like_erm():
  shape = (4, 4, 1)
  model = get_model("mlp", 4, shape, hidden_dims=(8,))
  tx = optax.sgd(0.3)
  erm = [objectives.make_term("t", "cross_entropy", 1.0, {})]
  opts = dro.validate_options("dro_label_shift", {"radius": 0.0}, "objective.t", COUNTS)
  zero = [objectives.make_term("t", "dro_label_shift", 1.0, opts)]
  params = {}
  for name, terms in (("erm", erm), ("dro", zero)):
    state = trainer.init_state(model, tx, shape, jax.random.key(0), terms=terms)
    step = jax.jit(trainer.make_train_step(model, tx, terms))
    data = np.random.default_rng(3)
    for _ in range(4):
      batch = {"image": jnp.asarray(data.normal(size=(16, *shape)), jnp.float32),
               "label": jnp.asarray(data.integers(0, 4, 16))}
      state, _ = step(state, batch, jax.random.key(1))
    params[name] = state["params"]
  for a, b in zip(jax.tree.leaves(params["erm"]), jax.tree.leaves(params["dro"])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_ema_prior_and_class_losses_in_closed_form():
  prior = jnp.asarray([0.25, 0.25, 0.5])
  labels = jnp.asarray([0, 0, 2, 1])
  new = dro.ema_prior(prior, labels, 0.9)
  np.testing.assert_allclose(new, 0.9 * np.array([0.25, 0.25, 0.5])
                             + 0.1 * np.array([0.5, 0.25, 0.25]), rtol=1e-6)
  per = jnp.asarray([1.0, 3.0, 0.4, 10.0])
  g = dro.class_losses(per, labels, prior, clip=2.0)
  np.testing.assert_allclose(g, [min(4.0 / 4 / 0.25, 2.0), min(10.0 / 4 / 0.25, 2.0),
                                 0.4 / 4 / 0.5], rtol=1e-6)


def test_reweighting_and_logit_adjustment_in_closed_form():
  p = COUNTS / COUNTS.sum()
  rng = np.random.default_rng(4)
  logits = rng.normal(size=(8, 4)).astype(np.float32)
  labels = rng.integers(0, 4, 8)
  ce = np.asarray(losses.cross_entropy(jnp.asarray(logits), jnp.asarray(labels)))
  batch = {"logits": jnp.asarray(logits), "label": jnp.asarray(labels)}
  for opts, target in (({"tilt": 0.0}, np.full(4, 0.25)),
                       ({"target_prior": (1.0, 1.0, 2.0, 4.0)}, np.array([1, 1, 2, 4]) / 8)):
    o = dro.validate_options("reweighted_cross_entropy", opts, "objective.t", COUNTS)
    fn, init = dro.make_fns("reweighted_cross_entropy", o)
    assert init is None
    want = np.mean((target / p)[labels] * ce)
    assert float(fn(None, None, batch, None, None)[0]) == pytest.approx(want, rel=1e-5)
  o = dro.validate_options("logit_adjusted_cross_entropy", {"tau": 1.0}, "objective.t", COUNTS)
  fn, _ = dro.make_fns("logit_adjusted_cross_entropy", o)
  adj = logits + np.log(p)
  want = np.mean(np.log(np.exp(adj).sum(-1)) - adj[np.arange(8), labels])
  assert float(fn(None, None, batch, None, None)[0]) == pytest.approx(want, rel=1e-5)


def test_label_shift_accuracy_reweights_per_class_accuracy_on_a_padded_batch():
  w = jnp.eye(3)
  x = jnp.asarray([[1.0, 0, 0], [0, 1.0, 0], [1.0, 0, 0], [0, 0, 1.0], [0, 1.0, 0]])
  y = jnp.asarray([0, 1, 1, 2, 0])           # Right, right, wrong, right, (padding).
  mask = jnp.asarray([1.0, 1, 1, 1, 0])
  priors = jnp.asarray([[1 / 3, 1 / 3, 1 / 3], [0.0, 1.0, 0.0]])
  out = jax.jit(lambda v, x, y, m, pr: measures.label_shift_accuracy(
      lambda v, x: x @ v, v, x, labels=y, mask=m, priors=pr))(w, x, y, mask, priors)
  np.testing.assert_allclose(out["per_class_accuracy"], [1.0, 0.5, 1.0])
  np.testing.assert_allclose(out["accuracy"], [2.5 / 3, 0.5], rtol=1e-6)


def _term_config(**fields):
  return ml_collections.ConfigDict({"objective": {"t": {"kind": "dro_label_shift",
                                                        "weight": 1.0, **fields}}})


@pytest.mark.parametrize("fields, field, part", [
    ({"radius": -0.1}, "objective.t.radius", "must be a finite number >= 0"),
    ({"radius": float("nan")}, "objective.t.radius", "must be a finite number >= 0"),
    ({"epsilon": 1.0}, "objective.t.epsilon", "must be in [0, 1)"),
    ({"epsilon": -1e-3}, "objective.t.epsilon", "must be in [0, 1)"),
    ({"ema_rate": 1.0}, "objective.t.ema_rate", "must be in [0, 1)"),
    ({"ema_rate": -0.5}, "objective.t.ema_rate", "must be in [0, 1)"),
    ({"step_size": 0.0}, "objective.t.step_size", "must be a finite number > 0"),
    ({"loss_clip": 0.0}, "objective.t.loss_clip", "must be a finite number > 0"),
    ({"project": 1}, "objective.t.project", "True or False"),
    ({"kind": "reweighted_cross_entropy", "target_prior": (1.0, 2.0)},
     "objective.t.target_prior", "4 numbers >= 0"),
    ({"kind": "logit_adjusted_cross_entropy", "tau": -1.0}, "objective.t.tau", ">= 0"),
    ({"radius_typo": 1.0}, "objective.t.radius_typo", "unknown field"),
])
def test_bad_term_fields_are_one_line_errors(fields, field, part):
  with pytest.raises(ConfigError) as e:
    objectives.terms_from_config(_term_config(**fields), (4, 4, 1), losses.cross_entropy,
                                 class_counts=COUNTS)
  assert e.value.field == field and part in e.value.message and "\n" not in str(e.value)


def test_label_shift_terms_need_class_counts():
  with pytest.raises(ConfigError, match="objective.t.kind: a dro_label_shift term needs"):
    objectives.terms_from_config(_term_config(), (4, 4, 1), losses.cross_entropy)


@pytest.mark.parametrize("field, value", [
    ("radii", (-1.0,)), ("dirichlet_concentrations", (0.0,)), ("num_dirichlet", -1),
    ("tilts", ()), ("eval_batch_size", 0)])
def test_bad_study_fields_are_one_line_errors(field, value):
  config = ls_cfg.get_config("smoke")
  config.label_shift[field] = value
  with pytest.raises(ConfigError) as e:
    ls_study.validate(config)
  assert e.value.field == f"label_shift.{field}" and "\n" not in str(e.value)


def test_config_variants_and_methods():
  for setup, ratio in itertools.product(("mnist5k", "digits"), (1, 10, 100)):
    config = ls_cfg.get_config(f"setup={setup},ratio={ratio}")
    fractions = config.train.data.class_fractions
    assert float(fractions["0"]) == 1.0
    assert float(fractions["9"]) == pytest.approx(1.0 / ratio)
  config = ls_cfg.get_config("setup=cifar100_lt,smoke")
  assert config.train.data.name == "cifar100" and len(config.train.data.class_fractions) == 100
  assert set(ls_cfg.get_config("").runs) == {"erm", "balanced", "agnostic", "fixed",
                                            "logit_adjust", "oracle", "dro"}
  assert ls_cfg.get_config("").num_seeds == 3


@pytest.mark.slow
def test_resumed_dro_run_equals_an_uninterrupted_one_bit_for_bit(tmp_path):
  """3 steps, then the same run extended to 6 from its checkpoint, equals 6 straight steps:
  the parameters and the DRO state (π, p) bit for bit."""
  config = run_config(ls_cfg.get_config("smoke"), "dro")
  config.data.test_split = "test[:64]"
  config.checkpoint_every = 3
  config.total_steps = 3
  first = trainer.train_and_evaluate(config, str(tmp_path / "resumed"))
  config.total_steps = 6
  resumed = trainer.train_and_evaluate(config, str(tmp_path / "resumed"))
  straight = trainer.train_and_evaluate(config, str(tmp_path / "straight"))
  assert resumed.summary["steps"] == straight.summary["steps"] == 6
  pi3 = first.objective_state["task"]["pi"]
  assert not np.array_equal(pi3, straight.objective_state["task"]["pi"])  # π moved.
  for a, b in zip(jax.tree.leaves((resumed.variables, resumed.objective_state)),
                  jax.tree.leaves((straight.variables, straight.objective_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_ball_is_in_kl_pi_to_p_not_the_reverse_direction():
  """The spec: xsens uses KL(π‖p) (as ShahryarBQ/DRO); tableshift computes KL(p‖π)."""
  p, pi = jnp.asarray([0.7, 0.2, 0.1]), jnp.asarray([0.2, 0.3, 0.5])
  assert float(label_shift.kl_divergence(pi, p)) == pytest.approx(
      float(np.sum(np.array([0.2, 0.3, 0.5]) * np.log(np.array([0.2, 0.3, 0.5]) /
                                                      np.array([0.7, 0.2, 0.1])))), rel=1e-5)
  new = dro.pi_step(pi, p, jnp.asarray([0.0, 0.0, 2.0]), radius=0.3, step_size=1.0)
  assert float(label_shift.kl_divergence(new, p)) == pytest.approx(0.3, abs=1e-4)
  assert abs(float(label_shift.kl_divergence(p, new)) - 0.3) > 1e-2   # Not the reverse ball.


def test_iterated_pi_step_reaches_the_closed_form_fixed_point_of_the_smoothing():
  """Two classes, constant class losses g = (c, 0), inside the ball (α = 0): the mirror step
  moves π by e^{ηc} and the ε-smoothing pulls it back toward uniform; the iteration's fixed
  point x = π_0 solves (1+2ε)(a−1)x² + ((1+2ε) − ε(a−1) − a)x − ε = 0 with a = e^{ηc}."""
  eta, c, eps = 0.01, 1.5, 1e-3
  a = np.exp(eta * c)
  coeffs = [(1 + 2 * eps) * (a - 1), (1 + 2 * eps) - eps * (a - 1) - a, -eps]
  x = max(r.real for r in np.roots(coeffs) if 0 < r.real < 1)
  step = jax.jit(lambda pi: dro.pi_step(pi, jnp.asarray([0.5, 0.5]), jnp.asarray([c, 0.0]),
                                        radius=1e3, step_size=eta, epsilon=eps))
  pi = jnp.asarray([0.5, 0.5])
  for _ in range(3000):
    pi = step(pi)
  np.testing.assert_allclose(np.asarray(pi), [x, 1 - x], atol=1e-4)
  assert x > 0.9  # A constant loss gap drives π far from uniform despite the smoothing.


def test_without_a_loss_gap_the_smoothing_returns_pi_to_uniform():
  """Class losses equal (all clipped, or all ≈ 0 once the training set is fitted): π decays
  to uniform by the factor 1/(1+Kε) per step, whatever it was."""
  k, eps = 10, 1e-3
  pi0 = jnp.asarray(np.r_[0.55, np.full(k - 1, 0.05)], jnp.float32)
  step = jax.jit(lambda pi, g: dro.pi_step(pi, jnp.full((k,), 0.1), g, radius=1e3,
                                           step_size=0.01, epsilon=eps))
  pi = pi0
  for _ in range(300):
    pi = step(pi, jnp.full((k,), 2.0))
  want = 0.1 + (np.asarray(pi0) - 0.1) / (1 + k * eps) ** 300
  np.testing.assert_allclose(np.asarray(pi), want, atol=1e-5)
