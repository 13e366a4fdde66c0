"""Tests for xsens/measures/perturbations.py and the models' `skip` field."""

import functools
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.errors import ConfigError
from xsens.lab import robustness as lab_robustness
from xsens.measures import perturbations as pert
from xsens.models import get_model
from xsens.models import resnet as resnet_lib
from xsens.models import vit as vit_lib

SHAPE = (8, 8, 1)
VIT = dict(patch_size=4, width=8, depth=3, num_heads=2, mlp_dim=16)


def _images(n=6, seed=1, shape=SHAPE):
  return jax.random.normal(jax.random.key(seed), (n, *shape), jnp.float32)


def _rngs(seed=0):
  return {"params": jax.random.key(seed), "dropout": jax.random.key(seed)}


@functools.cache
def _vit(dropout_rate=0.0):
  model = get_model("vit", 5, SHAPE, **VIT, dropout_rate=dropout_rate)
  variables = jax.jit(lambda r, x: model.init(r, x, train=False))(_rngs(), _images(1))
  return model, variables


@functools.cache
def _resnet():
  model = get_model("resnet18", 5, SHAPE, width_multiplier=0.0625)

  @jax.jit
  def init(rngs, x):
    variables = model.init(rngs, x, train=False)
    # One train step, so the running statistics are not the trivial init.
    _, state = model.apply(variables, 3.0 * x + 1.0, train=True, mutable=["batch_stats"])
    return {"params": variables["params"], "batch_stats": state["batch_stats"]}

  return model, init(_rngs(), _images(4))


def _fn(model):
  return functools.partial(model.apply, train=False)


def _run(model, variables):
  """A finished run as the lab's pooled measures take it."""
  return types.SimpleNamespace(apply_fn=_fn(model), variables=variables, model=model)


def _apply(model, variables, x):
  return jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x)


# ---------------------------------------------------------------------------
# ViT layer removal.
# ---------------------------------------------------------------------------


def _reference_vit(model, params, x, skip):
  """ViT forward built from its sub-modules; `skip` = {layer: set of parts}."""
  p = model.patch_size
  x = nn.Conv(model.width, (p, p), strides=(p, p), padding="VALID").apply(
      {"params": params["embedding"]}, x)
  b, h, w, d = x.shape
  x = x.reshape(b, h * w, d) + params["pos_embedding"]
  x = jnp.concatenate([jnp.tile(params["cls"], (b, 1, 1)), x], axis=1)
  for i in range(model.depth):
    block = params[f"encoderblock_{i}"]
    parts = skip.get(i, set())
    if "attention" not in parts:
      y = nn.LayerNorm().apply({"params": block["LayerNorm_0"]}, x)
      y = nn.MultiHeadDotProductAttention(num_heads=model.num_heads).apply(
          {"params": block["MultiHeadDotProductAttention_0"]}, y, y)
      x = x + y
    if "mlp" not in parts:
      y = nn.LayerNorm().apply({"params": block["LayerNorm_1"]}, x)
      y = vit_lib.MlpBlock(model.mlp_dim).apply({"params": block["MlpBlock_0"]},
                                                 y, train=False)
      x = x + y
  x = nn.LayerNorm().apply({"params": params["encoder_norm"]}, x)[:, 0]
  return nn.Dense(model.num_classes).apply({"params": params["head"]}, x)


@pytest.mark.slow
@pytest.mark.parametrize("layer", [0, 2])
@pytest.mark.parametrize("part", ["block", "attention", "mlp"])
def test_vit_removal_equals_reference_forward(layer, part):
  model, variables = _vit()
  x = _images()
  got = _apply(pert.remove_layers(model, [(layer, part)]), variables, x)
  parts = {"attention", "mlp"} if part == "block" else {part}
  want = _reference_vit(model, variables["params"], x, {layer: parts})
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert not np.allclose(got, _apply(model, variables, x), atol=1e-4)


@pytest.mark.slow
def test_vit_reference_forward_matches_model():
  model, variables = _vit()
  x = _images()
  np.testing.assert_allclose(_apply(model, variables, x),
                             _reference_vit(model, variables["params"], x, {}),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_vit_block_removal_equals_shallower_vit():
  model, variables = _vit()
  x = _images()
  params = dict(variables["params"])
  blocks = [params.pop(f"encoderblock_{i}") for i in range(model.depth)]
  del blocks[1]
  params.update({f"encoderblock_{i}": b for i, b in enumerate(blocks)})
  shallow = model.clone(depth=model.depth - 1)
  np.testing.assert_allclose(
      _apply(pert.remove_layers(model, [(1, "block")]), variables, x),
      _apply(shallow, {"params": params}, x), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_skip_nothing_is_the_normal_forward_and_tree_is_unchanged():
  model, variables = _vit(dropout_rate=0.3)
  x = _images()
  np.testing.assert_array_equal(
      _apply(pert.remove_layers(model, []), variables, x), _apply(model, variables, x))
  skipped = model.clone(skip=((0, "block"), (1, "mlp")))
  tree = jax.jit(lambda r, x: skipped.init(r, x, train=False))(_rngs(), _images(1))
  assert jax.tree.structure(tree) == jax.tree.structure(variables)
  for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(variables)):
    np.testing.assert_array_equal(a, b)
  # Train mode (dropout) is unchanged by an empty skip as well.
  train = lambda m: m.apply(variables, x, train=True, rngs={"dropout": jax.random.key(7)})
  np.testing.assert_array_equal(train(model.clone(skip=())), train(model))


@pytest.mark.slow
def test_attention_plus_mlp_equals_block():
  model, variables = _vit()
  x = _images()
  both = pert.remove_layers(model, [(1, "attention"), (1, "mlp")])
  np.testing.assert_array_equal(
      _apply(both, variables, x),
      _apply(pert.remove_layers(model, [(1, "block")]), variables, x))


@pytest.mark.parametrize("skip", [((3, "block"),), ((0, "head"),), ((-1, "mlp"),),
                                  ((0,),)])
def test_vit_bad_skip_is_refused(skip):
  model, variables = _vit()
  with pytest.raises(ConfigError, match="model.skip"):
    model.clone(skip=skip).apply(variables, _images(1))
  with pytest.raises(ConfigError, match="model.skip"):
    get_model("vit", 5, SHAPE, **VIT, skip=skip)


# ---------------------------------------------------------------------------
# ResNet18 block removal.
# ---------------------------------------------------------------------------


def _reference_resnet(model, variables, x, skip):
  params, stats = variables["params"], variables["batch_stats"]
  bn = lambda name, y: nn.BatchNorm(use_running_average=True, momentum=0.9,
                                    epsilon=1e-5).apply(
                                        {"params": params[name],
                                         "batch_stats": stats[name]}, y)
  widths = resnet_lib.stage_widths(model.width_multiplier)
  x = nn.Conv(widths[0], (3, 3), padding=1, use_bias=False).apply(
      {"params": params["stem_conv"]}, x)
  x = nn.relu(bn("stem_bn", x))
  for k, name in enumerate(resnet_lib.block_names()):
    if k in skip:
      continue
    stage, j = divmod(k, resnet_lib.BLOCKS_PER_STAGE)
    stride = resnet_lib.STRIDES[stage] if j == 0 else 1
    x = resnet_lib.BasicBlock(widths[stage], stride).apply(
        {"params": params[name], "batch_stats": stats[name]}, x, train=False)
  return nn.Dense(model.num_classes).apply({"params": params["head"]},
                                           x.mean(axis=(1, 2)))


@pytest.mark.slow
def test_resnet_identity_blocks():
  assert resnet_lib.identity_blocks() == (0, 1, 3, 5, 7)
  model, _ = _resnet()
  assert pert.removable_layers(model, ("block",)) == tuple(
      (i, "block") for i in (0, 1, 3, 5, 7))


@pytest.mark.slow
@pytest.mark.parametrize("block", [1, 5])
def test_resnet_block_removal_equals_reference(block):
  model, variables = _resnet()
  x = _images()
  got = _apply(pert.remove_layers(model, [(block, "block")]), variables, x)
  np.testing.assert_allclose(got, _reference_resnet(model, variables, x, {block}),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(_apply(model, variables, x),
                             _reference_resnet(model, variables, x, set()),
                             rtol=1e-5, atol=1e-5)
  shapes = lambda m: jax.eval_shape(lambda x: m.init(_rngs(), x, train=False), _images(1))
  assert shapes(model.clone(skip=(block,))) == shapes(model)


@pytest.mark.slow
def test_resnet_projection_block_is_refused():
  model, variables = _resnet()
  with pytest.raises(ConfigError, match=r"stage2_block1 has a projection shortcut"):
    pert.remove_layers(model, [(2, "block")])
  with pytest.raises(ConfigError, match="model.skip"):
    model.clone(skip=(4,)).apply(variables, _images(1))
  with pytest.raises(ValueError, match="only 'block'"):
    pert.removable_layers(model, ("attention", "mlp"))
  with pytest.raises(ValueError, match="only 'block'"):
    pert.remove_layers(model, [(1, "mlp")])
  # The default parts reduce to whole blocks for a ResNet.
  assert pert.removable_layers(model) == pert.removable_layers(model, ("block",))


# ---------------------------------------------------------------------------
# Layer removal through the registry entries (the measure imports no models).
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_entry_removal_equals_measure():
  from xsens.models import REGISTRY  # pylint: disable=g-import-not-at-top
  vit, vit_vars = _vit()
  resnet, _ = _resnet()
  bit = get_model("bit_resnet", 5, (16, 16, 1), block_units=(1, 2, 1, 3), width_factor=0.125,
                  num_groups=4)
  for name, model, parts in (("vit", vit, ("attention", "block")), ("resnet18", resnet, None),
                             ("bit_resnet", bit, None)):
    entry = REGISTRY[name]
    assert entry.supports_removal
    assert entry.removable_layers(model) == pert.removable_layers(model)
    if parts is not None:
      assert entry.removable_layers(model, parts) == pert.removable_layers(model, parts)
    for layer in entry.removable_layers(model):
      assert entry.remove_layers(model, [layer]) == pert.remove_layers(model, [layer])
  assert REGISTRY["bit_resnet"].removable_layers(bit) == ((2, "block"), (5, "block"),
                                                           (6, "block"))
  x = _images()
  np.testing.assert_array_equal(
      _apply(REGISTRY["vit"].remove_layers(vit, [(1, "mlp")]), vit_vars, x),
      _apply(vit.clone(skip=((1, "mlp"),)), vit_vars, x))
  with pytest.raises(TypeError, match="must be a ViT"):
    REGISTRY["vit"].removable_layers(resnet)
  with pytest.raises(ValueError, match="unknown part 'head'"):
    REGISTRY["vit"].removable_layers(vit, ("head",))


def test_models_without_removable_layers_are_refused():
  from xsens.models import REGISTRY  # pylint: disable=g-import-not-at-top
  mlp = get_model("mlp", 5, SHAPE, hidden_dims=(4,))
  assert not REGISTRY["mlp"].supports_removal
  with pytest.raises(ValueError, match="'mlp' has no removable layers"):
    REGISTRY["mlp"].removable_layers(mlp)
  with pytest.raises(ValueError, match="layer removal needs a model with `removable_layers`"):
    pert.removable_layers(mlp)
  with pytest.raises(ValueError, match="not MLP"):
    pert.remove_layers(mlp, [(0, "block")])
  with pytest.raises(ValueError, match="unknown part 'head'"):
    pert.removable_layers(mlp, ("head",))


@pytest.mark.slow
def test_layer_removal_accuracy():
  model, variables = _vit()
  x = _images(7)
  labels = np.asarray(jnp.argmax(_apply(model, variables, x), -1))
  out = lab_robustness.split_layer_removal(_run(model, variables), x, labels, batch_size=3)
  assert out["baseline"] == 1.0
  assert set(out["accuracy"]) == {(i, p) for i in range(3)
                                 for p in ("block", "attention", "mlp")}
  for layer, part in [(0, "block"), (2, "mlp")]:
    acc = out["accuracy"][(layer, part)]
    variant = pert.remove_layers(model, [(layer, part)])
    want = np.mean(np.asarray(jnp.argmax(_apply(variant, variables, x), -1)) == labels)
    assert acc == pytest.approx(want)
  model, variables = _resnet()
  out = lab_robustness.split_layer_removal(_run(model, variables), x, labels,
                                           layers=[(3, "block")], batch_size=4)
  assert list(out["accuracy"]) == [(3, "block")]
  assert 0.0 <= out["accuracy"][(3, "block")] <= 1.0


@pytest.mark.slow
def test_layer_removal_accuracy_one_batch_in_jit():
  """The per-batch measure: masked accuracies of every variant in one jitted program."""
  model, variables = _vit()
  x = _images(6)
  labels = np.array(jnp.argmax(_apply(model, variables, x), -1))
  labels[5] = (labels[5] + 1) % 5   # Wrong, but masked out.
  mask = jnp.array([1, 1, 1, 1, 1, 0], jnp.float32)
  layers = ((0, "block"), (2, "mlp"))
  fn = jax.jit(functools.partial(pert.layer_removal_accuracy, _fn(model), model=model,
                                 layers=layers))
  out = fn(variables, x, labels=labels, mask=mask)
  assert float(out["baseline"]) == 1.0 and float(out["count"]) == 5.0
  assert out["correct"].shape == (2, 6) and out["accuracy"].shape == (2,)
  for l, layer in enumerate(layers):
    pred = np.asarray(jnp.argmax(_apply(pert.remove_layers(model, [layer]), variables, x), -1))
    np.testing.assert_array_equal(out["correct"][l], pred == labels)
    assert float(out["accuracy"][l]) == pytest.approx(np.mean((pred == labels)[:5]))


@pytest.mark.slow
def test_accuracy_padding_is_masked():
  model, variables = _vit()
  x = _images(5)
  labels = np.array([0, 1, 2, 3, 4])
  want = np.mean(np.asarray(jnp.argmax(_apply(model, variables, x), -1)) == labels)
  apply_fn = _fn(model)
  # Several batches with a padded last one, and one batch larger than the split.
  for batch_size in (2, 8):
    assert lab_robustness.split_accuracy(apply_fn, variables, x, labels, batch_size) == (
        pytest.approx(want))
  mask = jnp.array([1, 1, 1, 0, 0])
  out = pert.accuracy(_fn(model), variables, x, labels=labels, mask=mask)
  correct = np.asarray(jnp.argmax(_apply(model, variables, x), -1)) == labels
  assert float(out["accuracy"]) == pytest.approx(correct[:3].mean())
  assert float(out["count"]) == 3.0


# ---------------------------------------------------------------------------
# Weight noise.
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_weight_noise_zero_scale_is_identity():
  _, variables = _vit()
  params = variables["params"]
  noisy = pert.perturb_weights(params, jax.random.key(0), relative_scale=0.0)
  for a, b in zip(jax.tree.leaves(noisy), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)
  # Jittable with a traced scale; equal to the eager result.
  jitted = jax.jit(lambda p, k, s: pert.perturb_weights(p, k, relative_scale=s))
  eager = pert.perturb_weights(params, jax.random.key(1), relative_scale=0.3)
  for a, b in zip(jax.tree.leaves(jitted(params, jax.random.key(1), 0.3)),
                  jax.tree.leaves(eager)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_weight_noise_norm_ratio():
  params = {"big": {"kernel": jax.random.normal(jax.random.key(1), (300, 200)) * 3.0,
                    "bias": jnp.ones((200,))},
            "small": {"kernel": jnp.full((40, 50), 0.01)}}
  scale = 0.1
  ratios = {"big": [], "small": []}
  for seed in range(20):
    noisy = pert.perturb_weights(params, jax.random.key(seed), relative_scale=scale)
    np.testing.assert_array_equal(noisy["big"]["bias"], params["big"]["bias"])
    for name in ratios:
      w = params[name]["kernel"]
      ratios[name].append(float(jnp.linalg.norm(noisy[name]["kernel"] - w)
                                / jnp.linalg.norm(w)))
  # ||E|| / ||W|| = scale * chi_n / sqrt(n): relative sd ~ 1/sqrt(2n) per draw.
  for name, n in (("big", 60_000), ("small", 2_000)):
    r = np.asarray(ratios[name]) / scale
    assert abs(r.mean() - 1) < 4 / np.sqrt(2 * n * len(r)) + 1e-3
    assert r.std() < 3 / np.sqrt(2 * n)


@pytest.mark.slow
def test_weight_noise_per_layer_matches_joint_noise():
  _, variables = _vit()
  params = variables["params"]
  key = jax.random.key(3)
  joint = pert.perturb_weights(params, key, relative_scale=0.2)
  only = pert.perturb_weights(params, key, relative_scale=0.2,
                              layer_filter=lambda p: p.startswith("encoderblock_1/")
                              and pert.is_kernel(p))
  block = jax.tree.leaves(only["encoderblock_1"])
  np.testing.assert_array_equal(block[0], jax.tree.leaves(joint["encoderblock_1"])[0])
  for name in params:
    if name != "encoderblock_1":
      for a, b in zip(jax.tree.leaves(only[name]), jax.tree.leaves(params[name])):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_weight_noise_accuracy():
  model, variables = _vit()
  x = _images(7)
  labels = np.asarray(jnp.argmax(_apply(model, variables, x), -1))
  assert pert.weight_layers(variables["params"]) == (
      "embedding", "encoderblock_0", "encoderblock_1", "encoderblock_2", "head")
  # One draw per layer here (each draw is another forward in the program); the pooling
  # over several draws is checked with `num_draws=3` below.
  out = lab_robustness.split_weight_noise(_run(model, variables), x, labels, jax.random.key(0),
                                          relative_scale=0.0, num_draws=1, batch_size=4)
  assert out["baseline"] == 1.0
  assert out["per_layer"] == {name: 1.0 for name in pert.weight_layers(variables["params"])}
  out = lab_robustness.split_weight_noise(_run(model, variables), x, labels, jax.random.key(0),
                                          relative_scale=5.0, num_draws=3, batch_size=4,
                                          layers=["head"])
  assert len(out["per_layer_draws"]["head"]) == 3
  assert out["per_layer"]["head"] < 1.0
  with pytest.raises(ValueError, match="unknown layer"):
    lab_robustness.split_weight_noise(_run(model, variables), x, labels, jax.random.key(0),
                                      relative_scale=0.1, layers=["nope"], batch_size=4)
  # The per-batch measure equals the pooled driver on one unpadded batch.
  one = pert.weight_noise_accuracy(_fn(model), variables, x, labels=labels,
                                   key=jax.random.key(0), relative_scale=5.0, num_draws=3,
                                   layers=["head"])
  np.testing.assert_allclose(one["per_layer_draws"][0], out["per_layer_draws"]["head"],
                             rtol=1e-6)
  assert one["correct"].shape == (1, 3, 7)


# ---------------------------------------------------------------------------
# Sharpness.
# ---------------------------------------------------------------------------


def _jit_sharpness(model, **kwargs):
  return jax.jit(lambda v, x, key, sigma: pert.sharpness(
      _fn(model), v, x, key=key, sigma=sigma, **kwargs))


@pytest.mark.slow
def test_sharpness_zero_sigma_is_zero_in_eval_mode():
  # Dropout 0.5: in train mode the two forwards would differ (or need an rng).
  model, variables = _vit(dropout_rate=0.5)
  x = _images()
  fn = _jit_sharpness(model, num_draws=3)
  out = fn(variables, x, jax.random.key(0), 0.0)
  # The noisy forwards run vmapped over draws, the clean one alone: two compiled programs
  # whose float rounding may differ by ~1e-6 in the logits (never a flipped label). With
  # dropout active (train mode) the L1 would be of order 1.
  assert float(out["sharpness_l1"]) < 1e-4
  assert float(out["sharpness_flip"]) == 0.0
  assert float(out["l1_stderr"]) < 1e-4
  out = fn(variables, x, jax.random.key(0), 0.05)
  assert float(out["sharpness_l1"]) > 0.0
  assert float(out["l1_stderr"]) > 0.0
  assert {k: float(v) for k, v in out.items()}  # All scalars.


@pytest.mark.slow
def test_sharpness_matches_manual_eval_mode_computation():
  model, variables = _resnet()
  stats = jax.tree.map(np.asarray, variables["batch_stats"])
  x = _images()
  key = jax.random.key(5)
  out = _jit_sharpness(model, num_draws=2)(variables, x, key, 0.05)
  apply = jax.jit(lambda v, x: model.apply(v, x, train=False))
  clean = apply(variables, x)
  l1, flip = [], []
  for r in range(2):
    noisy = pert.add_gaussian(variables["params"], jax.random.fold_in(key, r), 0.05)
    logits = apply({**variables, "params": noisy}, x)
    l1.append(float(jnp.abs(logits - clean).sum(-1).mean()))
    flip.append(float((logits.argmax(-1) != clean.argmax(-1)).mean()))
  assert float(out["sharpness_l1"]) == pytest.approx(np.mean(l1), rel=1e-4)
  assert float(out["sharpness_flip"]) == pytest.approx(np.mean(flip), abs=1e-6)
  assert float(out["l1_stderr"]) == pytest.approx(np.std(l1, ddof=1) / np.sqrt(2),
                                                  rel=1e-3)
  # One draw at a time gives the same numbers.
  chunked = _jit_sharpness(model, num_draws=2, draw_chunk_size=1)(variables, x, key, 0.05)
  for k, v in out.items():
    assert float(chunked[k]) == pytest.approx(float(v), rel=1e-4, abs=1e-7)
  # BatchNorm running statistics are inputs, never updated.
  for a, b in zip(jax.tree.leaves(variables["batch_stats"]), jax.tree.leaves(stats)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_sharpness_perturbs_params_only():
  model, variables = _resnet()
  noisy = pert.add_gaussian(variables["params"], jax.random.key(0), 0.05)
  delta = jnp.concatenate([(a - b).reshape(-1) for a, b in zip(
      jax.tree.leaves(noisy), jax.tree.leaves(variables["params"]))])
  assert float(jnp.std(delta)) == pytest.approx(0.05, rel=0.05)


def test_sharpness_rejects_bad_arguments():
  model, variables = _vit()
  with pytest.raises(ValueError, match="num_draws"):
    pert.sharpness(_fn(model), variables, _images(), key=jax.random.key(0), num_draws=0)
  with pytest.raises(ValueError, match="sigma"):
    pert.sharpness(_fn(model), variables, _images(), key=jax.random.key(0), sigma=-1.0)
