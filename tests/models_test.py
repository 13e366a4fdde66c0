"""Tests for the vision model zoo (xsens/models)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.errors import ConfigError
from xsens.models import MODELS, TEXT_MODELS, config_fields, get_model, vit

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
}

BATCHNORM_MODELS = ("resnet18", "densenet", "convmixer")
# The text models take token ids; tests/text_models_test.py covers them.
VISION_MODELS = sorted(set(MODELS) - set(TEXT_MODELS))


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


@pytest.mark.parametrize("image_shape", [MNIST, CIFAR], ids=["28x28x1", "32x32x3"])
@pytest.mark.parametrize("name", VISION_MODELS)
def test_forward_shape_and_finite(name, image_shape):
  model = get_model(name, NUM_CLASSES, image_shape, **SMALL[name])
  x = _images(image_shape)
  variables = _init(model, x)
  logits = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x)
  assert logits.shape == (2, NUM_CLASSES)
  assert logits.dtype == jnp.float32
  assert np.all(np.isfinite(logits))


@pytest.mark.parametrize("image_shape", [MNIST, CIFAR], ids=["28x28x1", "32x32x3"])
@pytest.mark.parametrize("name", VISION_MODELS)
def test_default_output_shape(name, image_shape):
  model = get_model(name, NUM_CLASSES, image_shape)
  x = jax.ShapeDtypeStruct((2, *image_shape), jnp.float32)
  variables = jax.eval_shape(lambda x: model.init(_rngs(), x, train=False), x)
  out = jax.eval_shape(lambda v, x: model.apply(v, x, train=False), variables, x)
  assert out.shape == (2, NUM_CLASSES)
  assert out.dtype == jnp.float32


def test_param_table_covers_every_model():
  assert set(VISION_MODELS) <= {name for name, _, _ in PARAM_COUNTS.values()}
  assert set(VISION_MODELS) <= set(PARAM_COUNTS)


@pytest.mark.parametrize("entry", sorted(PARAM_COUNTS))
def test_param_count(entry):
  name, kwargs, expected = PARAM_COUNTS[entry]
  model = get_model(name, NUM_CLASSES, MNIST, **kwargs)
  x = jax.ShapeDtypeStruct((1, *MNIST), jnp.float32)
  variables = jax.eval_shape(lambda x: model.init(_rngs(), x, train=False), x)
  assert _n_params(variables) == expected


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


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("posemb", ["learned", "sincos"])
def test_vit_variants(pooling, posemb):
  model = get_model("vit", NUM_CLASSES, MNIST, **SMALL["vit"], pooling=pooling,
                    posemb=posemb)
  x = _images(MNIST)
  variables = _init(model, x)
  assert ("cls" in variables["params"]) == (pooling == "cls")
  assert ("pos_embedding" in variables["params"]) == (posemb == "learned")
  assert np.all(np.isfinite(jax.jit(model.apply)(variables, x)))


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


@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh", "leaky_relu"])
def test_mlp_activations(activation):
  model = get_model("mlp", NUM_CLASSES, MNIST, hidden_dims=[8], activation=activation)
  x = _images(MNIST)
  assert model.apply(_init(model, x), x).shape == (2, NUM_CLASSES)


def test_lists_from_ml_collections_become_tuples():
  model = get_model("densenet", NUM_CLASSES, MNIST, block_sizes=[2, 2])
  assert model.block_sizes == (2, 2)


def test_config_fields():
  assert config_fields("mlp") == ("hidden_dims", "activation")
  for name in MODELS:
    assert not {"parent", "name", "num_classes"} & set(config_fields(name))


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
])
def test_refusals(name, kwargs, image_shape, field):
  with pytest.raises(ConfigError) as info:
    get_model(name, NUM_CLASSES, image_shape, **kwargs)
  assert info.value.field == field
  assert f"config.{field}:" in str(info.value)


def test_refusal_messages_list_what_is_allowed():
  with pytest.raises(ConfigError, match=r"allowed: 1, 2, 4, 7, 14, 28$"):
    get_model("vit", NUM_CLASSES, MNIST, patch_size=5)
  with pytest.raises(ConfigError, match=r"allowed: bit_resnet, cnn, convmixer, densenet, "
                     r"gpt2, lstm, mlp, resnet18, reuse_vit, roberta, vit$"):
    get_model("nope", NUM_CLASSES, MNIST)
  with pytest.raises(ConfigError, match=r"allowed: relu, gelu, tanh, leaky_relu$"):
    get_model("mlp", NUM_CLASSES, MNIST, activation="swish")
  with pytest.raises(ConfigError, match=r"at least 8x8; got 4x4"):
    get_model("resnet18", NUM_CLASSES, (4, 4, 3))
  with pytest.raises(ConfigError, match=r"unknown field for model 'vit'; allowed: "
                     r"depth, dropout_rate, mlp_dim"):
    get_model("vit", NUM_CLASSES, MNIST, activation="relu")


def test_smallest_inputs_accepted():
  get_model("resnet18", NUM_CLASSES, (8, 8, 3))
  get_model("densenet", NUM_CLASSES, (8, 8, 3))
  get_model("cnn", NUM_CLASSES, (4, 4, 1))
  get_model("vit", NUM_CLASSES, (28, 32, 1), patch_size=4)
