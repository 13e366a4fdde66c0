"""`xsens.measures`: the public names, and the one calling convention they share."""

import inspect

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
