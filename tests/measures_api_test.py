"""`xsens.measures`: the public names, and the one calling convention they share."""

import doctest
import importlib
import inspect
import pkgutil
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens import measures

# Feature extractors: they return activations, not measurements of a batch.
EXTRACTORS = {"layer_features", "attention_maps", "attention_logits"}


def _model_taking():
  out = []
  for name in measures.__all__:
    fn = getattr(measures, name)
    if callable(fn) and list(inspect.signature(fn).parameters)[:3] == [
        "apply_fn", "variables", "inputs"]:
      out.append(name)
  return out


def test_all_names_exist_and_the_model_taking_ones_are_many():
  assert all(hasattr(measures, n) for n in measures.__all__)
  assert len(set(measures.__all__)) == len(measures.__all__)
  assert {"token_sensitivity", "fgsm", "corruption_accuracy", "prediction_churn",
          "subgroup_accuracy", "sharpness"} <= set(_model_taking())


@pytest.mark.parametrize("name", sorted(set(_model_taking()) - EXTRACTORS))
def test_every_measure_takes_labels_key_and_mask_by_keyword(name):
  params = inspect.signature(getattr(measures, name)).parameters
  for arg in ("labels", "key", "mask"):
    assert arg in params and params[arg].kind == inspect.Parameter.KEYWORD_ONLY, arg


def _linear(variables, inputs):
  return inputs.reshape(inputs.shape[0], -1) @ variables["w"]


def test_attack_accuracy_is_fgsm_then_adversarial_accuracy_inside_jit():
  x = jax.random.uniform(jax.random.key(0), (8, 4, 4, 1))
  w = jax.random.normal(jax.random.key(1), (16, 3))
  y = jnp.argmax(_linear({"w": w}, x), -1)  # The clean model is right everywhere.
  mask = jnp.asarray([1, 1, 1, 1, 1, 1, 0, 0], jnp.float32)
  out = jax.jit(lambda v, x, y, m: measures.attack_accuracy(
      _linear, v, x, labels=y, mask=m, attack="fgsm", epsilon=0.5))({"w": w}, x, y, mask)
  adv = measures.fgsm(_linear, {"w": w}, x, labels=y, epsilon=0.5)["adv_inputs"]
  want = np.asarray(jnp.argmax(_linear({"w": w}, adv), -1) == y, np.float32)
  assert float(out["clean_acc"]) == 1.0
  assert float(out["adv_acc"]) == pytest.approx(float((want * mask).sum() / 6))
  with pytest.raises(ValueError, match="attack must be one of"):
    measures.attack_accuracy(_linear, {"w": w}, x, labels=y, attack="cw")


def test_subgroup_and_churn_measures_on_a_padded_batch():
  x = jnp.eye(4, dtype=jnp.float32)                    # 4 examples, 4 features.
  w = jnp.eye(4, 3, dtype=jnp.float32)                 # Predicts class i for i < 3.
  labels = jnp.asarray([0, 1, 1, 2])
  mask = jnp.asarray([1, 1, 1, 0], jnp.float32)
  sub = measures.subgroup_accuracy(_linear, {"w": w}, x, labels=labels, mask=mask,
                                   num_classes=3)
  np.testing.assert_allclose(sub["count_per_class"], [1, 2, 0])
  np.testing.assert_allclose(sub["correct_per_class"], [1, 1, 0])
  assert float(sub["accuracy"]) == pytest.approx(2 / 3)
  peer = {"w": jnp.eye(4, 3)[:, ::-1]}
  ch = measures.prediction_churn(_linear, {"w": w}, x, mask=mask, peer_variables=peer)
  pred_a = np.argmax(np.asarray(_linear({"w": w}, x)), -1)
  pred_b = np.argmax(np.asarray(_linear(peer, x)), -1)
  assert float(ch["churn"]) == pytest.approx(float(np.mean((pred_a != pred_b)[:3])))


# ------------------------------------------------------------------------ jit and docs


def _is_size(annotation) -> bool:
  """int, str, bool or an Optional/Union of them (strings: their spelling)."""
  if isinstance(annotation, str):
    return set(annotation.replace(" ", "").split("|")) <= {"int", "str", "bool", "None"}
  if annotation in (int, str, bool):
    return True
  args = typing.get_args(annotation)
  return bool(args) and all(a in (int, str, bool, type(None)) for a in args)


@pytest.mark.parametrize("name", sorted(_model_taking()))
def test_every_size_or_name_option_is_a_static_argname(name):
  fn = getattr(measures, name)
  declared = measures.static_argnames(fn)
  for p in inspect.signature(fn).parameters.values():
    if p.kind == inspect.Parameter.KEYWORD_ONLY and _is_size(p.annotation):
      assert p.name in declared, (name, p.name)
  assert set(declared) <= set(measures.STATIC_ARGNAMES)


def test_jit_recipe_runs_as_documented_and_equals_the_closure():
  x = jax.random.normal(jax.random.key(0), (4, 5, 3))
  w = jax.random.normal(jax.random.key(1), (5, 3))
  apply = lambda v, x: jnp.stack([-(x * v).sum((1, 2)), (x * v).sum((1, 2))], -1)
  kw = dict(key=jax.random.key(2), sigma=0.7, num_draws=3)
  for fn in (measures.token_sensitivity, measures.global_sensitivity):
    want = jax.jit(lambda v, x, key: fn(apply, v, x, key=key, sigma=0.7, num_draws=3))(
        w, x, kw["key"])
    by_hand = jax.jit(fn, static_argnums=0, static_argnames=measures.static_argnames(fn))
    for jitted in (measures.jit(fn), by_hand):
      got = jitted(apply, w, x, **kw)
      np.testing.assert_array_equal(got["per_example"], want["per_example"])
      assert {k: int(v) for k, v in got["plan"].items()} == {
          k: int(v) for k, v in want["plan"].items()}
  with pytest.raises(ValueError, match="num_draws must be a positive Python int"):
    jax.jit(measures.token_sensitivity, static_argnums=0)(apply, w, x, **kw)


@pytest.mark.parametrize("normalize,stats", [
    ("half", None), ("standardize", ((0.4,), (0.2,))), ("zero_one", None)])
def test_corrupt_then_measure_equals_the_manual_conversion(normalize, stats):
  pixels = jax.random.uniform(jax.random.key(0), (4, 8, 8, 1))
  mean, std = (jnp.asarray(s, jnp.float32) for s in (stats or ((0.0,), (1.0,))))
  to_model = {"half": lambda p: (p - 0.5) / 0.5, "zero_one": lambda p: p,
              "standardize": lambda p: (p - mean) / std}[normalize]
  x = to_model(pixels)
  key = jax.random.key(1)
  noisy = measures.corrupt_normalized_jax(x, "gaussian_noise", 3, normalize=normalize,
                                          stats=stats, key=key)
  by_hand = to_model(measures.corrupt_jax(pixels, "gaussian_noise", 3, key=key))
  np.testing.assert_allclose(noisy, by_hand, rtol=1e-6, atol=1e-6)
  w = jax.random.normal(jax.random.key(2), (64, 3))
  sens = measures.jit(measures.token_sensitivity)
  kw = dict(key=jax.random.key(3), sigma=0.3, num_draws=2, patch_size=4)
  np.testing.assert_array_equal(sens(_linear, {"w": w}, noisy, **kw)["per_token"],
                                sens(_linear, {"w": w}, by_hand, **kw)["per_token"])


MEASURE_MODULES = sorted(
    m.name for m in pkgutil.iter_modules(measures.__path__, "xsens.measures."))


@pytest.mark.parametrize("module", ["xsens.measures"] + MEASURE_MODULES)
def test_docstring_examples_run_as_written(module):
  mod = importlib.import_module(module)
  tests = doctest.DocTestFinder().find(mod, module)
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
  for test in tests:
    runner.run(test)
  assert runner.failures == 0, f"{runner.failures} failing example(s) in {module}"
  if module in ("xsens.measures", "xsens.measures.sensitivity",
                "xsens.measures.text_sensitivity", "xsens.measures.boolean",
                "xsens.measures.convention"):
    assert runner.tries > 0, module  # The usage examples are doctests.
