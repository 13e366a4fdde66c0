"""The compute dtype of every model (`model.dtype`, `xsens.models.precision`): bfloat16
logits close to float32 ones at the same init, float32 params and outputs, bfloat16
training whose loss falls, and the field on the command line."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from tests.cli_test import TRAIN, _parse
from tests.helpers import run_cli
from tests.models_test import NUM_CLASSES, SMALL, SMALL_NON_IMAGE
from tests.train_test import smoke_train
from xsens.errors import ConfigError
from xsens.models import MODELS, REGISTRY, config_fields, get_model
from xsens.train import losses, objectives, trainer
from xsens.train import workdir as workdir_lib
from xsens.train.metrics import read_metrics

jax.config.update("jax_disable_most_optimizations", True)

IMAGE = (16, 16, 3)
# Relative error ||f_bf16 - f_32|| / ||f_32|| of the outputs at one init. bfloat16 keeps 8
# significant bits (relative rounding 2^-9 ≈ 0.002 per operation); through these small
# models it adds up to 0.003-0.012 (measured), so 0.05 leaves a margin of 4x. BiT's
# weight-standardised convs and GroupNorm amplify any perturbation at init: rounding only
# its params and inputs to bfloat16 (float32 arithmetic) already moves its logits by 0.016,
# and bfloat16 compute by 0.03-0.04 (measured over seeds); 0.1 for it.
TOLERANCE = {"bit_resnet": 0.1}
DEFAULT_TOLERANCE = 0.05
FAST = ("mlp", "cnn", "two_layer_cnn")   # The rest is in the slow tier.
BATCHNORM_MODELS = ("resnet18", "densenet", "convmixer")


def _case(name, **extra):
  """(model, inputs [4, *input_shape]) of entry `name` at its small test size."""
  if name in SMALL:
    num_classes, shape, kwargs = NUM_CLASSES, IMAGE, SMALL[name]
  else:
    num_classes, shape, kwargs = SMALL_NON_IMAGE[name]
  model = get_model(name, num_classes, shape, **kwargs, **extra)
  key = jax.random.key(1)
  if REGISTRY[name].input_dtype == jnp.int32:
    x = jax.random.randint(key, (4, *shape), 1, kwargs["vocab_size"], jnp.int32)
  else:
    x = jax.random.normal(key, (4, *shape), jnp.float32)
  return model, x


def _entries():
  """Every registry entry, those not in `FAST` marked slow."""
  return [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in sorted(REGISTRY)]


def test_every_entry_has_a_dtype_field_defaulting_to_float32():
  for name, module in MODELS.items():
    assert "dtype" in config_fields(name), name
    default = {f.name: f.default for f in dataclasses.fields(module)}["dtype"]
    assert default == "float32", name


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_bad_dtype_is_a_one_line_config_error(name):
  with pytest.raises(ConfigError) as info:
    _case(name, dtype="float16")
  assert info.value.field == "model.dtype"
  assert str(info.value).endswith("unknown value 'float16'; allowed: float32, bfloat16")
  assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", _entries())
def test_bfloat16_outputs_are_close_to_float32_with_float32_params(name):
  """Same params (float32) under both dtypes; float32 outputs within the tolerance."""
  ref, x = _case(name)
  model, _ = _case(name, dtype="bfloat16")
  init = lambda m: jax.jit(lambda x: m.init({"params": jax.random.key(0),
                                             "dropout": jax.random.key(0)}, x, train=False))(x)
  variables, bf16_variables = init(ref), init(model)
  # The same init (the dtype adds no parameter and renames none), float32 in both.
  assert jax.tree.structure(variables) == jax.tree.structure(bf16_variables)
  for a, b in zip(jax.tree.leaves(variables), jax.tree.leaves(bf16_variables)):
    assert a.dtype == b.dtype == jnp.float32
    np.testing.assert_array_equal(a, b)
  apply = lambda m: jax.jit(lambda v, x: m.apply(v, x, train=False))
  out, ref_out = apply(model)(variables, x), apply(ref)(variables, x)
  assert out.dtype == ref_out.dtype == jnp.float32 and out.shape == ref_out.shape
  assert np.all(np.isfinite(out))
  rel = float(jnp.linalg.norm(out - ref_out) / jnp.linalg.norm(ref_out))
  assert rel < TOLERANCE.get(name, DEFAULT_TOLERANCE), rel
  # Gradients reach the float32 params in float32.
  loss = lambda p: jnp.sum(model.apply({**variables, "params": p}, x, train=False) ** 2)
  grads = jax.jit(jax.grad(loss))(variables["params"])
  assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
  if name in BATCHNORM_MODELS:  # Train mode: batch statistics stay float32.
    _, state = jax.jit(lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]))(
        variables, x)
    assert {a.dtype for a in jax.tree.leaves(state)} == {jnp.dtype(jnp.float32)}


@pytest.mark.parametrize("model", ["mlp", pytest.param("cnn", marks=pytest.mark.slow),
                                   pytest.param("resnet18", marks=pytest.mark.slow)])
def test_bfloat16_training_loss_falls_with_float32_state(tmp_path, model):
  """A few dozen bfloat16 steps of the `train.py:smoke` model on mnist5k (resnet18 with
  BatchNorm): the logged train loss falls, the saved variables are float32."""
  steps = 20 if model == "resnet18" else 30
  config = smoke_train(model, total_steps=steps, log_every=5, eval_every=0,
                       checkpoint_every=0, **{"model.dtype": "bfloat16",
                                              "data.test_split": "test[:256]"})
  result = trainer.train_and_evaluate(config, str(tmp_path))
  losses = [r["train/loss"] for r in read_metrics(str(tmp_path)) if "train/loss" in r]
  assert len(losses) == steps // 5 and all(np.isfinite(losses))
  assert losses[-1] < losses[0] - 0.1, losses
  assert {a.dtype for a in jax.tree.leaves(result.variables)} == {jnp.dtype(jnp.float32)}
  assert ("batch_stats" in result.variables) == (model == "resnet18")


def test_bfloat16_train_step_keeps_a_float32_state():
  """Params and Adam's moments stay float32 through bfloat16 steps (the optimizer state
  follows the params), and the loss is float32."""
  shape = (28, 28, 1)
  kwargs = {k: v for k, v in smoke_train("mlp").model.items() if k != "name"}
  net = get_model("mlp", 10, shape, **dict(kwargs, dtype="bfloat16"))
  tx = optax.adam(1e-3)
  terms = objectives.terms_from_config(ml_collections.ConfigDict({"loss": "cross_entropy"}),
                                       shape, losses.cross_entropy)
  state = trainer.init_state(net, tx, shape, jax.random.key(0))
  step = jax.jit(trainer.make_train_step(net, tx, terms, input_dtype=jnp.float32))
  batch = {"image": jax.random.normal(jax.random.key(1), (16, *shape)),
           "label": jnp.arange(16) % 10}
  for _ in range(2):
    state, metrics = step(state, batch, jax.random.key(2))
  assert {a.dtype for a in jax.tree.leaves(state)} == {jnp.dtype(jnp.float32),
                                                       jnp.dtype(jnp.int32)}
  assert metrics["loss"].dtype == jnp.float32 and np.isfinite(float(metrics["loss"]))


# ------------------------------------------------------------------------ the command line


@pytest.mark.parametrize("model", ["resnet18", "cnn", "mlp", "densenet", "convmixer", "vit"])
def test_dtype_is_a_field_of_every_train_config_model(model):
  config = _parse(f"{TRAIN}:model={model},smoke", "--config.train.model.dtype=bfloat16")
  assert config.train.model.dtype == "bfloat16"


@pytest.mark.slow
def test_cli_trains_a_bfloat16_resnet18(tmp_path):
  workdir = tmp_path / "wd"
  proc = run_cli(f"{TRAIN}:model=resnet18,smoke", "--config.train.model.dtype=bfloat16",
                 "--config.train.total_steps=2", "--config.train.data.test_split=test[:64]",
                 f"--workdir={workdir}", timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert workdir_lib.Workdir(str(workdir)).latest_step() == 2


@pytest.mark.slow
def test_cli_bad_dtype_is_one_line_and_exit_code_2(tmp_path):
  workdir = tmp_path / "wd"
  proc = run_cli(f"{TRAIN}:model=resnet18,smoke", "--config.train.model.dtype=float16",
                 f"--workdir={workdir}", timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.splitlines() == [
      "xsens: error: --config.train.model.dtype: unknown value 'float16'; allowed: "
      "float32, bfloat16"]
  assert not workdir.exists()
