"""The single attention layer, the sparse-token data, and the synthetic_sensitivity study
(trained through the one loop: exact resume)."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mlcollections_configs import synthetic_sensitivity as syn_config
from xsens import studies
from xsens.data import sparse_tokens as st
from xsens.errors import ConfigError
from xsens.measures import boolean
from xsens.models import one_layer_attention as ola
from xsens.studies import synthetic_sensitivity as syn
from xsens.train.workdir import Workdir


def test_attention_layer_equals_numpy():
  b, n, d = 3, 5, 4
  x = np.random.default_rng(0).normal(size=(b, n, d)).astype(np.float32)
  model = ola.OneLayerAttention(num_outputs=2, qk_dim=3, v_dim=6)
  params = model.init(jax.random.key(0), x)["params"]
  assert set(params) == {"w_q", "w_k", "w_v", "u"}
  assert all(set(v) == {"kernel"} for v in params.values())  # no biases
  wq, wk, wv, u = (np.asarray(params[k]["kernel"], np.float64) for k in ("w_q", "w_k", "w_v",
                                                                        "u"))
  out = np.asarray(model.apply({"params": params}, x))
  ref = np.zeros((b, 2))
  for i in range(b):
    xi = x[i].astype(np.float64)
    s = (xi @ wq) @ (xi @ wk).T / np.sqrt(3)
    a = np.exp(s - s.max(1, keepdims=True))
    a /= a.sum(1, keepdims=True)
    ref[i] = (a @ xi @ wv).mean(0) @ u
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
  # Permutation invariant (no positional encoding inside the layer).
  perm = np.asarray(model.apply({"params": params}, x[:, ::-1]))
  np.testing.assert_allclose(perm, out, rtol=1e-5, atol=1e-5)


def test_token_mlp_shapes():
  model = ola.TokenMLP(num_outputs=2, hidden_dims=(7,))
  params = model.init(jax.random.key(0), jnp.zeros((1, 4, 3)))["params"]
  assert sum(x.size for x in jax.tree.leaves(params)) == 12 * 7 + 7 + 7 * 2 + 2
  assert model.apply({"params": params}, jnp.zeros((5, 4, 3))).shape == (5, 2)


@pytest.mark.parametrize("rule", st.RULES)
def test_sparse_labels_depend_only_on_the_relevant_tokens(rule):
  n, m, k = 7, 3, 3
  pos = st.relevant_positions(n, k, 4)
  data = st.sparse_token_task(200, n=n, m=m, k=k, rule=rule, position_scale=2.0, seed=1,
                              positions=pos)
  x, y, bits = data["tokens"], data["labels"], data["bits"]
  assert x.shape == (200, n, m + n) and set(np.unique(y)) == {0, 1}
  np.testing.assert_allclose(np.linalg.norm(x[:, :, :m], axis=-1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(x[0, :, m:], 2.0 * np.eye(n))
  rel = bits[:, pos]
  want = rel.sum(1) > 0 if rule == "majority" else rel.prod(1) > 0
  np.testing.assert_array_equal(y, want.astype(np.int32))
  other = np.setdiff1d(np.arange(n), pos)
  # Labels are a function of the relevant bits alone: same relevant bits -> same label.
  key = [tuple(r) for r in rel]
  for kk in set(key):
    assert len(set(y[[i for i, r in enumerate(key) if r == kk]])) == 1
  assert len(other) == n - k


def test_boolean_tokens_and_target():
  n = 4
  tok = st.boolean_tokens(n, 1.0)
  np.testing.assert_array_equal(tok[:, :, 0], np.asarray(boolean.all_inputs(n)))
  values, comps = st.boolean_target(n, [((0,), 1.0), ((1, 3), -2.0)])
  c = np.asarray(boolean.fourier_coefficients(values))
  assert c[comps[0]["index"]] == pytest.approx(1.0) and c[comps[1]["index"]] == pytest.approx(-2)
  assert [x["degree"] for x in comps] == [1, 2]


def _wd(path, **fingerprint):
  return Workdir.open(str(path), fingerprint or {"test": 1})


def _boolean_setup(n=4):
  model = ola.TokenMLP(num_outputs=1, hidden_dims=(16,))
  tokens = jnp.asarray(st.boolean_tokens(n, 1.0))
  target, _ = st.boolean_target(n, [((0,), 1.0), ((1, 2), 0.5)])
  params = model.init(jax.random.key(0), tokens[:1])["params"]
  return model, tokens, jnp.asarray(target), params


@pytest.mark.slow
def test_boolean_trajectory_logs_the_spectrum_of_the_learned_function(tmp_path):
  n = 4
  model, tokens, target, params = _boolean_setup(n)
  p, coeffs, losses, _ = syn.boolean_trajectory(_wd(tmp_path), model, params,
                                                optax.adam(1e-2), tokens, target,
                                                jnp.ones(2**n), steps=30, log_every=10)
  assert coeffs.shape == (4, 16) and losses.shape == (4,)
  direct = boolean.fourier_coefficients(model.apply({"params": p}, tokens)[:, 0])
  np.testing.assert_allclose(np.asarray(coeffs[-1]), np.asarray(direct), rtol=1e-4, atol=1e-5)
  first = boolean.fourier_coefficients(model.apply({"params": params}, tokens)[:, 0])
  np.testing.assert_allclose(np.asarray(coeffs[0]), np.asarray(first), rtol=1e-4, atol=1e-5)
  assert float(losses[-1]) < float(losses[0])


@pytest.mark.slow
def test_matched_loss_criterion_trains_until_the_loss_is_reached(tmp_path):
  pos = np.array([1])
  data = st.sparse_token_task(64, n=3, m=2, k=1, rule="majority", position_scale=1.0,
                              seed=0, positions=pos)
  x, y = jnp.asarray(data["tokens"]), jnp.asarray(data["labels"])
  model = ola.TokenMLP(num_outputs=2, hidden_dims=(8,))
  params = model.init(jax.random.key(0), x[:1])["params"]
  kw = dict(target=1.0, eval_every=5, max_steps=400)
  _, s_acc, acc, _, _ = syn.train_to_accuracy(_wd(tmp_path / "acc"), model, params,
                                               optax.adam(3e-2), x, y, **kw)
  _, s_loss, acc2, curve, _ = syn.train_to_accuracy(_wd(tmp_path / "loss"), model, params,
                                                    optax.adam(3e-2), x, y,
                                                    target_loss=0.01, **kw)
  assert acc == acc2 == 1.0
  assert s_loss > s_acc and curve[-1][1] <= 0.01 and s_loss % 5 == 0
  assert [c[0] for c in curve] == list(range(5, s_loss + 1, 5))
  # A rerun of the finished run trains nothing more: same steps, same curve.
  again = syn.train_to_accuracy(_wd(tmp_path / "loss"), model, params, optax.adam(3e-2), x,
                                y, target_loss=0.01, **kw)
  assert again[1] == s_loss and again[3] == curve


def _sparse_setup():
  data = st.sparse_token_task(64, n=3, m=2, k=1, rule="majority", position_scale=1.0,
                              seed=0, positions=np.array([1]))
  x, y = jnp.asarray(data["tokens"]), jnp.asarray(data["labels"])
  model = ola.TokenMLP(num_outputs=2, hidden_dims=(8,))
  return model, model.init(jax.random.key(0), x[:1])["params"], x, y


def _assert_trees_equal(a, b):
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@pytest.mark.slow
def test_interrupted_training_resumes_bit_equal(tmp_path, monkeypatch):
  """Both trainings, interrupted after a checkpointed chunk and rerun, give exactly the
  uninterrupted run's params, curve, coefficients and losses; the array logs of steps
  after the restored checkpoint are rewritten, not duplicated."""
  model, params, x, y = _sparse_setup()
  kw = dict(target=1.0, target_loss=1e-30, eval_every=5, max_steps=48)  # Never met.
  tx = optax.adam(3e-2)
  cut = syn.train_to_accuracy(_wd(tmp_path / "s_cut"), model, params, tx, x, y,
                              max_chunks=3, **kw)
  assert cut[1] == 15 and Workdir(str(tmp_path / "s_cut")).latest_step() == 15
  resumed = syn.train_to_accuracy(_wd(tmp_path / "s_cut"), model, params, tx, x, y, **kw)
  straight = syn.train_to_accuracy(_wd(tmp_path / "s_straight"), model, params, tx, x, y,
                                   **kw)
  assert resumed[1] == straight[1] == 50  # max_steps rounded up to whole chunks.
  _assert_trees_equal(resumed[0], straight[0])
  assert resumed[2:4] == straight[2:4]

  monkeypatch.setattr(syn, "LOGS_PER_CHUNK", 2)  # Chunks of 2 logs × 5 steps.
  n = 4
  bmodel, tokens, target, bparams = _boolean_setup(n)
  mask = jnp.asarray(np.arange(2**n) % 3 != 0, jnp.float32)
  bkw = dict(steps=35, log_every=5)
  run = lambda name, **extra: syn.boolean_trajectory(
      _wd(tmp_path / name), bmodel, bparams, optax.adam(1e-2), tokens, target, mask,
      **bkw, **extra)
  cut = run("b_cut", max_chunks=2)
  assert Workdir(str(tmp_path / "b_cut")).latest_step() == 20 and cut[1].shape == (5, 2**n)
  # A log of steps the checkpoint does not hold (written, then the run was killed).
  wd = Workdir(str(tmp_path / "b_cut"))
  wd.write_step_log(20, 30, {"coef": np.zeros((2**n, 2)), "loss": np.zeros(2)})
  resumed, straight = run("b_cut"), run("b_straight")
  assert resumed[1].shape == (8, 2**n)
  _assert_trees_equal(resumed[0], straight[0])
  for got, want in zip(resumed[1:3], straight[1:3]):
    np.testing.assert_array_equal(got, want)
  assert [f[:2] for f in wd.step_log_files()] == [(0, 10), (10, 20), (20, 30), (30, 35)]


def test_learned_step():
  steps = [0, 10, 20, 30]
  assert syn.learned_step(np.array([0.0, 0.4, 0.95, 1.0]), 1.0, 0.9, steps) == 20
  assert syn.learned_step(np.array([0.0, -0.6, -0.95, -1.0]), -1.0, 0.5, steps) == 10
  assert syn.learned_step(np.array([0.0, 0.1, 0.2, 0.3]), 1.0, 0.9, steps) is None


@pytest.mark.parametrize("field,value,match", [
    ("models", ["attention", "cnn"], r"config\.models"),
    ("sparse.k", 2, r"sparse\.k"),
    ("sparse.rule", "xor", r"sparse\.rule"),
    ("sparse.sigmas", [], r"sparse\.sigmas"),
    ("boolean.n", 17, r"boolean\.n"),
    ("boolean.components", [[[0, 0], 1.0]], r"boolean\.components"),
    ("boolean.log_every", 7, r"boolean\.steps"),
])
def test_bad_config_is_refused_before_anything_is_written(tmp_path, field, value, match):
  config = syn_config.get_config("smoke")
  if "." in field:
    section, name = field.split(".")
    config[section][name] = value
  else:
    config[field] = value
  with pytest.raises(ConfigError, match=match):
    studies.run(config, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()


@pytest.fixture(scope="module")
def smoke_study(tmp_path_factory):
  """The smoke study, run once without interruption (default chunking): (workdir, output)."""
  workdir = tmp_path_factory.mktemp("smoke_study")
  return workdir, syn.run(syn_config.get_config("smoke"), str(workdir), log=lambda *_: None)


@pytest.mark.slow
def test_smoke_study_end_to_end(smoke_study):
  tmp_path, out = smoke_study
  config = syn_config.get_config("smoke")
  rows = out["rows"]
  assert {r["model"] for r in rows} == {"attention", "mlp"}
  assert len(rows) == 2 * len(config.sparse.sigmas)
  for r in rows:
    assert 0 <= r["sensitivity"] <= 1 and 0 <= r["train_acc"] <= 1
    assert r["steps"] % config.sparse.eval_every == 0 and r["steps"] <= config.sparse.max_steps
  # Sensitivity grows with sigma for each model (common random numbers, large gap).
  for m in ("attention", "mlp"):
    s = [r["sensitivity"] for r in rows if r["model"] == m]
    assert s[-1] >= s[0]
  bo = out["boolean"]
  assert len(bo["rows"]) == 2 * len(config.boolean.components)
  n_logs = config.boolean.steps // config.boolean.log_every + 1
  assert bo["spectrum"]["attention"].shape == (n_logs, config.boolean.n + 1)
  assert bo["target_spectrum"][:4] == pytest.approx([0, 1, 1, 1])
  assert bo["target_influence"] == pytest.approx(6.0)
  md = (tmp_path / "results.md").read_text()
  assert "Boolean spectrum rows" in md and "relevant_tokens" in md
  for plot in ("sparse_per_position.png", "sparse_sensitivity_vs_sigma.png",
               "boolean_spectrum.png"):
    assert (tmp_path / plot).exists() and plot in md
  payload = json.loads((tmp_path / "results.json").read_text())
  assert set(payload["boolean"]["order"]) == {"attention", "mlp"}


def _report(path):
  """results.json without the timings."""
  def clean(o):
    if isinstance(o, dict):
      return {k: clean(v) for k, v in o.items() if k not in ("train_s", "wall_s")}
    return [clean(v) for v in o] if isinstance(o, list) else o
  with open(os.path.join(path, "results.json")) as f:
    return clean(json.load(f))


@pytest.mark.slow
def test_interrupted_study_resumes_with_the_same_report(tmp_path, monkeypatch, smoke_study):
  """Cut into short checkpointed chunks, interrupted and rerun: the report of the
  uninterrupted, default-chunked smoke study (a copy of it; `smoke_study` stays intact)."""
  monkeypatch.setattr(syn, "LOGS_PER_CHUNK", 2)    # Boolean smoke: 2 chunks of 20 steps.
  monkeypatch.setattr(syn, "CHECKPOINT_CHUNKS", 1)
  config = syn_config.get_config("smoke")
  quiet = lambda *_: None
  cut, straight = str(tmp_path / "cut"), str(tmp_path / "straight")
  syn.run_sparse(config, cut, log=quiet, max_chunks=2)
  syn.run_boolean(config, cut, log=quiet, max_chunks=1)
  for (part, _), (path, _) in syn.run_workdirs(config, cut).items():
    assert Workdir(path).latest_step() == 20, part
  assert not os.path.exists(os.path.join(cut, "results.json"))
  syn.run(config, cut, log=quiet)
  shutil.copytree(smoke_study[0], straight)
  assert _report(cut) == _report(straight)
  # Another training config is refused before anything is written; --overwrite retrains.
  config.mlp.learning_rate = 2e-3
  with pytest.raises(ConfigError, match=r"config\.workdir: .*sparse_mlp.*learning_rate"):
    syn.run(config, straight, log=quiet)
  assert _report(straight) == _report(cut)
  config.boolean.enabled = False  # (Quicker: retrain the sparse part only.)
  syn.run(config, straight, log=quiet, overwrite=True)
  new, old = _report(straight)["rows"], _report(cut)["rows"]
  assert [r for r in new if r["model"] == "attention"] == [
      r for r in old if r["model"] == "attention"]
  assert [r for r in new if r["model"] == "mlp"] != [r for r in old if r["model"] == "mlp"]


def test_a_run_workdir_is_keyed_by_what_its_training_depends_on():
  config = syn_config.get_config("smoke")
  base = syn.run_workdirs(config, "w")
  config.sparse.sigmas = [0.3]
  config.sparse.num_draws = 5
  config.boolean.learned_fraction = 0.5
  assert syn.run_workdirs(config, "w") == base
  config.boolean.steps = 50
  changed = syn.run_workdirs(config, "w")
  assert [k for k in base if base[k] != changed[k]] == [("boolean", "attention"),
                                                          ("boolean", "mlp")]
  assert set(base) == {(p, m) for p in ("sparse", "boolean") for m in ("attention", "mlp")}
