"""ConvNeXt (xsens/models/convnext.py) and its timm `.safetensors` loader
(xsens/models/pretrained.py), on fake files of timm's key layout written here."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from safetensors.numpy import save_file

from xsens import models
from xsens.errors import ConfigError
from xsens.models import convnext, pretrained
from xsens.train import trainer

jax.config.update("jax_disable_most_optimizations", True)

# A tiny ConvNeXt in timm's layout: 2 stages, 1 + 2 blocks, widths 4 and 8, stem 2x2.
TINY = dict(depths=(1, 2), dims=(4, 8), patch_size=2)
CLASSES, C, HW = 5, 3, 8


def _timm_checkpoint(depths, dims, patch, k=7, classes=CLASSES, seed=0):
  """Random arrays under timm's ConvNeXt keys, in PyTorch layouts (OIHW, [out, in])."""
  rng = np.random.default_rng(seed)
  r = lambda *shape: rng.normal(size=shape).astype(np.float32) * 0.5
  ck = {"stem.0.weight": r(dims[0], C, patch, patch), "stem.0.bias": r(dims[0]),
        "stem.1.weight": 1 + r(dims[0]), "stem.1.bias": r(dims[0])}
  for i, (depth, d) in enumerate(zip(depths, dims)):
    if i:
      ck[f"stages.{i}.downsample.0.weight"] = 1 + r(dims[i - 1])
      ck[f"stages.{i}.downsample.0.bias"] = r(dims[i - 1])
      ck[f"stages.{i}.downsample.1.weight"] = r(d, dims[i - 1], 2, 2)
      ck[f"stages.{i}.downsample.1.bias"] = r(d)
    for j in range(depth):
      b = f"stages.{i}.blocks.{j}."
      ck.update({b + "conv_dw.weight": r(d, 1, k, k), b + "conv_dw.bias": r(d),
                 b + "norm.weight": 1 + r(d), b + "norm.bias": r(d),
                 b + "mlp.fc1.weight": r(4 * d, d), b + "mlp.fc1.bias": r(4 * d),
                 b + "mlp.fc2.weight": r(d, 4 * d), b + "mlp.fc2.bias": r(d),
                 b + "gamma": r(d)})
  ck.update({"head.norm.weight": 1 + r(dims[-1]), "head.norm.bias": r(dims[-1]),
             "head.fc.weight": r(classes, dims[-1]), "head.fc.bias": r(classes)})
  return ck


# ------------------------------------------------- a NumPy reference of timm's forward (NCHW)


def _conv(x, w, b, stride=1, pad=0, groups=1):
  """PyTorch Conv2d: x [B, Ci, H, W], w [Co, Ci/groups, k, k] (OIHW)."""
  x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  k = w.shape[-1]
  win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::stride,
                                                                         ::stride]
  if groups == 1:
    out = np.einsum("bchwij,ocij->bohw", win, w)
  else:  # depthwise
    out = np.einsum("bchwij,cij->bchw", win, w[:, 0])
  return out + b[None, :, None, None]


def _ln(x, w, b, axis):
  mu = x.mean(axis, keepdims=True)
  var = ((x - mu) ** 2).mean(axis, keepdims=True)
  shape = [1] * x.ndim
  shape[axis] = -1
  return (x - mu) / np.sqrt(var + 1e-6) * w.reshape(shape) + b.reshape(shape)


def _gelu(x):
  from math import erf  # pylint: disable=g-import-not-at-top
  return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


def timm_forward(ck, x_nhwc, depths):
  x = np.transpose(x_nhwc, (0, 3, 1, 2)).astype(np.float64)
  g = lambda k: ck[k].astype(np.float64)
  p = ck["stem.0.weight"].shape[-1]
  x = _conv(x, g("stem.0.weight"), g("stem.0.bias"), stride=p)
  x = _ln(x, g("stem.1.weight"), g("stem.1.bias"), 1)
  for i, depth in enumerate(depths):
    if i:
      x = _ln(x, g(f"stages.{i}.downsample.0.weight"), g(f"stages.{i}.downsample.0.bias"), 1)
      x = _conv(x, g(f"stages.{i}.downsample.1.weight"), g(f"stages.{i}.downsample.1.bias"),
                stride=2)
    for j in range(depth):
      b = f"stages.{i}.blocks.{j}."
      k = ck[b + "conv_dw.weight"].shape[-1]
      y = _conv(x, g(b + "conv_dw.weight"), g(b + "conv_dw.bias"), pad=k // 2,
                groups=x.shape[1])
      y = np.transpose(y, (0, 2, 3, 1))
      y = _ln(y, g(b + "norm.weight"), g(b + "norm.bias"), -1)
      y = _gelu(y @ g(b + "mlp.fc1.weight").T + g(b + "mlp.fc1.bias"))
      y = y @ g(b + "mlp.fc2.weight").T + g(b + "mlp.fc2.bias")
      y = np.transpose(y * g(b + "gamma"), (0, 3, 1, 2))
      x = x + y
  x = x.mean(axis=(2, 3))
  x = _ln(x, g("head.norm.weight"), g("head.norm.bias"), -1)
  return x @ g("head.fc.weight").T + g("head.fc.bias")


# ------------------------------------------------------------------------------------- tests


def test_presets_have_the_published_parameter_counts():
  x = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
  # timm's convnext_tiny: 28,589,128 (small 50,223,688, base 88,591,464, large
  # 197,767,336 match too; not traced here, for time).
  for name, count in (("tiny", 28_589_128),):
    model = models.get_model("convnext", 1000, (224, 224, 3), **convnext.PRESETS[name])
    v = jax.eval_shape(lambda x, m=model: m.init({"params": jax.random.key(0)}, x), x)
    assert sum(a.size for a in jax.tree.leaves(v)) == count, name
  assert convnext.PRESETS["small"]["depths"] == (3, 3, 27, 3)
  assert convnext.PRESETS["large"]["dims"] == (192, 384, 768, 1536)


def test_safetensors_file_of_timm_layout_loads_and_matches_a_numpy_reference(tmp_path):
  ck = _timm_checkpoint(**{"depths": TINY["depths"], "dims": TINY["dims"],
                           "patch": TINY["patch_size"]})
  path = str(tmp_path / "model.safetensors")
  save_file(ck, path)
  read = pretrained.read_safetensors(path)
  config = pretrained.convnext_config_from_checkpoint(read)
  assert config == dict(num_classes=CLASSES, depths=(1, 2), dims=(4, 8), patch_size=2,
                        kernel_size=7, mlp_ratio=4, layer_scale_init=1e-6)
  classes = config.pop("num_classes")
  model = models.get_model("convnext", classes, (HW, HW, C), **config)
  variables = models.REGISTRY["convnext"].load_pretrained(path, model, (HW, HW, C))
  flat = pretrained.flatten(variables["params"])
  assert len(flat) == len(ck)  # Every tensor has one place, and every place a tensor.
  np.testing.assert_array_equal(flat["stage1_block1/conv_dw/kernel"],
                                ck["stages.1.blocks.1.conv_dw.weight"].transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(flat["stage1_block0/fc2/kernel"],
                                ck["stages.1.blocks.0.mlp.fc2.weight"].T)
  x = np.random.default_rng(1).normal(size=(2, HW, HW, C)).astype(np.float32)
  out = np.asarray(model.apply(variables, jnp.asarray(x), train=False))
  np.testing.assert_allclose(out, timm_forward(ck, x, TINY["depths"]), rtol=2e-4, atol=2e-4)
  # A fresh head keeps the head LayerNorm and replaces the Dense.
  fresh = pretrained.convnext_params_from_checkpoint(
      read, model.clone(num_classes=3), (HW, HW, C), reinit_head=True)
  assert fresh["head"]["kernel"].shape == (8, 3) and not np.any(fresh["head"]["kernel"])
  np.testing.assert_array_equal(fresh["head_norm"]["scale"], ck["head.norm.weight"])


def test_checkpoint_that_does_not_fit_lists_the_keys():
  ck = _timm_checkpoint((1, 2), (4, 8), 2)
  model = models.get_model("convnext", CLASSES, (HW, HW, C), **TINY)
  bad = dict(ck)
  del bad["stages.1.blocks.1.gamma"]
  bad["stages.1.blocks.1.extra"] = np.zeros(3, np.float32)
  with pytest.raises(pretrained.CheckpointError, match=r"missing.*stage1_block1/gamma") as e:
    pretrained.convnext_params_from_checkpoint(bad, model, (HW, HW, C))
  assert "stages.1.blocks.1.extra" in str(e.value)
  with pytest.raises(pretrained.CheckpointError, match="shape mismatch"):
    pretrained.convnext_params_from_checkpoint(
        ck, model.clone(dims=(4, 16)), (HW, HW, C))


def test_wrong_file_is_a_one_line_config_error_naming_the_flag(tmp_path):
  not_st = tmp_path / "weights.safetensors"
  not_st.write_text("this is not a safetensors file\n")
  model = models.get_model("convnext", CLASSES, (HW, HW, C), **TINY)
  config = ml_collections.ConfigDict({"model": {"name": "convnext"},
                                      "pretrained": {"path": str(not_st),
                                                     "reinit_head": False}})
  with pytest.raises(ConfigError) as e:
    trainer.load_pretrained(config, model, (HW, HW, C), jax.random.key(0))
  assert e.value.flag == "--config.pretrained.path" and "\n" not in str(e.value)
  vit_file = tmp_path / "vit.safetensors"  # A safetensors file of another layout.
  save_file({"embedding/kernel": np.zeros((2, 2, 3, 4), np.float32)}, str(vit_file))
  config.pretrained.path = str(vit_file)
  with pytest.raises(ConfigError) as e:
    trainer.load_pretrained(config, model, (HW, HW, C), jax.random.key(0))
  assert e.value.flag == "--config.pretrained.path" and "\n" not in str(e.value)


def test_stochastic_depth_and_block_removal():
  model = models.get_model("convnext", CLASSES, (HW, HW, C), drop_path_rate=0.5, **TINY)
  assert convnext.drop_path_rates((1, 2), 0.5) == [[0.0], [0.25, 0.5]]
  x = jnp.asarray(np.random.default_rng(2).normal(size=(4, HW, HW, C)), jnp.float32)
  variables = jax.jit(model.init)({"params": jax.random.key(0)}, x)
  # Layer scale starts at 1e-6: make the residual branches matter.
  params = jax.tree_util.tree_map_with_path(
      lambda p, a: jnp.ones_like(a) if "gamma" in jax.tree_util.keystr(p) else a,
      variables["params"])
  variables = {"params": params}
  train = jax.jit(lambda v, x, k: model.apply(v, x, train=True, rngs={"dropout": k}))
  evals = jax.jit(lambda v, x, m=model: m.apply(v, x, train=False))
  clean = evals(variables, x)
  np.testing.assert_array_equal(clean, evals(variables, x))
  assert not np.allclose(train(variables, x, jax.random.key(1)),
                         train(variables, x, jax.random.key(2)))
  entry = models.REGISTRY["convnext"]
  assert entry.removable_layers(model) == ((0, "block"), (1, "block"), (2, "block"))
  removed = entry.remove_layers(model, [(2, "block")])
  assert not np.allclose(jax.jit(removed.apply)(variables, x), clean)
  with pytest.raises(ConfigError, match="model.skip"):
    entry.remove_layers(model, [(3, "block")])


@pytest.mark.parametrize("kwargs, shape, field", [
    (dict(dims=(4,)), (8, 8, 3), "model.dims"),
    (dict(depths=(1, 0)), (8, 8, 3), "model.depths"),
    ({}, (28, 28, 1), "model.patch_size"),
    (dict(drop_path_rate=1.0), (32, 32, 3), "model.drop_path_rate"),
])
def test_refusals(kwargs, shape, field):
  full = dict(TINY, **kwargs) if "depths" in kwargs or "dims" in kwargs else kwargs
  with pytest.raises(ConfigError) as e:
    models.get_model("convnext", CLASSES, shape, **full)
  assert e.value.field == field
