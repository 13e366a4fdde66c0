"""Exact Fourier–Walsh spectra (xsens.measures.boolean) of known Boolean functions."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from xsens.measures import boolean


def _table_fn(table: np.ndarray, n: int):
  """apply_fn(_, x) = table[index of x] for ±1 inputs [M, n] in all_inputs' bit layout."""
  weights = 2 ** np.arange(n - 1, -1, -1)

  def f(variables, x):
    del variables
    bits = ((1 - x) / 2).astype(jnp.int32)
    return jnp.asarray(table)[bits @ jnp.asarray(weights, jnp.int32)]
  return f


def test_all_inputs_order_matches_boolean_sensitivity_layout():
  x = np.asarray(boolean.all_inputs(3))
  assert x.shape == (8, 3)
  # Index 0 is all +1; index 1 flips the last coordinate; index 4 the first.
  np.testing.assert_array_equal(x[0], [1, 1, 1])
  np.testing.assert_array_equal(x[1], [1, 1, -1])
  np.testing.assert_array_equal(x[4], [-1, 1, 1])
  assert boolean.subset_index(3, [0]) == 4 and boolean.subset_index(3, [2]) == 1


def test_walsh_hadamard_equals_sylvester_matrix_and_inverts():
  v = np.random.default_rng(0).normal(size=(2, 32)).astype(np.float32)
  h = scipy.linalg.hadamard(32)
  out = np.asarray(boolean.walsh_hadamard(v))
  np.testing.assert_allclose(out, v @ h.T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(boolean.walsh_hadamard(out)) / 32, v, rtol=1e-5,
                             atol=1e-5)
  jitted = jax.jit(boolean.fourier_coefficients)(v)
  np.testing.assert_allclose(np.asarray(jitted), out / 32, rtol=1e-5, atol=1e-6)


def test_parity_puts_all_weight_on_the_full_set():
  n = 5
  coeffs = np.asarray(boolean.fourier_spectrum(lambda _, x: jnp.prod(x, -1), None, n))
  expected = np.zeros(2**n)
  expected[2**n - 1] = 1.0
  np.testing.assert_allclose(coeffs, expected, atol=1e-6)
  np.testing.assert_allclose(np.asarray(boolean.degree_spectrum(coeffs)), [0, 0, 0, 0, 0, 1],
                             atol=1e-6)
  assert float(boolean.fourier_average_sensitivity(coeffs)) == pytest.approx(5.0)


def test_majority_of_three_is_exact():
  # Maj3 = (x0 + x1 + x2 - x0 x1 x2) / 2.
  coeffs = np.asarray(boolean.fourier_spectrum(lambda _, x: jnp.sign(jnp.sum(x, -1)), None, 3))
  expected = np.zeros(8)
  for i in range(3):
    expected[boolean.subset_index(3, [i])] = 0.5
  expected[boolean.subset_index(3, [0, 1, 2])] = -0.5
  np.testing.assert_allclose(coeffs, expected, atol=1e-7)
  np.testing.assert_allclose(np.asarray(boolean.degree_spectrum(coeffs)), [0, 0.75, 0, 0.25],
                             atol=1e-7)
  assert float(boolean.fourier_average_sensitivity(coeffs)) == pytest.approx(1.5)
  assert float(boolean.fourier_average_sensitivity(coeffs, normalize=True)) == pytest.approx(0.5)


@pytest.mark.slow
def test_dictator_and_constant():
  n = 4
  dictator = np.asarray(boolean.fourier_spectrum(lambda _, x: x[:, 2], None, n))
  expected = np.zeros(16)
  expected[boolean.subset_index(n, [2])] = 1.0
  np.testing.assert_allclose(dictator, expected, atol=1e-7)
  assert float(boolean.fourier_average_sensitivity(dictator)) == pytest.approx(1.0)
  const = np.asarray(boolean.fourier_spectrum(lambda _, x: jnp.full(x.shape[:1], -0.7), None, n))
  expected = np.zeros(16)
  expected[0] = -0.7
  np.testing.assert_allclose(const, expected, atol=1e-7)
  assert float(boolean.fourier_average_sensitivity(const)) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_average_sensitivity_from_spectrum_equals_direct_counting(seed):
  n = 6
  table = np.random.default_rng(seed).choice([-1.0, 1.0], size=2**n).astype(np.float32)
  f = _table_fn(table, n)
  coeffs = boolean.fourier_coefficients(jnp.asarray(table))
  direct = boolean.boolean_sensitivity(f, None, boolean.all_inputs(n))
  assert float(boolean.fourier_average_sensitivity(coeffs)) == pytest.approx(
      float(direct["mean"]), abs=1e-5)
  # Parseval: sum fhat^2 = E f^2 = 1 for a ±1 function; the spectrum sums to it.
  assert float(jnp.sum(boolean.degree_spectrum(coeffs))) == pytest.approx(1.0, abs=1e-5)


def test_monomial_values_and_multi_output():
  n = 4
  for coords in itertools.combinations(range(n), 2):
    v = boolean.monomial_values(n, coords)
    c = np.asarray(boolean.fourier_coefficients(v))
    assert c[boolean.subset_index(n, coords)] == pytest.approx(1.0)
    assert np.sum(np.abs(c)) == pytest.approx(1.0)
  two = boolean.fourier_spectrum(
      lambda _, x: jnp.stack([x[:, 0], x[:, 1] * x[:, 3]], -1), None, n)
  assert two.shape == (2, 16)
  np.testing.assert_allclose(np.asarray(boolean.degree_spectrum(two))[:, :3],
                             [[0, 1, 0], [0, 0, 1]], atol=1e-7)


def test_bad_inputs():
  with pytest.raises(ValueError, match="2\\^n"):
    boolean.fourier_coefficients(jnp.ones(12))
  with pytest.raises(ValueError, match="outside"):
    boolean.subset_index(3, [3])
  with pytest.raises(ValueError, match="n must be"):
    boolean.all_inputs(0)


# Average sensitivity counted at points (boolean_sensitivity).

parity = lambda v, x: jnp.prod(x, -1)


dictator = lambda v, x: x[:, 0]


majority = lambda v, x: jnp.sign(jnp.sum(x, -1))


def test_boolean_exact():
  bs = jax.jit(lambda f, n, **kw: boolean.boolean_sensitivity(
      f, None, boolean.all_inputs(n), **kw), static_argnums=(0, 1),
               static_argnames="normalize")
  out = bs(parity, 6)
  assert float(out["mean"]) == 6.0 and float(out["stderr"]) == 0.0
  np.testing.assert_array_equal(out["influence"], np.ones(6))
  np.testing.assert_array_equal(out["per_example"], np.full(64, 6.0))
  assert int(out["count"]) == 64
  assert float(bs(dictator, 4)["mean"]) == 1.0
  # Majority on n = 5: n * C(n-1, (n-1)/2) / 2^(n-1) = 5 * 6 / 16.
  np.testing.assert_allclose(bs(majority, 5)["mean"], 5 * 6 / 16)
  np.testing.assert_allclose(bs(parity, 6, normalize=True)["mean"], 1.0)
  np.testing.assert_allclose(bs(majority, 5, normalize=True)["mean"], 6 / 16)


def test_boolean_sampled():

  @jax.jit
  def run(key):
    return (boolean.boolean_sensitivity(majority, None,
                                        boolean.random_inputs(key, 4000, 5)),
            boolean.boolean_sensitivity(parity, None,
                                        boolean.random_inputs(key, 64, 30),
                                        normalize=True))

  out, par = run(jax.random.key(42))
  assert float(out["stderr"]) > 0
  assert abs(float(out["mean"]) - 1.875) < 4 * float(out["stderr"])
  assert int(out["count"]) == 4000
  assert float(par["mean"]) == 1.0 and float(par["stderr"]) == 0.0


def test_boolean_logits_labels_and_mask():
  x = boolean.all_inputs(5)
  logits = lambda v, x: jnp.stack([-v * jnp.sum(x, -1), v * jnp.sum(x, -1)],
                                  -1)

  @jax.jit
  def run(v, x):
    return (boolean.boolean_sensitivity(majority, None, x),
            boolean.boolean_sensitivity(logits, v, x),
            boolean.boolean_sensitivity(majority, None, x,
                                        labels=majority(None, x)),
            boolean.boolean_sensitivity(majority, None, x,
                                        mask=jnp.arange(32) < 16))

  ref, from_logits, given, half = run(2.0, x)
  for out in (from_logits, given):
    for name in ("per_example", "mean", "influence", "count"):
      np.testing.assert_array_equal(out[name], ref[name], err_msg=name)
  s = np.asarray(ref["per_example"])
  np.testing.assert_allclose(half["mean"], s[:16].mean(), rtol=1e-6)
  np.testing.assert_allclose(half["stderr"],
                             s[:16].std(ddof=1) / np.sqrt(16), rtol=1e-5)
  assert int(half["count"]) == 16


def test_boolean_errors():
  with pytest.raises(ValueError, match="n must"):
    boolean.all_inputs(21)
  with pytest.raises(ValueError, match="inputs"):
    boolean.boolean_sensitivity(parity, None, jnp.ones((2, 3, 4)))
