"""Empirical NTK on the Boolean cube and its Walsh spectrum (xsens.measures.spectral)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens import boolean_cube
from xsens import measures
from xsens.measures import spectral


def _chi(n):
  """chi [2^n, 2^n] float32 from boolean_cube.monomial_values, column S = chi_S."""
  cols = []
  for s in range(2**n):
    coords = [i for i in range(n) if s >> (n - 1 - i) & 1]
    cols.append(np.asarray(boolean_cube.monomial_values(n, coords)))
  return np.stack(cols, axis=1)


def _hand_kernel(n, coeffs):
  chi = _chi(n)
  return (chi * coeffs[None, :]) @ chi.T


def test_walsh_diagonal_of_a_hand_made_kernel_is_exactly_its_coefficients():
  n = 4
  # Dyadic coefficients (some negative): every sum below is exact in float32.
  coeffs = (np.arange(16, dtype=np.float32) - 5.0) / 8.0
  kernel = _hand_kernel(n, coeffs)
  np.testing.assert_array_equal(np.asarray(jax.jit(spectral.walsh_diagonal)(kernel)), coeffs)
  out = jax.jit(spectral.walsh_degree_spectrum)(kernel)
  sizes = np.asarray([bin(s).count("1") for s in range(16)])
  for k in range(n + 1):
    sel = coeffs[sizes == k]
    assert float(out["degree_mean"][k]) == sel.mean()
    assert float(out["degree_min"][k]) == sel.min()
    assert float(out["degree_max"][k]) == sel.max()
    assert float(out["degree_sum"][k]) == sel.sum()
  assert float(out["trace"]) == coeffs.sum()
  assert float(out["offdiag_mass"]) == 0.0 and float(out["cross_degree_mass"]) == 0.0
  assert float(out["spectrum_captured"]) == 1.0


def test_walsh_kernel_places_off_diagonal_terms_and_their_mass():
  n = 3
  chi = _chi(n)
  a, b, c = 4, 2, 6                       # {0}, {1} (degree 1) and {0, 1} (degree 2)
  same = np.outer(chi[:, a], chi[:, b]) + np.outer(chi[:, b], chi[:, a])
  khat = np.asarray(jax.jit(spectral.walsh_kernel)(same))
  expected = np.zeros((8, 8), np.float32)
  expected[a, b] = expected[b, a] = 1.0
  np.testing.assert_array_equal(khat, expected)
  spectrum = jax.jit(spectral.walsh_degree_spectrum)
  out = spectrum(same)
  assert float(out["offdiag_mass"]) == 1.0 and float(out["cross_degree_mass"]) == 0.0
  cross = np.outer(chi[:, a], chi[:, c]) + np.outer(chi[:, c], chi[:, a]) + np.outer(
      chi[:, a], chi[:, a])
  out = spectrum(cross)
  assert float(out["offdiag_mass"]) == pytest.approx(2 / 3, abs=1e-7)
  assert float(out["cross_degree_mass"]) == pytest.approx(2 / 3, abs=1e-7)


def test_block_eigenvalues_differ_from_the_walsh_diagonal_of_a_symmetric_block():
  # K = (sum_i chi_i)(sum_i chi_i)^T: every singleton has lambda_S = 1, but the degree-1
  # block is the all-ones matrix, with eigenvalues n, 0, ..., 0.
  n = 4
  chi = _chi(n)
  g = sum(chi[:, boolean_cube.subset_index(n, [i])] for i in range(n))
  kernel = np.outer(g, g)
  out = jax.jit(spectral.walsh_degree_spectrum)(kernel)
  np.testing.assert_array_equal(np.asarray(out["degree_mean"]), [0, 1, 0, 0, 0])
  assert float(out["offdiag_mass"]) == pytest.approx(1 - 4 / 16, abs=1e-7)
  blocks = spectral.degree_block_eigenvalues(kernel)
  assert [b.shape[0] for b in blocks] == [math.comb(n, k) for k in range(n + 1)]
  np.testing.assert_allclose(blocks[1], [4, 0, 0, 0], atol=1e-12)
  np.testing.assert_allclose(np.concatenate([blocks[0], *blocks[2:]]), 0, atol=1e-12)


def _direct_ntk(apply_fn, params, x):
  """J J^T from the jacobian of the whole batch (forward mode), flattened leaf by leaf."""
  jac = jax.jacfwd(lambda p: apply_fn(p, x).reshape(-1))(params)
  flat = jnp.concatenate([j.reshape(x.shape[0], -1) for j in jax.tree_util.tree_leaves(jac)],
                         axis=1)
  return flat @ flat.T


@pytest.mark.parametrize("model", ["attention", "mlp"])
def test_ntk_equals_a_direct_jacobian_product(model):
  n = 3
  if model == "attention":
    init_fn, apply_fn = spectral.linear_attention_model(n, heads=2, head_dim=3,
                                                        position_scale=0.5)
  else:
    init_fn, apply_fn = spectral.relu_mlp_model(n, width=5, depth=2)
  params = init_fn(jax.random.key(1))
  x = boolean_cube.all_inputs(n)
  direct = np.asarray(jax.jit(lambda p: _direct_ntk(apply_fn, p, x))(params))
  ntk = jax.jit(lambda p: measures.empirical_ntk(apply_fn, p, x)["kernel"])
  kernel = np.asarray(ntk(params))
  assert kernel.shape == (8, 8)
  np.testing.assert_allclose(kernel, direct, rtol=1e-5, atol=1e-6 * np.abs(direct).max())
  # A linen-style tree: only variables["params"] is differentiated.
  wrapped = jax.jit(lambda v: measures.empirical_ntk(
      lambda w, z: apply_fn(w["params"], z) * w["scale"], v, x))(
          {"params": params, "scale": jnp.float32(1.0)})["kernel"]
  np.testing.assert_allclose(np.asarray(wrapped), direct, rtol=1e-5,
                             atol=1e-6 * np.abs(direct).max())
  # The kernel is symmetric positive semi-definite.
  np.testing.assert_allclose(kernel, kernel.T, rtol=1e-6, atol=1e-7 * np.abs(kernel).max())
  eig = np.linalg.eigvalsh(kernel.astype(np.float64))
  assert eig.min() >= -1e-5 * eig.max()


def test_linear_model_has_the_analytic_degree_0_and_1_eigenvalues():
  # f(x) = w.x / sqrt(n) + b: K(x, x') = <x, x'> / n + 1, so lambda_{} = 1, lambda_{i} = 1/n.
  n = 5
  apply_fn = lambda p, x: x @ p["w"] / math.sqrt(n) + p["b"]
  params = {"w": jnp.arange(n, dtype=jnp.float32), "b": jnp.float32(3.0)}
  out = jax.jit(lambda p: measures.walsh_degree_spectrum(measures.empirical_ntk(
      apply_fn, p, boolean_cube.all_inputs(n))["kernel"]))(params)
  expected = np.zeros(2**n, np.float32)
  expected[0] = 1.0
  for i in range(n):
    expected[boolean_cube.subset_index(n, [i])] = 1.0 / n
  np.testing.assert_allclose(np.asarray(out["walsh_diagonal"]), expected, atol=1e-7)
  np.testing.assert_allclose(np.asarray(out["degree_mean"]), [1, 1 / n, 0, 0, 0, 0],
                             atol=1e-7)
  assert float(out["offdiag_mass"]) < 1e-12


def test_mask_zeroes_padding_rows_and_columns():
  apply_fn = lambda p, x: x @ p
  x = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
  out = measures.empirical_ntk(apply_fn, jnp.ones(2), x, mask=jnp.asarray([1, 0, 1]))
  np.testing.assert_array_equal(np.asarray(out["kernel"]),
                                [[5, 0, 17], [0, 0, 0], [17, 0, 61]])


def test_vector_output_and_non_square_kernels_are_rejected():
  with pytest.raises(ValueError, match=r"one scalar per example, got shape \(1, 2\)"):
    measures.empirical_ntk(lambda p, x: x @ p, jnp.ones((2, 2)), jnp.ones((3, 2)))
  with pytest.raises(ValueError, match=r"must be square, got shape \(4, 2\)"):
    spectral.walsh_kernel(jnp.ones((4, 2)))


def test_linear_attention_kernel_has_no_degree_above_two_and_seed_means_agree():
  n = 5
  init_fn, apply_fn = spectral.linear_attention_model(n, heads=2, head_dim=4)
  keys = jax.random.split(jax.random.key(0), 3)
  out = jax.jit(lambda k: spectral.ntk_degree_spectrum(init_fn, apply_fn, n, k))(keys)
  assert out["seed_degree_mean"].shape == (3, n + 1) and out["kernel"].shape == (32, 32)
  np.testing.assert_allclose(np.asarray(out["seed_degree_mean"]).mean(0),
                             np.asarray(out["degree_mean"]), rtol=1e-5, atol=1e-9)
  lam = np.asarray(out["seed_walsh_diagonal"])
  high = np.asarray([bin(s).count("1") >= 3 for s in range(2**n)])
  # f and its gradients are multilinear of degree <= 2 in x (x_s^2 = 1): exact zeros.
  assert np.abs(lam[:, high]).max() <= 1e-6 * np.asarray(out["seed_trace"]).min()
  assert (lam[:, ~high] > 0).all()
  # Their degree-2 part is sum_{t<s} (c_t + c_s) x_t x_s: rank n of the C(n, 2) = 10.
  blocks = spectral.degree_block_eigenvalues(out["kernel"])
  top = blocks[0][0]
  assert blocks[2][n - 1] > 1e-4 * top and np.abs(blocks[2][n:]).max() < 1e-6 * top
  kernels = jax.jit(lambda k: spectral.init_ntks(init_fn, apply_fn,
                                                 boolean_cube.all_inputs(n), k))(keys)
  np.testing.assert_allclose(np.asarray(kernels.mean(0)), np.asarray(out["kernel"]),
                             rtol=1e-5, atol=1e-9)


def test_boolean_tokens_match_the_sparse_token_embedding():
  from xsens.data import sparse_tokens  # pylint: disable=g-import-not-at-top
  tokens = spectral.boolean_tokens(boolean_cube.all_inputs(3), position_scale=0.5)
  np.testing.assert_array_equal(np.asarray(tokens), sparse_tokens.boolean_tokens(3, 0.5))


def test_monomial_matrix_matches_monomial_values():
  n = 3
  np.testing.assert_array_equal(spectral.monomial_matrix(n), _chi(n))
