"""Tests for reuse multi-head attention (xsens/models/reuse_vit.py).

Bhojanapalli et al. 2021, "Leveraging redundancy in attention with Reuse
Transformers", arXiv 2110.06821.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.errors import ConfigError
from xsens.models import get_model
from xsens.models.reuse_vit import ReuseAttention

jax.config.update("jax_disable_most_optimizations", True)

B, T, D, H = 2, 5, 8, 4
MNIST = (28, 28, 1)


def _x(seed=0, shape=(B, T, D)):
  return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _scores(seed=1, heads=H):
  logits = jax.random.normal(jax.random.key(seed), (B, heads, T, T))
  return jax.nn.softmax(logits, axis=-1)


def test_no_reuse_equals_standard_attention():
  x = _x()
  ref = nn.MultiHeadDotProductAttention(num_heads=H)
  ref_vars = ref.init(jax.random.key(2), x, x)
  layer = ReuseAttention(num_heads=H, reuse_heads=0)
  variables = layer.init(jax.random.key(3), x, None)
  # Same parameter tree, different draws: copy the reference's into it.
  assert (jax.tree.structure(variables["params"])
          == jax.tree.structure(ref_vars["params"]))
  out, scores = layer.apply(ref_vars, x, None)
  expected, state = ref.apply(ref_vars, x, x, sow_weights=True,
                              mutable=["intermediates"])
  np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
      scores, state["intermediates"]["attention_weights"][0], rtol=1e-6, atol=1e-7)
  assert scores.shape == (B, H, T, T)


def test_full_reuse_uses_given_attention_exactly():
  x, prev = _x(), _scores()
  layer = ReuseAttention(num_heads=H, reuse_heads=-1)
  variables = layer.init(jax.random.key(3), x, prev)
  assert set(variables["params"]) == {"value_reuse", "out_reuse"}
  out, scores = layer.apply(variables, x, prev)
  params = variables["params"]
  v = np.einsum("btd,dhk->bthk", x, params["value_reuse"]["kernel"])
  v = v + np.asarray(params["value_reuse"]["bias"])
  y = np.einsum("bhqk,bkhd->bqhd", prev, v)          # scores @ V per head
  expected = np.einsum("bqhd,hdo->bqo", y, params["out_reuse"]["kernel"])
  expected = expected + np.asarray(params["out_reuse"]["bias"])
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(scores, prev)        # P = H passes S_prev on


@pytest.mark.slow
@pytest.mark.parametrize("p", [0, 1, H - 1, H])
def test_shapes_and_passed_on_attention(p):
  x, prev = _x(), _scores(heads=H)
  layer = ReuseAttention(num_heads=H, reuse_heads=p)
  variables = layer.init(jax.random.key(3), x, prev)
  (out, scores), state = layer.apply(variables, x, prev, mutable=["intermediates"])
  assert out.shape == (B, T, D)
  assert scores.shape == (B, H, T, T)
  np.testing.assert_allclose(scores.sum(-1), 1.0, rtol=1e-5)
  # New heads first, then the first P of the previous layer's heads.
  np.testing.assert_array_equal(scores[:, H - p:], prev[:, :p])
  if p < H:
    assert not np.allclose(scores[:, :H - p], prev[:, p:])
  np.testing.assert_array_equal(state["intermediates"]["attention_weights"][0], scores)
  expected = ({"query", "key", "value", "out"} if p < H else set()) | (
      {"value_reuse", "out_reuse"} if p else set())
  assert set(variables["params"]) == expected
  if 0 < p < H:
    assert "bias" not in variables["params"]["out"]   # spec A.2


def test_partial_reuse_splits_output_into_both_groups():
  x, prev = _x(), _scores()
  layer = ReuseAttention(num_heads=H, reuse_heads=2)
  variables = layer.init(jax.random.key(3), x, prev)
  out, _ = layer.apply(variables, x, prev)
  # Changing the reused heads changes the output; the unused heads do not.
  other = prev.at[:, 2:].set(_scores(seed=7)[:, 2:])
  np.testing.assert_allclose(layer.apply(variables, x, other)[0], out, atol=1e-6)
  other = prev.at[:, :2].set(_scores(seed=7)[:, :2])
  assert not np.allclose(layer.apply(variables, x, other)[0], out)


def _rename(tree):
  """ViT param tree -> ReuseViT (K=0) tree: the attention module's name only."""
  if not isinstance(tree, dict):
    return tree
  return {("attention" if k == "MultiHeadDotProductAttention_0" else k): _rename(v)
          for k, v in tree.items()}


@pytest.mark.slow
def test_reuse_vit_without_reuse_layers_equals_vit():
  kwargs = dict(patch_size=7, width=16, depth=3, num_heads=4, mlp_dim=32)
  vit = get_model("vit", 10, MNIST, **kwargs)
  reuse = get_model("reuse_vit", 10, MNIST, reuse_heads=-1, reuse_layers=0, **kwargs)
  x = _x(shape=(3, *MNIST))
  vit_vars = vit.init(jax.random.key(0), x)
  reuse_vars = reuse.init(jax.random.key(5), x)
  mapped = {"params": _rename(jax.tree.map(lambda a: a, vit_vars["params"]))}
  assert jax.tree.structure(mapped) == jax.tree.structure(
      {"params": reuse_vars["params"]})
  np.testing.assert_allclose(reuse.apply(mapped, x), vit.apply(vit_vars, x),
                             rtol=1e-5, atol=1e-5)
  # And the sown attention maps agree layer by layer.
  _, s1 = vit.apply(vit_vars, x, mutable=["intermediates"])
  _, s2 = reuse.apply(mapped, x, mutable=["intermediates"])
  for i in range(3):
    a = s1["intermediates"][f"encoderblock_{i}"]["MultiHeadDotProductAttention_0"]
    b = s2["intermediates"][f"encoderblock_{i}"]["attention"]
    np.testing.assert_allclose(a["attention_weights"][0], b["attention_weights"][0],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_reuse_vit_full_reuse_repeats_layer0_attention():
  model = get_model("reuse_vit", 10, MNIST, patch_size=7, width=16, depth=3,
                    num_heads=2, mlp_dim=32, reuse_heads=-1, reuse_layers=2)
  x = _x(shape=(2, *MNIST))
  variables = model.init(jax.random.key(0), x)
  assert "query" not in variables["params"]["encoderblock_1"]["attention"]
  logits, state = model.apply(variables, x, mutable=["intermediates"])
  assert logits.shape == (2, 10)
  maps = [state["intermediates"][f"encoderblock_{i}"]["attention"]["attention_weights"][0]
          for i in range(3)]
  np.testing.assert_array_equal(maps[1], maps[0])
  np.testing.assert_array_equal(maps[2], maps[0])


@pytest.mark.parametrize("field,kwargs", [
    ("model.reuse_heads", dict(reuse_heads=5)),
    ("model.reuse_heads", dict(reuse_heads=-2)),
    ("model.reuse_layers", dict(reuse_layers=2)),
    ("model.reuse_layers", dict(reuse_layers=-1)),
    ("model.skip", dict(skip=((0, "attention"),))),
])
def test_check_input_names_the_field(field, kwargs):
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    get_model("reuse_vit", 10, MNIST, depth=2, num_heads=4, **kwargs)


def test_skipped_attention_passes_scores_on():
  model = get_model("reuse_vit", 10, MNIST, patch_size=7, width=16, depth=3,
                    num_heads=2, mlp_dim=32, reuse_layers=2, skip=((1, "attention"),))
  x = _x(shape=(2, *MNIST))
  variables = model.init(jax.random.key(0), x)
  _, state = model.apply(variables, x, mutable=["intermediates"])
  inter = state["intermediates"]
  assert "attention" not in inter.get("encoderblock_1", {})
  np.testing.assert_array_equal(
      inter["encoderblock_2"]["attention"]["attention_weights"][0],
      inter["encoderblock_0"]["attention"]["attention_weights"][0])
