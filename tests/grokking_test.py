"""The grokking study: data split, model (shapes, count, init, no residual), sensitivity,
AdamW semantics, events, validation, and the smoke run end to end with a resume."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from mlcollections_configs import grokking as grok_config
from xsens import studies
from xsens.errors import ConfigError
from xsens.models import grokking_transformer as gt
from xsens.studies import grokking
from xsens.train.workdir import Workdir


# ---------------------------------------------------------------------------------- data


@pytest.mark.parametrize("p,seed", [(11, 0), (23, 42)])
def test_split_covers_every_pair_exactly_once(p, seed):
  s = grokking.split(p, 0.3, seed)
  tr, te = s["train_index"], s["test_index"]
  assert len(tr) == int(0.3 * p * p) and len(tr) + len(te) == p * p
  assert len(np.intersect1d(tr, te)) == 0
  np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), np.arange(p * p))
  pairs = {tuple(r[:2]) for r in np.concatenate([s["train_ids"], s["test_ids"]])}
  assert pairs == {(a, b) for a in range(p) for b in range(p)}
  for ids, labels in ((s["train_ids"], s["train_labels"]), (s["test_ids"], s["test_labels"])):
    assert np.all(ids[:, 2] == p)
    np.testing.assert_array_equal(labels, (ids[:, 0] + ids[:, 1]) % p)
  # The official notebook's stream: np.random.seed(seed); np.random.shuffle(indices).
  state = np.random.get_state()
  try:
    np.random.seed(seed)
    order = np.arange(p * p)
    np.random.shuffle(order)
  finally:
    np.random.set_state(state)
  np.testing.assert_array_equal(tr, order[:len(tr)])
  assert not np.array_equal(tr, grokking.split(p, 0.3, seed + 1)["train_index"])


def test_official_sizes_for_p113():
  s = grokking.split(113, 0.3, 42)
  assert len(s["train_ids"]) == 3830 and len(s["test_ids"]) == 12769 - 3830


# ---------------------------------------------------------------------------------- model


def _init(model, seed=0):
  return model.init(jax.random.key(seed), jnp.zeros((1, 3), jnp.int32))["params"]


@pytest.mark.slow
def test_paper_model_parameter_count_and_shapes():
  model = gt.GrokkingTransformer()
  params = _init(model)
  count = sum(x.size for x in jax.tree.leaves(params))
  # Hand count of the official SimpleTransformer (vocab 114, d 128, MLP 512):
  # embed 114·128 + pos 3·128 + in_proj 3·128·128 + 3·128 + out_proj 128·128 + 128
  # + fc1 128·512 + 512 + fc2 512·128 + 128 + fc_out 128·114 + 114.
  hand = (114 * 128 + 3 * 128 + 3 * 128 * 128 + 3 * 128 + 128 * 128 + 128
          + 128 * 512 + 512 + 512 * 128 + 128 + 128 * 114 + 114)
  assert count == hand == 227_442 == gt.num_params(114, 114, 128, 512)
  logits = model.apply({"params": params}, jnp.zeros((5, 3), jnp.int32))
  assert logits.shape == (5, 114) and logits.dtype == jnp.float32
  assert set(params) == {"token_embed", "pos_embed", "q_proj", "k_proj", "v_proj",
                         "out_proj", "fc1", "fc2", "fc_out"}  # no LayerNorm anywhere


@pytest.mark.slow
def test_init_follows_pytorch_defaults():
  d = 128
  params = _init(gt.GrokkingTransformer(), seed=3)
  assert np.all(np.asarray(params["pos_embed"]) == 0)
  emb = np.asarray(params["token_embed"])
  assert abs(emb.std() - 1.0) < 0.03  # nn.Embedding: N(0, 1)
  xavier = np.sqrt(6 / (4 * d))
  for name in ("q_proj", "k_proj", "v_proj"):
    k = np.asarray(params[name]["kernel"])
    assert np.abs(k).max() <= xavier and np.abs(k).max() > 0.95 * xavier
    assert np.all(np.asarray(params[name]["bias"]) == 0)
  assert np.all(np.asarray(params["out_proj"]["bias"]) == 0)
  for name, fan_in in (("out_proj", d), ("fc1", d), ("fc2", 512), ("fc_out", d)):
    k = np.asarray(params[name]["kernel"])
    assert np.abs(k).max() <= 1 / np.sqrt(fan_in) and np.abs(k).max() > 0.95 / np.sqrt(fan_in)


def _numpy_full_forward(params, ids, heads):
  """Every position through PyTorch-style MHA and the MLP, no residual; read position 2."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = p["token_embed"][ids] + p["pos_embed"][None]                 # [B, 3, d]
  b, t, d = x.shape
  hd = d // heads
  lin = lambda v, n: v @ p[n]["kernel"] + p[n]["bias"]
  q, k, v = (lin(x, n).reshape(b, t, heads, hd) for n in ("q_proj", "k_proj", "v_proj"))
  s = np.einsum("bqhc,bkhc->bhqk", q, k) / np.sqrt(hd)
  a = np.exp(s - s.max(-1, keepdims=True))
  a /= a.sum(-1, keepdims=True)
  o = np.einsum("bhqk,bkhc->bqhc", a, v).reshape(b, t, d)
  y = lin(np.maximum(lin(lin(o, "out_proj"), "fc1"), 0), "fc2")   # all positions
  return lin(y[:, -1], "fc_out")


@pytest.mark.slow
def test_last_position_forward_equals_full_numpy_forward_without_residual():
  model = gt.GrokkingTransformer(vocab_size=8, num_classes=8, width=16, num_heads=4,
                                 mlp_dim=24)
  params = _init(model, seed=1)
  # Non-zero positional embeddings so every term is exercised.
  params = dict(params, pos_embed=jax.random.normal(jax.random.key(2), (3, 16)))
  ids = np.array([[1, 2, 7], [0, 6, 7], [5, 5, 7]], np.int32)
  out = np.asarray(model.apply({"params": params}, ids))
  ref = _numpy_full_forward(params, ids, 4)
  np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-4)
  # A residual (x + attention) would change the output: the reference is not trivial.
  emb = np.asarray(model.apply({"params": params}, ids, method=model.embed))
  assert not np.allclose(out, ref + emb[:, -1, :1], atol=1e-3)
  # Token interface: from_embeddings(embed(ids)) == apply(ids).
  again = model.apply({"params": params}, jnp.asarray(emb), method=model.from_embeddings)
  np.testing.assert_allclose(np.asarray(again), out, rtol=1e-6, atol=1e-6)


def test_bad_head_count_is_a_config_error():
  with pytest.raises(ConfigError, match="num_heads"):
    gt.GrokkingTransformer(width=10, num_heads=4).check_config()


# ---------------------------------------------------------------------------- sensitivity


@pytest.mark.slow
@pytest.mark.parametrize("reads,expect_flips", [(0, True), (1, True), (2, False)])
def test_sensitivity_perturbs_only_positions_0_and_1(reads, expect_flips):
  """A classifier reading one position: only positions 0 and 1 may flip it."""
  b, d = 64, 4
  tokens = jnp.zeros((b, 3, d)).at[:, :, 0].set(1e-3)  # clean class 0 everywhere
  apply_fn = lambda v, t: jnp.stack([t[:, reads, 0], -t[:, reads, 0]], -1) * v
  clean = jnp.argmax(apply_fn(1.0, tokens), -1)
  s = float(grokking.embedding_sensitivity(apply_fn, 1.0, tokens, labels=clean,
                                           key=jax.random.key(0), sigma=1.0,
                                           token_mask=jnp.array([True, True, False])))
  if expect_flips:
    assert 0.3 < s < 0.7  # sign flips about half the time at sigma >> 1e-3
  else:
    assert s == 0.0


@pytest.mark.slow
def test_sensitivity_noise_is_one_draw_on_both_operands_together():
  b, d = 8, 3
  tokens = jax.random.normal(jax.random.key(1), (b, 3, d))
  key = jax.random.key(5)
  seen = []
  grokking.embedding_sensitivity(
      lambda v, t: (seen.append(t), t[:, 0, :2])[1], None, tokens,
      labels=jnp.zeros(b, jnp.int32), key=key, sigma=0.1,
      token_mask=jnp.array([True, True, False]))
  noisy = np.asarray(seen[-1])
  assert noisy.shape == (b, 3, d)  # one perturbed copy per example
  delta = noisy - np.asarray(tokens)
  np.testing.assert_array_equal(delta[:, 2], 0)
  expected = 0.1 * np.asarray(jax.random.normal(jax.random.fold_in(key, 0), (b, 3, d)))
  np.testing.assert_allclose(delta[:, :2], expected[:, :2], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- optimiser


def test_adamw_matches_pytorch_update_rule():
  """torch.optim.AdamW: p <- p(1 - lr wd); m, v EMAs; p -= lr m_hat / (sqrt(v_hat) + eps)."""
  config = grok_config.get_config("paper")
  config.optimizer.learning_rate = 0.01
  tx = grokking.make_optimizer(config)
  p = {"w": jnp.array([0.5, -1.0, 2.0])}
  grads = [jnp.array([0.1, -0.2, 0.3]), jnp.array([-0.4, 0.0, 0.2])]
  state = tx.init(p)
  lr, wd, b1, b2, eps = 0.01, 1.0, 0.9, 0.999, 1e-8
  ref, m, v = np.array([0.5, -1.0, 2.0]), 0.0, 0.0
  for t, g in enumerate(grads, 1):
    upd, state = tx.update({"w": g}, state, p)
    p = optax.apply_updates(p, upd)
    g = np.asarray(g)
    ref = ref * (1 - lr * wd)
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    ref = ref - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    np.testing.assert_allclose(np.asarray(p["w"]), ref, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------- events


def test_rolling_mean_and_events():
  np.testing.assert_allclose(grokking.rolling_mean(np.array([1.0, 3.0, 5.0, 7.0]), 2),
                             [1, 2, 4, 6])
  e = 400
  sens = np.concatenate([np.linspace(0, 0.4, 100), np.full(100, 0.4),
                         np.linspace(0.4, 0.0, 200)])
  sens[5] = 1.0  # a transient before memorisation is not the peak
  test = np.full(e, np.nan)
  test[::10] = np.where(np.arange(0, e, 10) >= 330, 0.9, 0.01)
  logs = {"sensitivity": sens, "test_accuracy": test,
          "train_accuracy": np.where(np.arange(e) >= 50, 1.0, 0.5)}
  ev = grokking.events(logs, window=1, grok_threshold=0.5, fall_fraction=0.5)
  assert ev["memorised_epoch"] == 50 and ev["grok_epoch"] == 330
  assert 99 <= ev["sens_peak_epoch"] <= 199
  assert ev["sens_fall_epoch"] == 300 and ev["lead_epochs"] == 30
  assert ev["sens_drop10_epoch"] == 220 and ev["test_rise_epoch"] == 330


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize("field,value,match", [
    ("model.num_heads", 3, r"model\.num_heads"),
    ("sensitivity.positions", [0, 3], r"sensitivity\.positions"),
    ("data.train_fraction", 1.5, r"data\.train_fraction"),
    ("data.modulus", 1, r"data\.modulus"),
    ("optimizer.b2", 1.0, r"optimizer\.b2"),
    ("train.chunk_epochs", 0, r"train\.chunk_epochs"),
])
def test_bad_config_is_refused_before_anything_is_written(tmp_path, field, value, match):
  config = grok_config.get_config("smoke")
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ConfigError, match=match):
    studies.run(config, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------------- study, resume


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  config = grok_config.get_config("smoke")
  workdir = str(tmp_path_factory.mktemp("grok"))
  return config, workdir, grokking.run(config, workdir, log=lambda *_: None)


@pytest.mark.slow
def test_smoke_study_writes_logs_table_and_plot(smoke):
  config, workdir, out = smoke
  e, s = config.train.epochs, config.train.num_seeds
  logs = out["logs"]
  for k in grokking.STEP_FIELDS:
    assert logs[k].shape == (s, e), k
  tested = ~np.isnan(logs["test_accuracy"][0])
  np.testing.assert_array_equal(np.nonzero(tested)[0], np.arange(0, e, config.train.test_every))
  assert np.all(np.isfinite(logs["train_loss"])) and np.all(logs["weight_norm"] > 0)
  assert np.all((logs["sensitivity"] >= 0) & (logs["sensitivity"] <= 1))
  # Training moves: the loss goes down; different seeds give different runs.
  assert np.all(logs["train_loss"][:, -1] < logs["train_loss"][:, 0])
  assert not np.allclose(logs["train_loss"][0], logs["train_loss"][1])
  assert Workdir(workdir).latest_step() == e
  md = open(os.path.join(workdir, "results.md")).read()
  assert "Grokking and sensitivity" in md and "grokking.png" in md and "lead_epochs" in md
  assert os.path.exists(os.path.join(workdir, "grokking.png"))
  payload = json.load(open(os.path.join(workdir, "results.json")))
  assert len(payload["rows"]) == s and len(payload["events"]) == s
  assert out["num_params"] == gt.num_params(12, 12, 16, 32)
  # Weight norm logged in the scan equals the norm of the initial parameters at row 0.
  model, init_state, _, _ = grokking.make_fns(config)
  init_keys, _ = grokking.seed_keys(config)
  p0 = init_state(init_keys[0])["params"]
  assert float(grokking.weight_norm(p0)) == pytest.approx(float(logs["weight_norm"][0, 0]),
                                                          rel=1e-5)


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_logs(smoke, tmp_path):
  config, _, out = smoke
  workdir = str(tmp_path / "resume")
  Workdir.open(workdir, config)
  part = grokking.train(config, workdir, max_chunks=1, log=lambda *_: None)
  assert part["epochs_done"] == config.train.chunk_epochs and part["final"] is None
  assert part["chunks_computed"] == 1 and part["resumed_from"] == 0
  assert part["logs"]["train_loss"].shape == (config.train.num_seeds, config.train.chunk_epochs)
  # The chunk length may change on a resume: chunks then end at multiples of the new one
  # (epochs 10-12, 12-16, ..., 28-30), with the same numbers.
  rechunked = grok_config.get_config("smoke")
  rechunked.train.chunk_epochs = 4
  again = grokking.run(rechunked, workdir, log=lambda *_: None)
  assert again["resumed_from"] == config.train.chunk_epochs
  assert sorted(os.listdir(os.path.join(workdir, "logs")))[:3] == [
      "epochs_0000000_0000010.npz", "epochs_0000010_0000012.npz", "epochs_0000012_0000016.npz"]
  for k in grokking.STEP_FIELDS:
    np.testing.assert_array_equal(again["logs"][k], out["logs"][k], err_msg=k)
  for k in out["final"]:
    np.testing.assert_array_equal(again["final"][k], out["final"][k], err_msg=k)


@pytest.mark.slow
def test_workdir_written_by_the_previous_code_resumes(smoke, tmp_path):
  """The layout of the study's own loop before the one loop: config.json without the
  resume-free fields, orbax checkpoints/<epoch> of the vmapped state, float32 per-chunk logs
  logs/epochs_<a>_<b>.npz [S, b - a]. It wrote a chunk's logs before its (asynchronous)
  checkpoint, so a crash could leave logs past the newest checkpoint: here those of a run
  with chunk_epochs / 2, which the resume must drop."""
  config, _, out = smoke
  workdir = tmp_path / "old"
  size, seeds = config.train.chunk_epochs, config.train.num_seeds
  # The previous code's fingerprint: the config without report, train.epochs,
  # train.chunk_epochs and train.keep_checkpoints.
  saved = json.loads(config.to_json_best_effort())
  saved.pop("report")
  for k in ("epochs", "chunk_epochs", "keep_checkpoints"):
    saved["train"].pop(k)
  (workdir / "logs").mkdir(parents=True)
  (workdir / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True))
  _, init_state, chunk, _ = grokking.make_fns(config)
  init_keys, noise_keys = grokking.seed_keys(config)
  state = jax.vmap(init_state)(init_keys)
  state, logs = jax.jit(jax.vmap(lambda s, d, k, t: chunk(s, d, k, t, size),
                                 in_axes=(0, 0, 0, None)))(
      state, grokking.stacked_data(config), noise_keys, jnp.int32(0))
  np.savez(workdir / "logs" / f"epochs_{0:07d}_{size:07d}.npz",
           **{k: np.asarray(v, np.float32) for k, v in logs.items()})
  half = size // 2
  stale = {k: np.full((seeds, half), 7.0, np.float32) for k in grokking.STEP_FIELDS}
  for start in (size, size + half):
    np.savez(workdir / "logs" / f"epochs_{start:07d}_{start + half:07d}.npz", **stale)
  manager = ocp.CheckpointManager(str(workdir / "checkpoints"))
  manager.save(size, args=ocp.args.StandardSave(state))
  manager.wait_until_finished()
  manager.close()
  again = grokking.run(config, str(workdir), log=lambda *_: None)
  assert again["resumed_from"] == size and again["epochs_done"] == config.train.epochs
  for k in grokking.STEP_FIELDS:
    np.testing.assert_array_equal(again["logs"][k], out["logs"][k], err_msg=k)
  for k in out["final"]:
    np.testing.assert_array_equal(again["final"][k], out["final"][k], err_msg=k)
  assert json.loads((workdir / "config.json").read_text()) == saved


@pytest.mark.slow
def test_workdir_of_another_config_is_refused(smoke):
  config, workdir, _ = smoke
  other = grok_config.get_config("smoke")
  other.optimizer.learning_rate = 0.5
  with pytest.raises(ConfigError, match="workdir"):
    studies.run(other, workdir)


@pytest.mark.slow
def test_fewer_epochs_than_the_workdir_holds_is_refused(smoke):
  config, workdir, _ = smoke
  shorter = grok_config.get_config("smoke")
  shorter.train.epochs = config.train.epochs - 1
  with pytest.raises(ConfigError, match=r"config.train.epochs: .*already holds"):
    studies.run(shorter, workdir)
  assert Workdir(workdir).latest_step() == config.train.epochs
