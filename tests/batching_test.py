"""Tests for xsens/data/batching.py (the one padded index generator)."""

import numpy as np
import pytest

from xsens.data import batching


def _all(*args, **kwargs):
  return [(idx.tolist(), mask.tolist())
          for idx, mask in batching.padded_index_batches(*args, **kwargs)]


def test_last_batch_repeats_the_last_index_with_mask_zero():
  assert _all(7, 3) == [([0, 1, 2], [1, 1, 1]), ([3, 4, 5], [1, 1, 1]),
                        ([6, 6, 6], [1, 0, 0])]


def test_exact_multiple_has_no_padding():
  assert _all(6, 3) == [([0, 1, 2], [1, 1, 1]), ([3, 4, 5], [1, 1, 1])]


def test_fewer_examples_than_one_batch_pad_one_batch():
  assert _all(2, 4) == [([0, 1, 1, 1], [1, 1, 0, 0])]


def test_limit_uses_the_first_examples_only():
  assert _all(10, 4, limit=5) == [([0, 1, 2, 3], [1, 1, 1, 1]), ([4, 4, 4, 4], [1, 0, 0, 0])]
  assert _all(3, 4, limit=100) == _all(3, 4)
  assert not _all(10, 4, limit=0)
  assert not _all(0, 4)


def test_dtypes_and_shapes():
  for idx, mask in batching.padded_index_batches(5, 2):
    assert idx.shape == mask.shape == (2,)
    assert np.issubdtype(idx.dtype, np.integer) and mask.dtype == np.float32


def test_every_example_appears_once_among_real_rows():
  for n, bs in ((1, 1), (9, 4), (64, 8), (13, 13), (13, 14)):
    real = np.concatenate([idx[mask > 0] for idx, mask in batching.padded_index_batches(n, bs)])
    np.testing.assert_array_equal(real, np.arange(n))


@pytest.mark.parametrize("batch_size", [0, -1, 2.0, None])
def test_bad_batch_size_is_refused(batch_size):
  with pytest.raises(ValueError, match="batch_size"):
    list(batching.padded_index_batches(5, batch_size))


def test_negative_limit_is_refused():
  with pytest.raises(ValueError, match="limit"):
    list(batching.padded_index_batches(5, 2, limit=-1))
