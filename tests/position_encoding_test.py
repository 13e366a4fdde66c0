"""Position encodings of the text encoder (xsens.models.position), the pair tasks and the
logit-rank measure (DIET, issue 18 D)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
from absl.testing import parameterized

from xsens.data import pair_tasks
from xsens.data import text as text_data
from xsens.errors import ConfigError
from xsens.measures import logit_rank
from xsens.models import get_model, position
from xsens.models import text

from tests import text_data_test

L = 12
IDS = jnp.array([[1, 5, 6, 7, 8, 2, 2, 9, 10, 11, 2, 0],
                 [1, 12, 13, 14, 2, 2, 15, 16, 17, 18, 19, 2]])
SMALL = dict(num_classes=2, vocab_size=20, max_length=L, width=16, depth=2, num_heads=2,
             mlp_dim=32, dropout_rate=0.0)


def _model(mode, **kw):
  return text.RoBERTa(**{**SMALL, "position": mode, **kw})


def _perturbed(variables, scale=0.3):
  """Every parameter plus noise, so zero-initialised biases are non-zero."""
  leaves, tree = jax.tree.flatten(variables)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape)
                                   for x, k in zip(leaves, keys)])


def _variables(mode, ids=IDS, **kw):
  m = _model(mode, **kw)
  return m, _perturbed(m.init(jax.random.key(0), ids))


class PositionModesTest(parameterized.TestCase):

  def test_without_position_the_encoder_is_permutation_equivariant(self):
    m, v = _variables("none")
    ids = IDS[1:]                                  # No padding: every token is real.
    perm = jnp.array([0, 3, 1, 2, 7, 5, 6, 4, 11, 9, 10, 8])
    mask = text.padding_mask(ids)
    h = m.apply(v, m.apply(v, ids, method=m.embed), mask, method=m.hidden_states)
    hp = m.apply(v, m.apply(v, ids[:, perm], method=m.embed), mask[:, perm],
                 method=m.hidden_states)
    np.testing.assert_allclose(hp, h[:, perm], atol=2e-5)

  @parameterized.parameters("absolute", "sinusoidal", "shaw", "t5", "diet_abs", "diet_rel")
  def test_with_a_position_mode_it_is_not(self, mode):
    m, v = _variables(mode)
    ids = IDS[1:]
    perm = jnp.array([0, 3, 1, 2, 7, 5, 6, 4, 11, 9, 10, 8])
    mask = text.padding_mask(ids)
    seg = position.segment_ids(ids)
    h = m.apply(v, m.apply(v, ids, method=m.embed), mask, segments=seg,
                method=m.hidden_states)
    hp = m.apply(v, m.apply(v, ids[:, perm], method=m.embed), mask[:, perm],
                 segments=seg[:, perm], method=m.hidden_states)
    assert float(jnp.abs(hp - h[:, perm]).max()) > 1e-2

  @parameterized.parameters("shaw", "diet_abs", "diet_rel")   # A [B, H, L, L] bias each.
  @pytest.mark.slow
  def test_attention_impls_agree(self, mode):
    outs = []
    for impl in ("einsum", "folded", "xla_fused"):
      m = _model(mode, attention_impl=impl)
      v = _perturbed(_model(mode).init(jax.random.key(0), IDS))
      outs.append(m.apply(v, IDS))
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-5)
    np.testing.assert_allclose(outs[2], outs[0], atol=1e-5)

  def test_default_is_absolute_at_the_input_with_the_old_parameter_tree(self):
    m = text.RoBERTa(**SMALL)
    assert m.position == "absolute"
    p = m.init(jax.random.key(0), IDS)["params"]
    assert set(p) == {"word_embeddings", "position_embeddings", "embedding_norm",
                      "layers_0", "layers_1", "head_dense", "head_out"}
    assert set(p["layers_0"]) == {"attention", "attention_norm", "intermediate", "output",
                                  "output_norm"}
    assert set(p["layers_0"]["attention"]) == {"query", "key", "value", "out"}
    # The model as before the field: LN(word + position table) -> layers without bias.
    v = _perturbed({"params": p})
    ref_tokens = v["params"]["embedding_norm"]
    x = (v["params"]["word_embeddings"]["embedding"][IDS]
         + v["params"]["position_embeddings"]["embedding"][:L])
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    x = (x - mean) / jnp.sqrt(var + 1e-5) * ref_tokens["scale"] + ref_tokens["bias"]
    np.testing.assert_allclose(m.apply(v, IDS, method=m.embed), x, atol=1e-5)

  def test_default_attention_equals_plain_softmax_attention(self):
    """SelfAttention without bias = softmax(q kᵀ/√dh + mask) v, by hand."""
    att = text.SelfAttention(width=16, num_heads=2, dropout_rate=0.0)
    x = jax.random.normal(jax.random.key(1), (2, L, 16))
    mask = text.padding_mask(IDS)
    v = _perturbed(att.init(jax.random.key(0), x, mask))
    p = v["params"]
    proj = lambda n: jnp.einsum("bld,dhk->blhk", x, p[n]["kernel"]) + p[n]["bias"]
    q, k, val = proj("query"), proj("key"), proj("value")
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(8)
    s = jnp.where(mask[:, None, None, :], s, -1e30)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), val)
    ref = jnp.einsum("blhk,hkd->bld", o, p["out"]["kernel"]) + p["out"]["bias"]
    np.testing.assert_allclose(att.apply(v, x, mask), ref, atol=1e-5)

  def test_diet_rel_bias_is_a_hand_built_toeplitz_matrix(self):
    n, length = 6, 5
    table = jnp.arange(2 * (2 * n - 1), dtype=jnp.float32).reshape(2, 2 * n - 1)
    bias = np.asarray(position.toeplitz_bias(table, length))
    for h in range(2):
      for i in range(length):
        for j in range(length):
          assert bias[h, i, j] == table[h, i - j + n - 1]      # R_{i−j}
      for d in range(1, length):   # Constant along every diagonal.
        assert len(set(np.diagonal(bias[h], d))) == 1

  def test_diet_rel_layers_have_their_own_tables(self):
    _, v = _variables("diet_rel")
    p = v["params"]
    assert p["layers_0"]["position_bias"]["relative"].shape == (2, 2 * L - 1)
    assert not np.allclose(p["layers_0"]["position_bias"]["relative"],
                           p["layers_1"]["position_bias"]["relative"])
    assert "position_embeddings" not in p

  def test_diet_abs_is_shared_with_dim_dh_by_default(self):
    _, v = _variables("diet_abs")
    p = v["params"]
    assert p["position_bias"]["p_query"].shape == (2, L, 8)
    assert "position_bias" not in p["layers_0"] and "position_embeddings" not in p
    _, v = _variables("diet_abs", diet_dim=3)
    assert v["params"]["position_bias"]["p_key"].shape == (2, L, 3)

  def test_segment_ids_of_the_pair_template(self):
    np.testing.assert_array_equal(position.segment_ids(IDS),
                                  [[0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1],
                                   [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]])
    assert position.SEP_ID == text_data.EOS_ID

  def test_segment_biases_land_on_the_right_blocks(self):
    table = jnp.array([[[1., 2.], [3., 4.]]])                  # One head: E_S(s, t).
    seg = jnp.array([[0, 0, 0, 1, 1]])
    bias = np.asarray(position.segment_bias(table, seg))[0, 0]
    np.testing.assert_array_equal(bias[:3, :3], 1.0)
    np.testing.assert_array_equal(bias[:3, 3:], 2.0)
    np.testing.assert_array_equal(bias[3:, :3], 3.0)
    np.testing.assert_array_equal(bias[3:, 3:], 4.0)

  def test_t5_buckets_match_a_hand_computation(self):
    # Bidirectional, 32 buckets (16 per direction, 8 exact), max distance 128:
    # key − query = r; r > 0 adds 16; |r| < 8 is its own bucket; else
    # 8 + floor(log(|r|/8) / log(128/8) · 8), at most 15.
    for r, want in {0: 0, -1: 1, 1: 17, -7: 7, 7: 23, -8: 8, 8: 24, -16: 10, 20: 26,
                    -50: 13, 127: 31, -128: 15, 1000: 31}.items():
      assert int(position.t5_buckets(r)) == want, r

  def test_shaw_relative_keys_are_clipped(self):
    keys = position.ShawKeys(head_dim=2, clip=2)
    v = keys.init(jax.random.key(0), 6)
    a = np.asarray(keys.apply(v, 6))                           # [L, L, dh]
    table = np.asarray(v["params"]["relative_keys"])
    for i in range(6):
      for j in range(6):
        np.testing.assert_array_equal(a[i, j], table[np.clip(j - i, -2, 2) + 2])

  def test_sinusoidal_table(self):
    t = position.sinusoidal_table(7, 6)
    np.testing.assert_allclose(t[3, 0], np.sin(3.0), rtol=1e-6)
    np.testing.assert_allclose(t[3, 1], np.cos(3.0), rtol=1e-6)
    np.testing.assert_allclose(t[5, 2], np.sin(5.0 / 10000 ** (2 / 6)), rtol=1e-6)

  def test_unknown_mode_is_a_one_line_config_error(self):
    with pytest.raises(ConfigError, match=r"model\.position.*allowed: none, absolute") as e:
      get_model("roberta", 2, (L,), position="alibi")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"model\.diet_dim"):
      get_model("roberta", 2, (L,), position="diet_abs", diet_dim=0)
    with pytest.raises(ConfigError, match=r"model\.position.*softmax"):
      get_model("roberta", 2, (L,), position="diet_rel", attention="relu")


class LogitRankTest(parameterized.TestCase):

  def test_numerical_rank_of_constructed_matrices(self):
    u = jax.random.normal(jax.random.key(0), (3, 10, 4))
    w = jax.random.normal(jax.random.key(1), (3, 4, 10))
    np.testing.assert_array_equal(logit_rank.numerical_rank(u @ w), [4, 4, 4])
    np.testing.assert_array_equal(logit_rank.numerical_rank(jnp.eye(10)), 10)

  @parameterized.parameters(("absolute", 4, 4), ("none", 4, 4), ("sinusoidal", 4, 4),
                            ("diet_abs", 10, 10), ("diet_rel", 16, 16))
  def test_theorem_1(self, mode, low, high):
    """Input PE: rank <= d_h = 4; DIET-ABS: <= d_h + d_p + 2 (segments) = 10; DIET-REL
    reaches the sequence length 16."""
    ids, _ = pair_tasks.pair_task("rotation", 4, 0, max_length=16)
    m = text.RoBERTa(num_classes=2, vocab_size=20, max_length=16, width=16, depth=1,
                     num_heads=4, mlp_dim=16, position=mode)
    v = _perturbed(m.init(jax.random.key(0), ids), 0.5)
    out = logit_rank.attention_logit_rank(functools.partial(m.apply, train=False), v,
                                jnp.asarray(ids), mask=jnp.array([1, 1, 1, 0], bool))
    assert out["rank"].shape == (1, 4, 4)
    assert low <= int(out["rank"][:, :3].min()) and int(out["max_rank"][0]) <= high

  @pytest.mark.slow
  def test_token_mask_caps_the_rank(self):
    m, v = _variables("diet_rel")
    out = logit_rank.attention_logit_rank(functools.partial(m.apply, train=False), v, IDS,
                                token_mask=text.padding_mask(IDS))
    assert int(out["rank"][:, 0].max()) <= 11


class PairTasksTest(parameterized.TestCase):

  @parameterized.parameters("reversed", "rotation", "match")
  def test_labels_are_exact_balanced_and_deterministic(self, task):
    ids, labels = pair_tasks.pair_task(task, 40, 3, max_length=22)
    again, _ = pair_tasks.pair_task(task, 40, 3, max_length=22)
    np.testing.assert_array_equal(ids, again)
    assert labels.mean() == 0.5
    m = pair_tasks.words_per_sentence(22)
    assert m == 9
    for row, y in zip(ids, labels):
      assert row[0] == text_data.BOS_ID and list(row[m + 1:m + 3]) == [2, 2]
      assert row[2 * m + 3] == text_data.EOS_ID
      a, b = row[1:m + 1], row[m + 3:2 * m + 3]
      assert sorted(a) == sorted(b) and len(set(a)) == m      # B is a permutation of A.
      if task == "reversed":
        assert (list(b) == list(a[::-1])) == bool(y)
      elif task == "rotation":
        assert any(list(np.roll(a, r)) == list(b) for r in range(m)) == bool(y)
      else:
        assert (a[pair_tasks.MATCH_INDEX] == b[pair_tasks.MATCH_INDEX]) == bool(y)
    assert pair_tasks.BOS_ID == text_data.BOS_ID and pair_tasks.EOS_ID == text_data.EOS_ID
    assert pair_tasks.NUM_SPECIAL == len(text_data.SPECIAL_TOKENS)

  def test_loaded_through_the_text_datasets(self):
    dc = text_data.default_text_data_config()
    dc.name, dc.max_length = "text/pair_match", 16
    dc.synthetic.num_train, dc.synthetic.num_test = 32, 8
    split = text_data.load_text_split(dc, "train", seed=0)
    assert split.inputs.shape == (32, 16) and split.vocab_size == pair_tasks.VOCAB_SIZE
    dc.max_length = 10
    with pytest.raises(ConfigError, match=r"data\.max_length"):
      text_data.validate_text_data_config(dc)


class FakeRte(text_data_test.FakeGlue, skip_registration=True):
  """tests/text_data_test.py's TF-free fake GLUE builder under RTE's config name."""
  name = "glue"
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="rte")]


def test_glue_rte_from_a_data_dir_and_its_segments(tmp_path):
  dc = text_data.default_text_data_config()
  dc.update({"name": "glue/rte", "data_dir": str(tmp_path), "max_length": 24,
             "vocab_size": 300})
  with pytest.raises(ConfigError, match="not found in data_dir"):
    text_data.validate_text_data_config(dc)
  FakeRte(data_dir=str(tmp_path), config="rte", file_format="array_record"
          ).download_and_prepare(file_format="array_record")
  split = text_data.load_text_split(dc, "validation", seed=0)
  assert split.inputs.shape == (8, 24)
  seg = np.asarray(position.segment_ids(jnp.asarray(split.inputs)))
  for row, s in zip(split.inputs, seg):
    seps = np.flatnonzero(row == text_data.EOS_ID)   # </s></s> between A and B, </s> last.
    assert seps[1] == seps[0] + 1
    assert (s[:seps[1] + 1] == 0).all() and (s[seps[1] + 1:] == 1).all()


def _shuffle_patches(images, perm, p=2):
  """[B, 8, 8, C] images with their p×p patches (row-major) reordered by `perm`."""
  b, h, w, c = images.shape
  patches = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
  patches = patches.reshape(b, -1, p, p, c)[:, perm]
  return patches.reshape(b, h // p, w // p, p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(
      images.shape)


@pytest.mark.parametrize("posemb, bias, invariant", [
    ("none", "none", True), ("learned", "none", False), ("none", "diet_abs", False),
    ("none", "diet_rel", False)])
def test_vit_diet_modes_and_patch_permutations(posemb, bias, invariant):
  """A CLS-pooled ViT without position information ignores the order of its patches."""
  from xsens.models.vit import ViT   # pylint: disable=import-outside-toplevel
  x = jax.random.normal(jax.random.key(1), (2, 8, 8, 1))
  m = ViT(num_classes=3, patch_size=2, width=16, depth=2, num_heads=2, mlp_dim=16,
          posemb=posemb, position_bias=bias)
  v = _perturbed(m.init(jax.random.key(0), x))
  perm = np.random.default_rng(0).permutation(16)
  y, yp = m.apply(v, x), m.apply(v, _shuffle_patches(x, perm))
  assert np.allclose(y, yp, atol=1e-5) == invariant
  if bias != "none":
    folded = m.clone(attention_impl="folded").apply(v, x)
    np.testing.assert_allclose(folded, y, atol=1e-5)
    with pytest.raises(ConfigError, match=r"model\.position_bias"):
      get_model("vit", 3, (8, 8, 1), patch_size=2, position_bias=bias, attention="lsa")
