"""Benign overfitting study: data model, one-layer ViT, GD, vmapped sweep, resume, report."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlcollections_configs import benign_overfitting as bo_config
from xsens import studies
from xsens.data import signal_noise as sn
from xsens.errors import ConfigError
from xsens.lab import gd_sweep, phase_boundary
from xsens.models import one_layer_vit as vit
from xsens.models import two_layer_cnn as cnn
from xsens.report import phase_diagram
from xsens.studies import benign_overfitting as bo
from xsens.train import full_batch_gd as gd
from xsens.train.workdir import Workdir


def tiny_config(**sweep):
  config = bo_config.get_config("smoke")
  config.dynamics.enabled = False
  config.sweep.update(sweep)
  return config


# ---------------------------------------------------------------------------------- data


def test_snr_and_row_map():
  assert sn.snr(1.0, 0.2, 1024) == 0.15625
  assert sn.snr(32.0, 0.2, 1024) == pytest.approx(5.0)
  assert sn.grid_n(0) == 2 and sn.grid_n(99) == 20 and sn.grid_n(10) == 4
  assert sn.default_strong_noise_factor(16) == 20.0


def test_sample_statistics():
  n, m, d, mu, sigma = 64, 5, 512, 3.0, 0.5
  x, y, y_clean = sn.sample(jax.random.key(0), n, num_tokens=m, d=d, mu_norm=mu,
                            sigma_p=sigma)
  x, y = np.asarray(x), np.asarray(y)
  assert x.shape == (n, m, d) and y.shape == (n,)
  assert y.sum() == 0 and y[0] == 1 and np.all(y[:10].reshape(5, 2).sum(1) == 0)
  np.testing.assert_array_equal(y, y_clean)
  # Token 1: μ₊ = ‖μ‖e₁ for y=+1, μ₋ = ‖μ‖e₂ for y=−1.
  np.testing.assert_allclose(x[y > 0, 0], np.tile(mu * np.eye(d)[0], (32, 1)))
  np.testing.assert_allclose(x[y < 0, 0], np.tile(mu * np.eye(d)[1], (32, 1)))
  strong = 5 * np.sqrt(m) * sigma
  assert x[:, 1].std() == pytest.approx(strong, rel=0.03)
  assert x[:, 2:].std() == pytest.approx(sigma, rel=0.03)
  assert abs(x[:, 2:].mean()) < 0.01
  # Norms concentrate at σ√d.
  np.testing.assert_allclose(np.linalg.norm(x[:, 2:], axis=-1).mean(), sigma * np.sqrt(d),
                             rtol=0.02)


def test_project_noise_and_layouts():
  kw = dict(num_tokens=4, d=16, mu_norm=2.0, sigma_p=1.0)
  x, _, _ = sn.sample(jax.random.key(1), 10, project_noise=True, **kw)
  assert np.all(np.asarray(x)[:, 1:, :2] == 0)
  mus = sn.signal_vectors(2.0, 16)
  assert float(mus[0] @ mus[1]) == 0.0  # μ₊ ⟂ μ₋, noise ⟂ both.
  assert np.all(np.asarray(x)[:, 1:] @ np.asarray(mus).T == 0)
  x, y, _ = sn.sample(jax.random.key(1), 10, layout="plus_minus", project_noise=True, **kw)
  np.testing.assert_allclose(np.asarray(x)[:, 0, 0], 2.0 * np.asarray(y))
  assert np.all(np.asarray(x)[:, 1:, 0] == 0) and np.any(np.asarray(x)[:, 1:, 1] != 0)


def test_projected_noise_is_orthogonal_to_mu_and_default_is_unchanged():
  kw = dict(num_tokens=5, d=64, mu_norm=3.0, sigma_p=0.7)
  key = jax.random.key(7)
  x_def, y, _ = sn.sample(key, 12, **kw)
  x_off, _, _ = sn.sample(key, 12, project_noise=False, **kw)
  x_on, _, _ = sn.sample(key, 12, project_noise=True, **kw)
  x_def, x_off, x_on = map(np.asarray, (x_def, x_off, x_on))
  np.testing.assert_array_equal(x_def, x_off)  # The default is the unprojected draw.
  # ...which is exactly the pre-option formula: signal token, then N(0, 1) × per-token std.
  k_noise, _ = jax.random.split(key)
  raw = np.asarray(jax.random.normal(k_noise, (12, 4, 64), jnp.float32))
  stds = np.array([5 * np.sqrt(5) * 0.7] + [0.7] * 3, np.float32)
  np.testing.assert_array_equal(x_def[:, 1:], raw * stds[None, :, None])
  assert np.abs(x_def[:, 1:, :2]).max() > 0  # Unprojected noise does touch span{μ±}.
  for layout in sn.LAYOUTS:
    xp, _, _ = sn.sample(key, 12, project_noise=True, layout=layout, **kw)
    mus = np.asarray(sn.signal_vectors(3.0, 64, layout), np.float64)
    inner = np.asarray(xp, np.float64)[:, 1:] @ mus.T
    assert np.abs(inner).max() <= 1e-6
  # Projection only zeroes span{μ₊, μ₋}: the other coordinates are the same draw.
  np.testing.assert_array_equal(x_on[:, 1:, 2:], x_def[:, 1:, 2:])
  np.testing.assert_array_equal(x_on[:, 0], x_def[:, 0])
  config = bo_config.get_config()
  assert config.data.project_noise is False
  assert bo._data_kwargs(config.data)["project_noise"] is False


def test_label_flip_rate():
  _, y, yc = sn.sample(jax.random.key(2), 4000, num_tokens=2, d=4, mu_norm=1.0, sigma_p=1.0,
                       label_flip=0.2)
  assert np.mean(np.asarray(y) != np.asarray(yc)) == pytest.approx(0.2, abs=0.03)


# ---------------------------------------------------------------------------------- model


def numpy_vit(params, w_o, x):
  """Hand-written (1/M) Σ_l softmax(x_lᵀ W_Q W_Kᵀ Xᵀ) X W_V w_O for one example x [M, d]."""
  wq, wk, wv = (np.asarray(params[k], np.float64) for k in ("wq", "wk", "wv"))
  x = np.asarray(x, np.float64)
  total = 0.0
  for l in range(x.shape[0]):
    logits = np.array([x[l] @ wq @ wk.T @ x[j] for j in range(x.shape[0])])
    s = np.exp(logits - logits.max())
    s /= s.sum()
    total += s @ x @ wv @ np.asarray(w_o, np.float64)
  return total / x.shape[0]


def test_hand_vjp_equals_autodiff_of_the_model():
  """`apply_hand_vjp` (what the sweeps differentiate): the value of `apply` bit for bit,
  and every gradient (params, w_O, x; a weighted loss, leading batch axes) as autodiff's."""
  params, w_o = vit.init(jax.random.key(0), 32, 8, 6)
  x = jax.random.normal(jax.random.key(1), (3, 5, 7, 32))
  y = jnp.sign(jax.random.normal(jax.random.key(2), (3, 5)))
  np.testing.assert_array_equal(vit.apply_hand_vjp(params, w_o, x), vit.apply(params, w_o, x))

  def grads(apply_fn):
    loss = lambda p, w, xs: jnp.sum(jax.nn.softplus(-y * apply_fn(p, w, xs)) * jnp.arange(5))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(params, w_o, x)

  want, got = grads(vit.apply), grads(vit.apply_hand_vjp)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6 * float(jnp.abs(a).max()))
  assert bo.model_fns(bo_config.get_config("smoke"), "vit")[1] is vit.apply_hand_vjp


def test_forward_matches_numpy_and_both_forms():
  params, w_o = vit.init(jax.random.key(0), 6, 3, 4, init="gaussian", init_std=0.7)
  x = jax.random.normal(jax.random.key(1), (5, 4, 6))
  f = np.asarray(vit.apply(params, w_o, x))
  np.testing.assert_allclose(f, [numpy_vit(params, w_o, xi) for xi in x], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(f, vit.apply_matrix_form(params, w_o, x), rtol=1e-5, atol=1e-6)


def test_forward_two_token_hand_example():
  # W_Q = W_K = I (d=d_h=2): logits x_lᵀx_j; x_1 = (1, 0), x_2 = (0, 2).
  params = {"wq": jnp.eye(2), "wk": jnp.eye(2), "wv": jnp.eye(2)}
  w_o = jnp.array([1.0, 1.0])
  x = jnp.array([[1.0, 0.0], [0.0, 2.0]])
  s1 = np.exp([1.0, 0.0]) / np.exp([1.0, 0.0]).sum()   # query x_1: logits (1, 0)
  s2 = np.exp([0.0, 4.0]) / np.exp([0.0, 4.0]).sum()   # query x_2: logits (0, 4)
  a = (s1 + s2) / 2
  expected = a[0] * 1.0 + a[1] * 2.0  # values x_jᵀ W_V w_O = 1, 2.
  assert float(vit.apply(params, w_o, x)) == pytest.approx(expected, rel=1e-6)
  np.testing.assert_allclose(vit.pooled_attention(params, x), a, rtol=1e-6)


def test_torch_scaled_init_bounds():
  params, w_o = vit.init(jax.random.key(0), 1024, 512, 512, init_divisor=16.0)
  assert set(params) == {"wq", "wk", "wv"}  # w_O is not a trained parameter.
  bound = 1 / np.sqrt(1024) / 16
  assert np.abs(np.asarray(params["wq"])).max() <= bound
  assert np.abs(np.asarray(params["wq"])).max() > 0.95 * bound
  assert np.abs(np.asarray(w_o)).max() <= 1 / np.sqrt(512)


def test_cnn_matches_formula():
  params, _ = cnn.init(jax.random.key(0), 5, 3, sigma_0=1.0)
  x = jax.random.normal(jax.random.key(1), (4, 2, 5))
  w = np.asarray(params["w"])
  z = np.einsum("npd,jrd->njrp", np.asarray(x), w)
  f = (np.maximum(z, 0) ** 3).sum(-1).mean(-1)
  np.testing.assert_allclose(cnn.apply(params, None, x), f[:, 0] - f[:, 1], rtol=1e-5)


# ---------------------------------------------------------------------------------- GD


def _tiny_problem():
  x, y, _ = sn.sample(jax.random.key(3), 6, num_tokens=3, d=5, mu_norm=1.5, sigma_p=0.3)
  params, w_o = vit.init(jax.random.key(4), 5, 3, 4, init="gaussian", init_std=0.5)
  return params, w_o, x, y, jnp.ones(6)


@pytest.mark.slow
def test_gd_step_equals_finite_difference_step():
  params, w_o, x, y, mask = _tiny_problem()
  eta = 0.3
  _, new = gd.gd_step(vit.apply, params, w_o, x, y, mask, eta)
  with jax.enable_x64(True):
    p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    args = [jnp.asarray(np.asarray(a), jnp.float64) for a in (w_o, x, y, mask)]
    loss_fn = jax.jit(lambda p: gd.loss_fn(vit.apply, p, *args))  # Compiled once, in x64.
    loss = lambda p: float(loss_fn(p))
    h = 1e-6
    for name in p64:
      fd = np.zeros_like(p64[name])
      for idx in np.ndindex(fd.shape):
        plus = {k: v.copy() for k, v in p64.items()}
        minus = {k: v.copy() for k, v in p64.items()}
        plus[name][idx] += h
        minus[name][idx] -= h
        fd[idx] = (loss(plus) - loss(minus)) / (2 * h)
      np.testing.assert_allclose(new[name], p64[name] - eta * fd, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_w_o_is_frozen():
  params, w_o, x, y, mask = _tiny_problem()
  w_o_before = np.asarray(w_o).copy()
  out, steps, _ = gd.fit(vit.apply, params, w_o, x, y, mask, eta=0.5, max_steps=20, eps=1e-9)
  assert int(steps) == 20 and set(out) == {"wq", "wk", "wv"}
  assert all(not np.allclose(out[k], params[k]) for k in out)
  np.testing.assert_array_equal(np.asarray(w_o), w_o_before)
  grads = jax.grad(gd.loss_fn, argnums=1)(vit.apply, params, w_o, x, y, mask)
  assert set(grads) == {"wq", "wk", "wv"}


def test_early_stopping_records_first_crossing():
  params, w_o, x, y, mask = _tiny_problem()
  eta, eps = 1.0, 0.3
  losses, p = [], params
  for _ in range(200):
    loss, p_next = gd.gd_step(vit.apply, p, w_o, x, y, mask, eta)
    losses.append(float(loss))
    if loss < eps:
      break
    p = p_next
  expected = next(t for t, l in enumerate(losses) if l < eps)
  out, steps, converged = jax.jit(
      lambda p: gd.fit(vit.apply, p, w_o, x, y, mask, eta=eta, max_steps=200, eps=eps))(params)
  assert int(steps) == expected > 0 and bool(converged)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), out, p)
  # Never crossing: max_steps updates and converged=False.
  _, steps, converged = gd.fit(vit.apply, params, w_o, x, y, mask, eta=eta, max_steps=3,
                               eps=1e-9)
  assert int(steps) == 3 and not bool(converged)


def test_fit_differentiates_only_the_steps_that_update():
  """The stopping check is a forward alone: unbatched (the sweeps' groups of one), the
  backward runs once per update, not at the step whose loss falls under eps."""
  params, w_o, x, y, mask = _tiny_problem()
  backward_calls = []

  @jax.custom_vjp
  def counted_apply(p, w, x):
    return vit.apply(p, w, x)

  def backward(res, g):
    jax.debug.callback(lambda: backward_calls.append(1))
    return jax.vjp(vit.apply, *res)[1](g)

  counted_apply.defvjp(lambda p, w, x: (vit.apply(p, w, x), (p, w, x)), backward)
  fit = jax.jit(lambda p: gd.fit(counted_apply, p, w_o, x, y, mask, eta=1.0, max_steps=200,
                                 eps=0.3))
  out, steps, converged = fit(params)
  jax.effects_barrier()
  assert bool(converged) and len(backward_calls) == int(steps) > 0
  reference = gd.fit(vit.apply, params, w_o, x, y, mask, eta=1.0, max_steps=200, eps=0.3)
  assert int(reference[1]) == int(steps)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), out,
               reference[0])


# ---------------------------------------------------------------------------------- sweep


@pytest.mark.slow
def test_vmapped_sweep_equals_individual_runs():
  config = tiny_config()
  run = bo.make_run_fn(config, "vit", 8)
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(3))
  ns, mus = jnp.array([2, 8, 4]), jnp.array([1.0, 64.0, 8.0])
  batched = jax.jit(jax.vmap(run))(keys, ns, mus)
  single = jax.jit(run)
  for i in range(3):
    one = single(keys[i], ns[i], mus[i])
    assert int(one["steps"]) == int(batched["steps"][i])
    assert bool(one["converged"]) == bool(batched["converged"][i])
    for k in ("test_loss", "train_loss", "test_accuracy"):
      np.testing.assert_allclose(one[k], batched[k][i], rtol=2e-4, atol=1e-5)


@pytest.mark.slow
def test_interrupted_sweep_resumes_to_the_same_grid(tmp_path):
  config = tiny_config()
  full = bo.run_sweep(config, str(tmp_path / "a"), "vit", log=lambda s: None)
  assert full["complete"] and full["chunks_computed"] == 2
  part = bo.run_sweep(config, str(tmp_path / "b"), "vit", max_chunks=1, log=lambda s: None)
  assert not part["complete"] and np.isnan(part["test_loss"]).any()
  np.testing.assert_array_equal(part["test_loss"].ravel()[:4], full["test_loss"].ravel()[:4])
  wd = Workdir(str(tmp_path / "b" / "sweep_vit"))
  assert wd.latest_step() == 4 and [f[:2] for f in wd.step_log_files()] == [(0, 4)]
  # A chunk logged after the last checkpoint (a crash before its save) is dropped on resume.
  wd.write_step_log(4, 8, {k: np.full(4, -1.0) for k in bo.RESULT_FIELDS})
  resumed = bo.run_sweep(config, str(tmp_path / "b"), "vit", log=lambda s: None)
  assert resumed["complete"] and resumed["chunks_computed"] == 1
  assert wd.latest_step() == 8
  for k in bo.RESULT_FIELDS:
    assert resumed[k].dtype == full[k].dtype == np.float64
    np.testing.assert_array_equal(resumed[k], full[k])
  # A finished sweep computes nothing more.
  again = bo.run_sweep(config, str(tmp_path / "b"), "vit", log=lambda s: None)
  assert again["complete"] and again["chunks_computed"] == 0
  np.testing.assert_array_equal(again["test_loss"], full["test_loss"])
  # A different config is refused in that workdir.
  config.train.learning_rate = 0.05
  with pytest.raises(ConfigError, match="config.workdir"):
    bo.run_sweep(config, str(tmp_path / "b"), "vit")


@pytest.mark.slow
def test_last_chunk_is_padded_to_the_chunk_size(tmp_path):
  # 12 runs in chunks of 5: the last chunk computes 5 runs (same program), keeps 2.
  config = tiny_config(trials=3, chunk_size=5)
  out = bo.run_sweep(config, str(tmp_path), "cnn", log=lambda s: None)
  assert out["complete"] and out["chunks_computed"] == 3
  files = Workdir(str(tmp_path / "sweep_cnn")).step_log_files()
  assert [f[:2] for f in files] == [(0, 5), (5, 10), (10, 12)]
  n, mu, _ = bo.grid_points(config)
  run = gd_sweep.chunk_program(bo.make_run_fn(config, "cnn", 8),
                               gd_sweep.resolved_vmap_size(config.sweep.get("vmap_size")))
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(config.seed), i))(
      jnp.array([10, 11, 11, 11, 11]))
  last = run(keys, jnp.asarray(n[[10, 11, 11, 11, 11]]), jnp.asarray(mu[[10, 11, 11, 11, 11]]))
  np.testing.assert_array_equal(out["test_loss"].ravel()[10:], np.asarray(last["test_loss"])[:2])


def assert_same_runs_to_rounding(got, want):
  """Two sweeps' (or chunks') results: equal steps, stops and accuracies, losses equal to
  float rounding."""
  for k in ("steps", "converged", "train_accuracy", "test_accuracy"):
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  for k in ("train_loss", "test_loss"):
    np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=k)


def write_sweep_before_field(config, tmp_path, field: str) -> None:
  """One chunk of the ViT sweep, its config.json then rewritten without `grid.<field>`,
  as a sweep written before that field existed."""
  bo.run_sweep(config, str(tmp_path), "vit", max_chunks=1, log=lambda s: None)
  wd = Workdir(str(tmp_path / "sweep_vit"))
  saved = wd.read_json("config.json")
  del saved["grid"][field]
  with open(wd.file("config.json"), "w") as f:
    json.dump(saved, f)


@pytest.mark.slow
def test_vmap_groups_change_only_float_rounding_and_old_sweeps_resume_with_zero(tmp_path):
  """`sweep.vmap_size` groups of a chunk give each run its steps, stop and accuracies of the
  whole-chunk vmap and its losses to float rounding; the size is fingerprinted, and a sweep
  written before the field (one vmap per chunk) resumes with vmap_size=0."""
  config = tiny_config(trials=3, chunk_size=6)
  assert gd_sweep.resolved_vmap_size(config.sweep.get("vmap_size")) == (
      1 if jax.default_backend() == "cpu" else 0)
  n, mu, idx = bo.grid_points(config)
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(config.seed), i))(
      jnp.asarray(idx[:6]))
  run_fn = bo.make_run_fn(config, "vit", 8)
  outs = {g: jax.device_get(gd_sweep.chunk_program(run_fn, g)(keys, jnp.asarray(n[:6]),
                                                        jnp.asarray(mu[:6])))
          for g in (0, 1, 4)}
  assert 1 < outs[0]["steps"].max() and outs[0]["steps"].min() < outs[0]["steps"].max()
  for g in (1, 4):
    assert_same_runs_to_rounding(outs[g], outs[0])
  # A sweep whose config.json predates the field: resumed with 0, refused (with the hint)
  # under the auto default.
  config.sweep.vmap_size = 0
  write_sweep_before_field(config, tmp_path, "vmap_size")
  config.sweep.vmap_size = None
  with pytest.raises(ConfigError, match="sweep.vmap_size=0") as err:
    bo.run_sweep(config, str(tmp_path), "vit", log=lambda s: None)
  assert "\n" not in str(err.value)
  config.sweep.vmap_size = 0
  out = bo.run_sweep(config, str(tmp_path), "vit", log=lambda s: None)
  assert out["complete"] and out["chunks_computed"] == 1
  config.sweep.vmap_size = -1
  with pytest.raises(ConfigError, match="sweep.vmap_size"):
    bo.validate(config)


@pytest.mark.parametrize("model", ["vit", "cnn"])
def test_chunk_padding_changes_only_float_rounding(model):
  """A run of N = 2 padded to 2 (its chunk's largest N; for the ViT at d = 32 > 2·4 tokens
  that also picks the reduced solver) or to the grid's 8 draws the same data and gives the
  same steps, stop and accuracies, and its losses to float rounding."""
  config = tiny_config(pad_to="chunk")
  n, mu, idx = bo.grid_points(config)
  sel = np.flatnonzero(n == 2)
  assert bo.chunk_padding(config, n[sel]) == 2 and bo.chunk_padding(config, n) == 8
  config.sweep.pad_to = "grid"
  assert bo.chunk_padding(config, n[sel]) == 8
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(config.seed), i))(
      jnp.asarray(idx[sel]))
  outs = {p: jax.device_get(jax.jit(jax.vmap(bo.make_run_fn(config, model, 8, n_pad=p)))(
      keys, jnp.asarray(n[sel]), jnp.asarray(mu[sel]))) for p in (2, 8)}
  assert outs[2]["steps"].max() > 1
  assert_same_runs_to_rounding(outs[2], outs[8])


def test_pad_to_is_fingerprinted_and_old_sweeps_resume_under_the_default(tmp_path):
  """`sweep.pad_to` is fingerprinted: a sweep written before the field (every chunk
  padded to the grid's largest N) resumes under the default "grid", and is refused under
  "chunk" with a one-line hint; a value not allowed is a ConfigError."""
  config = tiny_config()
  assert config.sweep.pad_to == "grid"
  write_sweep_before_field(config, tmp_path, "pad_to")
  config.sweep.pad_to = "chunk"
  with pytest.raises(ConfigError, match="sweep.pad_to=grid") as err:
    bo.run_sweep(config, str(tmp_path), "vit", log=lambda s: None)
  assert "\n" not in str(err.value)
  config.sweep.pad_to = "grid"
  out = bo.run_sweep(config, str(tmp_path), "vit", log=lambda s: None)
  assert out["complete"] and out["chunks_computed"] == 1
  config.sweep.pad_to = "largest"
  with pytest.raises(ConfigError, match="sweep.pad_to"):
    bo.validate(config)


def test_chunk_padding_sweep_equals_grid_padding(tmp_path):
  """The whole (smoke) sweep with `pad_to` "chunk" (one program per N) gives the grid
  padding's steps and accuracies, and its losses to float rounding."""
  outs = {}
  for pad in ("grid", "chunk"):
    outs[pad] = bo.run_sweep(tiny_config(pad_to=pad), str(tmp_path / pad), "vit",
                             log=lambda s: None)
  assert_same_runs_to_rounding(outs["chunk"], outs["grid"])


def test_stream_pieces_hold_whole_groups():
  assert gd_sweep.stream_pieces(120, 1, 2) == (60, 2)
  assert gd_sweep.stream_pieces(120, 1, 1) == (120, 1)
  assert gd_sweep.stream_pieces(120, 0, 4) == (120, 1)  # One vmap over the chunk: one piece.
  assert gd_sweep.stream_pieces(10, 4, 2) == (8, 2)  # Groups 4 + 4 | 2 (padded to 4).
  assert gd_sweep.stream_pieces(5, 1, 3) == (2, 3)
  assert gd_sweep.stream_pieces(3, 2, 8) == (2, 2)


@pytest.mark.slow
@pytest.mark.parametrize("vmap_size,streams", [(1, 2), (1, 3), (2, 2)])
def test_streams_give_bit_identical_sweeps(tmp_path, vmap_size, streams):
  """A chunk split over concurrent streams (the last piece padded) gives every run the
  numbers of the one-stream sweep, bit for bit; the field is not fingerprinted."""
  config = tiny_config(trials=3, chunk_size=6, vmap_size=vmap_size, streams=1)
  want = bo.run_sweep(config, str(tmp_path), "vit", max_chunks=1, log=lambda s: None)
  config.sweep.streams = streams
  got = bo.run_sweep(config, str(tmp_path), "vit", log=lambda s: None)
  assert got["complete"] and got["chunks_computed"] == 1
  config.sweep.streams = 1
  whole = bo.run_sweep(config, str(tmp_path / "one"), "vit", log=lambda s: None)
  for k in bo.RESULT_FIELDS:
    np.testing.assert_array_equal(got[k], whole[k], err_msg=k)
  np.testing.assert_array_equal(got["test_loss"].ravel()[:6], want["test_loss"].ravel()[:6])


def _write_old_format_sweep(path):
  os.makedirs(path)
  with open(os.path.join(path, "index.json"), "w") as f:
    json.dump({"fingerprint": {}, "chunks": {"chunk_00000.npz": {"runs": [0, 3]}}}, f)
  np.savez(os.path.join(path, "chunk_00000.npz"), run=np.arange(4), test_loss=np.zeros(4))


@pytest.mark.slow
def test_old_format_sweep_is_refused_with_one_line(tmp_path, monkeypatch):
  config = tiny_config()
  _write_old_format_sweep(str(tmp_path / "sweep_vit"))
  with pytest.raises(ConfigError, match="config.workdir") as err:
    bo.run_sweep(config, str(tmp_path), "vit")
  assert "--overwrite" in str(err.value) and "\n" not in str(err.value)
  # The study refuses it before anything compiles or is written.
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled before the check"))
  with pytest.raises(ConfigError, match="old format"):
    studies.run(config, str(tmp_path))
  assert sorted(os.listdir(tmp_path / "sweep_vit")) == ["chunk_00000.npz", "index.json"]
  monkeypatch.undo()
  # --overwrite recomputes it in the new format.
  out = bo.run_sweep(config, str(tmp_path), "vit", overwrite=True, log=lambda s: None)
  assert out["complete"] and out["chunks_computed"] == 2
  assert not {"index.json", "chunk_00000.npz"} & set(os.listdir(tmp_path / "sweep_vit"))
  assert bo.run_sweep(config, str(tmp_path), "vit")["chunks_computed"] == 0


@pytest.mark.parametrize("field,value", [
    ("sweep.n_values", [3, 4]), ("sweep.mu_norms", [0.0]), ("data.num_tokens", 1),
    ("data.layout", "diagonal"), ("vit.init", "xavier"), ("train.learning_rate", -0.1),
    ("models", ["mlp"]), ("cnn.q", 0.5), ("data.kind", "cifar"), ("train.solver", "newton"),
    ("sweep.streams", 0)])
def test_bad_config_fields_raise_before_compile(tmp_path, monkeypatch, field, value):
  config = bo_config.get_config("smoke")
  parent, _, leaf = field.rpartition(".")
  (config[parent] if parent else config)[leaf] = value
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled before validation"))
  with pytest.raises(ConfigError, match=f"config.{field}"):
    studies.run(config, str(tmp_path / "wd"))
  assert not os.path.exists(tmp_path / "wd")


def test_project_noise_is_refused_for_mnist_signals(tmp_path):
  config = bo_config.get_config("smoke")
  config.data.kind, config.data.project_noise = "mnist", True
  with pytest.raises(ConfigError, match="config.data.project_noise"):
    studies.run(config, str(tmp_path / "wd"))
  assert not os.path.exists(tmp_path / "wd")


def test_fit_boundary_recovers_exponent():
  ns = np.arange(2, 21, 2)
  snrs = np.geomspace(0.5, 50, 30)
  # A sharp transition at N·SNR² = 100, with per-trial noise.
  rng = np.random.default_rng(0)
  z = np.log(ns[:, None] * snrs[None] ** 2 / 100)
  loss = 0.7 / (1 + np.exp(3 * z))
  trials = loss[..., None] + 0.01 * rng.standard_normal((len(ns), len(snrs), 8))
  fit = phase_boundary.fit_boundary(ns, snrs, trials, 0.2, bootstrap=50)
  assert fit["k"] == pytest.approx(2.0, abs=0.1) and fit["num_points"] == len(ns)
  assert fit["k_ci95"][0] <= 2.0 <= fit["k_ci95"][1] or abs(fit["k"] - 2) < 0.05


@pytest.mark.parametrize("k_true", [2.0, 3.0])
def test_logistic_boundary_recovers_exponent(k_true):
  ns = np.arange(2, 21, 2)
  snrs = np.geomspace(0.3, 60, 24)
  rng = np.random.default_rng(1)
  # Labels from a known boundary N·SNR^k = 50 with logistic noise; the loss is a two-level
  # stand-in (0.05 benign, 0.6 harmful), so 1[loss < 0.2] are those labels.
  z = np.log(ns[:, None, None] * snrs[None, :, None] ** k_true / 50.0) * np.ones((1, 1, 40))
  benign = rng.random(z.shape) < 1 / (1 + np.exp(-6 * z))
  loss = np.where(benign, 0.05, 0.6)
  k, c = phase_boundary.logistic_k(ns, snrs, loss, 0.2)
  assert k == pytest.approx(k_true, rel=0.06) and c == pytest.approx(50.0, rel=0.3)
  fit = phase_boundary.fit_boundary_logistic(ns, snrs, loss, 0.2, bootstrap=20)
  assert fit["k"] == k and fit["k_ci95"][0] < fit["k_ci95"][1]
  # Separable labels (no noise) still give a finite line near the truth.
  k_sep, _ = phase_boundary.logistic_k(ns, snrs, np.where(z > 0, 0.05, 0.6), 0.2)
  assert k_sep == pytest.approx(k_true, rel=0.1)
  assert np.isnan(phase_boundary.logistic_k(ns, snrs, np.full_like(loss, 0.6), 0.2)[0])


def test_paper_variant_pads_each_chunk_to_its_own_n():
  config = bo_config.get_config("paper")
  n, _, _ = bo.grid_points(config)
  size = config.sweep.chunk_size
  chunks = [n[i:i + size] for i in range(0, len(n), size)]
  assert config.sweep.pad_to == "chunk" and all(len(set(c)) == 1 for c in chunks)
  assert [bo.chunk_padding(config, c) for c in chunks[::2]] == list(config.sweep.n_values)
  assert bo.chunk_padding(bo_config.get_config(None), chunks[0]) == 20  # Default: the grid's.


def test_curves_draw_the_paper_n_snr2_1000_curve():
  ns, snrs = np.arange(2, 21, 2), np.geomspace(0.2, 40, 8)
  fit = {"k": 2.1, "c": 200.0, "crossings": list(np.sqrt(200 / ns)),
         "logistic": {"k": 2.0, "c": 180.0}}
  curves = phase_diagram.boundary_curves(snrs, ns, fit, 2.0, paper_curve=True)
  assert len(curves) == 4
  s, n = curves["paper N·SNR²=1000"]
  np.testing.assert_allclose(n * s ** 2, 1000.0)
  assert "paper N·SNR²=1000" not in phase_diagram.boundary_curves(snrs, ns, fit, 3.0)


def test_power_law_fit_recovers_exponents_and_skips_unconverged():
  rng = np.random.default_rng(0)
  eta = np.geomspace(0.01, 0.3, 5)[:, None, None]
  inv_eps = np.geomspace(10, 1000, 4)[None, :, None]
  mu = np.geomspace(1, 100, 6)[None, None, :]
  t = 3.0 / eta * inv_eps ** 0.8 * mu ** -0.5 * np.exp(0.01 * rng.standard_normal((5, 4, 6)))
  t[0, 0, 0] = np.nan  # A run that did not converge is left out, not fitted as 0.
  fit = phase_boundary.power_law_fit(t, {"eta": eta, "inv_eps": inv_eps, "mu": mu})
  assert fit["runs"] == t.size - 1 and fit["r2"] > 0.99
  assert fit["b_eta"] == pytest.approx(-1.0, abs=0.02)
  assert fit["b_inv_eps"] == pytest.approx(0.8, abs=0.02)
  assert fit["b_mu"] == pytest.approx(-0.5, abs=0.02)
  assert fit["a"] == pytest.approx(np.log(3.0), abs=0.05)
  assert np.isnan(phase_boundary.power_law_fit(
      t[:1, :1, :3], {"eta": eta[:1], "inv_eps": inv_eps[:, :1], "mu": mu[..., :3]})["b_eta"])


def test_convergence_fit_uses_only_converged_runs():
  ns, mus = np.array([2, 4, 8]), np.array([1.0, 10.0])
  steps = (5.0 * ns[:, None, None] ** 1.5 * mus[None, :, None] ** -1.0) * np.ones((1, 1, 3))
  converged = np.ones_like(steps)
  steps[0, 0, 0], converged[0, 0, 0] = 300.0, 0.0  # Stopped at max_steps: not a time.
  fit = phase_boundary.convergence_fit(steps, converged, ns, mus)
  assert fit["b_n"] == pytest.approx(1.5) and fit["b_mu"] == pytest.approx(-1.0)
  assert fit["runs"] == steps.size - 1 and fit["max_steps_seen"] < 300


def test_theory_exponent_per_model_and_kou_variant():
  assert bo.theory_exponent(bo_config.get_config(), "vit") == 2.0
  assert bo.theory_exponent(bo_config.get_config("cnn,q=3"), "cnn") == 3.0
  kou = bo_config.get_config("kou")
  assert bo.theory_exponent(kou, "cnn") == 4.0 and kou.models == ("cnn",)
  assert (kou.cnn.q, kou.data.num_tokens, kou.data.label_flip) == (1.0, 2, 0.1)
  assert kou.data.project_noise and kou.data.strong_noise_factor == 1.0
  assert bo_config.get_config("cnn,q=2,steps=3000").train.max_steps == 3000


def test_kou_variant_flips_train_labels_only_and_generalises_at_high_snr():
  config = bo_config.get_config("kou,smoke")
  config.train.max_steps = 400
  run = jax.jit(jax.vmap(bo.make_run_fn(config, "cnn", 8)))
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(6))
  n = jnp.full((6,), 8, jnp.int32)
  mu = jnp.asarray([0.05] * 3 + [20.0] * 3)
  out = jax.device_get(run(keys, n, mu))
  # At high SNR the clean test labels are predicted although training labels were flipped.
  assert out["test_accuracy"][3:].min() >= 0.95
  assert out["test_accuracy"][:3].mean() < out["test_accuracy"][3:].mean() - 0.2


# ---------------------------------------------------------------------------------- smoke


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("bo_smoke"))
  return workdir, studies.run(bo_config.get_config("smoke"), workdir)


@pytest.mark.slow
def test_smoke_high_n_snr2_generalises_better(smoke_run):
  workdir, out = smoke_run
  for name in ("results.md", "results.json", "heatmap_vit.png", "cutoff_vit.png",
               "boundary_overlay.png", "dynamics_harmful_attention.png"):
    assert os.path.exists(os.path.join(workdir, name)), name
  loss = np.nanmean(out["sweeps"]["vit"]["test_loss"], -1)  # [N ∈ {2, 8}, ‖μ‖ ∈ {1, 64}]
  assert loss[1, 1] < loss[0, 0] - 0.2
  assert {r["model"] for r in out["rows"]} == {"vit", "cnn"}


@pytest.mark.slow
def test_harmful_run_attends_to_strong_noise(smoke_run):
  _, out = smoke_run
  harmful = out["dynamics"]["harmful"]["final_mean"]
  assert harmful["attn_xi2_mean"] > harmful["attn_signal_mean"]
  assert harmful["train_loss"] < harmful["test_loss"]
  benign = out["dynamics"]["benign"]["final_mean"]
  assert benign["gamma_plus"] > harmful["gamma_plus"]


@pytest.mark.slow
def test_reduced_state_solver_equals_direct():
  from xsens.train import reduced_vit_gd  # pylint: disable=g-import-not-at-top
  x, y, _ = sn.sample(jax.random.key(5), 6, num_tokens=3, d=40, mu_norm=3.0, sigma_p=0.3)
  params, w_o = vit.init(jax.random.key(6), 40, 8, 6, init="gaussian", init_std=0.3)
  mask = jnp.array([1.0, 1, 1, 1, 0, 0])
  kw = dict(eta=0.5, max_steps=25, eps=0.05)
  direct = gd.fit(vit.apply, params, w_o, x, y, mask, **kw)
  reduced = reduced_vit_gd.fit(params, w_o, x, y, mask, **kw)
  assert int(direct[1]) == int(reduced[1]) > 0 and bool(direct[2]) == bool(reduced[2])
  for k in params:
    np.testing.assert_allclose(reduced[0][k], direct[0][k], rtol=1e-4, atol=1e-6)
  # Through the study: the same grid point with either solver.
  config = tiny_config()
  outs = []
  for solver in ("direct", "reduced"):
    config.train.solver = solver
    outs.append(jax.jit(bo.make_run_fn(config, "vit", 8))(jax.random.key(0), 8, 64.0))
  assert int(outs[0]["steps"]) == int(outs[1]["steps"])
  np.testing.assert_allclose(outs[0]["test_loss"], outs[1]["test_loss"], rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_cli_refuses_bad_field_with_exit_code_2(tmp_path):
  from tests.helpers import run_cli  # pylint: disable=g-import-not-at-top
  proc = run_cli("--config=mlcollections_configs/benign_overfitting.py:smoke",
                 "--config.sweep.trials=0", f"--workdir={tmp_path / 'wd'}", timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert "config.sweep.trials" in proc.stderr
  assert not os.path.exists(tmp_path / "wd")


@pytest.mark.slow
def test_linen_module_with_frozen_readout_matches_pure_gd():
  import optax  # pylint: disable=g-import-not-at-top
  x, y, _ = sn.sample(jax.random.key(7), 4, num_tokens=3, d=8, mu_norm=2.0, sigma_p=0.5)
  module = vit.OneLayerViT(d_h=4, d_v=4, init_scheme="gaussian", init_std=0.5)
  variables = module.init(jax.random.key(8), x)
  p = dict(variables["params"])
  f = module.apply({"params": p}, x)
  pure = {k: p[k] for k in ("wq", "wk", "wv")}
  np.testing.assert_allclose(f, vit.apply(pure, p["w_o"], x), rtol=1e-6)
  tx = vit.frozen_readout(optax.sgd(0.5))
  opt = tx.init(p)
  loss = lambda q: gd.logistic_loss(y * module.apply({"params": q}, x))
  for _ in range(3):
    updates, opt = tx.update(jax.grad(loss)(p), opt, p)
    p = optax.apply_updates(p, updates)
    _, pure = gd.gd_step(vit.apply, pure, variables["params"]["w_o"], x, y, None, 0.5)
  np.testing.assert_array_equal(p["w_o"], variables["params"]["w_o"])
  for k in pure:
    np.testing.assert_allclose(p[k], pure[k], rtol=1e-5, atol=1e-7)
