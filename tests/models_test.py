"""Tests for the model zoo (xsens/models): the registry and the vision models."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlcollections_configs import benign_overfitting as benign_config
from mlcollections_configs import grokking as grok_config
from mlcollections_configs import synthetic_sensitivity as synthetic_config
from tests.text_models_test import PARAM_COUNTS as TEXT_PARAM_COUNTS
from tests.text_models_test import SMALL as TEXT_SMALL
from xsens.errors import ConfigError
from xsens.models import (MODELS, REGISTRY, TEXT_MODELS, config_fields, get_entry,
                          get_model, vit)
from xsens.models import grokking_transformer as gt
from xsens.models import one_layer_vit
from xsens.models import two_layer_cnn

jax.config.update("jax_disable_most_optimizations", True)

NUM_CLASSES = 10
MNIST = (28, 28, 1)
CIFAR = (32, 32, 3)

# Small settings that keep the forward tests fast; defaults are checked with
# jax.eval_shape below.
SMALL = {
    "vit": dict(patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=32),
    "resnet18": dict(width_multiplier=0.125),
    "densenet": dict(growth_rate=4, block_sizes=(2, 2, 2)),
    "convmixer": dict(width=16, depth=2),
    "mlp": dict(hidden_dims=(32,)),
    "cnn": dict(features=(8, 8, 8), dense_dim=16),
    "bit_resnet": dict(block_units=(1, 1, 1, 1), width_factor=0.125, num_groups=4),
    "reuse_vit": dict(patch_size=4, width=16, depth=2, num_heads=2, mlp_dim=32),
    "eigen_vit": dict(patch_size=4, width=16, depth=2, num_heads=2, mlp_dim=32,
                      keys_kept=10, basis_rank=4),
    "convnext": dict(depths=(1, 1, 1, 1), dims=(4, 8, 8, 8), patch_size=2),
}

# Exact parameter counts on 28x28x1 with 10 classes: name -> (model, kwargs, count).
PARAM_COUNTS = {
    "vit": ("vit", {}, 72_010),
    "resnet18": ("resnet18", {}, 11_172_810),
    "resnet18_w0.25": ("resnet18", dict(width_multiplier=0.25), 701_178),
    "densenet": ("densenet", {}, 1_000_186),
    "densenet_222": ("densenet", dict(block_sizes=(2, 2, 2)), 43_978),
    "convmixer": ("convmixer", {}, 21_322),
    "mlp": ("mlp", {}, 468_874),
    "cnn": ("cnn", {}, 458_570),
    "bit_resnet": ("bit_resnet", {}, 23_514_570),  # BiT R50x1
    "bit_resnet_r101x1": ("bit_resnet", dict(block_units=(3, 4, 23, 3)), 42_506_698),
    "reuse_vit": ("reuse_vit", {}, 63_690),  # layer 1 reuses all 4 heads: no Q, K
    "eigen_vit": ("eigen_vit", {}, 72_010),  # keys_kept=0: the ViT
    # + layer 1's basis [4 heads, 50 tokens, k=4] and mean [4, 50].
    "eigen_vit_m10_k4": ("eigen_vit", dict(keys_kept=10, basis_rank=4), 73_010),
    # ConvNeXt-T with a 2x2 stem (the 4x4 one needs 32x32 inputs); tests/convnext_test.py
    # checks the published 28,589,128 of ConvNeXt-T on 224x224x3, 1000 classes.
    "convnext": ("convnext", dict(patch_size=2), 27_823_594),
}

BATCHNORM_MODELS = ("resnet18", "densenet", "convmixer")
# The models on token ids or float tokens (text ones: also tests/text_models_test.py).
NON_IMAGE_MODELS = (*TEXT_MODELS, "grokking_transformer", "one_layer_attention", "token_mlp",
                    "one_layer_vit", "two_layer_cnn")
VISION_MODELS = sorted(set(MODELS) - set(NON_IMAGE_MODELS))

# Every non-image entry at a small size: name -> (num_classes, input_shape, kwargs).
SMALL_NON_IMAGE = {
    **{name: (3, (16,), TEXT_SMALL[name]) for name in TEXT_MODELS},
    "grokking_transformer": (8, (3,), dict(vocab_size=8, width=16, num_heads=4, mlp_dim=24)),
    "one_layer_attention": (3, (5, 4), dict(qk_dim=3, v_dim=6)),
    "token_mlp": (3, (5, 4), dict(hidden_dims=(7,))),
    "one_layer_vit": (2, (5, 4), dict(d_h=3, d_v=6)),
    "two_layer_cnn": (2, (5, 4), dict(m=3)),
}
# Exact parameter counts of the non-text, non-image entries:
# name -> (model, num_classes, input_shape, kwargs, count).
NON_IMAGE_PARAM_COUNTS = {
    # The grokking paper's SimpleTransformer (p = 113: vocab 114, d 128, MLP 512).
    "grokking_transformer": ("grokking_transformer", 114, (3,), {}, 227_442),
    "grokking_transformer_small": ("grokking_transformer", 8, (3,),
                                   SMALL_NON_IMAGE["grokking_transformer"][2],
                                   gt.num_params(8, 8, 16, 24)),
    # W_Q, W_K 4x3, W_V 4x6, U 6x2; defaults qk = v = d: 3 d^2 + d K.
    "one_layer_attention": ("one_layer_attention", 2, (5, 4), dict(qk_dim=3, v_dim=6), 60),
    "one_layer_attention_default": ("one_layer_attention", 2, (5, 8), {}, 3 * 64 + 16),
    "token_mlp": ("token_mlp", 2, (4, 3), dict(hidden_dims=(7,)), 12 * 7 + 7 + 7 * 2 + 2),
    "token_mlp_default": ("token_mlp", 2, (4, 3), {},
                          12 * 256 + 256 + 256 * 256 + 256 + 256 * 2 + 2),
    # W_Q, W_K [d, d_h], W_V [d, d_v], w_O [d_v] (64 each by default), d = 8.
    "one_layer_vit": ("one_layer_vit", 2, (3, 8), {}, 3 * 8 * 64 + 64),
    # w [2, m, d], m = 10 by default.
    "two_layer_cnn": ("two_layer_cnn", 2, (3, 8), {}, 2 * 10 * 8),
}


def _rngs(seed=0):
  key = jax.random.key(seed)
  return {"params": key, "dropout": key}


def _images(image_shape, batch=2, seed=1):
  return jax.random.normal(jax.random.key(seed), (batch, *image_shape), jnp.float32)


def _init(model, x):
  return jax.jit(lambda r, x: model.init(r, x, train=False))(_rngs(), x)


def _n_params(variables):
  return sum(a.size for a in jax.tree.leaves(variables["params"]))


def test_every_model_has_small_settings():
  assert set(SMALL) == set(VISION_MODELS)


@pytest.mark.slow
@pytest.mark.parametrize("name", VISION_MODELS)
def test_forward_shape_and_finite(name):
  """Compiled and run on 32x32x3; on 28x28x1 (odd 7x7 maps after two halvings) the same
  small model is traced only: the shapes do not depend on the values."""
  model = get_model(name, NUM_CLASSES, CIFAR, **SMALL[name])
  x = _images(CIFAR)
  variables = _init(model, x)
  logits = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x)
  assert logits.shape == (2, NUM_CLASSES)
  assert logits.dtype == jnp.float32
  assert np.all(np.isfinite(logits))
  model = get_model(name, NUM_CLASSES, MNIST, **SMALL[name])
  x = jax.ShapeDtypeStruct((2, *MNIST), jnp.float32)
  variables = jax.eval_shape(lambda x: model.init(_rngs(), x, train=False), x)
  out = jax.eval_shape(lambda v, x: model.apply(v, x, train=False), variables, x)
  assert out.shape == (2, NUM_CLASSES) and out.dtype == jnp.float32


@pytest.mark.slow
@pytest.mark.parametrize("image_shape", [MNIST, CIFAR], ids=["28x28x1", "32x32x3"])
@pytest.mark.parametrize("name", VISION_MODELS)
def test_default_output_shape(name, image_shape):
  if name == "convnext" and image_shape == MNIST:  # Stride 4 x 2³ needs 32 x 32.
    with pytest.raises(ConfigError, match="at least 32x32; got 28x28"):
      get_model(name, NUM_CLASSES, image_shape)
    return
  model = get_model(name, NUM_CLASSES, image_shape)
  x = jax.ShapeDtypeStruct((2, *image_shape), jnp.float32)
  variables = jax.eval_shape(lambda x: model.init(_rngs(), x, train=False), x)
  out = jax.eval_shape(lambda v, x: model.apply(v, x, train=False), variables, x)
  assert out.shape == (2, NUM_CLASSES)
  assert out.dtype == jnp.float32


def test_param_table_covers_every_model():
  assert set(VISION_MODELS) <= {name for name, _, _ in PARAM_COUNTS.values()}
  assert set(VISION_MODELS) <= set(PARAM_COUNTS)


@pytest.mark.slow
@pytest.mark.parametrize("entry", sorted(PARAM_COUNTS))
def test_param_count(entry):
  name, kwargs, expected = PARAM_COUNTS[entry]
  model = get_model(name, NUM_CLASSES, MNIST, **kwargs)
  x = jax.ShapeDtypeStruct((1, *MNIST), jnp.float32)
  variables = jax.eval_shape(lambda x: model.init(_rngs(), x, train=False), x)
  assert _n_params(variables) == expected


@pytest.mark.slow
@pytest.mark.parametrize("name", BATCHNORM_MODELS)
def test_batchnorm_train_updates_stats_and_eval_is_deterministic(name):
  model = get_model(name, NUM_CLASSES, MNIST, **SMALL[name])
  x = _images(MNIST, batch=4)
  variables = _init(model, x)
  assert "batch_stats" in variables

  train = jax.jit(lambda v, x: model.apply(
      v, x, train=True, mutable=["batch_stats"], rngs={"dropout": jax.random.key(2)}))
  _, updates = train(variables, x)
  old = jax.tree.leaves(variables["batch_stats"])
  new = jax.tree.leaves(updates["batch_stats"])
  assert len(old) == len(new)
  assert any(not np.allclose(a, b) for a, b in zip(old, new))

  evaluate = jax.jit(lambda v, x: model.apply(v, x, train=False))
  np.testing.assert_array_equal(evaluate(variables, x), evaluate(variables, x))
  # Eval logits of one example do not depend on the rest of the batch.
  np.testing.assert_allclose(evaluate(variables, x)[:1], evaluate(variables, x[:1]),
                             rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_vit_dropout_active_only_in_train():
  model = get_model("vit", NUM_CLASSES, MNIST, **SMALL["vit"], dropout_rate=0.5)
  x = _images(MNIST)
  variables = _init(model, x)
  apply = jax.jit(lambda v, x, key, train: model.apply(
      v, x, train=train, rngs={"dropout": key}), static_argnames="train")
  k1, k2 = jax.random.key(3), jax.random.key(4)
  np.testing.assert_array_equal(apply(variables, x, k1, False),
                                apply(variables, x, k2, False))
  assert not np.allclose(apply(variables, x, k1, True), apply(variables, x, k2, True))


@pytest.mark.slow
@pytest.mark.parametrize("pooling,posemb", [("cls", "sincos"), ("mean", "learned")])
def test_vit_variants(pooling, posemb):
  """Each pooling and each position embedding runs once (the two choices are independent
  code paths); the parameter trees of all four pairs are checked by `eval_shape`."""
  model = get_model("vit", NUM_CLASSES, MNIST, **SMALL["vit"], pooling=pooling,
                    posemb=posemb)
  x = _images(MNIST)
  variables = _init(model, x)
  assert np.all(np.isfinite(jax.jit(model.apply)(variables, x)))
  for pool in ("cls", "mean"):
    for pe in ("learned", "sincos"):
      model = get_model("vit", NUM_CLASSES, MNIST, **SMALL["vit"], pooling=pool, posemb=pe)
      params = jax.eval_shape(lambda x, m=model: m.init(_rngs(), x, train=False), x)["params"]
      assert ("cls" in params) == (pool == "cls")
      assert ("pos_embedding" in params) == (pe == "learned")


@pytest.mark.slow
def test_vit_patch_maps_to_one_token():
  model = get_model("vit", NUM_CLASSES, MNIST, **SMALL["vit"])
  x = _images(MNIST, batch=1)
  variables = _init(model, x)

  @jax.jit
  def tokens(x):
    _, state = model.apply(variables, x, capture_intermediates=lambda m, _: (
        m.name == "embedding"), mutable=["intermediates"])
    return state["intermediates"]["embedding"]["__call__"][0].reshape(1, 49, -1)

  # Perturb the patch at grid row 1, column 2 (pixels [4:8, 8:12]) -> token 9.
  y = x.at[:, 4:8, 8:12, :].add(1.0)
  changed = np.any(np.abs(tokens(y) - tokens(x)) > 1e-6, axis=-1)[0]
  assert np.flatnonzero(changed).tolist() == [1 * 7 + 2]


@pytest.mark.slow
def test_vit_sows_attention_weights():
  model = get_model("vit", NUM_CLASSES, MNIST, **SMALL["vit"])
  x = _images(MNIST)
  variables = _init(model, x)
  _, state = jax.jit(lambda v, x: model.apply(v, x, mutable=["intermediates"]))(
      variables, x)
  (weights,) = state["intermediates"]["encoderblock_0"][
      "MultiHeadDotProductAttention_0"]["attention_weights"]
  assert weights.shape == (2, 2, 50, 50)  # [B, heads, 1 + 49 tokens, 1 + 49]
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)


def test_posemb_sincos_2d():
  pe = vit.posemb_sincos_2d(3, 5, 16)
  assert pe.shape == (1, 15, 16)
  # First frequency is 1: channel 0 is sin(column), channel 8 is sin(row).
  np.testing.assert_allclose(pe[0, :, 0], np.sin(np.tile(np.arange(5), 3)), atol=1e-6)
  np.testing.assert_allclose(pe[0, :, 8], np.sin(np.repeat(np.arange(3), 5)), atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh", "leaky_relu"])
def test_mlp_activations(activation):
  model = get_model("mlp", NUM_CLASSES, MNIST, hidden_dims=[8], activation=activation)
  x = _images(MNIST)
  assert model.apply(_init(model, x), x).shape == (2, NUM_CLASSES)


def test_lists_from_ml_collections_become_tuples():
  model = get_model("densenet", NUM_CLASSES, MNIST, block_sizes=[2, 2])
  assert model.block_sizes == (2, 2)


def test_config_fields():
  assert config_fields("mlp") == ("hidden_dims", "activation", "dtype")
  for name in MODELS:
    assert not {"parent", "name", "num_classes"} & set(config_fields(name))
  assert config_fields("one_layer_attention") == ("qk_dim", "v_dim", "dtype")
  assert config_fields("grokking_transformer") == ("vocab_size", "width", "num_heads",
                                                   "mlp_dim", "seq_len", "dtype")


@pytest.mark.parametrize("name, kwargs, image_shape, field", [
    ("vit", dict(patch_size=5), MNIST, "model.patch_size"),
    ("vit", dict(patch_size=8), (28, 32, 1), "model.patch_size"),
    ("vit", dict(width=30, num_heads=4), MNIST, "model.width"),
    ("vit", dict(width=6, num_heads=2, posemb="sincos"), MNIST, "model.width"),
    ("vit", dict(depth=0), MNIST, "model.depth"),
    ("vit", dict(num_heads=-1), MNIST, "model.num_heads"),
    ("vit", dict(pooling="max"), MNIST, "model.pooling"),
    ("vit", dict(posemb="rope"), MNIST, "model.posemb"),
    ("vit", dict(dropout_rate=1.0), MNIST, "model.dropout_rate"),
    ("resnet18", {}, (4, 4, 3), "model.name"),
    ("resnet18", dict(width_multiplier=0), MNIST, "model.width_multiplier"),
    ("densenet", dict(block_sizes=(1, 1, 1, 1, 1)), (8, 8, 3), "model.block_sizes"),
    ("densenet", dict(block_sizes=()), MNIST, "model.block_sizes"),
    ("densenet", dict(compression=0.0), MNIST, "model.compression"),
    ("densenet", dict(growth_rate=0), MNIST, "model.growth_rate"),
    ("convmixer", dict(patch_size=3), MNIST, "model.patch_size"),
    ("convmixer", dict(width=0), MNIST, "model.width"),
    ("mlp", dict(activation="swish"), MNIST, "model.activation"),
    ("mlp", dict(hidden_dims=(8, 0)), MNIST, "model.hidden_dims"),
    ("cnn", dict(features=(8,) * 6), (16, 16, 1), "model.features"),
    ("cnn", dict(kernel_size=0), MNIST, "model.kernel_size"),
    ("nope", {}, MNIST, "model.name"),
    ("vit", dict(activation="relu"), MNIST, "model.activation"),
    ("bit_resnet", dict(block_units=(3, 4, 6)), MNIST, "model.block_units"),
    ("bit_resnet", dict(width_factor=0.1), MNIST, "model.num_groups"),
    ("bit_resnet", dict(width_factor=-1.0), MNIST, "model.width_factor"),
    ("grokking_transformer", dict(width=10, num_heads=4), (3,), "model.num_heads"),
    ("grokking_transformer", {}, (4,), "model.seq_len"),
    ("grokking_transformer", {}, MNIST, "model.seq_len"),
    ("one_layer_attention", dict(qk_dim=0), (5, 4), "model.qk_dim"),
    ("one_layer_attention", {}, MNIST, "model.name"),
    ("token_mlp", dict(hidden_dims=(4, 0)), (5, 4), "model.hidden_dims"),
    ("token_mlp", {}, (5,), "model.name"),
    ("one_layer_vit", dict(init_scheme="xavier"), (5, 4), "model.init_scheme"),
    ("one_layer_vit", dict(d_h=0), (5, 4), "model.d_h"),
    ("one_layer_vit", {}, MNIST, "model.name"),
    ("two_layer_cnn", dict(q=0.5), (5, 4), "model.q"),
    ("two_layer_cnn", dict(sigma_0=0.0), (5, 4), "model.sigma_0"),
    ("two_layer_cnn", {}, (0, 4), "model.name"),
])
def test_refusals(name, kwargs, image_shape, field):
  binary = name in REGISTRY and REGISTRY[name].classes_field is None
  with pytest.raises(ConfigError) as info:
    get_model(name, 2 if binary else NUM_CLASSES, image_shape, **kwargs)
  assert info.value.field == field
  assert f"config.{field}:" in str(info.value)


def test_refusal_messages_list_what_is_allowed():
  with pytest.raises(ConfigError, match=r"allowed: 1, 2, 4, 7, 14, 28$"):
    get_model("vit", NUM_CLASSES, MNIST, patch_size=5)
  with pytest.raises(ConfigError, match=r"allowed: bit_resnet, cnn, convmixer, convnext, "
                     r"densenet, eigen_vit, "
                     r"gpt2, grokking_transformer, lstm, mlp, one_layer_attention, "
                     r"one_layer_vit, resnet18, reuse_vit, roberta, token_mlp, "
                     r"two_layer_cnn, vit$"):
    get_model("nope", NUM_CLASSES, MNIST)
  with pytest.raises(ConfigError, match=r"allowed: relu, gelu, tanh, leaky_relu$"):
    get_model("mlp", NUM_CLASSES, MNIST, activation="swish")
  with pytest.raises(ConfigError, match=r"at least 8x8; got 4x4"):
    get_model("resnet18", NUM_CLASSES, (4, 4, 3))
  with pytest.raises(ConfigError, match=r"unknown field for model 'vit'; allowed: "
                     r"attention, attention_impl, depth, dropout_rate, dtype, mlp_dim"):
    get_model("vit", NUM_CLASSES, MNIST, activation="relu")


def test_smallest_inputs_accepted():
  get_model("resnet18", NUM_CLASSES, (8, 8, 3))
  get_model("densenet", NUM_CLASSES, (8, 8, 3))
  get_model("cnn", NUM_CLASSES, (4, 4, 1))
  get_model("vit", NUM_CLASSES, (28, 32, 1), patch_size=4)


# ---------------------------------------------------------------------------------- registry


def _inputs(name, input_shape, batch=2, seed=1):
  """A batch [batch, *input_shape] of the entry's dtype (ids in 1..vocab - 1)."""
  entry = REGISTRY[name]
  key = jax.random.key(seed)
  if entry.input_dtype == jnp.int32:
    vocab = SMALL_NON_IMAGE[name][2]["vocab_size"]
    return jax.random.randint(key, (batch, *input_shape), 1, vocab, jnp.int32)
  return jax.random.normal(key, (batch, *input_shape), jnp.float32)


def test_registry_entries():
  assert set(REGISTRY) == set(MODELS) == set(VISION_MODELS) | set(NON_IMAGE_MODELS)
  for name, entry in REGISTRY.items():
    assert entry.name == name and MODELS[name] is entry.module
    assert get_entry(name) is entry
    ids = name in TEXT_MODELS or name == "grokking_transformer"
    assert entry.input_dtype == (jnp.int32 if ids else jnp.float32)
  assert {n for n, e in REGISTRY.items() if e.classes_field is None} == {
      "one_layer_vit", "two_layer_cnn"}
  assert {n for n, e in REGISTRY.items() if e.supports_removal} == {
      "vit", "reuse_vit", "eigen_vit", "resnet18", "bit_resnet", "convnext"}
  with pytest.raises(ConfigError, match="unknown model 'nope'"):
    get_entry("nope")


def test_every_non_image_entry_has_small_settings_and_counts():
  assert set(SMALL_NON_IMAGE) == set(NON_IMAGE_MODELS)
  counted = ({m for m, *_ in NON_IMAGE_PARAM_COUNTS.values()}
             | {m for m, _, _ in TEXT_PARAM_COUNTS.values()})
  assert set(NON_IMAGE_MODELS) <= counted
  # Together with test_param_table_covers_every_model: every entry has a count.
  assert set(REGISTRY) <= counted | {name for name, _, _ in PARAM_COUNTS.values()}


@pytest.mark.slow
@pytest.mark.parametrize("name", NON_IMAGE_MODELS)
def test_non_image_forward_shape_and_finite(name):
  num_classes, input_shape, kwargs = SMALL_NON_IMAGE[name]
  model = get_model(name, num_classes, input_shape, **kwargs)
  x = _inputs(name, input_shape)
  assert x.dtype == REGISTRY[name].input_dtype
  if name in TEXT_MODELS:  # Run in tests/text_models_test.py; shapes only here.
    variables = jax.eval_shape(lambda x: model.init(_rngs(), x, train=False), x)
    out = jax.eval_shape(lambda v, x: model.apply(v, x, train=False), variables, x)
    assert out.shape == (2, num_classes) and out.dtype == jnp.float32
    return
  variables = _init(model, x)
  out = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x)
  binary = REGISTRY[name].classes_field is None
  assert out.shape == ((2,) if binary else (2, num_classes))
  assert out.dtype == jnp.float32
  assert np.all(np.isfinite(out))


@pytest.mark.parametrize("entry", sorted(NON_IMAGE_PARAM_COUNTS))
def test_non_image_param_count(entry):
  name, num_classes, input_shape, kwargs, expected = NON_IMAGE_PARAM_COUNTS[entry]
  model = get_model(name, num_classes, input_shape, **kwargs)
  x = jax.ShapeDtypeStruct((1, *input_shape), REGISTRY[name].input_dtype)
  variables = jax.eval_shape(lambda x: model.init(_rngs(), x, train=False), x)
  assert _n_params(variables) == expected


def test_input_shape_by_position_or_keyword():
  a = get_model("vit", NUM_CLASSES, input_shape=MNIST, **SMALL["vit"])
  assert a == get_model("vit", NUM_CLASSES, MNIST, **SMALL["vit"])
  with pytest.raises(TypeError, match="input_shape"):
    get_model("vit", NUM_CLASSES)  # pylint: disable=no-value-for-parameter


def test_binary_models_take_two_classes():
  for name in ("one_layer_vit", "two_layer_cnn"):
    with pytest.raises(ConfigError, match=f"'{name}' is a binary classifier"):
      get_model(name, 3, (5, 4))


def test_grokking_entry_builds_the_study_model():
  from xsens.studies import grokking  # pylint: disable=g-import-not-at-top
  for arg in (None, "smoke"):
    config = grok_config.get_config(arg)
    p, m = int(config.data.modulus), config.model
    model = get_model("grokking_transformer", p + 1, (gt.SEQ_LEN,), vocab_size=p + 1,
                      width=m.width, num_heads=m.num_heads, mlp_dim=m.mlp_dim)
    assert model == grokking.make_model(config)


def test_synthetic_sensitivity_entries_build_the_study_models():
  from xsens.studies import synthetic_sensitivity as syn  # pylint: disable=g-import-not-at-top
  config = synthetic_config.get_config(None)
  a = config.attention
  for num_outputs in (1, 2):
    assert get_model("one_layer_attention", num_outputs, (6, 5), qk_dim=a.qk_dim,
                     v_dim=a.v_dim) == syn.make_model(config, "attention", num_outputs)
    assert get_model("token_mlp", num_outputs, (6, 5),
                     hidden_dims=config.mlp.hidden_dims) == syn.make_model(
                         config, "mlp", num_outputs)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["vit", "cnn"])
def test_benign_entries_equal_the_study_functions(kind):
  """Same parameters (names, shapes, init law) and bit-identical outputs as the pure
  functions `benign_overfitting.model_fns` builds the sweeps from."""
  from xsens.studies import benign_overfitting as benign  # pylint: disable=g-import-not-at-top
  config = benign_config.get_config("smoke")
  d, m = int(config.data.d), int(config.data.num_tokens)
  init_fn, apply_fn = benign.model_fns(config, kind)
  params, frozen = init_fn(jax.random.key(0))
  if kind == "vit":
    v = config.vit
    model = get_model("one_layer_vit", 2, (m, d), d_h=v.d_h, d_v=v.d_v, init_scheme=v.init,
                      init_divisor=v.init_divisor, init_std=v.init_std)
    variables = {"params": {**params, "w_o": frozen}}
  else:
    c = config.cnn
    model = get_model("two_layer_cnn", 2, (m, d), m=c.m, q=c.q, sigma_0=c.sigma_0)
    variables = {"params": params}
  x = jax.random.normal(jax.random.key(1), (7, m, d), jnp.float32)
  own = model.init(jax.random.key(2), x[:1])
  assert (jax.tree.map(lambda a: (a.shape, a.dtype), own)
          == jax.tree.map(lambda a: (a.shape, a.dtype), variables))
  np.testing.assert_array_equal(model.apply(variables, x, train=False),
                                apply_fn(params, frozen, x))
  np.testing.assert_array_equal(jax.jit(model.apply)(variables, x),
                                jax.jit(apply_fn)(params, frozen, x))


@pytest.mark.slow
def test_benign_module_inits_follow_the_pure_laws():
  """The modules draw from the same distributions as `init` (bounds / scales)."""
  d, n = 16, 3
  x = jnp.zeros((1, n, d))
  vit_params = get_model("one_layer_vit", 2, (n, d), d_h=32, d_v=32).init(
      jax.random.key(0), x)["params"]
  bound = 1.0 / d ** 0.5 / 16.0
  for k in ("wq", "wk", "wv"):
    a = np.abs(np.asarray(vit_params[k]))
    assert a.max() <= bound and a.max() > 0.9 * bound
  a = np.abs(np.asarray(vit_params["w_o"]))
  assert a.max() <= 1 / 32 ** 0.5 and a.max() > 0.8 / 32 ** 0.5
  pure, _ = one_layer_vit.init(jax.random.key(0), d, 32, 32)
  assert {k: a.shape for k, a in pure.items()} == {
      k: vit_params[k].shape for k in ("wq", "wk", "wv")}
  w = get_model("two_layer_cnn", 2, (n, d), m=500, sigma_0=0.5).init(
      jax.random.key(0), x)["params"]["w"]
  assert w.shape == two_layer_cnn.init(jax.random.key(0), d, 500)[0]["w"].shape
  assert abs(float(np.std(np.asarray(w))) - 0.5) < 0.01
