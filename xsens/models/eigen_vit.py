"""Attention from partial computation: exact scores on m keys, the rest from a basis.

Bhojanapalli, Chakrabarti, Jain, Kumar, Lukasik, Veit (2021), "Eigen Analysis of
Self-Attention and its Reconstruction from Partial Computation", arXiv 2106.08823
(docs/papers/google_papers.md §C; the method details are our reconstruction, not confirmed from the
paper). Per head, a score row a ∈ R^T (the logits q·k_j/√d_h of one query over the T keys) is
estimated from its exact entries on a key subset S (|S| = m) with a rank-k basis U ∈ R^{T×k} and
mean μ ∈ R^T:

  c = argmin_c ‖U_S c − (a_S − μ_S)‖²  (least squares, c = pinv(U_S)(a_S − μ_S))
  â = μ + U c,   â_S = a_S (the computed entries are kept exact),   then softmax(â).

`reconstruct_logits` is that estimator (shared with `xsens.measures.attention_eigen`);
`partial_attention` is a flax `attention_fn` that computes q·k only for the m keys of S.

`EigenViT` is `xsens.models.vit.ViT` whose encoder blocks ≥ `eigen_from_layer` attend
this way, with per-block params `eigen_basis_<i>` [H, T, k] and `eigen_mean_<i>` [H, T]
(initialised to an orthonormal DCT-II basis over key positions, or with `basis_init`
"random" to a uniformly random orthonormal one, and zero; learned by
training, or overwritten by a PCA basis of a trained ViT for the frozen-model evaluation,
`with_basis`). Every other param has the ViT's name, so a trained ViT's params plus the
basis params apply as they are. `keys_kept` = 0 (the default) is the plain ViT.
Key subsets S per block and head: `key_rule` "strided" (round(linspace(0, T−1, m))) or
"random" (a fixed draw from `key_seed`), or the explicit `kept_keys` [blocks][H][m] (e.g.
pivoted-QR keys of a PCA basis, `xsens.measures.attention_eigen.choose_keys`).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xsens.errors import ConfigError
from xsens.models import _checks
from xsens.models.vit import EncoderBlock, ViT, classifier_head, encoder_input

KEY_RULES = ("strided", "random")
BASIS_INITS = ("dct", "random")


def num_tokens(model, image_shape) -> int:
  """Tokens T of a ViT on (H, W, C) images: the patch grid plus the CLS token."""
  p = model.patch_size
  return (image_shape[0] // p) * (image_shape[1] // p) + (model.pooling == "cls")


def strided_keys(num_keys: int, m: int) -> np.ndarray:
  """[m] int: m of `num_keys` positions evenly spread, first and last included."""
  return np.unique(np.round(np.linspace(0, num_keys - 1, m)).astype(np.int32))


def random_basis(key, dim: int, k: int, batch: tuple[int, ...] = ()) -> jax.Array:
  """Uniformly random orthonormal [*batch, dim, k] bases (QR of Gaussian matrices)."""
  q, r = jnp.linalg.qr(jax.random.normal(key, batch + (dim, k)))
  return q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


def rule_keys(rule: str, num_keys: int, m: int, num_heads: int, seed: int = 0) -> np.ndarray:
  """[H, m] int sorted key subsets of a fixed rule ("strided" | "random")."""
  if rule == "strided":
    return np.tile(strided_keys(num_keys, m), (num_heads, 1))
  rng = np.random.default_rng(seed)
  return np.stack([np.sort(rng.choice(num_keys, m, replace=False))
                   for _ in range(num_heads)]).astype(np.int32)


def dct_basis(num_keys: int, k: int) -> np.ndarray:
  """[T, k] the first k orthonormal DCT-II vectors over T positions (column 0 constant)."""
  t = np.arange(num_keys)[:, None] + 0.5
  basis = np.cos(np.pi * t * np.arange(k)[None] / num_keys)
  return (basis / np.linalg.norm(basis, axis=0, keepdims=True)).astype(np.float32)


def reconstruct_logits(a_s, basis, mean, keys):
  """Full score rows from their entries on the key subset (module docstring).

  Args:
    a_s: [..., H, Q, m] exact scores on the keys `keys`.
    basis: [H, T, k] per-head basis (columns need not be orthonormal).
    mean: [H, T] per-head mean row.
    keys: [H, m] int key subset per head (distinct).

  Returns:
    [..., H, Q, T] estimated scores, exact on `keys`.
  """
  u_s = jnp.take_along_axis(basis, keys[:, :, None], axis=1)          # [H, m, k]
  mu_s = jnp.take_along_axis(mean, keys, axis=1)                       # [H, m]
  coef = jnp.einsum("hkm,...hqm->...hqk", jnp.linalg.pinv(u_s), a_s - mu_s[:, None])
  full = mean[:, None] + jnp.einsum("htk,...hqk->...hqt", basis, coef)
  num_keys = basis.shape[1]
  slot = jnp.full((keys.shape[0], num_keys), -1, jnp.int32).at[
      jnp.arange(keys.shape[0])[:, None], keys].set(jnp.arange(keys.shape[1]))  # [H, T]
  index = jnp.broadcast_to(jnp.maximum(slot, 0)[:, None], a_s.shape[:-1] + (num_keys,))
  exact = jnp.take_along_axis(a_s, index, axis=-1)                     # a gather
  return jnp.where((slot >= 0)[:, None], exact, full)


def partial_attention(query, key, value, mask=None, dropout_rng=None, dropout_rate=0.,
                      broadcast_dropout=True, deterministic=True, dtype=None,
                      precision=None, module=None, *, basis, mean, keys):
  """A flax `attention_fn`: scores q·k/√d_h on the keys `keys` [H, m] only, the rest by
  `reconstruct_logits` with `basis` [H, T, k] and `mean` [H, T]; softmax; weights · v.
  [B, T, H, D] -> [B, T, H, D]. Sows the weights as `attention_weights` when flax passes
  `module`. No attention dropout, no mask (the ViT uses neither)."""
  del mask, dropout_rng, dropout_rate, broadcast_dropout, deterministic, precision
  d = query.shape[-1]
  query = query / jnp.sqrt(d).astype(query.dtype)
  key_s = jnp.take_along_axis(key.transpose(0, 2, 1, 3), keys[None, :, :, None], axis=2)
  a_s = jnp.einsum("bqhd,bhmd->bhqm", query, key_s)                    # [B, H, T, m]
  logits = reconstruct_logits(a_s.astype(jnp.float32), basis, mean, keys)
  weights = jax.nn.softmax(logits, axis=-1)
  if module is not None:
    module.sow("intermediates", "attention_weights", weights)
  return jnp.einsum("bhqk,bkhd->bqhd", weights.astype(value.dtype), value)


class EigenViT(ViT):
  """ViT whose blocks ≥ `eigen_from_layer` compute scores on `keys_kept` keys and
  reconstruct the rest in a rank-`basis_rank` basis (module docstring).
  [B, H, W, C] -> logits [B, num_classes]."""
  keys_kept: int = 0            # m; 0: full attention everywhere (the plain ViT).
  basis_rank: int = 8           # k <= m.
  key_rule: str = "strided"
  key_seed: int = 0
  basis_init: str = "dct"       # "dct" | "random" (`random_basis`, from the init rng).
  eigen_from_layer: int = 1
  # Explicit key subsets [blocks eigen_from_layer..depth-1][H][m]; () = `key_rule`.
  kept_keys: tuple = ()

  def check_input(self, image_shape: tuple[int, int, int]) -> None:
    """Raises ConfigError for settings impossible on (H, W, C) inputs."""
    super().check_input(image_shape)
    if self.attention != "mha":
      raise ConfigError("model.attention", f"{self.attention!r} is not built for the "
                        "eigen ViT; use 'mha'")
    t = num_tokens(self, _checks.image(image_shape, self.num_classes))
    m, k = self.keys_kept, self.basis_rank
    if not _checks._is_int(m) or not 0 <= m <= t:  # pylint: disable=protected-access
      raise ConfigError("model.keys_kept", f"must be an int in [0, T={t}] (the tokens; "
                        f"0: full attention); got {m!r}")
    if not _checks._is_int(k) or k < 1 or (m and k > m):  # pylint: disable=protected-access
      raise ConfigError("model.basis_rank", f"must be an int in [1, keys_kept={m}]; got {k!r}")
    _checks.one_of("key_rule", self.key_rule, KEY_RULES)
    _checks.one_of("basis_init", self.basis_init, BASIS_INITS)
    if not _checks._is_int(self.eigen_from_layer) or not (  # pylint: disable=protected-access
        0 <= self.eigen_from_layer <= self.depth):
      raise ConfigError("model.eigen_from_layer", f"must be an int in [0, depth={self.depth}]"
                        f"; got {self.eigen_from_layer!r}")

  def block_keys(self, num_keys: int) -> list[np.ndarray]:
    """[H, m] key subsets of blocks eigen_from_layer..depth-1."""
    n = self.depth - self.eigen_from_layer
    if self.kept_keys:
      return [np.asarray(k, np.int32) for k in self.kept_keys]
    return [rule_keys(self.key_rule, num_keys, self.keys_kept, self.num_heads,
                      self.key_seed + i) for i in range(n)]

  @nn.compact
  def __call__(self, x, train: bool = False):
    x, dt, skipped = encoder_input(self, x, train)
    t, h, k = x.shape[1], self.num_heads, self.basis_rank
    keys = self.block_keys(t) if self.keys_kept else []
    block = nn.remat(EncoderBlock, static_argnums=(2,)) if self.remat else EncoderBlock
    for i in range(self.depth):
      fn = None
      if self.keys_kept and i >= self.eigen_from_layer:
        if self.basis_init == "random":
          basis = self.param(f"eigen_basis_{i}", lambda rng: random_basis(rng, t, k, (h,)))
        else:
          init_basis = jnp.tile(jnp.asarray(dct_basis(t, k))[None], (h, 1, 1))
          basis = self.param(f"eigen_basis_{i}", lambda *_: init_basis)
        mean = self.param(f"eigen_mean_{i}", nn.initializers.zeros, (h, t), jnp.float32)
        fn = functools.partial(partial_attention, basis=basis, mean=mean,
                               keys=jnp.asarray(keys[i - self.eigen_from_layer]))
      parts = skipped.get(i, frozenset())
      x = block(self.num_heads, self.mlp_dim, self.dropout_rate,
                skip_attention="attention" in parts, skip_mlp="mlp" in parts,
                attention=self.attention, attention_impl=self.attention_impl, dtype=dt,
                attention_core=fn, name=f"encoderblock_{i}")(x, train)
    return classifier_head(self, x, dt)


def with_basis(params: dict, bases, means) -> dict:
  """A ViT's `params` plus EigenViT basis params: `bases`/`means` map block i to
  [H, T, k] / [H, T] arrays."""
  out = dict(params)
  for i, u in bases.items():
    out[f"eigen_basis_{i}"] = jnp.asarray(u, jnp.float32)
    out[f"eigen_mean_{i}"] = jnp.asarray(means[i], jnp.float32)
  return out
