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
from xsens.lab import boolean_spectrum, token_tasks
from xsens.measures import boolean
from xsens.models import one_layer_attention as ola
from xsens.studies import synthetic_sensitivity as syn
from xsens.train import full_batch
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
  p, coeffs, losses, _ = boolean_spectrum.boolean_trajectory(_wd(tmp_path), model, params,
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
  _, s_acc, acc, _, _ = full_batch.train_to_accuracy(_wd(tmp_path / "acc"), model, params,
                                               optax.adam(3e-2), x, y, **kw)
  _, s_loss, acc2, curve, _ = full_batch.train_to_accuracy(_wd(tmp_path / "loss"), model, params,
                                                    optax.adam(3e-2), x, y,
                                                    target_loss=0.01, **kw)
  assert acc == acc2 == 1.0
  assert s_loss > s_acc and curve[-1][1] <= 0.01 and s_loss % 5 == 0
  assert [c[0] for c in curve] == list(range(5, s_loss + 1, 5))
  # A rerun of the finished run trains nothing more: same steps, same curve.
  again = full_batch.train_to_accuracy(_wd(tmp_path / "loss"), model, params, optax.adam(3e-2), x,
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
  cut = full_batch.train_to_accuracy(_wd(tmp_path / "s_cut"), model, params, tx, x, y,
                              max_chunks=3, **kw)
  assert cut[1] == 15 and Workdir(str(tmp_path / "s_cut")).latest_step() == 15
  resumed = full_batch.train_to_accuracy(_wd(tmp_path / "s_cut"), model, params, tx, x, y, **kw)
  straight = full_batch.train_to_accuracy(_wd(tmp_path / "s_straight"), model, params, tx, x, y,
                                   **kw)
  assert resumed[1] == straight[1] == 50  # max_steps rounded up to whole chunks.
  _assert_trees_equal(resumed[0], straight[0])
  assert resumed[2:4] == straight[2:4]

  monkeypatch.setattr(boolean_spectrum, "LOGS_PER_CHUNK", 2)  # Chunks of 2 logs × 5 steps.
  n = 4
  bmodel, tokens, target, bparams = _boolean_setup(n)
  mask = jnp.asarray(np.arange(2**n) % 3 != 0, jnp.float32)
  bkw = dict(steps=35, log_every=5)
  run = lambda name, **extra: boolean_spectrum.boolean_trajectory(
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
  assert boolean_spectrum.learned_step(np.array([0.0, 0.4, 0.95, 1.0]), 1.0, 0.9, steps) == 20
  assert boolean_spectrum.learned_step(np.array([0.0, -0.6, -0.95, -1.0]), -1.0, 0.5, steps) == 10
  assert boolean_spectrum.learned_step(np.array([0.0, 0.1, 0.2, 0.3]), 1.0, 0.9, steps) is None


@pytest.mark.parametrize("field,value,match", [
    ("models", ["attention", "cnn"], r"config\.models"),
    ("sparse.k", 2, r"sparse\.k"),
    ("sparse.rule", "xor", r"sparse\.rule"),
    ("sparse.sigmas", [], r"sparse\.sigmas"),
    ("boolean.n", 17, r"boolean\.n"),
    ("boolean.components", [[[0, 0], 1.0]], r"boolean\.components"),
    ("boolean.log_every", 7, r"boolean\.steps"),
    ("num_seeds", 0, r"config\.num_seeds"),
    ("models", ["attention", "attention"], r"config\.models"),
    ("vocab.sigmas", [], r"config\.vocab\.sigmas"),
    ("vocab.cues", ["both"], r"config\.vocab\.cues"),
    ("vocab.sparse_per_sequence", 6, r"config\.vocab\.sparse_per_sequence"),
    ("vocab.num_sparse", 5, r"config\.vocab\.num_sparse: must be even"),
    ("vocab.num_frequent", 1, r"config\.vocab\.num_frequent"),
    ("boolean.models", ["attention_freeze_qk"], r"config\.boolean\.models"),
    ("mlp_matched.learning_rate", 0.0, r"config\.mlp_matched\.learning_rate"),
])
def test_bad_config_is_refused_before_anything_is_written(tmp_path, field, value, match):
  config = syn_config.get_config("smoke")
  if "." in field:
    section, name = field.split(".")
    config[section][name] = value
  else:
    config[field] = value
  with pytest.raises(ConfigError, match=match) as err:
    studies.run(config, str(tmp_path / "w"))
  # The one-line CLI error names the full flag (log_every is checked through steps).
  assert err.value.flag == "--config." + ("boolean.steps" if field == "boolean.log_every"
                                          else field)
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
  tasks = ("sparse", "vocab_uninformative", "vocab_informative")
  token_rows = [r for r in rows if "task" in r]
  assert {r["task"] for r in token_rows} == set(tasks)
  assert {r["seed"] for r in token_rows} == {0, 1}
  want = {syn.RULE, syn.UNIFORM, *config.models}
  for task in tasks:
    sec = config.sparse if task == "sparse" else config.vocab
    mine = [r for r in token_rows if r["task"] == task]
    assert {r["model"] for r in mine} == want
    assert len(mine) == len(want) * len(sec.sigmas) * config.num_seeds
    for r in mine:
      assert 0 <= r["sensitivity"] <= 1 and 0 <= r["train_acc"] <= 1
      assert r["steps"] % sec.eval_every == 0 and r["steps"] <= sec.max_steps
      if r["model"] == syn.RULE:   # The rule is the label: exact on every split.
        assert r["train_acc"] == r["test_acc"] == 1.0
    # The matched MLP has about the attention layer's parameter count.
    p = {m: next(r["params"] for r in mine if r["model"] == m) for m in want}
    assert p["attention_freeze_qk"] == p["attention"] == p[syn.UNIFORM]
    assert abs(p["mlp_matched"] - p["attention"]) < p["attention"] / 2
  # Sensitivity grows with sigma for each model on "sparse" (common random numbers).
  for m in want:
    s = [r["sensitivity"] for r in token_rows
         if r["task"] == "sparse" and r["model"] == m and r["seed"] == 0]
    assert s[-1] >= s[0]
  assert all("shifted_test_acc" in r for r in token_rows if r["task"] == "vocab_informative")
  bo = out["boolean"]
  assert len(bo["rows"]) == 2 * len(config.boolean.components) * config.num_seeds
  n_logs = config.boolean.steps // config.boolean.log_every + 1
  assert bo["spectrum"]["attention"].shape == (n_logs, config.boolean.n + 1)
  assert bo["target_spectrum"][:4] == pytest.approx([0, 1, 1, 1])
  assert bo["target_influence"] == pytest.approx(6.0)
  md = (tmp_path / "results.md").read_text()
  assert "generating rule (yardstick)" in md and "relevant tokens" in md
  assert "W_Q W_Kᵀ frozen at init" in md and "sparse cue removed" in md
  assert " ± " in md
  for plot in ("sparse_per_position.png", "sparse_sensitivity_vs_sigma.png",
               "vocab_uninformative_sensitivity_vs_sigma.png", "boolean_spectrum.png"):
    assert (tmp_path / plot).exists() and plot in md
  payload = json.loads((tmp_path / "results.json").read_text())
  assert set(payload["boolean"]["order"]) == {"attention", "mlp"}
  assert len(payload["seed_rows"]) == len(rows)


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
  monkeypatch.setattr(boolean_spectrum, "LOGS_PER_CHUNK", 2)  # Boolean smoke: 2 chunks of 20.
  monkeypatch.setattr(full_batch, "CHECKPOINT_CHUNKS", 1)
  config = syn_config.get_config("smoke")
  quiet = lambda *_: None
  cut, straight = str(tmp_path / "cut"), str(tmp_path / "straight")
  syn.run_sparse(config, cut, log=quiet, max_chunks=2)
  syn.run_boolean(config, cut, log=quiet, max_chunks=1)
  for key, (path, _) in syn.run_workdirs(config, cut).items():
    assert Workdir(path).latest_step() == 20, key
  assert not os.path.exists(os.path.join(cut, "results.json"))
  syn.run(config, cut, log=quiet)
  shutil.copytree(smoke_study[0], straight)
  assert _report(cut) == _report(straight)
  # Another training config is refused before anything is written; --overwrite retrains.
  config.mlp_matched.learning_rate = 2e-3
  with pytest.raises(ConfigError,
                     match=r"config\.workdir: .*sparse_mlp_matched_s0.*learning_rate"):
    syn.run(config, straight, log=quiet)
  assert _report(straight) == _report(cut)
  config.boolean.enabled = False  # (Quicker: retrain the sparse part only.)
  config.vocab.enabled = False
  config.num_seeds = 1
  syn.run(config, straight, log=quiet, overwrite=True)
  new, old = _report(straight)["seed_rows"], _report(cut)["seed_rows"]
  pick = lambda rows, m: [r for r in rows if r.get("task") == "sparse" and r["seed"] == 0
                          and r["model"] == m]
  assert pick(new, "attention") == pick(old, "attention")
  assert pick(new, "mlp_matched") != pick(old, "mlp_matched")


def test_a_run_workdir_is_keyed_by_what_its_training_depends_on():
  config = syn_config.get_config("smoke")
  base = syn.run_workdirs(config, "w")
  config.sparse.sigmas = [0.3]
  config.sparse.num_draws = 5
  config.vocab.sigmas = [0.3]
  config.boolean.learned_fraction = 0.5
  assert syn.run_workdirs(config, "w") == base
  config.boolean.steps = 50
  changed = syn.run_workdirs(config, "w")
  assert [k for k in base if base[k] != changed[k]] == [
      ("boolean", m, s) for s in (0, 1) for m in ("attention", "mlp")]
  parts = ("sparse", "vocab_uninformative", "vocab_informative")
  assert set(base) == {(p, m, s) for p in parts for m in config.models for s in (0, 1)} | {
      ("boolean", m, s) for m in ("attention", "mlp") for s in (0, 1)}
  # The ablation variants start from the attention layer's initial weights.
  fp = {k[1]: v[1] for k, v in base.items() if k[0] == "sparse" and k[2] == 0}
  assert fp["attention_freeze_qk"]["init"] == fp["attention"]["init"] == 0
  # The matched MLP's width follows the attention layer's size; its run is keyed by it.
  config.attention.v_dim = 3
  assert syn.run_workdirs(config, "w")[("sparse", "mlp_matched", 0)] != base[
      ("sparse", "mlp_matched", 0)]


# ------------------------------------------------------------------------------------------
# The paper's set-up as known (frequent and sparse tokens), the yardstick, the ablation.


def _vocab_task(cue, num=400, seed=1):
  vocab = st.vocabulary(num_frequent=6, num_sparse=10, dim=8, seed=0)
  return vocab, st.frequent_sparse_task(num, vocab=vocab, n=12, sparse_per_sequence=2,
                                        sparse_cue=cue, seed=seed)


def test_frequent_sparse_statistics_and_labels():
  vocab, data = _vocab_task("uninformative", num=2000)
  ids, sp, y, x = data["ids"], data["is_sparse"], data["labels"], data["tokens"]
  assert x.shape == (2000, 12, 8) and ids.shape == sp.shape == (2000, 12)
  np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(x, vocab["embeddings"][ids])
  np.testing.assert_array_equal(sp.sum(1), 2)          # Exactly 2 sparse tokens each.
  np.testing.assert_array_equal(sp, ids >= 6)          # Sparse positions hold sparse ids.
  # Frequent ids ~ (12 - 2) / 6 = 1.67 per sequence each, sparse ids 2 / 10 = 0.2.
  per_seq = np.stack([(ids == v).sum(1).mean() for v in range(16)])
  np.testing.assert_allclose(per_seq[:6], 10 / 6, rtol=0.05)
  np.testing.assert_allclose(per_seq[6:], 0.2, rtol=0.2)
  # The label is the rule on the frequent tokens; balanced (centred scores).
  score = np.where(sp, 0.0, vocab["weights"][np.minimum(ids, 5)]).sum(1)
  np.testing.assert_array_equal(y, (score > 0).astype(np.int32))
  assert 0.4 < y.mean() < 0.6
  # Uninformative: the sparse ids' class is independent of the label.
  cls = vocab["sparse_class"][ids[sp].reshape(-1, 2) - 6]     # [N, 2]
  for label in (0, 1):
    assert abs(cls[y == label].mean() - 0.5) < 0.05
  # Informative (control): the same sequences, every sparse id of the label's class.
  _, inf = _vocab_task("informative", num=2000)
  np.testing.assert_array_equal(inf["labels"], y)
  np.testing.assert_array_equal(inf["is_sparse"], sp)
  np.testing.assert_array_equal(np.where(sp, 0, inf["ids"]), np.where(sp, 0, ids))
  icls = vocab["sparse_class"][inf["ids"][sp].reshape(-1, 2) - 6]
  np.testing.assert_array_equal(icls, np.repeat(y[:, None], 2, 1))


def _pair_noise(key, b, t, d, draws):
  """The measures' noise: pair q = t * R + r draws normal(fold_in(key, q), [B, D])."""
  return np.stack([np.stack([np.asarray(jax.random.normal(
      jax.random.fold_in(key, tt * draws + r), (b, d))) for r in range(draws)])
                   for tt in range(t)])            # [T, R, B, D]


@pytest.mark.parametrize("task", ["sparse", "vocab"])
def test_the_rule_yardstick_equals_a_direct_numpy_computation(task):
  """token_sensitivity of the rule == NumPy: noise one token of the INPUT, apply the true
  rule (sign bits -> majority; nearest embedding -> frequent score), count flips."""
  if task == "sparse":
    pos = st.relevant_positions(7, 3, 0)
    data = st.sparse_token_task(40, n=7, m=4, k=3, rule="majority", position_scale=1.0,
                                seed=1, positions=pos)
    fn, make = st.sparse_rule("majority")
    variables = make(pos)
    def rule(tok):                                    # [..., n, d] -> labels
      return (np.sign(tok[..., pos, 0]).sum(-1) > 0).astype(int)
    sigma = 0.4
  else:
    vocab, data = _vocab_task("uninformative", num=40)
    fn, variables = st.vocab_rule, st.vocab_rule_variables(vocab)
    emb = vocab["embeddings"].astype(np.float64)
    def rule(tok):
      ids = np.argmin(((tok[..., None, :] - emb) ** 2).sum(-1), -1)
      w = np.concatenate([vocab["weights"], np.zeros(10)])
      return (w[ids].sum(-1) > 0).astype(int)
    sigma = 0.35
  x = data["tokens"]
  b, t, d = x.shape
  np.testing.assert_array_equal(rule(x.astype(np.float64)), data["labels"])
  key, draws = jax.random.key(3), 4
  out = token_tasks.sensitivity_fn(fn, num_draws=draws, chunk_size=t)(variables, jnp.asarray(x),
                                                               key, sigma)
  noise = _pair_noise(key, b, t, d, draws)
  flips = np.zeros((b, t))
  for tt in range(t):
    for r in range(draws):
      xn = x.astype(np.float64).copy()
      xn[:, tt] += sigma * noise[tt, r]
      flips[:, tt] += rule(xn) != data["labels"]
  np.testing.assert_allclose(np.asarray(out["per_token"]), flips / draws)
  assert float(out["mean"]) == pytest.approx(flips.mean() / draws, abs=1e-6)
  assert flips.sum() > 0                               # Not trivially zero.
  if task == "sparse":   # Only a relevant token can flip the rule.
    assert flips[:, np.setdiff1d(np.arange(t), pos)].sum() == 0


def test_freezing_keeps_the_frozen_parts_at_their_initial_values(tmp_path):
  config = syn_config.get_config("smoke")
  _, data = _vocab_task("uninformative", num=64)
  x, y = jnp.asarray(data["tokens"]), jnp.asarray(data["labels"])
  model = syn.make_model(config, "attention", 2)
  init = token_tasks.init_fn(model)(jax.random.key(0), x[:1])
  for name, frozen in syn.FROZEN.items():
    p, steps, *_ = full_batch.train_to_accuracy(_wd(tmp_path / name), model, init,
                                         syn.make_optimizer(config, name), x, y,
                                         target=1.0, eval_every=10, max_steps=20)
    assert steps == 20
    for part in init:
      same = np.array_equal(np.asarray(p[part]["kernel"]), np.asarray(init[part]["kernel"]))
      assert same == (part in frozen), (name, part)


def test_uniform_attention_and_the_matched_mlp_size():
  x = np.random.default_rng(0).normal(size=(3, 5, 4)).astype(np.float32)
  soft = ola.OneLayerAttention(num_outputs=2)
  params = soft.init(jax.random.key(0), x)["params"]
  uni = ola.UniformAttention(num_outputs=2)
  wv, u = (np.asarray(params[k]["kernel"], np.float64) for k in ("w_v", "u"))
  np.testing.assert_allclose(np.asarray(uni.apply({"params": params}, x)),
                             x.astype(np.float64).mean(1) @ wv @ u, rtol=1e-5, atol=1e-6)
  assert uni.uniform_attention and not soft.uniform_attention and uni != soft
  config = syn_config.get_config()
  for shape in ((16, 24), (16, 16), (6, 10)):
    n, d = shape
    att = token_tasks.attention_num_params(d, 2)
    assert att == sum(v.size for v in jax.tree.leaves(jax.eval_shape(
        lambda: soft.init(jax.random.key(0), jnp.zeros((1, n, d))))))
    h = token_tasks.matched_width(config.attention, shape, 2)
    mlp = ola.TokenMLP(num_outputs=2, hidden_dims=(h,))
    count = sum(v.size for v in jax.tree.leaves(jax.eval_shape(
        lambda: mlp.init(jax.random.key(0), jnp.zeros((1, n, d))))))
    assert count == ola.token_mlp_num_params(n * d, (h,), 2)
    per_unit = n * d + 1 + 2
    assert abs(count - att) <= per_unit / 2 + 1, (shape, h, count, att)
  assert token_tasks.matched_width(config.attention, (16, 24), 2) == 5        # 1,937 vs 1,776 parameters.
