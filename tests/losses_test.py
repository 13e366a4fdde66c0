"""Tests of xsens/train/losses.py against values computed by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.errors import ConfigError
from xsens.train import losses

# Rows: (logits, label) -> the Crammer–Singer hinge max(0, max_{j != y} 1 + z_j - z_y).
LOGITS = np.array([
    [2.0, 1.5, -1.0],   # y=0: j=1 -> 1 + 1.5 - 2 = 0.5, j=2 -> -2 -> 0.           loss 0.5
    [0.0, 3.0, 2.75],   # y=1: j=0 -> -2 -> 0, j=2 -> 1 + 2.75 - 3 = 0.75.         loss 0.75
    [1.0, 1.0, 1.0],    # y=2: every wrong class gives 1.                          loss 1
    [0.0, 0.5, 0.25],   # y=0: j=1 -> 1.5, j=2 -> 1.25; the max (not the sum 2.75). loss 1.5
    [5.0, 0.0, 0.0],    # y=0: margins met; the true class's own 1 + 0 is excluded. loss 0
], np.float32)
LABELS = np.array([0, 1, 2, 0, 0], np.int32)
HINGE = np.array([0.5, 0.75, 1.0, 1.5, 0.0], np.float32)
# PyTorch's MultiMarginLoss (mean over the K classes of the wrong-class hinges), which
# the loss is not: (0.5 + 0) / 3, 0.75 / 3, 2 / 3, 2.75 / 3, 0.
TORCH_MULTI_MARGIN = np.array([0.5, 0.75, 2.0, 2.75, 0.0], np.float32) / 3


def test_crammer_singer_hinge_matches_hand_values():
  out = jax.jit(losses.crammer_singer_hinge)(jnp.asarray(LOGITS), jnp.asarray(LABELS))
  assert out.shape == (5,)
  np.testing.assert_allclose(np.asarray(out), HINGE, rtol=0, atol=1e-6)
  assert not np.allclose(np.asarray(out), TORCH_MULTI_MARGIN)


def test_crammer_singer_hinge_gradient_hits_only_the_most_violating_class():
  grad = jax.grad(lambda z: losses.crammer_singer_hinge(z, jnp.asarray(LABELS)).sum())(
      jnp.asarray(LOGITS))
  expected = np.array([
      [-1.0, 1.0, 0.0],
      [0.0, -1.0, 1.0],
      [0.0, 0.0, 0.0],  # A three-way tie: filled in below from the argmax jax picks.
      [-1.0, 1.0, 0.0],
      [0.0, 0.0, 0.0],  # No violation, no gradient.
  ], np.float32)
  row = np.asarray(grad)[2]
  # Ties: max's gradient is split over the tied maxima (jax), the true class gets -1.
  assert row[2] == pytest.approx(-1.0) and row[:2].sum() == pytest.approx(1.0)
  expected[2] = row
  np.testing.assert_allclose(np.asarray(grad), expected, atol=1e-6)


def test_cross_entropy_matches_hand_values():
  logits = jnp.array([[0.0, math.log(3.0)], [2.0, 2.0]], jnp.bfloat16)
  out = losses.cross_entropy(logits, jnp.array([0, 1]))
  assert out.dtype == jnp.float32  # Computed in float32 whatever the logits' dtype.
  # -log(1 / (1 + e^z1)) = log(1 + e^z1) with z1 = log 3 as rounded to bf16 (about log 4);
  # equal logits: log 2.
  z1 = float(logits[0, 1])
  assert z1 == pytest.approx(math.log(3.0), abs=1e-2)
  np.testing.assert_allclose(np.asarray(out), [math.log1p(math.exp(z1)), math.log(2.0)],
                             rtol=1e-6)


def test_get_loss_by_config_name():
  assert losses.get_loss("cross_entropy") is losses.cross_entropy
  assert losses.get_loss("multi_margin") is losses.crammer_singer_hinge
  with pytest.raises(ConfigError) as e:
    losses.get_loss("hinge")
  assert e.value.field == "loss" and "allowed: cross_entropy, multi_margin" in str(e.value)
