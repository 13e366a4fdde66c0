"""The ViT's small-dataset options (xsens/models/vit.py): shifted patch tokenisation (SPT)
and locality self-attention (LSA), Lee, Lee, Song 2021, arXiv 2112.13492."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.errors import ConfigError
from xsens.models import get_model, pretrained, vit

jax.config.update("jax_disable_most_optimizations", True)

SMALL = dict(patch_size=4, width=16, depth=2, num_heads=2, mlp_dim=32)
SHAPE = (8, 8, 3)


def _x(batch=2, seed=1):
  return jax.random.normal(jax.random.key(seed), (batch, *SHAPE), jnp.float32)


def _torch_like_spt_input(x_nhwc, p, shifts):
  """SPT's concatenated image written as the PyTorch code does it, in NCHW:
  aanna0701/SPT_LSA_ViT `PatchShifting` (diagonal, shift p // 2) or lucidrains/vit-pytorch
  `vit_for_small_dataset.py` SPT (F.pad by one pixel), then 'b c (h p1) (w p2) -> b (h w)
  (p1 p2 c)'."""
  x = np.transpose(np.asarray(x_nhwc), (0, 3, 1, 2))
  if shifts == "diagonal":
    s = p // 2
    xp = np.pad(x, ((0, 0), (0, 0), (s, s), (s, s)))
    copies = [xp[:, :, :-2 * s, :-2 * s], xp[:, :, :-2 * s, 2 * s:],
              xp[:, :, 2 * s:, :-2 * s], xp[:, :, 2 * s:, 2 * s:]]
  else:
    def f_pad(t, left, right, top, bottom):  # torch.nn.functional.pad with crops (< 0)
      t = np.pad(t, ((0, 0), (0, 0), (max(top, 0), max(bottom, 0)),
                     (max(left, 0), max(right, 0))))
      h, w = t.shape[2:]
      return t[:, :, max(-top, 0):h - max(-bottom, 0), max(-left, 0):w - max(-right, 0)]
    copies = [f_pad(x, *s) for s in ((1, -1, 0, 0), (-1, 1, 0, 0), (0, 0, 1, -1),
                                     (0, 0, -1, 1))]
  cat = np.concatenate([x] + copies, axis=1)
  b, c, h, w = cat.shape
  cat = cat.reshape(b, c, h // p, p, w // p, p).transpose(0, 2, 4, 3, 5, 1)
  return cat.reshape(b, (h // p) * (w // p), p * p * c)


@pytest.mark.parametrize("shifts", vit.SPT_SHIFTS)
def test_shifted_patches_match_the_pytorch_layout(shifts):
  x = _x()
  np.testing.assert_array_equal(vit.shifted_patches(x, 4, shifts),
                                _torch_like_spt_input(x, 4, shifts))


def test_spt_lsa_tree_forward_and_attention():
  model = get_model("vit", 10, SHAPE, tokenizer="spt", attention="lsa", **SMALL)
  x = _x()
  variables = jax.jit(model.init)({"params": jax.random.key(0)}, x)
  params = pretrained.flatten(variables["params"])
  assert "embedding/kernel" not in params
  assert params["spt_norm/scale"].shape == (4 * 4 * 5 * 3,)
  assert params["spt_embedding/kernel"].shape == (4 * 4 * 5 * 3, 16)
  np.testing.assert_allclose(params["encoderblock_1/lsa_temperature"], np.log(8 ** -0.5),
                             rtol=1e-6)
  logits, state = jax.jit(lambda v, x: model.apply(v, x, mutable=["intermediates"]))(
      variables, x)
  assert logits.shape == (2, 10) and np.all(np.isfinite(logits))
  weights = jax.tree.leaves(state)[0]  # [B, heads, 1 + 4, 1 + 4] (CLS + the 2 x 2 grid).
  assert weights.shape == (2, 2, 5, 5)
  np.testing.assert_array_equal(np.diagonal(weights, axis1=-2, axis2=-1), 0.0)
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)


def test_lsa_attention_matches_numpy():
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(2, 5, 3, 4)).astype(np.float32) for _ in range(3))
  tau = np.float32(0.3)
  got = vit.lsa_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), log_scale=tau)
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) * np.exp(tau)
  logits[:, :, np.arange(5), np.arange(5)] = -np.inf
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  np.testing.assert_allclose(got, np.einsum("bhqk,bkhd->bqhd", w, v), rtol=1e-5, atol=1e-6)


def test_noise_in_one_pixel_patch_reaches_the_neighbouring_spt_tokens():
  """The measured token is the unshifted p x p patch; its shifted copies feed its
  neighbours' tokens, so the SPT tokens next to it change too (docstring of vit.py)."""
  x = np.zeros((1, *SHAPE), np.float32)
  noisy = x.copy()
  noisy[0, :4, :4] = 1.0  # Token 0's pixels.
  changed = np.any(vit.shifted_patches(jnp.asarray(noisy), 4, "diagonal")
                   != vit.shifted_patches(jnp.asarray(x), 4, "diagonal"), axis=-1)[0]
  np.testing.assert_array_equal(changed, [True, True, True, True])
  # In the unshifted channels (the first C of every pixel), only token 0 changes.
  own = vit.shifted_patches(jnp.asarray(noisy), 4, "diagonal").reshape(1, 4, 16, 15)[..., :3]
  np.testing.assert_array_equal(np.any(own != 0, axis=(-1, -2))[0], [True, False, False, False])


def test_refusals_and_checkpoint_and_reuse_vit_guards():
  with pytest.raises(ConfigError, match="model.tokenizer"):
    get_model("vit", 10, SHAPE, tokenizer="conv", **SMALL)
  with pytest.raises(ConfigError, match="model.attention"):
    get_model("vit", 10, SHAPE, attention="local", **SMALL)
  with pytest.raises(ConfigError, match="model.spt_shifts"):
    get_model("vit", 10, SHAPE, tokenizer="spt", spt_shifts="cardinal", **SMALL)
  with pytest.raises(ConfigError, match="model.patch_size"):
    get_model("vit", 10, SHAPE, tokenizer="spt", **dict(SMALL, patch_size=1))
  with pytest.raises(ConfigError, match="model.attention"):
    get_model("reuse_vit", 10, SHAPE, attention="lsa", **SMALL)
  spt = get_model("vit", 10, SHAPE, tokenizer="spt", **SMALL)
  with pytest.raises(pretrained.CheckpointError, match="tokenizer='patch'"):
    pretrained.vit_params_from_checkpoint({}, spt, SHAPE)
  # ReuseViT takes SPT (its stem is the ViT's).
  reuse = get_model("reuse_vit", 10, SHAPE, tokenizer="spt", **SMALL)
  out = jax.eval_shape(lambda x: reuse.init_with_output({"params": jax.random.key(0)}, x)[0],
                       jax.ShapeDtypeStruct((2, *SHAPE), jnp.float32))
  assert out.shape == (2, 10)
