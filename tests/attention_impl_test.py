"""The transformers' launch fields (issue 16): `attention_impl` (xsens/models/attention.py),
`dtype` and `remat` on ViT, ReuseViT, RoBERTa and GPT-2.

"einsum" is the models' implementation before the fields existed (the default; checked
bit for bit against the earlier code when the fields were added), so every other core is
compared with it, outputs and gradients, masks included.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.errors import ConfigError
from xsens.models import attention, get_model

VISION = {
    "vit": dict(patch_size=4, width=16, depth=2, num_heads=2, mlp_dim=32),
    "vit_lsa_mean": dict(patch_size=4, width=16, depth=2, num_heads=2, mlp_dim=32,
                         attention="lsa", pooling="mean", skip=((1, "mlp"),)),
    "reuse_vit": dict(patch_size=4, width=16, depth=3, num_heads=4, mlp_dim=32,
                      reuse_heads=2, reuse_layers=1),
}
TEXT = dict(vocab_size=20, max_length=8, width=16, depth=2, num_heads=4, mlp_dim=32)
# Right-padded ids; the second row has pad only after its first token, the last none.
IDS = jnp.array([[5, 7, 9, 2, 0, 0], [3, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6]], jnp.int32)
FAST_IMPLS = ("folded", "xla_fused")   # "cudnn" needs a GPU.
# The text models' variants compile the slowest (5-8 s each): in the full suite only, so the
# fast tier stays under 3 minutes (it checks the vision models, which pass no mask).
TEXT_SLOW = [pytest.param(n, marks=pytest.mark.slow) for n in ("roberta", "gpt2")]


def _case(name, **fields):
  """(model, inputs) of a small model `name` ('vit...', 'reuse_vit', 'roberta', 'gpt2')."""
  if name in ("roberta", "gpt2"):
    return get_model(name, 3, (IDS.shape[1],), **TEXT, **fields), IDS
  model_name = "reuse_vit" if name == "reuse_vit" else "vit"
  x = jax.random.normal(jax.random.key(1), (3, 8, 8, 3), jnp.float32)
  return get_model(model_name, 10, (8, 8, 3), **VISION[name], **fields), x


def _init(model, x):
  return model.init({"params": jax.random.key(0), "dropout": jax.random.key(0)}, x)


def _out_and_grads(model, variables, x, train=False):
  rngs = {"dropout": jax.random.key(3)}
  loss = lambda v: jnp.sum(jnp.sin(model.apply(v, x, train=train, rngs=rngs)))
  return model.apply(variables, x, train=train, rngs=rngs), jax.grad(loss)(variables)


# Compiled: one XLA program per model and mode, where op-by-op dispatch compiles every op
# on its own (most of the time of these tests). For the comparisons within a tolerance;
# the bit-for-bit remat checks stay op by op (XLA may fuse a remat program differently).
_jit_out_and_grads = jax.jit(_out_and_grads, static_argnames=("model", "train"))


def _assert_close(a, b, tol):
  """Leaves of `a` within tol · max(1, max |leaf of b|) of `b` (float32 rounding)."""
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    v = np.asarray(v, np.float32)
    np.testing.assert_allclose(np.asarray(u, np.float32), v, rtol=0,
                               atol=tol * max(1., float(np.abs(v).max(initial=0.))))


@pytest.mark.slow
@pytest.mark.parametrize("impl", FAST_IMPLS)
@pytest.mark.parametrize("name", [*VISION, *TEXT_SLOW])
def test_attention_impls_match_einsum_outputs_and_gradients(name, impl):
  ref, x = _case(name)
  model, _ = _case(name, attention_impl=impl)
  variables = _init(ref, x)
  assert jax.tree.structure(_init(model, x)) == jax.tree.structure(variables)
  # train=True runs the text models' attention dropout (through "folded").
  for train in (False, True):
    out, grads = _jit_out_and_grads(model, variables, x, train)
    ref_out, ref_grads = _jit_out_and_grads(ref, variables, x, train)
    _assert_close(out, ref_out, 1e-5)
    _assert_close(grads, ref_grads, 1e-5)


@pytest.mark.parametrize("name", list(VISION))
def test_sown_attention_weights_do_not_depend_on_the_impl(name):
  ref, x = _case(name)
  model, _ = _case(name, attention_impl="xla_fused")
  variables = _init(ref, x)
  out, state = model.apply(variables, x, mutable=["intermediates"])
  ref_out, ref_state = ref.apply(variables, x, mutable=["intermediates"])
  assert jax.tree.structure(state) == jax.tree.structure(ref_state)
  assert all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(state),
                                                  jax.tree.leaves(ref_state)))
  np.testing.assert_array_equal(out, ref_out)


def test_cores_match_on_a_fully_masked_row():
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 5, 3, 4)) for i in range(3))
  mask = jnp.ones((2, 1, 5, 5), bool).at[0, 0, 2].set(False)   # Query 2 sees no key.
  ref = attention.attend(q, k, v, mask, impl="einsum")
  for impl in FAST_IMPLS:
    np.testing.assert_allclose(attention.attend(q, k, v, mask, impl=impl), ref, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit", "reuse_vit", *TEXT_SLOW])
def test_remat_changes_neither_params_nor_numbers(name):
  ref, x = _case(name)
  model, _ = _case(name, remat=True)
  variables = _init(ref, x)
  remat_vars = _init(model, x)
  assert jax.tree.structure(remat_vars) == jax.tree.structure(variables)
  _assert_close(remat_vars, variables, 0)
  for train in (False, True):
    out, grads = _out_and_grads(model, variables, x, train)
    ref_out, ref_grads = _out_and_grads(ref, variables, x, train)
    _assert_close(out, ref_out, 0)
    # The text models' dropout (train=True) is recomputed inside the rematerialised
    # backward pass, which XLA fuses differently: float32 rounding (~1e-8 relative).
    _assert_close(grads, ref_grads, 1e-6 if train and name in ("roberta", "gpt2") else 0)


def test_remat_keeps_the_sown_attention_weights():
  ref, x = _case("vit")
  model, _ = _case("vit", remat=True)
  variables = _init(ref, x)
  _, state = model.apply(variables, x, mutable=["intermediates"])
  _, ref_state = ref.apply(variables, x, mutable=["intermediates"])
  _assert_close(state, ref_state, 0)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["einsum", "xla_fused"])
@pytest.mark.parametrize("name", ["vit", "reuse_vit", "roberta", "gpt2"])
def test_bfloat16_compute_is_close_to_float32_with_float32_params(name, impl):
  ref, x = _case(name)
  model, _ = _case(name, dtype="bfloat16", attention_impl=impl)
  variables = _init(model, x)
  assert {leaf.dtype for leaf in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}
  out, grads = _jit_out_and_grads(model, variables, x)
  ref_out, _ = _jit_out_and_grads(ref, variables, x)
  assert out.dtype == jnp.float32
  assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
  scale = float(jnp.abs(ref_out).max())
  np.testing.assert_allclose(out, ref_out, atol=0.05 * scale + 0.02)


@pytest.mark.parametrize("name", ["vit", "reuse_vit", "roberta", "gpt2"])
@pytest.mark.parametrize("field,value", [("dtype", "float16x"), ("attention_impl", "foo"),
                                         ("remat", "yes")])
def test_bad_launch_fields_are_config_errors(name, field, value):
  with pytest.raises(ConfigError) as info:
    _case(name, **{field: value})
  assert info.value.field == f"model.{field}"
  assert "\n" not in str(info.value)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN runs on a GPU")
@pytest.mark.parametrize("name", ["vit", "gpt2"])
def test_cudnn_attention_off_a_gpu_is_a_config_error(name):
  with pytest.raises(ConfigError, match="'cudnn' needs a GPU") as info:
    _case(name, attention_impl="cudnn", dtype="bfloat16")
  assert info.value.field == "model.attention_impl"


@pytest.mark.slow
def test_bench_training_small_runs_and_reports_every_variant(tmp_path):
  from experiments import bench_training  # pylint: disable=import-outside-toplevel
  out = bench_training.main(["--small", "--dtypes=float32", "--impls=einsum,folded",
                             "--rounds=1", f"--json={tmp_path / 'b.json'}"])
  assert [(r["dtype"], r["attention_impl"]) for r in out["training"]] == [
      ("float32", "einsum"), ("float32", "folded")]
  assert all(r["images_per_s"] > 0 and r["pct_peak"] > 0 for r in out["training"])
  assert [r["attention_impl"] for r in out["sensitivity"]] == ["einsum", "folded"]
  assert (tmp_path / "b.json").exists()


@pytest.mark.slow
def test_bench_accelerator_small_says_it_is_not_a_gpu_run():
  from experiments import bench_accelerator  # pylint: disable=import-outside-toplevel
  out = bench_accelerator.main(["--small", "--rounds=1", "--skip=training"])
  assert not out["on_gpu"] and out["banner"].startswith("NOT RUN ON A GPU")
  assert out["grid"]["runs"] == 8 and not out["grid"]["extrapolated"]
  assert {r["attention_impl"] for r in out["sensitivity"]} == {"einsum", "xla_fused"}
