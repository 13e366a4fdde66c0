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
from xsens.data import modular_addition
from xsens.errors import ConfigError
from xsens.lab import modular_addition as addition_model
from xsens.models import grokking_transformer as gt
from xsens.studies import grokking
from xsens.train.workdir import Workdir


# ---------------------------------------------------------------------------------- data


@pytest.mark.parametrize("p,seed", [(11, 0), (23, 42)])
def test_split_covers_every_pair_exactly_once(p, seed):
  s = modular_addition.split(p, 0.3, seed)
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
  assert not np.array_equal(tr, modular_addition.split(p, 0.3, seed + 1)["train_index"])


def test_official_sizes_for_p113():
  s = modular_addition.split(113, 0.3, 42)
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


def test_paper_variant_with_five_seeds():
  """`paper,seeds=5`: the script's seeds 42..46 at p 113, vmapped (shapes only)."""
  config = grok_config.get_config("paper,seeds=5")
  grokking.validate(config)
  assert grokking.seeds_of(config) == [42, 43, 44, 45, 46]
  assert (config.data.modulus, config.optimizer.learning_rate, config.train.epochs) == (
      113, 1e-3, 20000)
  assert config.model.init_npz is None and tuple(config.report.grok_thresholds) == (0.5, 0.95)
  data = grokking.stacked_data(config)
  assert data["train_ids"].shape == (5, 3830, 3) and data["test_ids"].shape == (5, 8939, 3)
  init_keys, _ = grokking.seed_keys(config)
  state = jax.eval_shape(lambda k: grokking.initial_state(config, k), init_keys)
  assert state["params"]["fc1"]["kernel"].shape == (5, 128, 512)
  assert state["params"]["token_embed"].shape == (5, 114, 128)


def test_bad_head_count_is_a_config_error():
  with pytest.raises(ConfigError, match="num_heads"):
    gt.GrokkingTransformer(width=10, num_heads=4).check_config()


# ------------------------------------------------------ official layout (model.init_npz)
# The official model is PyTorch's (language/sens_addition.py); these references compute it
# from its state_dict arrays alone, in float64 NumPy, with no JAX and no PyTorch.


def _official_random(rng, p, d, m, lead=()):
  """Random arrays of the official state_dict's keys and shapes (vocab = classes = p + 1)."""
  out = {}
  for k, shape in gt.official_shapes(p + 1, p + 1, d, m).items():
    scale = (1.0 if k == "token_embed.weight" else 0.3 if k == "pos_embed" else 0.1
             if k.endswith("bias") else 1 / np.sqrt(shape[-1]))
    out[k] = (scale * rng.standard_normal(lead + shape)).astype(np.float32)
  return out


def _official_forward(st, ids, heads):
  """PyTorch's SimpleTransformer.forward: embeddings, nn.MultiheadAttention (packed
  in_proj, q scaled by 1/sqrt(head_dim)), fc1, ReLU, fc2 at every position, no residual,
  the last position through fc_out. Returns (logits, cache for `_official_grads`)."""
  f = {k: np.asarray(v, np.float64) for k, v in st.items()}
  b, t = ids.shape
  d = f["pos_embed"].shape[1]
  hd = d // heads
  x = f["token_embed.weight"][ids] + f["pos_embed"][None, :t]
  qkv = x @ f["attention.in_proj_weight"].T + f["attention.in_proj_bias"]
  q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(b, t, heads, hd) for i in range(3))
  a = np.einsum("bqhc,bkhc->bhqk", q, k) / np.sqrt(hd)
  a = np.exp(a - a.max(-1, keepdims=True))
  a /= a.sum(-1, keepdims=True)
  o = np.einsum("bhqk,bkhc->bqhc", a, v).reshape(b, t, d)
  y = o @ f["attention.out_proj.weight"].T + f["attention.out_proj.bias"]
  z1 = y @ f["fc1.weight"].T + f["fc1.bias"]
  r = np.maximum(z1, 0)
  z2 = r @ f["fc2.weight"].T + f["fc2.bias"]
  logits = z2[:, -1] @ f["fc_out.weight"].T + f["fc_out.bias"]
  return logits, dict(f=f, x=x, q=q, k=k, v=v, a=a, o=o, y=y, z1=z1, r=r, z2=z2, hd=hd)


def _official_loss_and_grads(st, ids, labels, heads):
  """Mean cross-entropy and its gradient for every state_dict array (hand backprop)."""
  logits, c = _official_forward(st, ids, heads)
  f, (b, t, d) = c["f"], c["x"].shape
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  loss = -logp[np.arange(b), labels].mean()
  dl = np.exp(logp)
  dl[np.arange(b), labels] -= 1
  dl /= b
  g = {"fc_out.weight": dl.T @ c["z2"][:, -1], "fc_out.bias": dl.sum(0)}
  dz2 = np.zeros_like(c["z2"])
  dz2[:, -1] = dl @ f["fc_out.weight"]
  lin = lambda name, dout, inp: g.update({f"{name}.weight": np.einsum("bto,bti->oi", dout, inp),
                                          f"{name}.bias": dout.sum((0, 1))})
  lin("fc2", dz2, c["r"])
  dz1 = (dz2 @ f["fc2.weight"]) * (c["z1"] > 0)
  lin("fc1", dz1, c["y"])
  dy = dz1 @ f["fc1.weight"]
  lin("attention.out_proj", dy, c["o"])
  do = (dy @ f["attention.out_proj.weight"]).reshape(b, t, heads, c["hd"])
  a = c["a"]
  da = np.einsum("bqhc,bkhc->bhqk", do, c["v"])
  dv = np.einsum("bhqk,bqhc->bkhc", a, do)
  ds = a * (da - (da * a).sum(-1, keepdims=True)) / np.sqrt(c["hd"])
  dq = np.einsum("bhqk,bkhc->bqhc", ds, c["k"])
  dk = np.einsum("bhqk,bqhc->bkhc", ds, c["q"])
  dqkv = np.concatenate([u.reshape(b, t, d) for u in (dq, dk, dv)], -1)
  lin("attention.in_proj", dqkv, c["x"])
  g["attention.in_proj_weight"] = g.pop("attention.in_proj.weight")
  g["attention.in_proj_bias"] = g.pop("attention.in_proj.bias")
  dx = dqkv @ f["attention.in_proj_weight"]
  g["pos_embed"] = dx.sum(0)
  g["token_embed.weight"] = np.zeros_like(f["token_embed.weight"])
  np.add.at(g["token_embed.weight"], ids, dx)
  return loss, g


def _official_adamw(st, ids, labels, heads, steps, lr, wd, b1=0.9, b2=0.999, eps=1e-8):
  """torch.optim.AdamW (decoupled decay on every array) for `steps` full-batch steps from
  `st`: (the arrays after each step, the loss before each step)."""
  p = {k: np.asarray(v, np.float64) for k, v in st.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  losses = []
  for t in range(1, steps + 1):
    loss, g = _official_loss_and_grads(p, ids, labels, heads)
    losses.append(loss)
    for k in p:
      p[k] = p[k] * (1 - lr * wd)
      m[k] = b1 * m[k] + (1 - b1) * g[k]
      v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
      p[k] = p[k] - lr / (1 - b1 ** t) * m[k] / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
  return p, np.asarray(losses)


def test_hand_gradients_of_the_official_reference_match_finite_differences():
  """The reference's own check (float64): central differences on a few entries of each."""
  rng = np.random.default_rng(0)
  st = {k: v.astype(np.float64) for k, v in _official_random(rng, 5, 8, 12).items()}
  ids = np.array([[1, 2, 5], [4, 0, 5], [3, 3, 5]])
  labels = np.array([3, 4, 1])
  _, g = _official_loss_and_grads(st, ids, labels, 2)
  loss_at = lambda s: _official_loss_and_grads(s, ids, labels, 2)[0]
  for k, w in st.items():
    for i in rng.choice(w.size, 3, replace=False):
      idx = np.unravel_index(i, w.shape)
      up, down = dict(st, **{k: w.copy()}), dict(st, **{k: w.copy()})
      up[k][idx] += 1e-6
      down[k][idx] -= 1e-6
      fd = (loss_at(up) - loss_at(down)) / 2e-6
      assert abs(fd - g[k][idx]) <= 1e-7 + 1e-5 * abs(fd), (k, idx, fd, g[k][idx])


def _write_npz(path, arrays):
  np.savez(path, **arrays)
  return str(path)


def _init_npz_config(path, seeds=2):
  config = grok_config.get_config(f"smoke,init_npz={path},seeds={seeds}")
  assert config.model.init_npz == path and config.train.num_seeds == seeds
  return config


def test_official_layout_round_trip_and_forward_match_the_official_forward(tmp_path):
  """An .npz of the official layout -> our params: same forward as the official model."""
  config = grok_config.get_config("smoke")  # p 11, d 16, 2 heads, MLP 32
  p, d, m, heads = 11, 16, 32, 2
  st = _official_random(np.random.default_rng(1), p, d, m)
  # The converter and its inverse, with and without a leading seed axis.
  back = gt.to_official(gt.from_official(st))
  assert set(back) == set(st)
  for k in st:
    np.testing.assert_array_equal(back[k], st[k], err_msg=k)
  stacked = {k: np.stack([v, 2 * v]) for k, v in st.items()}
  for k, v in gt.to_official(gt.from_official(stacked)).items():
    np.testing.assert_array_equal(v, stacked[k], err_msg=k)
  # Transposes and the Q/K/V split by hand.
  ours = gt.from_official(st)
  np.testing.assert_array_equal(ours["k_proj"]["kernel"],
                                st["attention.in_proj_weight"][d:2 * d].T)
  np.testing.assert_array_equal(ours["v_proj"]["bias"], st["attention.in_proj_bias"][2 * d:])
  np.testing.assert_array_equal(ours["fc1"]["kernel"], st["fc1.weight"].T)
  # The study loads the file: every seed gets the arrays, float32, in model.init's tree.
  path = _write_npz(tmp_path / "init.npz", st)
  loaded = addition_model.load_init_npz(_init_npz_config(path))
  model = grokking.make_model(config)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 3), jnp.int32)))
  assert jax.tree.structure(loaded) == jax.tree.structure(shapes["params"])
  for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(shapes["params"])):
    assert got.shape == (2, *want.shape) and got.dtype == np.float32
  params = jax.tree.map(lambda x: x[1], loaded)
  ids = np.array([[0, 1, p], [7, 3, p], [10, 10, p], [5, 0, p]], np.int32)
  out = np.asarray(model.apply({"params": params}, ids))
  ref, _ = _official_forward(st, ids, heads)
  assert out.dtype == np.float32 and np.abs(ref).max() > 1
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change,match", [
    (lambda st: st.pop("fc2.bias"), r"missing \['fc2.bias'\], unexpected \[\]"),
    (lambda st: st.update({"attention.bias_k": st["fc2.bias"]}),
     r"missing \[\], unexpected \['attention.bias_k'\]"),
    (lambda st: st.update({"fc1.weight": st["fc1.weight"].T}),
     r"'fc1.weight' has shape \(16, 32\); data.modulus=11, model.width=16, model.mlp_dim=32 "
     r"and train.num_seeds=2 need \(32, 16\) \(every seed\) or \(2, 32, 16\)"),
    (lambda st: st.update({"fc1.weight": np.stack([st["fc1.weight"]] * 3)}),
     r"'fc1.weight' has shape \(3, 32, 16\)"),
    (lambda st: st.update({"fc1.weight": np.stack([st["fc1.weight"]] * 2)}),  # only one key
     r"'fc1.weight' has shape \(2, 32, 16\)"),
    (lambda st: st["pos_embed"].__setitem__((0, 0), np.nan), r"'pos_embed' must hold finite"),
], ids=["missing", "unexpected", "transposed", "seeds", "one_stacked", "nan"])
def test_bad_init_npz_is_a_config_error(tmp_path, change, match):
  st = _official_random(np.random.default_rng(2), 11, 16, 32)
  change(st)
  config = _init_npz_config(_write_npz(tmp_path / "bad.npz", st))
  with pytest.raises(ConfigError, match=r"^config\.model\.init_npz: .*" + match):
    grokking.validate(config)


@pytest.mark.slow
def test_adamw_steps_from_init_npz_follow_the_official_update(tmp_path):
  """Per-seed official arrays [S, ...]: the study's jitted, seed-vmapped epochs from them
  give the loss and the arrays of torch.optim.AdamW's full-batch steps (hand NumPy, float64;
  float32 in the study), each seed on its own split; and `train` starts from the file."""
  steps, heads = 4, 2
  rng = np.random.default_rng(3)
  seeds = [_official_random(rng, 11, 16, 32) for _ in range(2)]
  path = _write_npz(tmp_path / "init.npz", {k: np.stack([s[k] for s in seeds]) for k in seeds[0]})
  config = _init_npz_config(path)
  config.optimizer.learning_rate = 1e-3  # the paper's lr and weight decay 1.0
  assert config.optimizer.weight_decay == 1.0
  init_keys, noise_keys = grokking.seed_keys(config)
  state = grokking.initial_state(config, init_keys)
  _, _, chunk, _ = grokking.make_fns(config)
  data = grokking.stacked_data(config)
  state, logs = jax.jit(jax.vmap(lambda s, d, k: chunk(s, d, k, jnp.int32(0), steps)))(
      state, data, noise_keys)
  assert int(state["step"][0]) == steps
  got = gt.to_official(state["params"])
  for i, (seed, st) in enumerate(zip(grokking.seeds_of(config), seeds)):
    sp = modular_addition.split(11, 0.3, seed)
    ref, losses = _official_adamw(st, sp["train_ids"], sp["train_labels"], heads, steps,
                                  lr=1e-3, wd=1.0)
    np.testing.assert_allclose(np.asarray(logs["train_loss"][i]), losses, rtol=2e-6)
    # Adam moves an entry by lr g / (|g| + eps): where |g| is near eps = 1e-8 the step
    # amplifies rounding (float32 here, float64 in the reference). That is the key bias
    # (in_proj_bias[d:2d]: it adds q·b_k to every score of a query, softmax ignores it, so
    # its gradient is 0 up to rounding in any implementation, PyTorch's too, and it changes
    # no output) and a few entries whose first gradient happens to be tiny: those only
    # within the steps' reach; every other entry (exact zeros too, e.g. a dead ReLU unit's)
    # to 2e-6 (a step moves an entry by about lr = 1e-3).
    _, g0 = _official_loss_and_grads(st, sp["train_ids"], sp["train_labels"], heads)
    tiny = {k: (np.abs(g) < 1e-6) & (g != 0) for k, g in g0.items()}
    assert np.all(tiny["attention.in_proj_bias"][16:32])
    assert sum(t.sum() for t in tiny.values()) <= 16 + 5
    for k in ref:
      diff = np.abs(got[k][i] - ref[k])
      assert np.all(diff[tiny[k]] <= steps * 1e-3), (seed, k)
      np.testing.assert_allclose(np.where(tiny[k], 0, diff), 0, atol=2e-6, err_msg=(seed, k))
      assert np.abs(ref[k] - st[k]).max() > 3e-3, k  # the arrays did move
  # The study's run starts from the file: the logged norm at epoch 0 is the file's.
  config.train.epochs = config.train.chunk_epochs = 2
  out = grokking.train(config, str(tmp_path / "w"), log=lambda *_: None)
  norms = [np.sqrt(sum(np.sum(np.square(v.astype(np.float64))) for v in st.values()))
           for st in seeds]
  np.testing.assert_allclose(out["logs"]["weight_norm"][:, 0], norms, rtol=1e-6)
  np.testing.assert_allclose(out["logs"]["train_loss"], logs["train_loss"][:, :2], rtol=1e-6)


# ---------------------------------------------------------------------------- sensitivity


@pytest.mark.slow
@pytest.mark.parametrize("reads,expect_flips", [(0, True), (1, True), (2, False)])
def test_sensitivity_perturbs_only_positions_0_and_1(reads, expect_flips):
  """A classifier reading one position: only positions 0 and 1 may flip it."""
  b, d = 64, 4
  tokens = jnp.zeros((b, 3, d)).at[:, :, 0].set(1e-3)  # clean class 0 everywhere
  apply_fn = lambda v, t: jnp.stack([t[:, reads, 0], -t[:, reads, 0]], -1) * v
  clean = jnp.argmax(apply_fn(1.0, tokens), -1)
  s = float(addition_model.embedding_sensitivity(apply_fn, 1.0, tokens, labels=clean,
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
  addition_model.embedding_sensitivity(
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
  test[::10][np.arange(0, e, 10) >= 370] = 0.97
  ev = grokking.events(logs, window=1, grok_thresholds=(0.5, 0.95, 0.99), fall_fraction=0.5)
  assert ev["memorised_epoch"] == 50 and ev["grok_epoch"] == 330
  assert 99 <= ev["sens_peak_epoch"] <= 199
  assert ev["sens_fall_epoch"] == 300 and ev["lead_epochs"] == 30
  assert ev["sens_drop10_epoch"] == 220 and ev["test_rise_epoch"] == 330
  # Every threshold under its own key; the first also under the old keys.
  assert ev["grok_epoch_0.5"] == 330 and ev["lead_epochs_0.5"] == 30
  assert ev["grok_epoch_0.95"] == 370 and ev["lead_epochs_0.95"] == 70
  assert ev["grok_epoch_0.99"] is None and ev["lead_epochs_0.99"] is None
  assert ev["grokked"] is True and ev["sens_at_grok"] == pytest.approx(0.4 * 69 / 199)
  late = grokking.events(logs, window=1, grok_thresholds=(0.95, 0.5), fall_fraction=0.5)
  assert late["grok_epoch"] == 370 and late["lead_epochs"] == 70
  # A post-grokking rise (AdamW's late loss spikes) is not the plateau's peak: the peak is
  # searched up to the grokking epoch, the later maximum is reported apart.
  spiked = dict(logs, sensitivity=np.concatenate([sens, np.full(100, 0.8)]),
                test_accuracy=np.concatenate([test, np.full(100, np.nan)]),
                train_accuracy=np.concatenate([logs["train_accuracy"], np.ones(100)]))
  sp = grokking.events(spiked, window=1, grok_thresholds=(0.5,), fall_fraction=0.5)
  assert 99 <= sp["sens_peak_epoch"] <= 199 and sp["lead_epochs"] == 30
  assert sp["sens_post_grok_max"] == pytest.approx(0.8)
  assert ev["sens_post_grok_max"] == pytest.approx(sens[330:].max())


def test_summary_across_seeds_counts_and_mean_se():
  def ev(g5, g95, fall):
    lead = lambda g: None if g is None or fall is None else g - fall
    return {"grok_epoch_0.5": g5, "lead_epochs_0.5": lead(g5), "grok_epoch_0.95": g95,
            "lead_epochs_0.95": lead(g95)}
  evs = [ev(1000, 1200, 900), ev(2000, None, 1500), ev(None, None, 3000),
         ev(3000, 3100, None)]
  rows = grokking.summary(evs, (0.5, 0.95))
  r5, r95 = rows
  assert (r5["seeds"], r5["grokked"], r5["fraction_grokked"]) == (4, 3, 0.75)
  assert r5["grok_epoch_mean"] == 2000 and r5["grok_epoch_n"] == 3
  assert r5["grok_epoch_se"] == pytest.approx(1000 / np.sqrt(3))  # std 1000, n 3
  assert (r5["lead_epochs_mean"], r5["lead_epochs_n"]) == (300, 2)  # leads 100, 500
  assert r5["lead_epochs_se"] == pytest.approx(200)
  assert (r95["grokked"], r95["fraction_grokked"], r95["grok_epoch_mean"]) == (2, 0.5, 2150)
  assert (r95["lead_epochs_mean"], r95["lead_epochs_se"], r95["lead_epochs_n"]) == (300, None, 1)
  md = grokking.summary_markdown(rows)
  assert "| 0.5 | 3 of 4 (0.75) | 2,000 ± 577 (n = 3) | 300 ± 200 (n = 2) |" in md
  assert "| 0.95 | 2 of 4 (0.50) | 2,150 ± 950 (n = 2) | 300 (n = 1) |" in md
  none = grokking.summary([ev(None, None, 10)], (0.5,))[0]
  assert none["fraction_grokked"] == 0 and none["grok_epoch_mean"] is None
  assert "— (n = 0)" in grokking.summary_markdown([none])


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize("field,value,match", [
    ("model.num_heads", 3, r"model\.num_heads"),
    ("sensitivity.positions", [0, 3], r"sensitivity\.positions"),
    ("data.train_fraction", 1.5, r"data\.train_fraction"),
    ("data.modulus", 1, r"data\.modulus"),
    ("optimizer.b2", 1.0, r"optimizer\.b2"),
    ("train.chunk_epochs", 0, r"train\.chunk_epochs"),
    ("report.grok_thresholds", (0.5, 0.5), r"report\.grok_thresholds: must be distinct"),
    ("report.grok_thresholds", (), r"report\.grok_thresholds"),
    ("report.grok_thresholds", (0.5, 1.5), r"report\.grok_thresholds"),
    ("model.init_npz", "/nonexistent/init.npz", r"model\.init_npz: no file"),
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
  assert [r["test_acc_threshold"] for r in payload["summary"]] == [0.5, 0.95]
  for row, ev in zip(payload["rows"], payload["events"]):
    assert row["grokked"] == (ev["grok_epoch"] is not None) and "grok_epoch_0.95" in row
  assert payload["summary"][0]["grokked"] == sum(r["grokked"] for r in payload["rows"])
  assert payload["init_npz_sha256"] is None
  assert "| test acc ≥ | grokked | grokking epoch |" in md
  assert out["num_params"] == gt.num_params(12, 12, 16, 32)
  # Weight norm logged in the scan equals the norm of the initial parameters at row 0.
  model, init_state, _, _ = grokking.make_fns(config)
  init_keys, _ = grokking.seed_keys(config)
  p0 = init_state(init_keys[0])["params"]
  assert float(addition_model.weight_norm(p0)) == pytest.approx(float(logs["weight_norm"][0, 0]),
                                                          rel=1e-5)
  # The noise-to-signal columns: σ over the RMS coordinate of the token + position
  # embeddings at the noised positions (NumPy), at epoch 0 and at the end.
  data = grokking.stacked_data(config)
  ids = np.asarray(data["train_ids"][0])
  emb = np.asarray(p0["token_embed"])[ids] + np.asarray(p0["pos_embed"])[None]
  rms0 = np.sqrt(np.mean(emb[:, list(config.sensitivity.positions)] ** 2))
  assert payload["rows"][0]["noise_to_signal_initial"] == pytest.approx(
      config.sensitivity.sigma / rms0, rel=1e-5)
  assert out["final"]["initial_embedding_rms"][0] == pytest.approx(rms0, rel=1e-5)
  assert payload["rows"][0]["noise_to_signal_final"] > 0


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


def test_official_init_script_writes_pytorchs_weights_that_our_model_reproduces(tmp_path):
  """experiments/official_grokking_init (PyTorch, the `bench` extra): the file it writes
  loads through `model.init_npz`, one seed per torch.manual_seed, and our forward from it
  equals PyTorch's own nn.MultiheadAttention forward of the same module."""
  torch = pytest.importorskip("torch")
  from experiments import official_grokking_init as official  # pylint: disable=g-import-not-at-top
  p, d, heads, m = 11, 16, 2, 32
  state = official.official_init(["42", "43"], p, d, heads, m)
  again = official.official_init(["42"], p, d, heads, m)
  for k, v in state.items():
    np.testing.assert_array_equal(v[0], again[k][0], err_msg=k)  # torch.manual_seed decides
  assert np.abs(state["fc1.weight"][0] - state["fc1.weight"][1]).max() > 0
  for k in ("pos_embed", "attention.in_proj_bias", "attention.out_proj.bias"):
    np.testing.assert_array_equal(state[k], 0, err_msg=k)  # PyTorch's zero inits
  path = _write_npz(tmp_path / "official.npz", state)
  params = addition_model.load_init_npz(_init_npz_config(path))
  config = grok_config.get_config("smoke")
  model = grokking.make_model(config)
  ids = np.array([[0, 1, p], [7, 3, p], [10, 10, p], [5, 0, p]], np.int32)
  torch.manual_seed(43)
  module = official.official_model(p + 1, 3, d, heads, m)
  with torch.no_grad():
    want = module(torch.as_tensor(ids, dtype=torch.long)).numpy()
  got = np.asarray(model.apply({"params": jax.tree.map(lambda x: x[1], params)}, ids))
  assert np.abs(want).max() > 0.1
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
