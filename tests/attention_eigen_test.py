"""Eigen-analysis of attention and partial computation (xsens.measures.attention_eigen,
xsens.models.eigen_vit, the attention_eigen study's validation)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlcollections_configs import attention_eigen as ae_configs
from xsens import measures
from xsens.errors import ConfigError
from xsens.measures import attention_eigen as ae
from xsens.models import eigen_vit, get_model

IMAGE = (8, 8, 1)          # patch 2: 16 patches + CLS = 17 tokens


def _vit(name="vit", **kwargs):
  fields = dict(patch_size=2, width=16, depth=2, num_heads=2, mlp_dim=16)
  fields.update(kwargs)
  model = get_model(name, 3, IMAGE, **fields)
  x = jax.random.normal(jax.random.key(1), (5, *IMAGE))
  return model, model.init(jax.random.key(0), x), x


def _planted(key, n, t, r):
  """n rows μ + U z in R^t, U a random rank-r basis: (rows, U, μ)."""
  k1, k2, k3 = jax.random.split(key, 3)
  u = ae.random_basis(k1, t, r)
  mean = jax.random.normal(k3, (t,))
  z = jax.random.normal(k2, (n, r)) * jnp.arange(r, 0, -1)
  return mean + z @ u.T, u, mean


def test_re_exported():
  for name in ("score_moments", "merge_moments", "explained_variance", "subspace_overlap",
               "partial_reconstruction"):
    assert getattr(measures, name) is getattr(ae, name)


def test_streaming_moments_equal_the_batch_covariance():
  x = np.asarray(jax.random.normal(jax.random.key(0), (37, 2, 6)) * 3 + 1)
  w = np.ones(37)
  w[-5:] = 0.0                               # padded rows
  total = None
  for lo in range(0, 37, 10):
    part = jax.tree.map(np.asarray, ae.batch_moments(jnp.asarray(x[lo:lo + 10]),
                                                     jnp.asarray(w[lo:lo + 10])))
    total = part if total is None else ae.merge_moments(total, part)
  real = x[:32]
  assert total["count"] == 32
  np.testing.assert_allclose(total["mean"], real.mean(0), rtol=1e-5, atol=1e-5)
  for j in range(2):
    np.testing.assert_allclose(ae.covariance(total)[j], np.cov(real[:, j].T, bias=True),
                               rtol=1e-4, atol=1e-4)


def test_planted_low_rank_scores_recover_their_dimension():
  rows, u, _ = _planted(jax.random.key(2), 400, 20, 3)
  cov = ae.covariance(jax.tree.map(np.asarray, ae.batch_moments(rows)))
  ratio = ae.explained_variance(cov)
  assert ae.dimension_at(ratio, 0.999) == 3
  assert ratio[1] < 0.999
  np.testing.assert_allclose(ae.subspace_overlap(ae.top_basis(cov, 3), u), 1.0, atol=1e-4)


def test_overlap_of_identical_subspaces_is_one_and_of_random_ones_k_over_t():
  t, k = 30, 5
  u = ae.random_basis(jax.random.key(0), t, k)
  rotated = u @ ae.random_basis(jax.random.key(1), k, k)       # same span
  np.testing.assert_allclose(ae.subspace_overlap(u, rotated), 1.0, atol=1e-5)
  others = ae.random_basis(jax.random.key(2), t, k, (2000,))
  mean = float(ae.subspace_overlap(u, others).mean())
  assert abs(mean - k / t) < 0.01, mean
  pair = ae.pairwise_overlap(jnp.stack([u, rotated]))
  np.testing.assert_allclose(pair, np.ones((2, 2)), atol=1e-5)


@pytest.mark.parametrize("rule", ae.SUBSET_RULES)
def test_reconstruction_is_exact_for_m_equal_t_and_for_rank_k_scores(rule):
  t, k, h = 12, 3, 2
  rows, u, mean = _planted(jax.random.key(3), 7, t, k)
  a = jnp.stack([rows, rows[::-1] * 0.5])                       # [H, Q, T]
  basis = jnp.stack([u, u])
  means = jnp.stack([mean, mean * 0.5])
  for m in (t, k + 1, k):
    keys = jnp.asarray(ae.choose_keys(rule, basis, m, seed=1))
    assert keys.shape == (h, m) and all(len(set(r)) == m for r in keys.tolist())
    a_s = jnp.take_along_axis(a, jnp.broadcast_to(keys[:, None], (h, 7, m)), axis=-1)
    est = eigen_vit.reconstruct_logits(a_s, basis, means, keys)
    np.testing.assert_allclose(est, a, atol=2e-3 if rule == "random" else 1e-4)
  # m = T with a basis that does not span the scores: still exact (all keys computed).
  wrong = ae.random_basis(jax.random.key(9), t, k, (h,))
  keys = jnp.tile(jnp.arange(t), (h, 1))
  est = eigen_vit.reconstruct_logits(a, wrong, jnp.zeros((h, t)), keys)
  np.testing.assert_allclose(est, a, atol=1e-6)


def test_pivoted_qr_keys_pick_where_the_basis_lives():
  t = 10
  basis = np.zeros((1, t, 2), np.float32)
  basis[0, 3, 0] = basis[0, 7, 1] = 1.0                       # supported on keys 3 and 7
  assert set(ae.choose_keys("pivoted_qr", basis, 2)[0].tolist()) == {3, 7}
  assert ae.choose_keys("strided", basis, 4)[0].tolist() == [0, 3, 6, 9]


def test_logits_from_the_projections_match_the_sown_attention_weights():
  model, variables, x = _vit()
  apply_fn = functools.partial(model.apply, train=False)
  logits = ae.attention_logits(apply_fn, variables, x)
  _, state = model.apply(variables, x, train=False, mutable=["intermediates"])
  sown = [state["intermediates"][f"encoderblock_{i}"]["MultiHeadDotProductAttention_0"][
      "attention_weights"][0] for i in range(2)]
  assert len(logits) == 2 and logits[0].shape == (5, 2, 17, 17)
  for got, want in zip(logits, sown):
    np.testing.assert_allclose(jax.nn.softmax(got, -1), want, atol=1e-5)


# Compiled: one XLA program per input shape, where op-by-op dispatch compiles every op of
# the model on its own.
_score_moments = jax.jit(ae.score_moments, static_argnums=0,
                         static_argnames=("kind", "matrix_tokens"))


@pytest.mark.slow
def test_score_moments_stream_over_batches_and_cover_text_and_reuse_models():
  model, variables, x = _vit()
  apply_fn = functools.partial(model.apply, train=False)
  whole = jax.tree.map(np.asarray, _score_moments(apply_fn, variables, x,
                                                    matrix_tokens=5))
  parts = [jax.tree.map(np.asarray, _score_moments(apply_fn, variables, x[s],
                                                     matrix_tokens=5))
           for s in (slice(0, 2), slice(2, 5))]
  merged = {p: ae.merge_moments(parts[0][p], parts[1][p]) for p in parts[0]}
  assert whole["rows"]["m2"].shape == (2, 2, 17, 17)
  assert whole["matrices"]["m2"].shape == (2, 25, 25)
  for p in whole:
    np.testing.assert_allclose(merged[p]["m2"], whole[p]["m2"], rtol=1e-3, atol=1e-3)
  probs = _score_moments(apply_fn, variables, x, kind="probs")
  np.testing.assert_allclose(probs["rows"]["mean"].sum(-1), 1.0, atol=1e-5)
  reuse, rv, _ = _vit("reuse_vit", reuse_heads=1, reuse_layers=1)
  out = ae.attention_logits(functools.partial(reuse.apply, train=False), rv, x)
  assert [o.shape[1] for o in out] == [2, 1]                  # reused head: no query
  text = get_model("roberta", 2, (6,), vocab_size=11, max_length=6, width=8, depth=2,
                   num_heads=2, mlp_dim=8)
  ids = jnp.asarray([[1, 4, 5, 2, 0, 0], [1, 3, 3, 3, 7, 2]])
  tv = text.init(jax.random.key(0), ids)
  mom = _score_moments(functools.partial(text.apply, train=False), tv, ids, kind="probs")
  assert mom["rows"]["mean"].shape == (2, 2, 6)
  assert float(mom["rows"]["count"]) == 4 + 6                   # real query rows only
  # Keys 4, 5 are padding in example 0 only: their mean probability is that of example 1.
  np.testing.assert_allclose(mom["rows"]["mean"][..., 4:] * 10,
                             _probs_row_sums(text, tv, ids)[..., 4:], rtol=1e-4, atol=1e-6)


def _probs_row_sums(model, variables, ids):
  """Σ over real query rows of the masked attention probabilities, [L, H, T]."""
  logits = ae.attention_logits(functools.partial(model.apply, train=False), variables, ids)
  valid = np.asarray(ids != 0, np.float32)
  return np.stack([np.einsum("bhqk,bq->hk", ae.probabilities(a, ids != 0), valid)
                   for a in logits])


def test_partial_reconstruction_is_exact_with_all_keys():
  model, variables, x = _vit()
  apply_fn = functools.partial(model.apply, train=False)
  t, h = 17, 2
  bases = ae.random_basis(jax.random.key(0), t, 3, (2, h))
  keys = jnp.tile(jnp.arange(t), (2, h, 1))
  out = jax.jit(ae.partial_reconstruction, static_argnums=0)(
      apply_fn, variables, x, bases=bases, means=jnp.zeros((2, h, t)), keys=keys)
  np.testing.assert_allclose(out["score_mse"], 0.0, atol=1e-10)
  np.testing.assert_allclose(out["tv"], 0.0, atol=1e-6)
  part = ae.partial_reconstruction(apply_fn, variables, x, bases=bases,
                                   means=jnp.zeros((2, h, t)), keys=keys[..., :5])
  assert float(part["tv"].min()) > 0


@pytest.mark.slow
def test_eigen_vit_with_all_keys_is_the_vit_and_with_a_pca_basis_runs_frozen():
  vit, variables, x = _vit()
  full, fv, _ = _vit("eigen_vit", keys_kept=17, basis_rank=4)
  params = {**fv["params"], **variables["params"]}
  vit_out = jax.jit(vit.apply)(variables, x)   # Compiled (see _score_moments).
  np.testing.assert_allclose(jax.jit(full.apply)({"params": params}, x), vit_out, atol=1e-5)
  assert set(fv["params"]) - set(variables["params"]) == {"eigen_basis_1", "eigen_mean_1"}
  basis = np.asarray(ae.random_basis(jax.random.key(3), 17, 4, (2,)))
  keys = ((tuple(range(0, 17, 3)),) * 2,)
  part = full.clone(keys_kept=6, kept_keys=keys)
  out = jax.jit(part.apply)({"params": eigen_vit.with_basis(variables["params"], {1: basis},
                                                            {1: np.zeros((2, 17))})}, x)
  assert out.shape == (5, 3) and bool(jnp.isfinite(out).all())
  assert not np.allclose(out, vit_out, atol=1e-4)
  # Gradients reach the learned basis.
  model, mv, _ = _vit("eigen_vit", keys_kept=6, basis_rank=4)
  grads = jax.jit(jax.grad(lambda p: model.apply({"params": p}, x).sum()))(mv["params"])
  assert float(jnp.abs(grads["eigen_basis_1"]).sum()) > 0


def test_eigen_vit_initial_basis_is_dct_or_a_random_orthonormal_one():
  _, dct, _ = _vit("eigen_vit", keys_kept=6, basis_rank=4)
  _, rand, _ = _vit("eigen_vit", keys_kept=6, basis_rank=4, basis_init="random")
  d, r = dct["params"]["eigen_basis_1"], rand["params"]["eigen_basis_1"]
  assert d.shape == r.shape == (2, 17, 4)
  np.testing.assert_allclose(d[0], eigen_vit.dct_basis(17, 4), atol=1e-6)
  np.testing.assert_allclose(jnp.einsum("htk,htl->hkl", r, r), np.broadcast_to(np.eye(4),
                             (2, 4, 4)), atol=1e-5)
  assert not np.allclose(r[0], r[1], atol=1e-3)                 # one draw per head
  assert np.abs(np.asarray(r[0])[:, 0]).std() > 0.05            # not DCT's constant column
  _, again, _ = _vit("eigen_vit", keys_kept=6, basis_rank=4, basis_init="random")
  np.testing.assert_array_equal(again["params"]["eigen_basis_1"], r)   # from the init rng


@pytest.mark.parametrize("fields, path, part", [
    (dict(keys_kept=18), "model.keys_kept", "T=17"),
    (dict(keys_kept=4, basis_rank=5), "model.basis_rank", "keys_kept=4"),
    (dict(keys_kept=4, basis_rank=2, key_rule="diagonal"), "model.key_rule", "strided"),
    (dict(keys_kept=4, basis_rank=2, basis_init="pca"), "model.basis_init", "dct, random"),
])
def test_eigen_vit_refuses_bad_fields(fields, path, part):
  with pytest.raises(ConfigError) as e:
    get_model("eigen_vit", 3, IMAGE, patch_size=2, width=16, depth=2, num_heads=2,
              mlp_dim=16, **fields)
  assert e.value.field == path and part in str(e.value)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("field, value, path, part", [
    ("key_counts", (8, 51), "eigen.key_counts", "T=50"),
    ("ranks", (2, 9), "eigen.ranks", "k=9"),
    ("subset_rules", ("strided", "diagonal"), "eigen.subset_rules", "pivoted_qr"),
    ("accuracy_rule", "every_other", "eigen.accuracy_rule", "unknown subset rule"),
])
def test_study_refuses_bad_eigen_config(field, value, path, part):
  ec = ae_configs.get_config().eigen
  ec[field] = value
  with pytest.raises(ConfigError) as e:
    ae_configs.validate_eigen(ec, num_tokens=50)
  assert e.value.field == path and part in str(e.value)
  assert "\n" not in str(e.value)


def test_centered_rows_remove_the_softmax_invariant_offset():
  """A constant added to every logit row changes the logit rows' PCA but not the centred
  rows' (nor the softmax); padded keys of token ids are 0 and leave the mean."""
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(2, 3, 4, 5, 5)), jnp.float32)
  shifted = logits + jnp.asarray(rng.normal(size=(2, 3, 4, 5, 1)) * 10, jnp.float32)
  np.testing.assert_allclose(ae.centered(shifted), ae.centered(logits), atol=1e-4)
  np.testing.assert_allclose(ae.centered(logits).sum(-1), 0.0, atol=1e-5)
  valid = jnp.asarray([[1, 1, 1, 0, 0]] * 3, bool)
  c = ae.centered(shifted, valid)
  np.testing.assert_allclose(c[..., 3:], 0.0)
  np.testing.assert_allclose(c[..., :3], ae.centered(logits[..., :3]), atol=1e-4)
