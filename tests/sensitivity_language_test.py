"""The language sensitivity measures and the `sensitivity_language` study (smoke)."""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlcollections_configs import sensitivity_language as sl_config
from xsens import studies
from xsens.errors import ConfigError
from xsens.measures import planning
from xsens.measures import text_sensitivity as ts
from xsens.models import get_model
from xsens.models import text as text_models
from xsens.train import workdir as workdir_lib
from xsens.train.metrics import read_metrics


@pytest.mark.slow
def test_aggregates_by_hand():
  # Two sentences: lengths 3 and 2 (pads at the end), one masked special at position 0.
  p = jnp.asarray([[0.0, 0.5, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
  real = jnp.asarray([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
  out = ts.text_aggregates(p, real, ts.last_index(real))
  np.testing.assert_allclose(out["pooled"], 2.5 / 5)
  np.testing.assert_allclose(out["sentence_mean"], (1.5 / 3 + 1.0 / 2) / 2)
  # Right-aligned: k=0 -> {1.0 (s0, t2), 1.0 (s1, t1)}, k=1 -> {0.5, 0.0}, k=2 -> {0.0}.
  np.testing.assert_allclose(out["curve"][:3], [1.0, 0.25, 0.0])
  assert np.isnan(out["curve"][3])
  np.testing.assert_array_equal(out["curve_count"], [2, 2, 1, 0])
  early, late = ts.early_late(p, real)  # s0: t0 | t2 (t1 is the middle); s1: t0 | t1.
  np.testing.assert_allclose([early, late], [0.0, 1.0])
  content = real.at[:, 0].set(False)
  out = ts.text_aggregates(p, content, ts.last_index(real))
  np.testing.assert_allclose(out["pooled"], 2.5 / 3)
  np.testing.assert_array_equal(out["curve_count"], [2, 1, 0, 0])


@pytest.fixture(scope="module")
def roberta():
  model = get_model("roberta", 2, (10,), vocab_size=20, max_length=10, width=8, depth=1,
                    num_heads=2, mlp_dim=8)
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 20, (4, 10)), jnp.int32)
  ids = ids * (jnp.arange(10)[None] < jnp.asarray([[10], [7], [4], [9]]))
  key = jax.random.key(0)
  variables = model.init({"params": key, "dropout": key}, ids)
  return model, variables, ids


@functools.partial(jax.jit, static_argnames=("model",))
def _per_token(model, variables, ids, sigma, example_ids=None):
  tokens = model.apply(variables, ids, method=model.embed)
  encode = functools.partial(model.apply, method=model.encode)
  return ts.text_token_sensitivity(
      encode, variables, tokens, key=jax.random.key(3),
      token_mask=text_models.padding_mask(ids), sigma=sigma, num_draws=2,
      example_ids=example_ids)


@pytest.mark.slow
def test_token_sensitivity_masks_and_batching(roberta):
  model, variables, ids = roberta
  mask = np.asarray(text_models.padding_mask(ids))
  out = _per_token(model, variables, ids, 10.0)
  per_token = np.asarray(out["per_token"])
  assert per_token.shape == (4, 10)
  np.testing.assert_allclose(out["per_example"],
                             (per_token * mask).sum(-1) / mask.sum(-1), rtol=1e-6)
  np.testing.assert_allclose(out["mean"], np.asarray(out["per_example"]).mean(),
                             rtol=1e-6)
  assert int(out["count"]) == 2 * mask.sum()
  assert (per_token[~mask] == 0).all() and per_token[mask].max() > 0
  assert set(np.unique(per_token)) <= {0.0, 0.5, 1.0}
  assert (np.asarray(_per_token(model, variables, ids, 0.0)["per_token"]) == 0).all()
  # Example b's noise depends on its id only: measuring in two halves changes nothing.
  halves = [_per_token(model, variables, ids[s], 10.0, jnp.arange(4)[s])["per_token"]
            for s in (slice(0, 2), slice(2, 4))]
  np.testing.assert_array_equal(np.concatenate(halves), per_token)


@pytest.mark.slow
def test_token_sensitivity_labels_example_mask_and_chunks(roberta):
  model, variables, ids = roberta
  tokens = model.apply(variables, ids, method=model.embed)
  encode = functools.partial(model.apply, method=model.encode)
  pad = text_models.padding_mask(ids)
  run = lambda v, **kw: jax.jit(lambda v: ts.text_token_sensitivity(  # kw static
      encode, v, tokens, key=jax.random.key(3), token_mask=pad, sigma=10.0, num_draws=2,
      **kw))(v)
  ref = run(variables, chunk_size=None)
  clean = jnp.argmax(encode(variables, tokens, pad), -1)
  for out in (run(variables), run(variables, chunk_size=3), run(variables, labels=clean),
              run(variables, memory_budget_bytes=1)):
    np.testing.assert_array_equal(out["per_token"], ref["per_token"])
  padded = run(variables, mask=jnp.arange(4) < 3)
  np.testing.assert_array_equal(padded["per_example"], ref["per_example"])
  np.testing.assert_allclose(padded["mean"], np.asarray(ref["per_example"])[:3].mean(),
                             rtol=1e-6)
  assert int(padded["count"]) == 2 * int(np.asarray(pad)[:3].sum())
  with pytest.raises(ValueError, match="key"):
    ts.text_token_sensitivity(encode, variables, tokens, token_mask=pad, sigma=1.0,
                              num_draws=2)


@pytest.mark.slow
def test_global_sensitivity_range(roberta):
  model, variables, ids = roberta
  tokens = model.apply(variables, ids, method=model.embed)
  encode = functools.partial(model.apply, method=model.encode)
  mask = text_models.padding_mask(ids)
  glob = lambda v, sigma, **kw: jax.jit(lambda v, sigma: ts.text_global_sensitivity(
      encode, v, tokens, key=jax.random.key(1), token_mask=mask, sigma=sigma,
      num_draws=8, **kw)["per_example"])(v, sigma)
  big, none = glob(variables, 50.0), glob(variables, 0.0)
  # The draws are chunked ('auto', or explicitly) without changing any flip.
  np.testing.assert_array_equal(glob(variables, 50.0, chunk_size=3), big)
  np.testing.assert_array_equal(glob(variables, 50.0, chunk_size=None), big)
  assert big.shape == (4,) and (np.asarray(none) == 0).all() and np.asarray(big).max() > 0


@pytest.mark.slow
def test_text_plans_give_the_same_flips_and_the_result_says_its_sizes(roberta, monkeypatch):
  monkeypatch.setattr(planning, "TUNED_FORWARD_BATCH", {})
  model, variables, ids = roberta
  tokens = model.apply(variables, ids, method=model.embed)
  encode = functools.partial(model.apply, method=model.encode)
  mask = text_models.padding_mask(ids)
  for fn, n in ((ts.text_token_sensitivity, 10 * 2), (ts.text_global_sensitivity, 2)):
    run = jax.jit(lambda v: [fn(encode, v, tokens, key=jax.random.key(1), token_mask=mask,
                                sigma=10.0, num_draws=2, chunk_size=c)
                             for c in ("auto", "tune", 1, None)])
    auto, tuned, one, everything = run(variables)
    for out in (auto, tuned, one):
      np.testing.assert_array_equal(out["per_example"], everything["per_example"])
    # The examples run vmapped, all B = 4 in each forward call.
    assert {k: int(v) for k, v in one["plan"].items()} == dict(
        chunk_size=1, example_chunk_size=4, forward_batch=4)
    assert int(everything["plan"]["forward_batch"]) == 4 * n
    assert int(auto["plan"]["example_chunk_size"]) == 4
  with pytest.raises(ValueError, match="sigma must be a scalar"):
    ts.text_token_sensitivity(encode, variables, tokens, key=jax.random.key(1),
                              token_mask=mask, sigma=jnp.ones(2), num_draws=2)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("sensitivity_language")
  config = sl_config.get_config("smoke")
  return config, workdir, studies.run(config, str(workdir))


@pytest.mark.slow
def test_smoke_study_writes_table_plots_and_history(smoke_run):
  config, workdir, out = smoke_run
  rows = {r["run"]: r for r in out["rows"]}
  assert set(rows) == {"roberta", "gpt2", "lstm"}
  for name, row in rows.items():
    run_dir = os.path.join(workdir, "runs", name)
    assert workdir_lib.Workdir(run_dir).latest_step() == config.train.total_steps
    for key in ("S_token", "S_token_sentence", "S_token_content", "S_global", "S_early",
                "S_late"):
      assert 0.0 <= row[key] <= 1.0, (name, key)
    reports = [r for r in read_metrics(run_dir) if "sens/token_pooled" in r]
    assert [r["step"] for r in reports] == [0, 2, 4]
    assert all("sens/curve/0" in r and "sens/global" in r for r in reports)
    hist = out["history"][name]
    np.testing.assert_array_equal(hist["examples"], [0, 64, 128])
  md = (workdir / "results.md").read_text()
  assert "Token-wise sensitivity of language models on text/synthetic" in md
  assert "recency_ratio" in md and "Ordering of S_token" in md
  # The smoke config trains a fixed length: said in words, no `None` for the absent target.
  assert (f"Every model trained for {config.train.total_steps} steps (no train-accuracy "
          "target).") in md and "None" not in md
  for plot in ("sensitivity_vs_examples.png", "sensitivity_per_position.png"):
    assert (workdir / plot).exists() and plot in md
  payload = json.loads((workdir / "results.json").read_text())
  curve = payload["curves"]["lstm"]
  assert len(curve["curve"]) == config.train.data.max_length
  assert curve["count"][0] == config.sensitivity.num_examples  # Every sentence has an end.


@pytest.mark.slow
def test_rerun_resumes_without_training(smoke_run):
  config, workdir, out = smoke_run
  again = studies.run(config, str(workdir))
  assert [r["steps"] for r in again["rows"]] == [r["steps"] for r in out["rows"]]
  reports = [r for r in read_metrics(os.path.join(workdir, "runs", "gpt2"))
             if "sens/token_pooled" in r]
  assert [r["step"] for r in reports] == [0, 2, 4]


@pytest.mark.parametrize("field, value, error", [
    ("sensitivity.num_draws", 0, "sensitivity.num_draws"),
    ("sensitivity.sigma", -1.0, "sensitivity.sigma"),
    ("sensitivity.noise_scale", "relative", "sensitivity.noise_scale"),
    ("sensitivity.num_examples", 10_000, "sensitivity.num_examples"),
    ("runs.lstm.model.name", "vit", "runs.lstm.model.name"),
    ("runs.gpt2.model.vocab_size", 8, "runs.gpt2.model.vocab_size"),
    ("train.data.max_length", 4, "train.data.max_length"),
    ("sensitivity.noise_placement", "inside", "sensitivity.noise_placement"),
    ("num_seeds", 0, "num_seeds"),
    ("train.data.synthetic.task", "parity", "train.data.synthetic.task"),
    ("train.data.synthetic.label_noise", 0.7, "train.data.synthetic.label_noise"),
])
def test_bad_config_is_refused_before_anything_is_written(tmp_path, field, value, error):
  config = sl_config.get_config("smoke")
  *parents, last = field.split(".")
  node = config
  for p in parents:
    node = node[p]
  with node.unlocked():
    node[last] = value
  with pytest.raises(ConfigError) as e:
    studies.run(config, str(tmp_path))
  assert e.value.field == error
  assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_measure_options(roberta):
  """include_special_tokens picks the content aggregates; token_rms rescales σ."""
  from xsens.studies import sensitivity_language as sl  # pylint: disable=g-import-not-at-top
  model, variables, ids = roberta
  ids = np.asarray(ids).copy()
  ids[:, 0] = 1                                      # <s> first, </s> last real token.
  ids[np.arange(4), (ids != 0).sum(1) - 1] = 2
  labels = np.zeros(4, np.int32)
  sc = sl_config.get_config("smoke").sensitivity
  sc.batch_size = 3
  key = jax.random.key(0)
  full = sl.measure(model, variables, ids, labels, sc, key, 1)
  assert full["headline"] is full["all"]
  sc.include_special_tokens = False
  content = sl.measure(model, variables, ids, labels, sc, key, 1)
  assert content["headline"] is content["content"]
  np.testing.assert_array_equal(content["per_token"], full["per_token"])
  np.testing.assert_allclose(content["content"]["pooled"], full["content"]["pooled"])
  sc.noise_scale = "token_rms"
  scaled = sl.measure(model, variables, ids, labels, sc, key, 1)
  assert scaled["token_rms"] == full["token_rms"] and 0.5 < full["token_rms"] < 2.0
  sc.sigma = sc.sigma / full["token_rms"]              # Undo the scaling: same noise.
  sc.global_sigma = sc.global_sigma / full["token_rms"]
  again = sl.measure(model, variables, ids, labels, sc, key, 1)
  np.testing.assert_allclose(again["per_token"], content["per_token"], atol=1e-6)


def test_config_variants():
  config = sl_config.get_config("task=weak_sum,seeds=3,target=0.95,placement=before_norm,"
                                "official_lstm,margin=1.0")
  assert config.num_seeds == 3 and sl_config.get_config().num_seeds == 1
  assert config.train.data.synthetic.task == "weak_sum"
  assert config.train.data.synthetic.margin == 1.0
  assert config.train.target_train_accuracy == 0.95 and config.train.total_steps == 3000
  assert config.sensitivity.noise_placement == "before_norm"
  assert config.runs.lstm_official.model.official_frozen
  default = sl_config.get_config()
  assert default.train.target_train_accuracy is None and default.train.total_steps == 1500
  assert default.sensitivity.noise_placement == "after_norm"
  assert sl_config.get_config("steps=700").train.total_steps == 700


def test_token_type_masks_and_seed_aggregation():
  from xsens.data import text as text_data  # pylint: disable=g-import-not-at-top
  from xsens.studies import sensitivity_language as sl  # pylint: disable=g-import-not-at-top
  dc = sl_config.get_config().train.data
  ids, _ = text_data.synthetic_language(30, seed=0)
  masks = sl.token_type_masks(dc, 0, ids)
  assert set(masks) == set(sl.TOKEN_TYPES)
  total = sum(m.astype(int) for m in masks.values())
  np.testing.assert_array_equal(total, ids != 0)
  signal = text_data.signal_token_ids("polarity")
  np.testing.assert_array_equal(masks["signal"], np.isin(ids, signal))
  # Seeds: mean over the seeds that reached each report; one row per run.
  ids_map = {"a": ("a", 0), "a_seed1": ("a", 1)}
  hist = {"a": {"examples": np.asarray([0., 32.]), "token_pooled": np.asarray([.1, .3])},
          "a_seed1": {"examples": np.asarray([0., 32., 64.]),
                      "token_pooled": np.asarray([.3, .5, .6])}}
  agg = sl.seed_history(hist, ids_map)["a"]
  np.testing.assert_allclose(agg["examples"], [0, 32, 64])
  np.testing.assert_allclose(agg["token_pooled"], [.2, .4, .6])
  rows = [{"run": "a", "S_token": 0.1}, {"run": "a_seed1", "S_token": 0.3}]
  from xsens.report import seed_stats  # pylint: disable=g-import-not-at-top
  summary = seed_stats.seed_rows(rows, ids_map, ["S_token"])
  md = seed_stats.seed_summary_markdown(summary, ["S_token"])
  assert "| a | 2 | 0.2 ± 0.1 |" in md


@pytest.mark.slow
def test_two_seeds_matched_accuracy_and_placement(tmp_path):
  """num_seeds=2: two rows (ids lstm, lstm_seed1) with different training, one seed row;
  target accuracy stops at the first evaluation; noise before the LayerNorm."""
  config = sl_config.get_config("smoke,seeds=2,target=0.01,placement=before_norm")
  with config.unlocked():
    config.runs = {"lstm": config.runs.lstm.to_dict()}
  out = studies.run(config, str(tmp_path))
  rows = {r["run"]: r for r in out["rows"]}
  assert set(rows) == {"lstm", "lstm_seed1"}
  assert all(r["stop_reason"] == "target_train_accuracy" and r["steps"] == 2
             for r in rows.values())
  assert rows["lstm"]["S_global"] != rows["lstm_seed1"]["S_global"] or (
      rows["lstm"]["token_rms"] != rows["lstm_seed1"]["token_rms"])
  # Before the LayerNorm the tokens are the raw N(0, 1) embeddings.
  assert 0.8 < rows["lstm"]["token_rms"] < 1.2
  (summary,) = out["seed_summary"]
  assert summary["run"] == "lstm" and summary["seeds"] == 2
  np.testing.assert_allclose(summary["S_token"],
                             np.mean([r["S_token"] for r in rows.values()]))
  assert summary["S_token s.e."] >= 0
  md = (tmp_path / "results.md").read_text()
  assert "Mean ± standard error over the training seeds" in md and "S_signal" in md
  assert "before the embedding LayerNorm" in md
  assert (f"until its train accuracy (on {config.train.eval_train_examples} training "
          f"examples, checked every {config.train.eval_every} steps) reached 0.01, for at most "
          f"{config.train.total_steps} steps. Reached by lstm (step 2), lstm_seed1 (step 2)."
          ) in md and "None" not in md
