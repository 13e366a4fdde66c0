"""Tests for the text models (xsens/models/text.py): RoBERTa, GPT-2, LSTM."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.errors import ConfigError
from xsens.models import MODELS, TEXT_MODELS, get_model
from xsens.models import text

K = 3
V = 50
SMALL = {
    "roberta": dict(vocab_size=V, max_length=16, width=8, depth=2, num_heads=2, mlp_dim=12),
    "roberta_relu": dict(vocab_size=V, max_length=16, width=8, depth=2, num_heads=2,
                         mlp_dim=12, attention="relu"),
    "gpt2": dict(vocab_size=V, max_length=16, width=8, depth=2, num_heads=2, mlp_dim=12),
    "lstm": dict(vocab_size=V, width=8, hidden_dim=6, depth=2),
}
# Exact parameter counts (formulas in the model docstrings), K = 3 classes unless noted.
PARAM_COUNTS = {
    "roberta_small": ("roberta", SMALL["roberta"], 1_707),
    "roberta_relu_small": ("roberta", SMALL["roberta_relu"], 1_707),
    "gpt2_small": ("gpt2", SMALL["gpt2"], 1_632),
    "lstm_small": ("lstm", SMALL["lstm"], 1_157),
    # Paper sizes (4 layers, width 256, 8 heads; RoBERTa intermediate 3072), 2 classes.
    "roberta_default": ("roberta", {}, 9_558_274),
    "gpt2_default": ("gpt2", {}, 5_289_984),
    "lstm_default": ("lstm", {}, 4_203_522),
}


def _name(run):
  return "roberta" if run.startswith("roberta") else run


def _model(run, length=16, num_classes=K):
  return get_model(_name(run), num_classes, (length,), **SMALL[run])


def _ids(lengths, total, seed=0):
  """Right-padded ids [B, total] with real tokens in 1..V-1."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((len(lengths), total), np.int32)
  for b, n in enumerate(lengths):
    ids[b, :n] = rng.integers(1, V, size=n)
  return jnp.asarray(ids)


def _init(model, ids):
  key = jax.random.key(0)
  return model.init({"params": key, "dropout": key}, ids, train=False)


def test_registry():
  assert set(TEXT_MODELS) == {"roberta", "gpt2", "lstm"}
  assert all(MODELS[n] is TEXT_MODELS[n] for n in TEXT_MODELS)


@pytest.mark.parametrize("entry", sorted(PARAM_COUNTS))
def test_param_count(entry):
  name, kwargs, expected = PARAM_COUNTS[entry]
  num_classes = 2 if entry.endswith("default") else K
  model = get_model(name, num_classes, (16,), **kwargs)
  ids = jax.ShapeDtypeStruct((1, 16), jnp.int32)
  variables = jax.eval_shape(lambda x: _init(model, x), ids)
  assert sum(a.size for a in jax.tree.leaves(variables["params"])) == expected


@pytest.fixture(scope="module")
def initialised():
  """{run: (model, variables)} for the small settings."""
  out = {}
  for run in SMALL:
    model = _model(run)
    out[run] = (model, _init(model, _ids([16], 16)))
  return out


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(SMALL))
def test_shapes_and_token_interface(initialised, run):
  model, variables = initialised[run]
  ids = _ids([5, 9, 12], 12)
  logits = model.apply(variables, ids)
  assert logits.shape == (3, K) and logits.dtype == jnp.float32
  assert np.all(np.isfinite(logits))
  tokens = model.apply(variables, ids, method=model.embed)
  assert tokens.shape == (3, 12, 8)
  composed = model.apply(variables, tokens, text.padding_mask(ids), method=model.encode)
  np.testing.assert_allclose(composed, logits, rtol=1e-6, atol=1e-6)
  # Dropout is live only in training.
  train = model.apply(variables, ids, train=True, rngs={"dropout": jax.random.key(1)})
  assert train.shape == (3, K) and not np.allclose(train, logits)


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(SMALL))
def test_appending_padding_changes_nothing(initialised, run):
  model, variables = initialised[run]
  ids = _ids([3, 7, 10], 10)
  longer = jnp.concatenate([ids, jnp.zeros((3, 6), jnp.int32)], axis=1)
  np.testing.assert_allclose(model.apply(variables, longer), model.apply(variables, ids),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(SMALL))
def test_embeddings_at_padded_positions_do_not_matter(initialised, run):
  """Noise on a pad position (what a sensitivity estimator may add) changes nothing."""
  model, variables = initialised[run]
  ids = _ids([4, 8], 12)
  mask = text.padding_mask(ids)
  tokens = model.apply(variables, ids, method=model.embed)
  noise = 5.0 * jax.random.normal(jax.random.key(2), tokens.shape) * ~mask[..., None]
  clean = model.apply(variables, tokens, mask, method=model.encode)
  noisy = model.apply(variables, tokens + noise, mask, method=model.encode)
  np.testing.assert_allclose(noisy, clean, rtol=1e-5, atol=1e-5)
  # ... whereas noise on a real token does change the logits.
  on_real = 5.0 * jax.random.normal(jax.random.key(3), tokens.shape) * mask[..., None]
  real = model.apply(variables, tokens + on_real, mask, method=model.encode)
  assert not np.allclose(real, clean, atol=1e-4)


def test_gpt2_causal_mask_and_last_token_readout(initialised):
  model, variables = initialised["gpt2"]
  ids = _ids([12, 12], 12, seed=3)
  mask = text.padding_mask(ids)
  hidden = lambda x: model.apply(variables, model.apply(variables, x, method=model.embed),
                                 text.padding_mask(x), method=model.hidden_states)
  h = hidden(ids)
  for t in (0, 4, 10):
    future = ids.at[:, t + 1:].set((ids[:, t + 1:] + 7) % (V - 1) + 1)
    h2 = hidden(future)
    np.testing.assert_allclose(h2[:, :t + 1], h[:, :t + 1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(h2[:, t + 1:], h[:, t + 1:], atol=1e-4)
    # The classifier reads the last non-pad token: the prefix ids[:, :t+1] (padded) gives
    # the score of the full sequence's hidden state at t.
    prefix = jnp.where(jnp.arange(12)[None] <= t, ids, 0)
    kernel = variables["params"]["score"]["kernel"]
    np.testing.assert_allclose(model.apply(variables, prefix), h[:, t] @ kernel,
                               rtol=1e-5, atol=1e-5)
  assert mask.all()


@pytest.mark.slow
def test_roberta_is_not_causal(initialised):
  model, variables = initialised["roberta"]
  ids = _ids([10], 10, seed=4)
  later = ids.at[:, 9].set(ids[0, 9] % (V - 1) + 1)
  hidden = lambda x: model.apply(variables, model.apply(variables, x, method=model.embed),
                                 text.padding_mask(x), method=model.hidden_states)
  assert not np.allclose(hidden(later)[:, 0], hidden(ids)[:, 0], atol=1e-5)


@pytest.mark.parametrize("attention", ["softmax", "relu"])
def test_attention_matches_numpy(attention):
  width, heads, length = 6, 2, 5
  module = text.SelfAttention(width, heads, 0.0, attention)
  x = jax.random.normal(jax.random.key(5), (2, length, width))
  mask = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
  variables = module.init(jax.random.key(6), x, mask)
  out = np.asarray(module.apply(variables, x, mask))
  p = jax.tree.map(np.asarray, variables["params"])
  xn = np.asarray(x, np.float64)
  proj = lambda n: np.einsum("bld,dhk->blhk", xn, p[n]["kernel"]) + p[n]["bias"]
  q, k, v = proj("query"), proj("key"), proj("value")
  scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(width // heads)
  allowed = np.asarray(mask)[:, None, None, :]
  if attention == "relu":  # Unnormalised relu(scores), padded keys weigh 0.
    w = np.where(allowed, np.maximum(scores, 0.0), 0.0)
  else:
    s = np.where(allowed, scores, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
  ctx = np.einsum("bhqk,bkhd->bqhd", w, v)
  expected = np.einsum("bqhd,hdo->bqo", ctx, p["out"]["kernel"]) + p["out"]["bias"]
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def _sigmoid(z):
  return 1.0 / (1.0 + np.exp(-z))


@pytest.mark.slow
def test_lstm_equals_numpy_recurrence():
  model = get_model("lstm", 2, (5,), vocab_size=7, width=3, hidden_dim=4, depth=2,
                    dropout_rate=0.0)
  ids = jnp.asarray([[1, 4, 6, 2, 0], [3, 5, 2, 6, 1]], jnp.int32)
  variables = _init(model, ids)
  logits = np.asarray(model.apply(variables, ids))
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
  emb = p["embedding"]["embedding"][np.asarray(ids)]
  mu, var = emb.mean(-1, keepdims=True), emb.var(-1, keepdims=True)
  x = (emb - mu) / np.sqrt(var + 1e-5) * p["embedding_norm"]["scale"] + \
      p["embedding_norm"]["bias"]
  lengths = [4, 5]
  expected = []
  for b in range(2):
    seq = x[b, :lengths[b]]                            # Padding never enters the recurrence.
    for layer in range(2):
      w = p[f"layers_{layer}"]
      h, c, outs = np.zeros(4), np.zeros(4), []
      for t in range(len(seq)):
        g = seq[t] @ w["w_ih"] + w["b_ih"] + h @ w["w_hh"] + w["b_hh"]
        i, f, gg, o = g[:4], g[4:8], g[8:12], g[12:]
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(gg)
        h = _sigmoid(o) * np.tanh(c)
        outs.append(h)
      seq = np.stack(outs)
    expected.append(h @ p["head"]["kernel"] + p["head"]["bias"])
  np.testing.assert_allclose(logits, np.stack(expected), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, kwargs, shape, field", [
    ("roberta", dict(width=10, num_heads=4), (16,), "model.width"),
    ("roberta", dict(attention="gelu"), (16,), "model.attention"),
    ("roberta", dict(max_length=8), (16,), "model.max_length"),
    ("gpt2", dict(max_length=8), (16,), "model.max_length"),
    ("gpt2", dict(depth=0), (16,), "model.depth"),
    ("lstm", dict(hidden_dim=0), (16,), "model.hidden_dim"),
    ("lstm", dict(dropout_rate=1.0), (16,), "model.dropout_rate"),
    ("lstm", dict(official_frozen=1), (16,), "model.official_frozen"),
    ("roberta", {}, (28, 28, 1), "model.name"),
    ("lstm", {}, (28, 28, 1), "model.name"),
])
def test_bad_config_is_refused(name, kwargs, shape, field):
  with pytest.raises(ConfigError) as e:
    get_model(name, 2, shape, **kwargs)
  assert e.value.field == field


@pytest.mark.parametrize("run", ["roberta", "gpt2", "lstm"])
def test_noise_placement_before_the_embedding_norm(initialised, run):
  """encode_pre_norm(embed_pre_norm(ids)) is the model; RoBERTa's and the LSTM's tokens are
  the embedding LayerNorm's input; GPT-2's two placements coincide."""
  model, variables = initialised[run]
  ids = _ids([5, 12], 12)
  raw = model.apply(variables, ids, method=model.embed_pre_norm)
  logits = model.apply(variables, raw, text.padding_mask(ids), method=model.encode_pre_norm)
  np.testing.assert_allclose(logits, model.apply(variables, ids), rtol=1e-6, atol=1e-6)
  after = model.apply(variables, ids, method=model.embed)
  if run == "gpt2":
    np.testing.assert_array_equal(raw, after)
  else:
    normed = model.apply(variables, raw, method=lambda m, x: m.embedding_norm(x))
    np.testing.assert_allclose(normed, after, rtol=1e-6, atol=1e-6)
    assert not np.allclose(raw, after)


@pytest.mark.slow
def test_official_frozen_lstm_trains_only_the_lstm_layers():
  model = get_model("lstm", K, (12,), official_frozen=True, **SMALL["lstm"])
  ids = _ids([5, 12], 12)
  variables = _init(model, ids)
  plain = _init(_model("lstm", 12), ids)
  # The LayerNorm frozen at (scale 1, bias 0) has no parameters.
  assert set(variables["params"]) == set(plain["params"]) - {"embedding_norm"}
  # As the trainer applies it (train=True, mutable collections).
  loss = lambda p: model.apply({"params": p}, ids, train=True, mutable=["batch_stats"],
                               rngs={"dropout": jax.random.key(1)})[0].sum()
  grads = jax.grad(loss)(variables["params"])
  norms = {k: float(sum(jnp.abs(g).sum() for g in jax.tree.leaves(v)))
           for k, v in grads.items()}
  assert norms.pop("layers_0") > 0 and norms.pop("layers_1") > 0
  assert norms == {"embedding": 0.0, "head": 0.0}
  np.testing.assert_allclose(  # Same function as the plain LSTM with the same weights.
      model.apply(variables, ids), _model("lstm", 12).apply(
          {"params": {**variables["params"], "embedding_norm": {
              "scale": jnp.ones(8), "bias": jnp.zeros(8)}}}, ids), rtol=1e-6, atol=1e-6)
