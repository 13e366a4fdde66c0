"""Tests for xsens/models/pretrained.py on tiny fake checkpoints of the real layouts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.models import pretrained
from xsens.models.vit import ViT

P, D, DEPTH, HEADS, MLP, C, CLASSES = 4, 8, 2, 2, 16, 3, 5


def fake_vit_checkpoint(seed=0, token=True, grid=2, representation_size=None,
                        num_classes=CLASSES):
  """A vit_jax-layout {key: array} with tiny widths (flat keys as in the .npz)."""
  rng = np.random.default_rng(seed)
  a = lambda *shape: rng.normal(size=shape).astype(np.float32) * 0.5
  hd = D // HEADS
  ck = {"embedding/kernel": a(P, P, C, D), "embedding/bias": a(D),
        "Transformer/posembed_input/pos_embedding": a(1, grid * grid + token, D),
        "Transformer/encoder_norm/scale": 1 + a(D),
        "Transformer/encoder_norm/bias": a(D)}
  if token:
    ck["cls"] = a(1, 1, D)
  for i in range(DEPTH):
    b = f"Transformer/encoderblock_{i}/"
    for ln in ("LayerNorm_0", "LayerNorm_2"):
      ck[f"{b}{ln}/scale"], ck[f"{b}{ln}/bias"] = 1 + a(D), a(D)
    for name in ("query", "key", "value"):
      ck[f"{b}MultiHeadDotProductAttention_1/{name}/kernel"] = a(D, HEADS, hd)
      ck[f"{b}MultiHeadDotProductAttention_1/{name}/bias"] = a(HEADS, hd)
    ck[f"{b}MultiHeadDotProductAttention_1/out/kernel"] = a(HEADS, hd, D)
    ck[f"{b}MultiHeadDotProductAttention_1/out/bias"] = a(D)
    ck[f"{b}MlpBlock_3/Dense_0/kernel"], ck[f"{b}MlpBlock_3/Dense_0/bias"] = a(D, MLP), a(MLP)
    ck[f"{b}MlpBlock_3/Dense_1/kernel"], ck[f"{b}MlpBlock_3/Dense_1/bias"] = a(MLP, D), a(D)
  head_in = D
  if representation_size:
    ck["pre_logits/kernel"] = a(D, representation_size)
    ck["pre_logits/bias"] = a(representation_size)
    head_in = representation_size
  ck["head/kernel"], ck["head/bias"] = a(head_in, num_classes), a(num_classes)
  return ck


def _ln(x, scale, bias, eps=1e-6):
  m = x.mean(-1, keepdims=True)
  v = ((x - m) ** 2).mean(-1, keepdims=True)
  return (x - m) / np.sqrt(v + eps) * scale + bias


def _gelu(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def numpy_vit(ck, x):
  """vit_jax's VisionTransformer forward written out in NumPy (float64)."""
  ck = {k: v.astype(np.float64) for k, v in ck.items()}
  x = np.asarray(x, np.float64)
  b, h, w, c = x.shape
  patches = x.reshape(b, h // P, P, w // P, P, c).transpose(0, 1, 3, 2, 4, 5)
  t = patches.reshape(b, -1, P * P * c) @ ck["embedding/kernel"].reshape(-1, D)
  t = t + ck["embedding/bias"]
  if "cls" in ck:
    t = np.concatenate([np.tile(ck["cls"], (b, 1, 1)), t], axis=1)
  t = t + ck["Transformer/posembed_input/pos_embedding"]
  for i in range(DEPTH):
    g = lambda k, i=i: ck[f"Transformer/encoderblock_{i}/{k}"]
    a = lambda k: g(f"MultiHeadDotProductAttention_1/{k}")
    y = _ln(t, g("LayerNorm_0/scale"), g("LayerNorm_0/bias"))
    q, k, v = (np.einsum("btd,dhk->bthk", y, a(f"{n}/kernel")) + a(f"{n}/bias")
               for n in ("query", "key", "value"))
    logits = np.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(q.shape[-1])
    att = np.exp(logits - logits.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    o = np.einsum("bhqt,bthk->bqhk", att, v)
    t = t + np.einsum("bqhk,hkd->bqd", o, a("out/kernel")) + a("out/bias")
    y = _ln(t, g("LayerNorm_2/scale"), g("LayerNorm_2/bias"))
    y = _gelu(y @ g("MlpBlock_3/Dense_0/kernel") + g("MlpBlock_3/Dense_0/bias"))
    t = t + y @ g("MlpBlock_3/Dense_1/kernel") + g("MlpBlock_3/Dense_1/bias")
  t = _ln(t, ck["Transformer/encoder_norm/scale"], ck["Transformer/encoder_norm/bias"])
  z = t[:, 0] if "cls" in ck else t.mean(1)
  if "pre_logits/kernel" in ck:
    z = np.tanh(z @ ck["pre_logits/kernel"] + ck["pre_logits/bias"])
  return z @ ck["head/kernel"] + ck["head/bias"]


def _model(ck, **kwargs):
  return ViT(**{**pretrained.vit_config_from_checkpoint(ck), **kwargs})


def _images(shape=(8, 8, C), n=3):
  return jax.random.normal(jax.random.key(1), (n, *shape), jnp.float32)


@pytest.mark.parametrize("token, rep", [(True, 6), (False, None)])
def test_loaded_vit_equals_numpy_vit_jax(token, rep):
  ck = fake_vit_checkpoint(token=token, representation_size=rep)
  model = _model(ck)
  assert model.pooling == ("cls" if token else "mean")
  assert model.representation_size == rep
  params = pretrained.vit_params_from_checkpoint(ck, model, (8, 8, C))
  x = _images()
  got = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False))(params, x)
  np.testing.assert_allclose(got, numpy_vit(ck, x), rtol=2e-4, atol=2e-4)


# Independent of the loader's rules: vit_jax key -> xsens path, written out.
def _expected_path(key):
  key = key.replace("Transformer/", "")
  for old, new in (("MultiHeadDotProductAttention_1", "MultiHeadDotProductAttention_0"),
                   ("LayerNorm_2", "LayerNorm_1"), ("MlpBlock_3", "MlpBlock_0")):
    key = key.replace(old, new)
  return key


def test_every_array_lands_in_place(tmp_path):
  ck = fake_vit_checkpoint(representation_size=6)
  np.savez(tmp_path / "vit.npz", **ck)
  model = _model(ck)
  variables = pretrained.load_vit(tmp_path / "vit.npz", model, (8, 8, C))
  flat = pretrained.flatten(variables["params"])
  pe = ck["Transformer/posembed_input/pos_embedding"]
  np.testing.assert_array_equal(flat.pop("cls"), ck["cls"] + pe[:, :1])
  np.testing.assert_array_equal(flat.pop("pos_embedding"), pe[:, 1:])
  rest = {k: v for k, v in ck.items()
          if k not in ("cls", "Transformer/posembed_input/pos_embedding")}
  assert set(flat) == {_expected_path(k) for k in rest}
  for k, v in rest.items():
    np.testing.assert_array_equal(flat[_expected_path(k)], v)
    assert flat[_expected_path(k)].dtype == jnp.float32
  # The tree is exactly the model's own.
  init = jax.eval_shape(lambda x: model.init(jax.random.key(0), x),
                        jax.ShapeDtypeStruct((1, 8, 8, C), jnp.float32))["params"]
  assert jax.tree.structure(init) == jax.tree.structure(variables["params"])


def test_config_from_checkpoint():
  ck = fake_vit_checkpoint()
  assert pretrained.vit_config_from_checkpoint(ck) == dict(
      num_classes=CLASSES, patch_size=P, width=D, depth=DEPTH, num_heads=HEADS,
      mlp_dim=MLP, pooling="cls", representation_size=None)
  with pytest.raises(pretrained.CheckpointError, match="not a vit_jax checkpoint"):
    pretrained.vit_config_from_checkpoint({"resnet/root_block/x": np.zeros(1)})


def test_missing_and_unexpected_keys_are_listed():
  ck = fake_vit_checkpoint()
  del ck["Transformer/encoderblock_1/LayerNorm_2/scale"]
  ck["Transformer/encoderblock_1/Extra_9/kernel"] = np.zeros((2,), np.float32)
  with pytest.raises(pretrained.CheckpointError) as info:
    pretrained.vit_params_from_checkpoint(ck, _model(fake_vit_checkpoint()), (8, 8, C))
  msg = str(info.value)
  assert "missing (in the model, not in the checkpoint): encoderblock_1/LayerNorm_1/scale" in msg
  assert "unexpected (in the checkpoint, not in the model): " \
         "Transformer/encoderblock_1/Extra_9/kernel" in msg


def test_shape_mismatches_are_listed():
  ck = fake_vit_checkpoint()
  with pytest.raises(pretrained.CheckpointError) as info:
    pretrained.vit_params_from_checkpoint(ck, _model(ck, mlp_dim=12), (8, 8, C))
  msg = str(info.value)
  for i in range(DEPTH):
    assert f"encoderblock_{i}/MlpBlock_0/Dense_0/kernel (8, 16) vs (8, 12)" in msg
  with pytest.raises(pretrained.CheckpointError, match=r"head/kernel \(8, 5\) vs \(8, 7\)"):
    pretrained.vit_params_from_checkpoint(ck, _model(ck, num_classes=7), (8, 8, C))
  # A deeper model: the missing blocks are listed.
  with pytest.raises(pretrained.CheckpointError, match="encoderblock_2/LayerNorm_0/bias"):
    pretrained.vit_params_from_checkpoint(ck, _model(ck, depth=3), (8, 8, C))


def test_pooling_and_pre_logits_mismatch():
  gap = fake_vit_checkpoint(token=False)
  with pytest.raises(pretrained.CheckpointError, match="no 'cls' token"):
    pretrained.vit_params_from_checkpoint(gap, _model(gap, pooling="cls"), (8, 8, C))
  rep = fake_vit_checkpoint(representation_size=6)
  with pytest.raises(pretrained.CheckpointError, match="unexpected.*pre_logits/bias"):
    pretrained.vit_params_from_checkpoint(rep, _model(rep, representation_size=None),
                                          (8, 8, C))
  with pytest.raises(pretrained.CheckpointError, match="posemb='learned'"):
    pretrained.vit_params_from_checkpoint(rep, _model(rep, posemb="sincos"), (8, 8, C))


def test_head_reinit():
  ck = fake_vit_checkpoint(representation_size=6)
  model = _model(ck, num_classes=7, representation_size=None)
  params = pretrained.vit_params_from_checkpoint(ck, model, (8, 8, C), reinit_head=True)
  assert "pre_logits" not in params
  assert params["head"]["kernel"].shape == (D, 7)
  assert not np.any(params["head"]["kernel"])
  np.testing.assert_array_equal(params["encoder_norm"]["scale"],
                                ck["Transformer/encoder_norm/scale"])
  params = pretrained.vit_params_from_checkpoint(
      ck, _model(ck, num_classes=7), (8, 8, C), reinit_head=True, key=jax.random.key(0))
  np.testing.assert_array_equal(params["pre_logits"]["kernel"], ck["pre_logits/kernel"])
  assert params["head"]["kernel"].shape == (6, 7)
  assert np.std(params["head"]["kernel"]) > 0


@pytest.mark.parametrize("old, new", [((3, 3), (5, 5)), ((4, 4), (2, 3)), ((2, 2), (7, 4)),
                                      ((5, 5), (1, 1))])
def test_resize_posemb_grid_matches_scipy_zoom(old, new):
  ndimage = pytest.importorskip("scipy.ndimage")
  grid = np.random.default_rng(0).normal(size=(*old, 6)).astype(np.float32)
  want = ndimage.zoom(grid, (new[0] / old[0], new[1] / old[1], 1), order=1)
  assert want.shape == (*new, 6)
  np.testing.assert_allclose(pretrained.resize_posemb_grid(grid, new), want,
                             rtol=1e-5, atol=1e-6)


def test_resize_posemb_grid_hand_values():
  grid = np.arange(4, dtype=np.float32).reshape(2, 2, 1)  # [[0, 1], [2, 3]]
  out = pretrained.resize_posemb_grid(grid, (3, 3))[..., 0]
  np.testing.assert_allclose(out, [[0, .5, 1], [1, 1.5, 2], [2, 2.5, 3]])
  np.testing.assert_array_equal(pretrained.resize_posemb_grid(grid, (2, 2)), grid)


@pytest.mark.slow
def test_load_at_another_image_size_resizes_posemb():
  ck = fake_vit_checkpoint(grid=2)  # trained on 8 x 8 images
  pe = ck["Transformer/posembed_input/pos_embedding"]
  model = _model(ck)
  params = pretrained.vit_params_from_checkpoint(ck, model, (12, 16, C))
  want = pretrained.resize_posemb_grid(pe[0, 1:].reshape(2, 2, D), (3, 4))
  np.testing.assert_allclose(params["pos_embedding"], want.reshape(1, 12, D), rtol=1e-6)
  np.testing.assert_array_equal(params["cls"], ck["cls"] + pe[:, :1])
  # Corners of the grid are kept exactly (corner-aligned interpolation).
  np.testing.assert_allclose(params["pos_embedding"][0, 0], pe[0, 1], rtol=1e-6)
  np.testing.assert_allclose(params["pos_embedding"][0, -1], pe[0, -1], rtol=1e-6)
  out = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False))(
      params, _images((12, 16, C)))
  assert out.shape == (3, CLASSES) and np.all(np.isfinite(out))
  # The resized model equals vit_jax's forward with the resized embedding.
  resized = dict(ck)
  resized["Transformer/posembed_input/pos_embedding"] = np.concatenate(
      [pe[:, :1], want.reshape(1, 12, D)], axis=1)
  np.testing.assert_allclose(out, numpy_vit(resized, _images((12, 16, C))),
                             rtol=2e-4, atol=2e-4)


def test_non_square_checkpoint_grid_is_refused():
  ck = fake_vit_checkpoint()
  ck["Transformer/posembed_input/pos_embedding"] = np.zeros((1, 1 + 6, D), np.float32)
  with pytest.raises(pretrained.CheckpointError, match="not a square grid"):
    pretrained.vit_params_from_checkpoint(ck, _model(ck), (8, 8, C))


# ---------------------------------------------------------------------------
# BiT ResNet-v2.
# ---------------------------------------------------------------------------

WF, UNITS, GROUPS = 0.125, (1, 2, 1, 1), 4


def fake_bit_checkpoint(seed=0, num_classes=CLASSES):
  """A big_transfer-layout {key: array}: R-(1, 2, 1, 1) at width factor 1/8."""
  rng = np.random.default_rng(seed)
  a = lambda *shape: rng.normal(size=shape).astype(np.float32) * 0.5
  root, mids = 8, (8, 16, 32, 64)
  ck = {"resnet/root_block/standardized_conv2d/kernel": a(7, 7, C, root)}
  cin = root
  for b, (units, mid) in enumerate(zip(UNITS, mids)):
    for u in range(units):
      p = f"resnet/block{b + 1}/unit{u + 1:02d}/"
      for name, c_in, c_out, k in (("a", cin, mid, 1), ("b", mid, mid, 3),
                                   ("c", mid, 4 * mid, 1)):
        ck[f"{p}{name}/group_norm/gamma"] = 1 + a(c_in)
        ck[f"{p}{name}/group_norm/beta"] = a(c_in)
        ck[f"{p}{name}/standardized_conv2d/kernel"] = a(k, k, c_in, c_out)
      if u == 0:
        ck[f"{p}a/proj/standardized_conv2d/kernel"] = a(1, 1, cin, 4 * mid)
      cin = 4 * mid
  # One GroupNorm stored with unit axes, as some exports do.
  ck["resnet/group_norm/gamma"] = (1 + a(cin)).reshape(1, 1, 1, cin)
  ck["resnet/group_norm/beta"] = a(cin)
  ck["resnet/head/conv2d/kernel"] = a(1, 1, cin, num_classes)
  ck["resnet/head/conv2d/bias"] = a(num_classes)
  return ck


def _ws(w):
  w = w - w.mean((0, 1, 2), keepdims=True)
  return w / np.sqrt((w**2).mean((0, 1, 2), keepdims=True) + 1e-10)


def _conv(x, w, stride, pad):
  return jax.lax.conv_general_dilated(
      x, jnp.asarray(_ws(w)), (stride, stride), ((pad, pad), (pad, pad)),
      dimension_numbers=("NHWC", "HWIO", "NHWC"),
      precision=jax.lax.Precision.HIGHEST)


def _gn_relu(x, gamma, beta):
  b, h, w, c = x.shape
  g = x.reshape(b, h, w, GROUPS, c // GROUPS)
  m = g.mean((1, 2, 4), keepdims=True)
  v = ((g - m) ** 2).mean((1, 2, 4), keepdims=True)
  g = ((g - m) / jnp.sqrt(v + 1e-5)).reshape(b, h, w, c)
  return jax.nn.relu(g * gamma.reshape(-1) + beta.reshape(-1))


def reference_bit(ck, x):
  """bit_pytorch's ResNetV2 forward, written from the checkpoint keys."""
  x = _conv(x, ck["resnet/root_block/standardized_conv2d/kernel"], 2, 3)
  x = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "VALID")
  for b, units in enumerate(UNITS):
    for u in range(units):
      p = f"resnet/block{b + 1}/unit{u + 1:02d}/"
      g = lambda n, part, p=p: ck[f"{p}{n}/{part}"]
      out = _gn_relu(x, g("a", "group_norm/gamma"), g("a", "group_norm/beta"))
      stride = 2 if (u == 0 and b > 0) else 1
      residual = x
      if u == 0:
        residual = _conv(out, g("a", "proj/standardized_conv2d/kernel"), stride, 0)
      out = _conv(out, g("a", "standardized_conv2d/kernel"), 1, 0)
      out = _gn_relu(out, g("b", "group_norm/gamma"), g("b", "group_norm/beta"))
      out = _conv(out, g("b", "standardized_conv2d/kernel"), stride, 1)
      out = _gn_relu(out, g("c", "group_norm/gamma"), g("c", "group_norm/beta"))
      x = _conv(out, g("c", "standardized_conv2d/kernel"), 1, 0) + residual
  x = _gn_relu(x, ck["resnet/group_norm/gamma"], ck["resnet/group_norm/beta"]).mean((1, 2))
  return x @ ck["resnet/head/conv2d/kernel"][0, 0] + ck["resnet/head/conv2d/bias"]


def _bit_model(ck, **kwargs):
  from xsens.models.bit import BiTResNet  # pylint: disable=g-import-not-at-top
  return BiTResNet(**{**pretrained.bit_config_from_checkpoint(ck), "num_groups": GROUPS,
                      **kwargs})


def test_bit_config_from_checkpoint():
  config = pretrained.bit_config_from_checkpoint(fake_bit_checkpoint())
  assert config == dict(num_classes=CLASSES, block_units=UNITS, width_factor=WF)
  with pytest.raises(pretrained.CheckpointError, match="not a big_transfer"):
    pretrained.bit_config_from_checkpoint(fake_vit_checkpoint())


@pytest.mark.slow
def test_loaded_bit_equals_reference_forward(tmp_path):
  ck = fake_bit_checkpoint()
  np.savez(tmp_path / "bit.npz", **ck)
  model = _bit_model(ck)
  variables = pretrained.load_bit(tmp_path / "bit.npz", model, (16, 16, C))
  x = _images((16, 16, C))
  got = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x)
  # Jitted (the checkpoint as constants), not op by op.
  want = jax.jit(lambda x: reference_bit(ck, x))(x)
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_bit_every_array_lands_in_place():
  ck = fake_bit_checkpoint()
  params = pretrained.bit_params_from_checkpoint(ck, _bit_model(ck), (16, 16, C))
  flat = pretrained.flatten(params)
  assert len(flat) == len(ck)
  for k, v in ck.items():
    path = (k.removeprefix("resnet/").replace("gamma", "scale").replace("beta", "bias")
            .replace("head/conv2d", "head"))
    np.testing.assert_array_equal(np.asarray(flat[path]).reshape(-1), v.reshape(-1))
  assert flat["head/kernel"].shape == (256, CLASSES)
  assert flat["group_norm/scale"].shape == (256,)


def test_bit_errors_and_head_reinit():
  ck = fake_bit_checkpoint()
  broken = dict(ck)
  del broken["resnet/block2/unit02/b/group_norm/beta"]
  broken["resnet/block2/unit03/a/group_norm/gamma"] = np.ones(64, np.float32)
  with pytest.raises(pretrained.CheckpointError) as info:
    pretrained.bit_params_from_checkpoint(broken, _bit_model(ck), (16, 16, C))
  assert "missing (in the model, not in the checkpoint): block2/unit02/b/group_norm/bias" \
      in str(info.value)
  assert "unexpected (in the checkpoint, not in the model): " \
         "resnet/block2/unit03/a/group_norm/gamma" in str(info.value)
  with pytest.raises(pretrained.CheckpointError, match=r"head/kernel \(1, 1, 256, 5\) vs "
                     r"\(256, 7\)"):
    pretrained.bit_params_from_checkpoint(ck, _bit_model(ck, num_classes=7), (16, 16, C))
  params = pretrained.bit_params_from_checkpoint(ck, _bit_model(ck, num_classes=7),
                                                 (16, 16, C), reinit_head=True)
  assert params["head"]["kernel"].shape == (256, 7) and not np.any(params["head"]["kernel"])
  with pytest.raises(pretrained.CheckpointError, match="shape mismatch"):
    pretrained.bit_params_from_checkpoint(ck, _bit_model(ck, width_factor=0.25),
                                          (16, 16, C))


# ----------------------------------------------------------------------------
# Pretrained loading through the registry entries.
# ----------------------------------------------------------------------------


def test_registry_entries_hold_the_checkpoint_formats():
  from xsens import models  # pylint: disable=g-import-not-at-top
  from xsens.models import mlm  # pylint: disable=g-import-not-at-top
  assert list(models.pretrained_formats()) == ["vit", "bit_resnet", "convnext", "roberta"]
  assert models.REGISTRY["vit"].pretrained is pretrained.VIT_JAX
  assert models.REGISTRY["bit_resnet"].pretrained is pretrained.BIG_TRANSFER
  assert models.REGISTRY["convnext"].pretrained is pretrained.TIMM_CONVNEXT
  assert models.REGISTRY["roberta"].pretrained is mlm.XSENS_MLM
  assert all(e.pretrained is None for n, e in models.REGISTRY.items()
             if n not in ("vit", "bit_resnet", "convnext", "roberta"))
  with pytest.raises(ValueError, match="'cnn' has no pretrained-checkpoint loader; models "
                     "with one: vit, bit_resnet, convnext, roberta"):
    models.REGISTRY["cnn"].load_pretrained("x.npz", models.get_model("cnn", 5, (8, 8, C)),
                                           (8, 8, C))


@pytest.mark.slow
def test_entry_load_pretrained_equals_the_loaders(tmp_path):
  from xsens import models  # pylint: disable=g-import-not-at-top
  vit_ck, bit_ck = fake_vit_checkpoint(representation_size=6), fake_bit_checkpoint()
  np.savez(tmp_path / "vit.npz", **vit_ck)
  np.savez(tmp_path / "bit.npz", **bit_ck)
  for name, path, model, shape, load in (
      ("vit", tmp_path / "vit.npz", _model(vit_ck), (12, 12, C), pretrained.load_vit),
      ("bit_resnet", tmp_path / "bit.npz", _bit_model(bit_ck), (16, 16, C),
       pretrained.load_bit)):
    entry = models.REGISTRY[name]
    # The format reads the architecture off the checkpoint, as the loaders' examples do.
    config = entry.pretrained.config_from_checkpoint(read := pretrained.read_npz(path))
    assert all(getattr(model, k) == v for k, v in config.items())
    got = entry.load_pretrained(path, model, shape)
    want = load(path, model, shape)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    jax.tree.map(np.testing.assert_array_equal, got, want)
    head = entry.load_pretrained(path, model.clone(num_classes=7), shape, reinit_head=True,
                                 key=jax.random.key(0))
    assert pretrained.flatten(head["params"])["head/kernel"].shape[-1] == 7
    np.testing.assert_array_equal(
        pretrained.flatten(entry.pretrained.params_from_checkpoint(read, model, shape))[
            "head/bias"], pretrained.flatten(want["params"])["head/bias"])
  with pytest.raises(TypeError, match="must be a ViT"):
    models.REGISTRY["vit"].load_pretrained(tmp_path / "bit.npz", _bit_model(bit_ck),
                                           (16, 16, C))
