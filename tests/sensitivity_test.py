"""Tests for the sensitivity estimators (xsens/measures/sensitivity.py, sensitivity_loop.py,
sensitivity_stats.py, sweep.py) and xsens/measures/tokens.py."""

import functools
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

from xsens.measures import sensitivity as sens
from xsens.measures import sensitivity_loop
from xsens.measures import sensitivity_stats
from xsens.measures import smooth_sensitivity
from xsens.measures import sweep
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
  ref = sensitivity_loop.token_sensitivity_loop(mlp_apply, params, tok, key=KEY, **kw)
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
  first = sensitivity_loop.token_sensitivity_loop(model, 1.0, tok, **kw)
  # New variables of the same structure: traced, so no new compilation.
  second = sensitivity_loop.token_sensitivity_loop(model, 2.0, tok, **kw)
  assert len(traces) == 2, traces            # Clean labels + one pair step.
  np.testing.assert_array_equal(first["per_token"], second["per_token"])

  class Unhashable:
    __hash__ = None

    def __call__(self, variables, x):
      return token0_model(variables, x)

  out = sensitivity_loop.token_sensitivity_loop(Unhashable(), None, tok, **kw)
  np.testing.assert_array_equal(out["per_token"], first["per_token"])


@pytest.mark.slow
def test_example_chunk_size_does_not_change_results():
  tok = random_tokens(28, b=5, t=4)
  params = mlp_params(jax.random.key(29), 4, 4)
  kw = dict(sigma=1.5, num_draws=3)
  ref = sensitivity_loop.token_sensitivity_loop(mlp_apply, params, tok, key=KEY,
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


def test_key_is_required():
  tok = random_tokens(42)
  for fn in (sens.token_sensitivity, sensitivity_loop.token_sensitivity_loop,
             sens.global_sensitivity, smooth_sensitivity.smooth_token_sensitivity):
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
          smooth=smooth_sensitivity.smooth_token_sensitivity(mlp_apply, v, x, **kw)["mean"]))
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
  loop = sensitivity_loop.token_sensitivity_loop(apply_fn, variables, images, key=KEY,
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
# Sweeps and the number of draws.
# ----------------------------------------------------------------------------


def test_sigma_sweep_loop_and_vmap_agree():
  tok = random_tokens(26)
  params = mlp_params(jax.random.key(27), 5, 4)
  sigmas = [0.0, 0.5, 4.0]

  @jax.jit
  def run(v, x, key):
    kw = dict(key=key, num_draws=4)
    return (sweep.sigma_sweep(sens.token_sensitivity, sigmas, mlp_apply, v, x,
                              **kw),
            sweep.sigma_sweep(sens.token_sensitivity, sigmas, mlp_apply, v, x,
                              vectorize=True, **kw),
            # chunk_size=1: exact 0 at sigma 0 (see the test above).
            sweep.sigma_sweep(smooth_sensitivity.smooth_token_sensitivity, sigmas,
                              apply_fn=mlp_apply, variables=v, inputs=x,
                              chunk_size=1, **kw))

  loop, vec, smooth = run(params, tok, KEY)
  assert loop["per_token"].shape == (3, 3, 5)
  np.testing.assert_array_equal(loop["per_token"], vec["per_token"])
  assert float(loop["mean"][0]) == 0.0
  assert float(loop["mean"][2]) > float(loop["mean"][1])
  assert smooth["mean"].shape == (3,) and float(smooth["mean"][0]) == 0.0


def test_num_draws_for_stderr():
  r = sensitivity_stats.num_draws_for_stderr(0.01, 0.2, num_examples=10, num_tokens=4)
  assert r == 40   # 0.16 / (40 * 1e-4) = 40.
  assert math.sqrt(0.16 / (40 * r)) <= 0.01 < math.sqrt(0.16 / (40 * (r - 1)))
  assert sensitivity_stats.num_draws_for_stderr(0.5, 0.5, 100, 64) == 1
  with pytest.raises(ValueError):
    sensitivity_stats.num_draws_for_stderr(0.0, 0.2, 10, 4)


# ----------------------------------------------------------------------------
# Clear edges: vector sigma, one compiled sweep, per-example keys.
# ----------------------------------------------------------------------------


def test_vector_sigma_is_refused_in_one_line():
  tok = random_tokens(58)
  for fn in (sens.token_sensitivity, sens.global_sensitivity,
             smooth_sensitivity.smooth_token_sensitivity):
    with pytest.raises(ValueError, match=r"^sigma must be a scalar, got shape "
                       r"\(2,\): for several sigmas use sigma_sweep or jax.vmap"):
      fn(token0_model, None, tok, key=KEY, sigma=jnp.array([0.5, 1.0]),
         num_draws=1)
  with pytest.raises(ValueError, match="sigma must be a scalar"):
    sens.token_sensitivity(token0_model, None, tok, key=KEY, sigma=[0.5, 1.0],
                           num_draws=1)
  with pytest.raises(ValueError, match="must be >= 0"):
    sweep.sigma_sweep(sens.token_sensitivity, [0.5, -1.0], token0_model, None,
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
        out = sweep.sigma_sweep(sens.token_sensitivity, sigmas, mlp_apply, params,
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
  for fn in (sens.token_sensitivity, sensitivity_loop.token_sensitivity_loop,
             sens.global_sensitivity, smooth_sensitivity.smooth_token_sensitivity):
    whole = fn(mlp_apply, params, tok, example_ids=ids, **kw)
    parts = [fn(mlp_apply, params, tok[i:j], example_ids=ids[i:j], **kw)
             for i, j in ((0, 1), (1, 4), (4, 6))]
    got = np.concatenate([np.asarray(p["per_example"]) for p in parts])
    if fn is smooth_sensitivity.smooth_token_sensitivity:
      np.testing.assert_allclose(got, whole["per_example"], rtol=1e-5, err_msg=fn.__name__)
    else:
      np.testing.assert_array_equal(got, whole["per_example"], err_msg=fn.__name__)
      assert sum(int(p["flips"]) for p in parts) == int(whole["flips"])
      assert 0 < float(whole["mean"]) < 1, fn.__name__   # Not vacuous.
    # Chunking does not change the per-example draws either; the batch-level scheme
    # (no example_ids) draws other noise.
    if fn is not sensitivity_loop.token_sensitivity_loop:
      chunked = fn(mlp_apply, params, tok, example_ids=ids, chunk_size=2,
                   example_chunk_size=4, **kw)
      np.testing.assert_allclose(chunked["per_example"], whole["per_example"], rtol=1e-5)
  loop = sensitivity_loop.token_sensitivity_loop(mlp_apply, params, tok, example_ids=ids, **kw)
  vec = sens.token_sensitivity(mlp_apply, params, tok, example_ids=ids, **kw)
  np.testing.assert_array_equal(loop["per_token"], vec["per_token"])
  plain = sens.token_sensitivity(mlp_apply, params, tok, **kw)
  assert not np.array_equal(plain["per_token"], vec["per_token"])
