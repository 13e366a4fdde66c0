"""Per-class (subgroup) metrics and churn on hand-made predictions."""

import jax.numpy as jnp
import numpy as np
import pytest

from xsens.lab import selection
from xsens.measures import churn, subgroups
from xsens.studies import distillation


def _onehot_logits(preds, k):
  return jnp.asarray(np.eye(k)[np.asarray(preds)] * 5.0, jnp.float32)


LABELS = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
PREDS = np.array([0, 0, 0, 1, 1, 0, 2, 2, 2, 2])  # class 0: 3/4, class 1: 1/2, class 2: 4/4


def test_per_class_accuracy_worst_and_head_tail():
  logits = _onehot_logits(PREDS, 4)
  acc = np.asarray(subgroups.per_class_accuracy(logits, LABELS, 4))
  np.testing.assert_allclose(acc[:3], [0.75, 0.5, 1.0])
  assert np.isnan(acc[3])  # class 3 has no example
  assert float(subgroups.worst_k_mean(jnp.asarray(acc), 1)) == pytest.approx(0.5)
  assert float(subgroups.worst_k_mean(jnp.asarray(acc), 2)) == pytest.approx(0.625)
  assert float(subgroups.worst_k_mean(jnp.asarray(acc), 4)) == pytest.approx(0.75)
  head = subgroups.head_mask([400, 100, 400, 7], 0.5)  # ties broken by class id
  np.testing.assert_array_equal(head, [True, False, True, False])
  assert float(subgroups.group_mean(jnp.asarray(acc), head)) == pytest.approx(0.875)
  assert float(subgroups.group_mean(jnp.asarray(acc), ~head)) == pytest.approx(0.5)
  report = subgroups.subgroup_report(logits, LABELS, 4, head, worst_k=2)
  assert report["accuracy"] == pytest.approx(0.8)
  assert report["balanced_accuracy"] == pytest.approx(0.75)
  assert report["worst_class"] == pytest.approx(0.5)
  assert report["tail_accuracy"] == pytest.approx(0.5)
  np.testing.assert_allclose(subgroups.class_counts(LABELS, 4), [4, 2, 4, 0])


def test_probability_margin_per_class():
  logits = jnp.log(jnp.array([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.6, 0.3, 0.1]]))
  labels = jnp.array([0, 1, 1])
  np.testing.assert_allclose(subgroups.probability_margin(logits, labels),
                             [0.5, 0.2, -0.3], rtol=1e-5)
  np.testing.assert_allclose(subgroups.per_class_margin(logits, labels, 3)[:2],
                             [0.5, -0.05], rtol=1e-4)


def test_mitigation_formulas():
  alpha = distillation.class_alpha(0.5, [0.9, 0.45, np.nan, 1.0], 0.9)
  np.testing.assert_allclose(alpha, [0.5, 0.25, 0.5, 0.5])
  margin = distillation.class_margin(2.0, [0.8, 0.4, -0.2, 0.6])  # mean 0.4
  np.testing.assert_allclose(margin, [0.0, 0.0, 2.0, 0.0])
  np.testing.assert_allclose(distillation.class_margin(2.0, [0.6, 0.2]), [0.0, 1.0])
  val, ev = selection.split_val_eval(10, 0.5, 0)
  assert len(val) == len(ev) == 5 and not set(val) & set(ev)


def test_churn_of_a_model_with_itself_is_zero_and_of_different_constants_is_one():
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(100, 10)), jnp.float32)
  assert float(churn.churn(logits, logits)) == 0.0
  const_a = jnp.tile(jnp.eye(10)[3], (100, 1))
  const_b = jnp.tile(jnp.eye(10)[7], (100, 1))
  assert float(churn.churn(const_a, const_b)) == 1.0
  assert float(churn.churn(const_a, const_a + 1.0)) == 0.0


def test_churn_on_hand_made_predictions_mask_and_confidence_bins():
  a = _onehot_logits([0, 1, 2, 3], 4)
  b = _onehot_logits([0, 1, 0, 0], 4)
  assert float(churn.churn(a, b)) == pytest.approx(0.5)
  assert float(churn.churn(a, b, jnp.array([1.0, 1.0, 1.0, 0.0]))) == pytest.approx(1 / 3)
  # Confidence = mean top-class probability: two confident agreeing examples, two unsure
  # disagreeing ones.
  sure = jnp.array([[9.0, 0, 0], [0, 9.0, 0]])
  unsure1 = jnp.array([[0.1, 0, 0], [0, 0.1, 0]])
  unsure2 = jnp.array([[0, 0.1, 0], [0, 0, 0.1]])
  l1 = jnp.concatenate([sure, unsure1])
  l2 = jnp.concatenate([sure, unsure2])
  rate, count = churn.churn_by_confidence(l1, l2, jnp.array([0.0, 0.5, 0.9, 1.0]))
  np.testing.assert_allclose(count, [2, 0, 2])
  assert float(rate[0]) == 1.0 and np.isnan(rate[1]) and float(rate[2]) == 0.0
  pair = churn.pairwise_churn([a, b, a])
  np.testing.assert_allclose(pair, [[0, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0]])
