"""Tests for xsens/measures/token_prefix.py and the models' token splits: reuse of the
clean pass's per-token prefix gives the plain estimator's results."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.measures import sensitivity as sens
from xsens.measures import token_prefix
from xsens.measures import tokens as tokens_lib
from xsens.models import get_model
from xsens.models import one_layer_attention as ola_lib
from xsens.models import token_split as split_lib
from xsens.train import trainer

KEY = jax.random.key(7)
EXACT = ("per_example", "per_token", "flips", "count")


def _vit(image_shape=(8, 8, 3), **kw):
  kw = dict(dict(patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=16), **kw)
  model = get_model("vit", 5, image_shape, **kw)
  x = jax.random.normal(jax.random.key(0), (4, *image_shape))
  return model, model.init(jax.random.key(1), x[:1], train=False), x


def _tokens_model(name, n=6, d=8, **kw):
  model = get_model(name, 3 if name == "one_layer_attention" else 2, (n, d), **kw)
  x = jax.random.normal(jax.random.key(0), (5, n, d))
  return model, model.init(jax.random.key(1), x[:1]), x


def _sign_logits(f):
  return jnp.stack([-f, f], -1)


def _both(apply_fn, variables, inputs, **kw):
  """token_sensitivity without and with reuse (the split must exist)."""
  kw = dict(dict(key=KEY, sigma=1.5, num_draws=2), **kw)
  assert token_prefix.find_split(apply_fn, kw.get("patch_size"), inputs.shape[1:])
  plain = sens.token_sensitivity(apply_fn, variables, inputs, token_split=None, **kw)
  reuse = sens.token_sensitivity(apply_fn, variables, inputs, token_split="always", **kw)
  return plain, reuse


def _assert_same(plain, reuse):
  for k in EXACT:
    np.testing.assert_array_equal(np.asarray(plain[k]), np.asarray(reuse[k]), err_msg=k)
  for k in ("mean", "stderr", "stderr_noise"):
    np.testing.assert_allclose(plain[k], reuse[k], rtol=1e-6, err_msg=k)
  assert 0 < float(plain["mean"]) < 1     # Some flips, not all: the test compares something.


# ----------------------------------------------------------------------------
# The models' splits: rest(prefix(every token)) is the model's forward.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [
    dict(), dict(pooling="mean"), dict(posemb="sincos"), dict(posemb="none"),
    dict(depth=2, patch_size=2), dict(representation_size=8),
    dict(attention="lsa"), dict(position_bias="diet_rel", posemb="none"),
    dict(skip=((0, "attention"),), depth=2), dict(remat=True),
    dict(attention_impl="folded")])
def test_vit_rest_of_the_prefix_is_the_forward(kw):
  model, v, x = _vit(**kw)
  apply = functools.partial(model.apply, train=False)
  split = token_prefix.find_split(apply, model.patch_size, x.shape[1:])
  tok = tokens_lib.patchify(x, model.patch_size)
  feats = token_prefix.clean_features(split, v, tok)
  np.testing.assert_allclose(split.rest(v, feats), apply(v, x), rtol=1e-5, atol=1e-5)
  assert 0 < split.prefix_share < 1


def test_vit_bfloat16_rest_of_the_prefix_is_the_forward():
  model, v, x = _vit(dtype="bfloat16")
  apply = functools.partial(model.apply, train=False)
  split = token_prefix.find_split(apply, 4, x.shape[1:])
  feats = token_prefix.clean_features(split, v, tokens_lib.patchify(x, 4))
  assert feats.dtype == jnp.bfloat16
  np.testing.assert_allclose(split.rest(v, feats), apply(v, x), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("name,kw", [
    ("one_layer_attention", {}), ("one_layer_attention", dict(qk_dim=4, v_dim=3)),
    ("one_layer_vit", dict(d_h=4, d_v=4))])
def test_one_layer_rest_of_the_prefix_is_the_forward(name, kw):
  model, v, x = _tokens_model(name, **kw)
  apply = functools.partial(model.apply, train=False)
  split = token_prefix.find_split(apply, None, x.shape[1:])
  feats = token_prefix.clean_features(split, v, x)
  np.testing.assert_allclose(split.rest(v, feats), apply(v, x), rtol=1e-6, atol=1e-6)


def test_perturbed_logits_are_those_of_the_perturbed_copies():
  model, v, x = _vit(depth=2)
  apply = functools.partial(model.apply, train=False)
  split = token_prefix.find_split(apply, 4, x.shape[1:])
  tok = tokens_lib.patchify(x, 4)
  ids = jnp.asarray([0, 3, 1], jnp.int32)
  scaled = jax.random.normal(jax.random.key(3), (4, 3, tok.shape[-1]))
  onehot = jax.nn.one_hot(ids, tok.shape[1], dtype=tok.dtype)            # [c, T]
  delta = onehot[None, :, :, None] * scaled[:, :, None, :]               # [B, c, T, D]
  copies = (tok[:, None] + delta).reshape(12, *tok.shape[1:])
  want = apply(v, tokens_lib.unpatchify(copies, 4, x.shape[1:])).reshape(4, 3, -1)
  for examples in (None, 3, 1):
    got = token_prefix.perturbed_logits_fn(split, v, tok, examples)(ids, scaled)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(examples))


# ----------------------------------------------------------------------------
# The estimator: the same results with and without reuse.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("depth,patch,sizes", [
    (1, 4, (None, None)), (2, 2, (5, 3)), (1, 2, (1, 1))])
def test_vit_token_sensitivity_same_with_reuse(depth, patch, sizes):
  model, v, x = _vit(depth=depth, patch_size=patch)
  plain, reuse = _both(functools.partial(model.apply, train=False), v, x, patch_size=patch,
                       chunk_size=sizes[0], example_chunk_size=sizes[1])
  _assert_same(plain, reuse)
  np.testing.assert_array_equal(plain["per_patch_map"], reuse["per_patch_map"])


def test_vit_same_with_masks_labels_and_the_default_plan():
  model, v, x = _vit()
  t = (x.shape[1] // 4) * (x.shape[2] // 4)
  kw = dict(patch_size=4, mask=jnp.asarray([1, 1, 0, 1], bool), labels=jnp.asarray(
      [0, 1, 2, 3]), token_mask=jnp.arange(t) != 1)
  _assert_same(*_both(functools.partial(model.apply, train=False), v, x, **kw))


@pytest.mark.parametrize("name,kw,sizes", [
    ("one_layer_attention", {}, (None, None)), ("one_layer_attention", {}, (4, 2)),
    ("one_layer_attention", dict(qk_dim=4), (3, None)),
    ("one_layer_vit", dict(d_h=4, d_v=4), (None, None)),
    ("one_layer_vit", dict(d_h=4, d_v=4), (5, 2))])
def test_one_layer_token_sensitivity_same_with_reuse(name, kw, sizes):
  model, v, x = _tokens_model(name, **kw)
  apply = functools.partial(model.apply, train=False)
  if name == "one_layer_vit":   # One score f [B]: logits [-f, f].
    apply = token_prefix.with_output(apply, _sign_logits)
  token_mask = jnp.ones((x.shape[0], x.shape[1]), bool).at[0, 2].set(False)
  plain, reuse = _both(apply, v, x, sigma=3.0, num_draws=3, chunk_size=sizes[0],
                       example_chunk_size=sizes[1], token_mask=token_mask,
                       mask=jnp.asarray([1, 0, 1, 1, 1], jnp.float32))
  _assert_same(plain, reuse)


def test_uniform_attention_same_with_reuse():
  model = ola_lib.UniformAttention(3)
  x = jax.random.normal(jax.random.key(0), (5, 6, 8))
  v = model.init(jax.random.key(1), x[:1])
  _assert_same(*_both(functools.partial(model.apply, train=False), v, x, sigma=3.0))


@pytest.mark.slow
def test_under_jit_and_vmap_over_sigma():
  model, v, x = _vit(depth=2)
  apply = functools.partial(model.apply, train=False)
  sigmas = jnp.asarray([0.5, 1.5, 4.0])

  def sweep(option):
    @jax.jit
    def run(v, x, key, sigmas):
      return jax.vmap(lambda s: sens.token_sensitivity(
          apply, v, x, key=key, sigma=s, num_draws=2, patch_size=4, chunk_size=3,
          example_chunk_size=2, token_split=option))(sigmas)
    return run(v, x, KEY, sigmas)

  plain, reuse = sweep(None), sweep("always")
  for k in EXACT:
    np.testing.assert_array_equal(plain[k], reuse[k], err_msg=k)
  assert float(plain["mean"][0]) < float(plain["mean"][-1])
  eager = sens.token_sensitivity(apply, v, x, key=KEY, sigma=1.5, num_draws=2, patch_size=4,
                                 chunk_size=3, example_chunk_size=2, token_split="always")
  np.testing.assert_array_equal(eager["per_example"], reuse["per_example"][1])
  # The measure itself jitted, its sizes and `token_split` static.
  jitted = jax.jit(sens.token_sensitivity, static_argnums=0, static_argnames=(
      "num_draws", "patch_size", "chunk_size", "example_chunk_size", "token_split"))
  got = jitted(apply, v, x, key=KEY, sigma=1.5, num_draws=2, patch_size=4, chunk_size=3,
               example_chunk_size=2, token_split="always")
  np.testing.assert_array_equal(got["per_example"], reuse["per_example"][1])


# ----------------------------------------------------------------------------
# Where a split comes from, and the default rule.
# ----------------------------------------------------------------------------


def test_find_split_recognises_the_apply_functions_that_carry_one():
  model, v, x = _vit()
  shape = x.shape[1:]
  assert token_prefix.find_split(functools.partial(model.apply, train=False), 4, shape)
  assert token_prefix.find_split(model.apply, 4, shape)
  assert token_prefix.find_split(trainer.eval_apply_fn(model), 4, shape)  # TrainResult's.
  # Not the eval-mode forward, not the model's tokens, or an opaque function: no split.
  assert token_prefix.find_split(functools.partial(model.apply, train=True), 4, shape) is None
  assert token_prefix.find_split(functools.partial(model.apply, mutable=["intermediates"],
                                                   train=False), 4, shape) is None
  assert token_prefix.find_split(lambda v, x: model.apply(v, x), 4, shape) is None
  assert token_prefix.find_split(model.apply, 2, shape) is None
  spt = get_model("vit", 5, shape, patch_size=4, width=16, depth=1, num_heads=2,
                  mlp_dim=16, tokenizer="spt")
  assert token_prefix.find_split(spt.apply, 4, shape) is None
  reuse_vit = get_model("reuse_vit", 5, shape, patch_size=4, width=16, depth=2,
                        num_heads=2, mlp_dim=16)
  assert token_prefix.find_split(reuse_vit.apply, 4, shape) is None
  cnn = get_model("cnn", 5, shape)
  assert token_prefix.find_split(cnn.apply, 4, shape) is None
  ola = get_model("one_layer_attention", 3, (6, 8))
  assert token_prefix.find_split(ola.apply, None, (6, 8))
  assert token_prefix.find_split(ola.apply, 2, (8, 8, 1)) is None


def test_resolve_applies_the_default_rule():
  model, v, x = _vit()
  apply = functools.partial(model.apply, train=False)
  split = token_prefix.find_split(apply, 4, x.shape[1:])
  low = split._replace(prefix_share=token_prefix.MIN_PREFIX_SHARE / 2)
  high = split._replace(prefix_share=min(1.0, token_prefix.MIN_PREFIX_SHARE * 2))
  assert token_prefix.resolve("auto", token_prefix.SplitApply(apply, lambda *_: low), 4,
                              x.shape[1:]) is None
  assert token_prefix.resolve("always", token_prefix.SplitApply(apply, lambda *_: low), 4,
                              x.shape[1:]) is low
  assert token_prefix.resolve("auto", token_prefix.SplitApply(apply, lambda *_: high), 4,
                              x.shape[1:]) is high
  assert token_prefix.resolve(None, apply, 4, x.shape[1:]) is None
  assert token_prefix.resolve(split, lambda v, x: x, 4, x.shape[1:]) is split
  assert token_prefix.resolve("auto", lambda v, x: x, 4, x.shape[1:]) is None
  with pytest.raises(ValueError, match="token_split must be"):
    token_prefix.resolve("on", apply, 4, x.shape[1:])
  with pytest.raises(ValueError, match="token_split must be"):
    sens.token_sensitivity(apply, v, x, key=KEY, sigma=1.0, num_draws=1, patch_size=4,
                           token_split=True)


def test_prefix_shares_follow_the_models_shapes():
  shares = {}
  for depth in (1, 6):
    model, _, x = _vit((28, 28, 1), depth=depth, width=128, num_heads=4, mlp_dim=256)
    shares[depth] = token_prefix.find_split(model.apply, 4, (28, 28, 1)).prefix_share
  assert shares[6] < token_prefix.MIN_PREFIX_SHARE < shares[1] < 0.5
  ola = get_model("one_layer_attention", 2, (16, 64))
  assert token_prefix.find_split(ola.apply, None, (16, 64)).prefix_share > 0.5
  assert split_lib.share(1.0, 1, 10.0) == 0.0 and split_lib.share(5.0, 3, 4.0) == 1.0


def test_an_explicit_split_is_what_runs():
  model, v, x = _vit()
  apply = functools.partial(model.apply, train=False)
  split = token_prefix.find_split(apply, 4, x.shape[1:])
  negated = split._replace(rest=lambda v, f: -split.rest(v, f))
  kw = dict(key=KEY, sigma=0.1, num_draws=1, patch_size=4, chunk_size=None,
            example_chunk_size=None)
  same = sens.token_sensitivity(apply, v, x, token_split=split, **kw)
  flipped = sens.token_sensitivity(apply, v, x, token_split=negated, **kw)
  assert float(same["mean"]) < 0.5 < float(flipped["mean"])


def test_the_benchmark_script_runs_a_case():
  from experiments import bench_token_prefix  # pylint: disable=import-outside-toplevel
  rows = bench_token_prefix.run_case("ola_n16_d64", batch=4, num_draws=1, plans=["fb64"],
                                     rounds=1)
  assert len(rows) == 1 and rows[0]["equal"] and rows[0]["prefix_share"] > 0.5
