"""Tests for xsens/measures/sensitivity.py and xsens/measures/tokens.py."""

import functools
import logging
import math
import os
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from xsens.measures import boolean
from xsens.measures import planning
from xsens.measures import sensitivity as sens
from xsens.measures import tokens as tokens_lib

jax.config.update("jax_disable_most_optimizations", True)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------
# Small token models: apply_fn(variables, tokens [B, T, D]) -> logits [B, K].
# ----------------------------------------------------------------------------


def token0_model(variables, tok):
  """Reads only token 0: class 1 iff tok[:, 0, 0] > 0 (no variables)."""
  del variables
  return jnp.stack([jnp.zeros(tok.shape[0]), tok[:, 0, 0]], -1)


def linear_apply(variables, tok):
  """logits = [0, sum_t w_t . x_t + b], variables = {"w": [T, D], "b": []}."""
  w, b = variables["w"], variables["b"]
  return jnp.stack(
      [jnp.zeros(tok.shape[0]), jnp.einsum("btd,td->b", tok, w) + b], -1)


def mlp_params(key, t, d, hidden=8, classes=4):
  k1, k2, k3 = jax.random.split(key, 3)
  return dict(w1=jax.random.normal(k1, (t, d, hidden)) / math.sqrt(t * d),
              b1=jax.random.normal(k2, (hidden,)) * 0.1,
              w2=jax.random.normal(k3, (hidden, classes)))


def mlp_apply(params, tok):
  """A nonlinear model that mixes all tokens."""
  h = jnp.tanh(jnp.einsum("btd,tdh->bh", tok, params["w1"]) + params["b1"])
  return h @ params["w2"]


def random_tokens(seed, b=3, t=5, d=4):
  return jax.random.normal(jax.random.key(seed), (b, t, d))


KEY = jax.random.key(42)


# ----------------------------------------------------------------------------
# Token interface.
# ----------------------------------------------------------------------------


def test_patchify_round_trip_and_order():
  images = jax.random.normal(jax.random.key(0), (2, 8, 12, 3))
  tok = tokens_lib.patchify(images, 4)
  assert tok.shape == (2, 6, 48)
  # Token t is the patch at grid row t // 3, column t % 3, laid out (p, p, C).
  np.testing.assert_array_equal(
      tok[:, 4], images[:, 4:8, 4:8, :].reshape(2, -1))
  np.testing.assert_array_equal(
      tokens_lib.unpatchify(tok, 4, images.shape[1:]), images)
  assert tokens_lib.patch_grid(images.shape, 4) == (2, 3)
  with pytest.raises(ValueError, match="divide"):
    tokens_lib.patchify(images, 5)


def test_token_view_reproduces_apply_fn():
  images = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
  apply_fn = lambda v, x: x.reshape(x.shape[0], -1)[:, :5] * v
  token_fn, tok = tokens_lib.token_view(apply_fn, images, 4)
  assert tok.shape == (2, 4, 48)
  np.testing.assert_array_equal(token_fn(2.0, tok), apply_fn(2.0, images))
  same_fn, same = tokens_lib.token_view(apply_fn, tok)      # tokens as they are
  assert same_fn is apply_fn and same is tok
  with pytest.raises(ValueError, match="patch_size"):
    tokens_lib.token_view(apply_fn, images)
  with pytest.raises(ValueError, match="divide"):
    tokens_lib.token_view(apply_fn, images, 3)


# ----------------------------------------------------------------------------
# Token-wise sensitivity.
# ----------------------------------------------------------------------------


def test_token0_model_is_sensitive_only_at_token0():
  tok = random_tokens(2).at[:, 0, 0].set(jnp.array([0.1, -0.2, 0.05]))
  out = jax.jit(lambda x, k: sens.token_sensitivity(
      token0_model, None, x, key=k, sigma=1.0, num_draws=16))(tok, KEY)
  per_token = np.asarray(out["per_token"])
  assert per_token.shape == (3, 5)
  np.testing.assert_array_equal(per_token[:, 1:], 0.0)
  assert np.all(per_token[:, 0] > 0.2)
  np.testing.assert_allclose(out["per_example"], per_token[:, 0] / 5)
  np.testing.assert_allclose(out["mean"], per_token[:, 0].mean() / 5,
                             rtol=1e-6)
  assert int(out["count"]) == 3 * 5 * 16
  assert int(out["flips"]) == round(per_token.sum() * 16)


def test_linear_classifier_matches_closed_form():
  b, t, d, sigma, draws = 2, 4, 3, 0.5, 4000
  w = jax.random.normal(jax.random.key(3), (t, d)) * jnp.array(
      [0.3, 1.0, 2.0, 0.6])[:, None]
  tok = random_tokens(4, b, t, d) * 0.1
  bias = 0.3
  margin = np.asarray(jnp.einsum("btd,td->b", tok, w) + bias)
  out = jax.jit(lambda v, x, k: sens.token_sensitivity(
      linear_apply, v, x, key=k, sigma=sigma, num_draws=draws,
      chunk_size=4096))(dict(w=w, b=bias), tok, KEY)
  # P[flip at token i] = Phi(-|margin| / (sigma ||w_i||)).
  expected = stats.norm.cdf(-np.abs(margin)[:, None] /
                            (sigma * np.linalg.norm(np.asarray(w), axis=-1)))
  se = np.sqrt(expected * (1 - expected) / draws)
  assert np.all(expected > 0.01), expected   # The test is informative.
  np.testing.assert_array_less(np.abs(out["per_token"] - expected),
                               4 * se + 1e-6)


def test_zero_sigma_and_constant_model_give_zero():
  tok = random_tokens(5)
  params = mlp_params(jax.random.key(6), 5, 4)
  const = lambda v, x: jnp.broadcast_to(jnp.array([1.0, 0.0]), (x.shape[0], 2))

  @jax.jit
  def run(v, x, key):
    return (sens.token_sensitivity(mlp_apply, v, x, key=key, sigma=0.0,
                                   num_draws=4),
            sens.token_sensitivity(const, v, x, key=key, sigma=10.0,
                                   num_draws=4))

  zero_sigma, constant = run(params, tok, KEY)
  assert float(zero_sigma["mean"]) == 0.0 and int(zero_sigma["flips"]) == 0
  assert float(zero_sigma["stderr"]) == 0.0
  assert float(zero_sigma["stderr_noise"]) == 0.0
  assert float(constant["mean"]) == 0.0


@pytest.mark.slow
def test_masks():
  tok = random_tokens(7, b=3, t=5)
  params = mlp_params(jax.random.key(8), 5, 4)
  token_mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]],
                         bool)
  no_tokens = jnp.array([[1] * 5, [1] * 5, [0] * 5], bool)
  example_mask = jnp.array([True, True, False])

  @jax.jit
  def run(v, x, key):
    ts = lambda f, **kw: sens.token_sensitivity(f, v, x, key=key, sigma=2.0,
                                                num_draws=8, **kw)
    return dict(full=ts(mlp_apply), masked=ts(mlp_apply, token_mask=token_mask),
                only0=ts(token0_model, token_mask=jnp.arange(5) > 0),
                ex=ts(mlp_apply, mask=example_mask),
                empty=ts(mlp_apply, token_mask=no_tokens),
                one_draw=sens.token_sensitivity(mlp_apply, v, x, key=key,
                                                sigma=2.0, num_draws=1))

  r = run(params, tok, KEY)
  full, masked, m = r["full"], r["masked"], np.asarray(token_mask)
  assert float(full["mean"]) > 0.1
  # Same noise per (token, draw): valid tokens keep their values.
  np.testing.assert_array_equal(masked["per_token"],
                                np.where(m, full["per_token"], 0.0))
  np.testing.assert_allclose(
      masked["per_example"],
      (np.asarray(full["per_token"]) * m).sum(-1) / m.sum(-1), rtol=1e-6)
  assert int(masked["count"]) == 8 * m.sum()
  # Padding tokens of a token-0 reader contribute nothing.
  assert float(r["only0"]["mean"]) == 0.0
  # A padded example (mask False) is left out of mean and count, but keeps
  # its per-example value.
  np.testing.assert_allclose(r["ex"]["mean"],
                             np.mean(full["per_example"][:2]), rtol=1e-6)
  np.testing.assert_array_equal(r["ex"]["per_example"], full["per_example"])
  assert int(r["ex"]["count"]) == 2 * 5 * 8
  # An example with no valid token is dropped as well.
  np.testing.assert_allclose(r["empty"]["mean"], r["ex"]["mean"], rtol=1e-6)
  assert int(r["empty"]["count"]) == 2 * 5 * 8
  # stderr: sample std of per_example / sqrt(N) over the valid examples.
  np.testing.assert_allclose(
      full["stderr"], np.std(full["per_example"], ddof=1) / np.sqrt(3),
      rtol=1e-5)
  np.testing.assert_allclose(
      r["ex"]["stderr"],
      np.std(full["per_example"][:2], ddof=1) / np.sqrt(2), rtol=1e-5)
  # stderr_noise, R >= 2: sum_t p(1 - p) / (R - 1) / T^2 per example.
  p = np.asarray(full["per_token"])
  var_b = (p * (1 - p)).sum(-1) / 7 / 25
  np.testing.assert_allclose(full["stderr_noise"],
                             np.sqrt(var_b.sum()) / 3, rtol=1e-5)
  # stderr_noise, R = 1: binomial bound s (1 - s) / (T - 1) per example.
  s = np.asarray(r["one_draw"]["per_example"])
  np.testing.assert_allclose(r["one_draw"]["stderr_noise"],
                             np.sqrt((s * (1 - s) / 4).sum()) / 3, rtol=1e-5)


@pytest.mark.slow
def test_vectorised_equals_loop_for_all_chunk_sizes():
  tok = random_tokens(9, b=3, t=5)
  params = mlp_params(jax.random.key(10), 5, 4)
  kw = dict(sigma=1.5, num_draws=4)
  ref = sens.token_sensitivity_loop(mlp_apply, params, tok, key=KEY, **kw)
  assert 0.05 < float(ref["mean"]) < 0.95
  sizes = (None, 1, 3, 7, "auto")

  @jax.jit
  def run(v, x, key):
    return [sens.token_sensitivity(mlp_apply, v, x, key=key, chunk_size=c,
                                   **kw) for c in sizes]

  for chunk_size, out in zip(sizes, run(params, tok, KEY)):
    for name in ("per_token", "per_example", "flips", "count"):
      np.testing.assert_array_equal(out[name], ref[name],
                                    err_msg=f"{name} chunk={chunk_size}")
    for name in ("mean", "stderr", "stderr_noise"):
      np.testing.assert_allclose(out[name], ref[name], rtol=1e-6)


@pytest.mark.slow
def test_loop_compiles_once_traces_variables_and_accepts_unhashable_models():
  tok = random_tokens(33, b=3, t=4)
  traces = []

  def model(variables, x):
    traces.append(x.shape)
    return token0_model(None, x) * variables

  kw = dict(key=KEY, sigma=1.0, num_draws=2)
  first = sens.token_sensitivity_loop(model, 1.0, tok, **kw)
  # New variables of the same structure: traced, so no new compilation.
  second = sens.token_sensitivity_loop(model, 2.0, tok, **kw)
  assert len(traces) == 2, traces            # Clean labels + one pair step.
  np.testing.assert_array_equal(first["per_token"], second["per_token"])

  class Unhashable:
    __hash__ = None

    def __call__(self, variables, x):
      return token0_model(variables, x)

  out = sens.token_sensitivity_loop(Unhashable(), None, tok, **kw)
  np.testing.assert_array_equal(out["per_token"], first["per_token"])


@pytest.mark.slow
def test_example_chunk_size_does_not_change_results():
  tok = random_tokens(28, b=5, t=4)
  params = mlp_params(jax.random.key(29), 4, 4)
  kw = dict(sigma=1.5, num_draws=3)
  ref = sens.token_sensitivity_loop(mlp_apply, params, tok, key=KEY,
                                    example_chunk_size=2, **kw)
  assert 0.05 < float(ref["mean"]) < 0.95
  sizes = [(None, 1), (3, 1), (4, 2), (5, None), (1, 7)]  # (pairs, examples)
  for c, e in sizes:
    batches = []

    def counting(v, x):
      batches.append(x.shape[0])
      return mlp_apply(v, x)

    out = jax.jit(lambda v, x, key: sens.token_sensitivity(
        counting, v, x, key=key, chunk_size=c, example_chunk_size=e, **kw))(
            params, tok, KEY)
    for name in ("per_token", "per_example", "flips", "count"):
      np.testing.assert_array_equal(out[name], ref[name],
                                    err_msg=f"{name} chunk={c} examples={e}")
    # n = ceil(B / e) strided blocks of ceil(B / n) examples (e = 2: three
    # blocks of 2, one padding copy), times min(c, T * R) pairs per call.
    examples = 5 if e is None else -(-5 // -(-5 // e))
    assert max(batches) == examples * min(c or 12, 12), (c, e, batches)
  with pytest.raises(ValueError, match="example_chunk_size"):
    sens.token_sensitivity(mlp_apply, params, tok, key=KEY,
                           example_chunk_size=0, **kw)


def test_plan_chunks():
  mib = 2**20
  per_input = planning.FORWARD_BYTES_PER_INPUT_BYTE
  # 1 KiB inputs, a budget of 8 inputs per forward call.
  plan = lambda **kw: planning.plan_chunks(
      4, 100, 1024, memory_budget_bytes=8 * 1024 * per_input, **kw)
  assert plan() == (2, None)                           # 4 examples x 2 copies
  assert plan(chunk_size=None) == (None, 1)            # 100 copies: 1 example
  assert plan(chunk_size=3) == (3, 2)
  assert plan(example_chunk_size=1) == (8, 1)
  assert plan(example_chunk_size=None) == (2, None)
  assert plan(chunk_size=5, example_chunk_size=None) == (5, None)  # explicit
  # The whole batch does not fit: one copy per call, blocks of 8 examples.
  assert planning.plan_chunks(20, 100, 1024,
                          memory_budget_bytes=8 * 1024 * per_input) == (1, 8)
  # Everything fits: all copies in one call (clipped to num_items).
  assert planning.plan_chunks(4, 10, 1024, memory_budget_bytes=mib * per_input) \
      == (10, None)
  # A budget below one input still evaluates one input per call.
  assert planning.plan_chunks(4, 10, 1024, memory_budget_bytes=1) == (1, 1)
  for bad in (dict(chunk_size=0), dict(chunk_size="big"),
              dict(memory_budget_bytes=0), dict(example_chunk_size=-1)):
    with pytest.raises(ValueError):
      planning.plan_chunks(4, 10, 1024, **bad)


@pytest.mark.slow
def test_auto_chunks_are_bounded_and_match_explicit():
  b, t, d, draws = 6, 5, 4, 4
  tok = random_tokens(40, b, t, d)
  params = mlp_params(jax.random.key(41), t, d)
  item = t * d * 4                                    # float32 bytes per copy
  # Room for 10 inputs per forward call.
  budget = 10 * item * planning.FORWARD_BYTES_PER_INPUT_BYTE
  kw = dict(sigma=1.5, num_draws=draws)
  ref = sens.token_sensitivity_loop(mlp_apply, params, tok, key=KEY, **kw)
  assert 0.05 < float(ref["mean"]) < 0.95
  for budget_bytes, expect in ((budget, 6), (budget // 4, 2)):
    batches = []

    def counting(v, x):
      batches.append(x.shape[0])
      return mlp_apply(v, x)

    run = jax.jit(lambda v, x, key: [sens.token_sensitivity(
        counting, v, x, key=key, memory_budget_bytes=budget_bytes,
        chunk_size=c, example_chunk_size=e, **kw)
        for c, e in (("auto", "auto"),
                     planning.plan_chunks(b, t * draws, item,
                                      memory_budget_bytes=budget_bytes))])
    auto, explicit = run(params, tok, KEY)
    # budget: the batch fits, 10 // 6 = 1 copy per call (6 inputs); a quarter
    # of it: 2 inputs per call, blocks of 2 examples.
    assert max(batches) == expect, batches
    assert max(batches) * item * planning.FORWARD_BYTES_PER_INPUT_BYTE <= \
        budget_bytes
    for out in (auto, explicit):
      for name in ("per_token", "flips", "count"):
        np.testing.assert_array_equal(out[name], ref[name], err_msg=name)
      np.testing.assert_allclose(out["per_example"], ref["per_example"],
                                 rtol=1e-6)
  # The default budget does not cut a small problem: one forward call.
  assert planning.plan_chunks(b, t * draws, item) == (t * draws, None)


def test_key_is_required():
  tok = random_tokens(42)
  for fn in (sens.token_sensitivity, sens.token_sensitivity_loop,
             sens.global_sensitivity, sens.smooth_token_sensitivity):
    with pytest.raises(ValueError, match="key"):
      fn(token0_model, None, tok, sigma=1.0, num_draws=2)
  with pytest.raises(ValueError, match="key"):
    sens.scattered_pixel_sensitivity(token0_model, None, tok[..., None],
                                     sigma=1.0, num_draws=2, num_pixels=2)


@pytest.mark.slow
def test_example_chunk_size_in_other_estimators():
  tok = random_tokens(30, b=4, t=5)
  images = jax.random.normal(jax.random.key(31), (3, 4, 4, 1))
  params = mlp_params(jax.random.key(32), 5, 4)
  probe = lambda v, x: jnp.stack([jnp.zeros(x.shape[0]),
                                  x.reshape(x.shape[0], -1).sum(-1)], -1)

  @jax.jit
  def run(v, x, im, key):
    outs = []
    for e in (None, 2):   # 2 blocks of 2: 4 tokens; 3 images + 1 padding.
      kw = dict(key=key, sigma=2.0, num_draws=4, chunk_size=3,
                example_chunk_size=e)
      outs.append(dict(
          glob=sens.global_sensitivity(mlp_apply, v, x, **kw)["per_example"],
          pix=sens.scattered_pixel_sensitivity(
              probe, None, im, num_pixels=3, **kw)["per_example"],
          img=sens.token_sensitivity(
              probe, None, im, patch_size=2, **kw)["per_token"],
          smooth=sens.smooth_token_sensitivity(mlp_apply, v, x, **kw)["mean"]))
    return outs

  full, blocked = run(params, tok, images, KEY)
  for name in ("glob", "pix", "img"):
    np.testing.assert_array_equal(blocked[name], full[name], err_msg=name)
  np.testing.assert_allclose(blocked["smooth"], full["smooth"], rtol=1e-6)
  assert float(full["smooth"]) > 0


def test_labels_argument():
  tok = random_tokens(11)
  params = mlp_params(jax.random.key(12), 5, 4)

  @jax.jit
  def run(v, x, key):
    clean = jnp.argmax(mlp_apply(v, x), -1)
    ts = lambda **kw: sens.token_sensitivity(mlp_apply, v, x, key=key,
                                             num_draws=2, **kw)
    return (ts(sigma=1.0), ts(sigma=1.0, labels=clean),
            ts(sigma=0.0, labels=(clean + 1) % 4))

  default, explicit, wrong = run(params, tok, KEY)
  np.testing.assert_array_equal(default["per_token"], explicit["per_token"])
  assert float(wrong["mean"]) == 1.0


@pytest.mark.slow
def test_under_jit_and_vmap_over_keys():
  b, t, d, draws = 8, 4, 3, 8
  w = jax.random.normal(jax.random.key(13), (t, d))
  tok = random_tokens(14, b, t, d) * 0.3
  variables = dict(w=w, b=0.1)

  def user_fn(v, x, key):
    out = sens.token_sensitivity(linear_apply, v, x, key=key, sigma=0.5,
                                 num_draws=draws, chunk_size=5)
    return out["mean"] * 100.0, out

  keys = jax.random.split(jax.random.key(15), 128)
  scaled, out = jax.jit(user_fn)(variables, tok, keys[3])
  many = jax.jit(jax.vmap(lambda k: user_fn(variables, tok, k)[1]))(keys)
  np.testing.assert_array_equal(many["per_token"][3], out["per_token"])
  np.testing.assert_allclose(scaled, out["mean"] * 100.0, rtol=1e-6)
  # stderr_noise predicts the spread of `mean` over keys (examples fixed).
  ratio = np.std(many["mean"], ddof=1) / np.mean(many["stderr_noise"])
  assert 0.75 < ratio < 1.33, ratio
  assert np.all(many["stderr"] > 0)


@pytest.mark.slow
def test_image_token_sensitivity_on_cnn():

  class TinyCNN(nn.Module):

    @nn.compact
    def __call__(self, x, train=False):
      x = nn.relu(nn.Conv(4, (3, 3))(x))
      return nn.Dense(3)(x.reshape(x.shape[0], -1))

  images = jax.random.normal(jax.random.key(16), (2, 8, 8, 3))
  model = TinyCNN()
  variables = model.init(jax.random.key(17), images)
  apply_fn = functools.partial(model.apply, train=False)
  token_fn, tokens = tokens_lib.token_view(apply_fn, images, 4)

  @jax.jit
  def run(v, x, tok, key):
    out = sens.token_sensitivity(apply_fn, v, x, key=key, patch_size=4,
                                 sigma=2.0, num_draws=4, chunk_size=6)
    ref = sens.token_sensitivity(token_fn, v, tok, key=key, sigma=2.0,
                                 num_draws=4)
    return out, ref

  out, ref = run(variables, images, tokens, KEY)
  assert out["per_patch_map"].shape == (2, 2, 2)
  np.testing.assert_array_equal(out["per_patch_map"].reshape(2, 4),
                                out["per_token"])
  np.testing.assert_array_equal(out["per_token"], ref["per_token"])
  assert 0.0 < float(out["mean"]) < 1.0
  loop = sens.token_sensitivity_loop(apply_fn, variables, images, key=KEY,
                                     patch_size=4, sigma=2.0, num_draws=4)
  np.testing.assert_array_equal(loop["per_patch_map"], out["per_patch_map"])


@pytest.mark.slow
def test_sharded_batch_matches_unsharded():
  script = textwrap.dedent("""
      import jax, jax.numpy as jnp, numpy as np
      from jax.sharding import NamedSharding, PartitionSpec as P
      from xsens.measures import sensitivity as sens
      assert jax.device_count() == 4
      k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
      w = dict(w1=jax.random.normal(k1, (5, 3, 8)),
               w2=jax.random.normal(k2, (8, 4)))
      f = lambda v, t: jnp.tanh(jnp.einsum('btd,tdh->bh', t, v['w1'])) @ v['w2']
      tok = jax.random.normal(k3, (8, 5, 3))
      mask = jnp.arange(8) < 7
      mesh = jax.make_mesh((4,), ('data',))
      sharded = jax.device_put(tok, NamedSharding(mesh, P('data')))
      sharded_mask = jax.device_put(mask, NamedSharding(mesh, P('data')))
      for e in (None, 4):
        run = jax.jit(lambda v, t, m, k: sens.token_sensitivity(
            f, v, t, key=k, mask=m, sigma=1.0, num_draws=3, chunk_size=4,
            example_chunk_size=e))
        ref = run(w, tok, mask, jax.random.key(1))
        out = run(w, sharded, sharded_mask, jax.random.key(1))
        np.testing.assert_array_equal(out['per_token'], ref['per_token'])
        np.testing.assert_array_equal(out['mean'], ref['mean'])
        assert out['per_token'].sharding.is_equivalent_to(
            NamedSharding(mesh, P('data')), 2), out['per_token'].sharding
      print('OK')
  """)
  # Both runs in the one process and mode: fast compiles are fine.
  env = dict(os.environ,
             XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                        + " --xla_force_host_platform_device_count=4"),
             JAX_DISABLE_MOST_OPTIMIZATIONS="1",
             JAX_PLATFORMS="cpu",
             PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


# ----------------------------------------------------------------------------
# Global and scattered-pixel variants.
# ----------------------------------------------------------------------------


@pytest.mark.slow
def test_global_sensitivity():
  tok = random_tokens(18)
  params = mlp_params(jax.random.key(19), 5, 4)

  @jax.jit
  def run(v, x, key):
    gs = lambda f, **kw: sens.global_sensitivity(f, v, x, key=key, **kw)
    return dict(
        chunked=gs(mlp_apply, sigma=2.0, num_draws=16, chunk_size=5),
        unchunked=gs(mlp_apply, sigma=2.0, num_draws=16, chunk_size=None),
        auto=gs(mlp_apply, sigma=2.0, num_draws=16),
        zero=gs(mlp_apply, sigma=0.0, num_draws=4),
        masked=gs(token0_model, sigma=5.0, num_draws=8,
                  token_mask=jnp.arange(5) > 0))

  r = run(params, tok, KEY)
  assert float(r["chunked"]["mean"]) > 0.1
  assert int(r["chunked"]["count"]) == 3 * 16
  np.testing.assert_array_equal(r["chunked"]["per_example"],
                                r["unchunked"]["per_example"])
  np.testing.assert_array_equal(r["auto"]["per_example"],
                                r["unchunked"]["per_example"])
  assert float(r["zero"]["mean"]) == 0.0
  assert float(r["masked"]["mean"]) == 0.0


def test_scattered_pixel_masks_are_shared_across_batch():
  images = jax.random.normal(jax.random.key(20), (3, 8, 8, 2))

  @jax.jit
  def run(x, key):
    masks = sens.scattered_pixel_masks(key, num_draws=6, image_shape=x.shape,
                                       num_pixels=5)
    copies = sens.scattered_pixel_perturb(x, key, jnp.arange(6), sigma=1.0,
                                          num_pixels=5)
    return masks, copies

  masks, copies = run(images, KEY)
  assert masks.shape == (6, 8, 8)
  counts = np.asarray(masks.sum((1, 2)))
  assert np.all((counts >= 1) & (counts <= 5))
  changed = np.asarray(copies != images[:, None])          # [B, R, H, W, C]
  np.testing.assert_array_equal(
      changed, np.broadcast_to(np.asarray(masks, bool)[None, :, :, :, None],
                               changed.shape))


@pytest.mark.slow
def test_scattered_pixel_sensitivity():
  images = jnp.zeros((4, 4, 4, 1))
  # Flips iff pixel (0, 0) is perturbed.
  probe = lambda v, x: jnp.stack(
      [jnp.full(x.shape[0], 0.5), v * jnp.abs(x[:, 0, 0, 0])], -1)

  @jax.jit
  def run(v, x, key):
    sps = lambda **kw: sens.scattered_pixel_sensitivity(
        probe, v, x, key=key, num_pixels=4, **kw)
    masks = sens.scattered_pixel_masks(key, num_draws=32, image_shape=x.shape,
                                       num_pixels=4)
    return (sps(sigma=1.0, num_draws=32, chunk_size=5),
            sps(sigma=0.0, num_draws=4), masks)

  out, zero, masks = run(1e4, images, KEY)
  hit = float(masks[:, 0, 0].mean())
  assert 0.0 < hit < 1.0
  # One mask per draw for the whole batch: every example flips on the same
  # draws, exactly those whose mask covers pixel (0, 0).
  np.testing.assert_allclose(out["per_example"], np.full(4, hit), rtol=1e-6)
  assert int(out["count"]) == 4 * 32
  assert float(zero["mean"]) == 0.0


# ----------------------------------------------------------------------------
# Smooth variant.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("norm,on,chunk_size", [
    ("l2", "logits", None), ("l1", "probs", 3), ("sq_l2", "logits", 7)])
@pytest.mark.slow
def test_smooth_gradient_matches_finite_difference(norm, on, chunk_size):
  with jax.enable_x64(True):
    params = jax.tree.map(lambda a: a.astype(jnp.float64),
                          mlp_params(jax.random.key(21), 5, 4))
    tok = random_tokens(22).astype(jnp.float64)

    @jax.jit
    def loss(scale, x):
      v = dict(params, w2=params["w2"] * scale)      # Gradient via variables.
      return sens.smooth_token_sensitivity(
          mlp_apply, v, x, key=KEY, sigma=0.5, num_draws=3, norm=norm, on=on,
          chunk_size=chunk_size)["mean"]

    value, (g_scale, g_tok) = jax.jit(jax.value_and_grad(loss, (0, 1)))(
        1.3, tok)
    h = 1e-5
    fd = (loss(1.3 + h, tok) - loss(1.3 - h, tok)) / (2 * h)
    assert float(value) > 0
    np.testing.assert_allclose(g_scale, fd, rtol=1e-6, atol=1e-9)
    direction = jax.random.normal(jax.random.key(23), tok.shape, jnp.float64)
    fd_tok = (loss(1.3, tok + h * direction) -
              loss(1.3, tok - h * direction)) / (2 * h)
    np.testing.assert_allclose(jnp.vdot(g_tok, direction), fd_tok, rtol=1e-6,
                               atol=1e-9)


@pytest.mark.slow
def test_smooth_variant_chunking_masking_and_zero():
  tok = random_tokens(24)
  params = mlp_params(jax.random.key(25), 5, 4)

  @jax.jit
  def run(v, x, key):
    sts = lambda f, **kw: sens.smooth_token_sensitivity(f, v, x, key=key, **kw)
    return (sts(mlp_apply, sigma=1.0, num_draws=4, chunk_size=None),
            sts(mlp_apply, sigma=1.0, num_draws=4, chunk_size=7),
            # One copy per call: the perturbed forward has the clean one's batch
            # size (B * T * R copies in one call may round differently: ~3e-7).
            sts(mlp_apply, sigma=0.0, num_draws=2, chunk_size=1),
            sts(token0_model, sigma=1.0, num_draws=2,
                token_mask=jnp.arange(5) > 0))

  unchunked, chunked, zero, masked = run(params, tok, KEY)
  assert float(unchunked["mean"]) > 0
  np.testing.assert_allclose(unchunked["mean"], chunked["mean"], rtol=1e-5)
  assert float(zero["mean"]) == 0.0 and float(masked["mean"]) == 0.0
  np.testing.assert_array_equal(masked["per_token"][:, 1:], 0.0)
  assert unchunked["per_token"].shape == (3, 5)
  np.testing.assert_allclose(unchunked["per_example"],
                             unchunked["per_token"].mean(-1), rtol=1e-6)
  np.testing.assert_allclose(unchunked["mean"],
                             unchunked["per_example"].mean(), rtol=1e-6)
  padded = jax.jit(lambda v, x, key: sens.smooth_token_sensitivity(
      mlp_apply, v, x, key=key, sigma=1.0, num_draws=4, chunk_size=None,
      mask=jnp.array([1.0, 1.0, 0.0])))(params, tok, KEY)
  np.testing.assert_allclose(padded["mean"],
                             unchunked["per_example"][:2].mean(), rtol=1e-6)
  with pytest.raises(ValueError, match="norm"):
    sens.smooth_token_sensitivity(mlp_apply, params, tok, key=KEY, sigma=1.0,
                                  num_draws=2, norm="linf")


# ----------------------------------------------------------------------------
# Boolean sensitivity.
# ----------------------------------------------------------------------------

parity = lambda v, x: jnp.prod(x, -1)
dictator = lambda v, x: x[:, 0]
majority = lambda v, x: jnp.sign(jnp.sum(x, -1))


def test_boolean_exact():
  bs = jax.jit(lambda f, n, **kw: sens.boolean_sensitivity(
      f, None, boolean.all_inputs(n), **kw), static_argnums=(0, 1),
               static_argnames="normalize")
  out = bs(parity, 6)
  assert float(out["mean"]) == 6.0 and float(out["stderr"]) == 0.0
  np.testing.assert_array_equal(out["influence"], np.ones(6))
  np.testing.assert_array_equal(out["per_example"], np.full(64, 6.0))
  assert int(out["count"]) == 64
  assert float(bs(dictator, 4)["mean"]) == 1.0
  # Majority on n = 5: n * C(n-1, (n-1)/2) / 2^(n-1) = 5 * 6 / 16.
  np.testing.assert_allclose(bs(majority, 5)["mean"], 5 * 6 / 16)
  np.testing.assert_allclose(bs(parity, 6, normalize=True)["mean"], 1.0)
  np.testing.assert_allclose(bs(majority, 5, normalize=True)["mean"], 6 / 16)


def test_boolean_sampled():

  @jax.jit
  def run(key):
    return (sens.boolean_sensitivity(majority, None,
                                     boolean.random_inputs(key, 4000, 5)),
            sens.boolean_sensitivity(parity, None,
                                     boolean.random_inputs(key, 64, 30),
                                     normalize=True))

  out, par = run(KEY)
  assert float(out["stderr"]) > 0
  assert abs(float(out["mean"]) - 1.875) < 4 * float(out["stderr"])
  assert int(out["count"]) == 4000
  assert float(par["mean"]) == 1.0 and float(par["stderr"]) == 0.0


def test_boolean_logits_labels_and_mask():
  x = boolean.all_inputs(5)
  logits = lambda v, x: jnp.stack([-v * jnp.sum(x, -1), v * jnp.sum(x, -1)],
                                  -1)

  @jax.jit
  def run(v, x):
    return (sens.boolean_sensitivity(majority, None, x),
            sens.boolean_sensitivity(logits, v, x),
            sens.boolean_sensitivity(majority, None, x,
                                     labels=majority(None, x)),
            sens.boolean_sensitivity(majority, None, x,
                                     mask=jnp.arange(32) < 16))

  ref, from_logits, given, half = run(2.0, x)
  for out in (from_logits, given):
    for name in ("per_example", "mean", "influence", "count"):
      np.testing.assert_array_equal(out[name], ref[name], err_msg=name)
  s = np.asarray(ref["per_example"])
  np.testing.assert_allclose(half["mean"], s[:16].mean(), rtol=1e-6)
  np.testing.assert_allclose(half["stderr"],
                             s[:16].std(ddof=1) / np.sqrt(16), rtol=1e-5)
  assert int(half["count"]) == 16


def test_boolean_errors():
  with pytest.raises(ValueError, match="n must"):
    boolean.all_inputs(21)
  with pytest.raises(ValueError, match="inputs"):
    sens.boolean_sensitivity(parity, None, jnp.ones((2, 3, 4)))


# ----------------------------------------------------------------------------
# Sweeps and planning.
# ----------------------------------------------------------------------------


def test_sigma_sweep_loop_and_vmap_agree():
  tok = random_tokens(26)
  params = mlp_params(jax.random.key(27), 5, 4)
  sigmas = [0.0, 0.5, 4.0]

  @jax.jit
  def run(v, x, key):
    kw = dict(key=key, num_draws=4)
    return (sens.sigma_sweep(sens.token_sensitivity, sigmas, mlp_apply, v, x,
                             **kw),
            sens.sigma_sweep(sens.token_sensitivity, sigmas, mlp_apply, v, x,
                             vectorize=True, **kw),
            # chunk_size=1: exact 0 at sigma 0 (see the test above).
            sens.sigma_sweep(sens.smooth_token_sensitivity, sigmas,
                             apply_fn=mlp_apply, variables=v, inputs=x,
                             chunk_size=1, **kw))

  loop, vec, smooth = run(params, tok, KEY)
  assert loop["per_token"].shape == (3, 3, 5)
  np.testing.assert_array_equal(loop["per_token"], vec["per_token"])
  assert float(loop["mean"][0]) == 0.0
  assert float(loop["mean"][2]) > float(loop["mean"][1])
  assert smooth["mean"].shape == (3,) and float(smooth["mean"][0]) == 0.0


def test_num_draws_for_stderr():
  r = sens.num_draws_for_stderr(0.01, 0.2, num_examples=10, num_tokens=4)
  assert r == 40   # 0.16 / (40 * 1e-4) = 40.
  assert math.sqrt(0.16 / (40 * r)) <= 0.01 < math.sqrt(0.16 / (40 * (r - 1)))
  assert sens.num_draws_for_stderr(0.5, 0.5, 100, 64) == 1
  with pytest.raises(ValueError):
    sens.num_draws_for_stderr(0.0, 0.2, 10, 4)


# ----------------------------------------------------------------------------
# Plans: speed target, tuning, the `plan` entry; clear edges.
# ----------------------------------------------------------------------------


def test_plan_chunks_near_a_target_within_the_memory_cap():
  per_input = planning.FORWARD_BYTES_PER_INPUT_BYTE
  budget = 1000 * 1024 * per_input                     # 1000 inputs of 1 KiB.
  plan = lambda b, n, target, **kw: planning.plan_chunks(
      b, n, 1024, memory_budget_bytes=budget, target_batch=target, **kw)
  assert plan(64, 49, 64) == (1, None)                 # 64 inputs per call.
  assert plan(64, 16, 188) == (3, None)                # 192 is nearest.
  assert plan(64, 10, 100) == (2, None)                # 128 (x1.28) beats 64 (x1.56).
  assert plan(64, 49, 40) == (1, 32)                   # Two blocks of 32.
  assert plan(64, 49, 5000) == (15, None)              # 960: the memory cap binds.
  assert plan(64, 49, 50, chunk_size=2) == (2, 22)     # 2 x 22 = 44 inputs.
  assert plan(64, 49, 50, example_chunk_size=16) == (3, 16)
  assert plan(64, 49, 50, chunk_size=4, example_chunk_size=None) == (4, None)
  assert plan(2000, 49, 5000) == (1, 1000)             # Nothing larger fits.
  assert planning.plan_sizes(64, 49, None, None) == dict(
      chunk_size=49, example_chunk_size=64, forward_batch=3136)
  assert planning.plan_sizes(64, 49, 1, 40) == dict(
      chunk_size=1, example_chunk_size=32, forward_batch=32)


def test_speed_target_from_the_rows_of_the_models_matmuls():
  tok = random_tokens(50, b=3, t=5, d=4)
  v = dict(w=jax.random.normal(jax.random.key(51), (4, 8)),
           h=jax.random.normal(jax.random.key(52), (8, 2)))

  def per_token_dense(v, x):                 # [B, T, 4] @ [4, 8]: T rows each.
    h = jnp.tanh(x @ v["w"])
    att = jnp.einsum("btd,bsd->bts", h, h)   # Activations x activations: not rows.
    return (att @ h).mean(1) @ v["h"]

  rows = planning.matmul_rows_per_example
  assert rows(per_token_dense, v, (tok,)) == 5
  assert rows(mlp_apply, mlp_params(jax.random.key(53), 5, 4), (tok,)) == 1
  assert rows(token0_model, None, (tok,)) is None      # No matmul: no target.
  cores = len(os.sched_getaffinity(0))
  assert planning.forward_batch_target(5, "cpu") == \
      planning.CPU_MATMUL_ROWS_PER_CORE * cores // 5
  assert planning.forward_batch_target(5, "gpu") is None
  assert planning.forward_batch_target(None, "cpu") is None


@pytest.mark.slow
def test_every_plan_gives_the_same_numbers_and_the_result_says_its_sizes(
    monkeypatch, caplog):
  monkeypatch.setattr(planning, "TUNED_FORWARD_BATCH", {})
  timings = []
  timed = planning._time_forward_batches
  monkeypatch.setattr(planning, "_time_forward_batches",
                      lambda *a: timings.append(a[-1]) or timed(*a))
  tok = random_tokens(54, b=6, t=5, d=4)
  images = jax.random.normal(jax.random.key(55), (6, 4, 4, 1))
  params = mlp_params(jax.random.key(56), 5, 4)
  image_params = mlp_params(jax.random.key(57), 4, 4)
  image_apply = lambda v, x: mlp_apply(v, x.reshape(x.shape[0], 4, 4))
  plans = (("auto", "auto"), ("tune", "auto"), (1, 1), (None, None), (3, 4))
  estimators = {
      "token": (sens.token_sensitivity, mlp_apply, params, tok, {}),
      "global": (sens.global_sensitivity, mlp_apply, params, tok, {}),
      "smooth": (sens.smooth_token_sensitivity, mlp_apply, params, tok, {}),
      "scattered": (sens.scattered_pixel_sensitivity, image_apply, image_params,
                    images, dict(num_pixels=3)),
  }
  with caplog.at_level(logging.DEBUG, logger="xsens.measures"):
    for name, (fn, apply, v, x, kw) in estimators.items():
      run = jax.jit(lambda v, x, key: [fn(
          apply, v, x, key=key, sigma=1.5, num_draws=4, chunk_size=c,
          example_chunk_size=e, **kw) for c, e in plans])
      outs = run(v, x, KEY)
      n = 5 * 4 if name in ("token", "smooth") else 4
      for (c, e), out in zip(plans, outs):
        if c not in ("auto", "tune"):
          assert {k: int(s) for k, s in out["plan"].items()} == \
              planning.plan_sizes(6, n, c, e), (name, c, e)
        for k in ("per_token", "per_example", "flips", "count"):
          if k in out:
            want, got = outs[3][k], out[k]
            if name == "smooth":       # Batch-size dependent float rounding only.
              np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)
            else:
              np.testing.assert_array_equal(got, want, err_msg=f"{name} {c} {e}")
  assert "token_sensitivity plan: chunk_size=" in caplog.text
  assert "tuned forward batch" in caplog.text
  # One timing per (model, input shape): token, global and smooth share the model.
  assert len(timings) == 2, timings
  jax.jit(lambda v, x, key: sens.token_sensitivity(
      mlp_apply, v, x, key=key, sigma=1.0, num_draws=2, chunk_size="tune"))(
          params, tok, KEY)
  assert len(timings) == 2                            # Cached in the process.


def test_vector_sigma_is_refused_in_one_line():
  tok = random_tokens(58)
  for fn in (sens.token_sensitivity, sens.global_sensitivity,
             sens.smooth_token_sensitivity):
    with pytest.raises(ValueError, match=r"^sigma must be a scalar, got shape "
                       r"\(2,\): for several sigmas use sigma_sweep or jax.vmap"):
      fn(token0_model, None, tok, key=KEY, sigma=jnp.array([0.5, 1.0]),
         num_draws=1)
  with pytest.raises(ValueError, match="sigma must be a scalar"):
    sens.token_sensitivity(token0_model, None, tok, key=KEY, sigma=[0.5, 1.0],
                           num_draws=1)
  with pytest.raises(ValueError, match="must be >= 0"):
    sens.sigma_sweep(sens.token_sensitivity, [0.5, -1.0], token0_model, None,
                     tok, key=KEY, num_draws=1)


@pytest.mark.slow
def test_sigma_sweep_compiles_once_eagerly():
  tok = random_tokens(59)
  params = mlp_params(jax.random.key(60), 5, 4)
  lowerings = []
  listener = lambda event, *_, **__: lowerings.append(event) if event == (
      "/jax/core/compile/jaxpr_to_mlir_module_duration") else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    for vectorize in (False, True):
      for sigmas in ([0.0, 0.5, 4.0], [0.1, 0.2, 0.3]):
        del lowerings[:]
        out = sens.sigma_sweep(sens.token_sensitivity, sigmas, mlp_apply, params,
                               tok, key=KEY, num_draws=4, vectorize=vectorize)
        jax.block_until_ready(out)
        # One program the first time; the second sweep reuses it.
        assert len(lowerings) == (1 if sigmas[0] == 0.0 else 0), (
            vectorize, sigmas, len(lowerings))
        assert out["per_token"].shape == (3, 3, 5)
        assert out["plan"]["forward_batch"].shape == (3,)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def test_example_ids_key_each_example_so_any_slice_draws_what_the_batch_draws():
  tok = random_tokens(61, b=6, t=5, d=4)
  params = mlp_params(jax.random.key(62), 5, 4)
  ids = jnp.arange(6, dtype=jnp.int32) + 100
  kw = dict(key=KEY, sigma=1.5, num_draws=3)
  for fn in (sens.token_sensitivity, sens.token_sensitivity_loop,
             sens.global_sensitivity, sens.smooth_token_sensitivity):
    whole = fn(mlp_apply, params, tok, example_ids=ids, **kw)
    parts = [fn(mlp_apply, params, tok[i:j], example_ids=ids[i:j], **kw)
             for i, j in ((0, 1), (1, 4), (4, 6))]
    got = np.concatenate([np.asarray(p["per_example"]) for p in parts])
    if fn is sens.smooth_token_sensitivity:
      np.testing.assert_allclose(got, whole["per_example"], rtol=1e-5, err_msg=fn.__name__)
    else:
      np.testing.assert_array_equal(got, whole["per_example"], err_msg=fn.__name__)
      assert sum(int(p["flips"]) for p in parts) == int(whole["flips"])
      assert 0 < float(whole["mean"]) < 1, fn.__name__   # Not vacuous.
    # Chunking does not change the per-example draws either; the batch-level scheme
    # (no example_ids) draws other noise.
    if fn is not sens.token_sensitivity_loop:
      chunked = fn(mlp_apply, params, tok, example_ids=ids, chunk_size=2,
                   example_chunk_size=4, **kw)
      np.testing.assert_allclose(chunked["per_example"], whole["per_example"], rtol=1e-5)
  loop = sens.token_sensitivity_loop(mlp_apply, params, tok, example_ids=ids, **kw)
  vec = sens.token_sensitivity(mlp_apply, params, tok, example_ids=ids, **kw)
  np.testing.assert_array_equal(loop["per_token"], vec["per_token"])
  plain = sens.token_sensitivity(mlp_apply, params, tok, **kw)
  assert not np.array_equal(plain["per_token"], vec["per_token"])
