"""Synthetic token tasks for the sensitivity study (docs/papers/sensitivity.md §6): ours, and the
paper's set-up as far as it is known.

Of the sensitivity paper's synthetic data model (ICLR 2025 §3.1) only the outline is known
(spec, "Facts from the full paper text", item 1): a synthetic vocabulary with frequent and
sparse tokens, the sparse tokens made uninformative so that the model must use the
frequent ones (a reviewer's paraphrase, not the paper's rule). Everything else is ours.

Ours, `sparse_token_task`: a sequence has n tokens x_i = [c_i ; p e_i] in R^{m + n}:

  * c_i in R^m: the content, m i.i.d. uniform signs scaled by 1/sqrt(m) (unit norm);
  * p e_i: a one-hot position code of scale p (`position_scale`), because a mean-pooled
    attention layer is permutation invariant and could not tell positions apart otherwise.

k fixed relevant positions K (drawn once per seed); b_j = sign of the first content
coordinate of token j; the label is

  rule "majority": y = 1[sum_{j in K} b_j > 0]   (k odd, so no ties)
  rule "parity":   y = 1[prod_{j in K} b_j > 0]

The paper's set-up as known, `vocabulary` + `frequent_sparse_task` (sizes and rule ours):
F frequent and S sparse token ids with unit-norm Gaussian embeddings in R^dim (no position
code: the rule does not depend on positions); each sequence has `sparse_per_sequence`
sparse tokens at uniform random positions and uniform frequent tokens elsewhere, so each
frequent id is far more common than each sparse one; y = 1[sum over the frequent tokens of
their scores w_v > 0], w_v ~ N(0, 1) centred. Sparse ids are drawn independently of y
("uninformative", the paper's as paraphrased) or from the label's half of the sparse ids
("informative", our control, where the sparse tokens alone also give the label).

The generating rules as classifiers of (noised) token embeddings, `sparse_rule` and
`vocab_rule` (nearest-embedding decoding, then the rule): the yardstick of the study, the
flip rate of the true rule when the input tokens are noised.

Boolean-cube tokens (`boolean_tokens`): for f on {±1}^n, token i = [x_i ; p e_i] (m = 1,
content unscaled), so a model of the tokens is a function of x in {±1}^n whose Fourier
spectrum `xsens.measures.boolean` measures exactly over all 2^n inputs.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from xsens import choices
from xsens import boolean_cube

RULES = choices.SPARSE_RULES


def relevant_positions(n: int, k: int, seed: int) -> np.ndarray:
  """k distinct positions of [0, n), sorted, drawn by numpy's default_rng(seed)."""
  return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))


def sparse_token_task(num_examples: int, *, n: int, m: int, k: int, rule: str,
                      position_scale: float, seed: int, positions: np.ndarray) -> dict:
  """{"tokens": float32 [N, n, m + n], "labels": int32 [N] in {0, 1}, "bits": [N, n]}.

  `positions` (the relevant set K) is fixed across the splits of one task; `seed` draws
  the content.
  """
  if rule not in RULES:
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")
  rng = np.random.default_rng(seed)
  content = rng.choice(np.array([-1.0, 1.0], np.float32), size=(num_examples, n, m))
  bits = content[:, :, 0]
  rel = bits[:, positions]
  if rule == "majority":
    labels = (rel.sum(1) > 0).astype(np.int32)
  else:
    labels = (rel.prod(1) > 0).astype(np.int32)
  pos = np.broadcast_to(position_scale * np.eye(n, dtype=np.float32), (num_examples, n, n))
  tokens = np.concatenate([content / np.sqrt(m), pos], axis=-1).astype(np.float32)
  return {"tokens": tokens, "labels": labels, "bits": bits.astype(np.float32)}


def boolean_tokens(n: int, position_scale: float) -> np.ndarray:
  """Tokens of every x in {±1}^n in `boolean_cube.all_inputs` order: float32 [2^n, n, 1 + n]."""
  x = np.asarray(boolean_cube.all_inputs(n))
  pos = np.broadcast_to(position_scale * np.eye(n, dtype=np.float32), (x.shape[0], n, n))
  return np.concatenate([x[:, :, None], pos], axis=-1).astype(np.float32)


def boolean_target(n: int, components) -> tuple[np.ndarray, list[dict]]:
  """f = sum_c coef_c chi_{S_c} on all 2^n inputs: values float32 [2^n] and the parsed
  components [{"coords", "degree", "coef", "index"}] (`components`: (coords, coef) pairs)."""
  values = np.zeros(2**n, np.float32)
  parsed = []
  for coords, coef in components:
    coords = tuple(int(c) for c in coords)
    values += float(coef) * np.asarray(boolean_cube.monomial_values(n, coords))
    parsed.append({"coords": coords, "degree": len(coords), "coef": float(coef),
                   "index": boolean_cube.subset_index(n, coords)})
  return values, parsed


# ------------------------------------------------------------------------------------------
# Frequent and sparse tokens of a vocabulary: the paper's set-up as far as it is known.
#
# What is known of the paper's synthetic task (ICLR 2025 §3.1; one reviewer's paraphrase,
# not the paper's rule): a synthetic vocabulary with frequent and sparse tokens, where the
# sparse tokens are made uninformative so the model must use the frequent ones. Every
# detail below is our choice.

SPARSE_CUES = choices.SPARSE_CUES


def vocabulary(*, num_frequent: int, num_sparse: int, dim: int, seed: int) -> dict:
  """A synthetic vocabulary: {"embeddings" float32 [F + S, dim], "weights" float32 [F],
  "sparse_class" int32 [S], "num_frequent" F}.

  Ids 0..F-1 are the frequent tokens, F..F+S-1 the sparse ones. Embeddings are i.i.d.
  Gaussian, normalised to unit norm; each frequent token has a score w_v ~ N(0, 1),
  centred over the F tokens (so labels are balanced); sparse token F + j belongs to
  class j mod 2 (used only by the informative control).
  """
  rng = np.random.default_rng(seed)
  emb = rng.normal(size=(num_frequent + num_sparse, dim))
  emb /= np.linalg.norm(emb, axis=1, keepdims=True)
  w = rng.normal(size=num_frequent)
  w -= w.mean()
  return {"embeddings": emb.astype(np.float32), "weights": w.astype(np.float32),
          "sparse_class": (np.arange(num_sparse) % 2).astype(np.int32),
          "num_frequent": int(num_frequent)}


def frequent_score(ids: np.ndarray, vocab: dict) -> np.ndarray:
  """The generating rule's score sum_{i: id_i frequent} w_{id_i} of ids [..., n]."""
  w = np.concatenate([vocab["weights"], np.zeros(len(vocab["sparse_class"]), np.float32)])
  return w[ids].sum(-1)


def frequent_sparse_task(num_examples: int, *, vocab: dict, n: int, sparse_per_sequence: int,
                         sparse_cue: str, seed: int) -> dict:
  """{"tokens" float32 [N, n, dim], "labels" int32 [N], "ids" int32 [N, n], "is_sparse"
  bool [N, n]}.

  Each sequence has n positions: `sparse_per_sequence` of them (distinct, uniform) hold a
  sparse token, the others a frequent token drawn uniformly from the F frequent ones. So a
  frequent id appears (n - s) / F times per sequence on average, a sparse id s / S times.
  The label is the generating rule y = 1[sum over frequent positions of w_id > 0] (ties
  have probability zero). The sparse ids are drawn

    "uninformative": uniformly from the S sparse ids, independent of the label;
    "informative" (control): uniformly from the S/2 sparse ids of class y, so the sparse
      tokens alone also give the label (both cues agree on every example).
  """
  if sparse_cue not in SPARSE_CUES:
    raise ValueError(f"sparse_cue must be one of {SPARSE_CUES}, got {sparse_cue!r}.")
  f = vocab["num_frequent"]
  num_sparse = len(vocab["sparse_class"])
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, f, size=(num_examples, n))
  order = np.argsort(rng.random((num_examples, n)), axis=1)
  is_sparse = np.zeros((num_examples, n), bool)
  np.put_along_axis(is_sparse, order[:, :sparse_per_sequence], True, axis=1)
  labels = (frequent_score(np.where(is_sparse, f, ids), vocab) > 0).astype(np.int32)
  if sparse_cue == "uninformative":
    sparse_ids = f + rng.integers(0, num_sparse, size=(num_examples, n))
  else:
    if num_sparse % 2:
      raise ValueError(f"the informative cue needs an even number of sparse ids, got "
                       f"{num_sparse}.")
    half = rng.integers(0, num_sparse // 2, size=(num_examples, n))
    sparse_ids = f + 2 * half + labels[:, None]
  ids = np.where(is_sparse, sparse_ids, ids).astype(np.int32)
  return {"tokens": vocab["embeddings"][ids], "labels": labels, "ids": ids,
          "is_sparse": is_sparse}


def decode_nearest(tokens, embeddings):
  """The id of the nearest embedding (Euclidean) of every token: [..., d] -> [...] int.

  Works on NumPy and JAX arrays alike (jnp in, jnp out)."""
  xp = np if isinstance(tokens, np.ndarray) else jnp
  d2 = (xp.sum(tokens**2, -1)[..., None] - 2 * tokens @ embeddings.T
        + xp.sum(embeddings**2, -1))
  return xp.argmin(d2, axis=-1)


# ------------------------------------------------------------------------------------------
# The generating rules as classifiers of token embeddings (the yardstick: the flip rate of
# the rule itself when the INPUT tokens are noised). Each is an apply_fn(variables, tokens
# [B, n, d]) -> logits [B, 2] = [-score, score] (argmax 1 iff score > 0, the label), so the
# measures of `xsens.measures` take them as they take a model.


def _majority_rule(variables, tokens):
  bits = jnp.sign(tokens[:, variables["positions"], 0])          # [B, k]
  score = bits.sum(-1)
  return jnp.stack([-score, score], -1)


def _parity_rule(variables, tokens):
  score = jnp.prod(jnp.sign(tokens[:, variables["positions"], 0]), -1)
  return jnp.stack([-score, score], -1)


def sparse_rule(rule: str):
  """(apply_fn, make_variables(positions)) of `sparse_token_task`'s rule on tokens: the sign
  of the first content coordinate of each relevant token (the bit b_j, also of a noised
  token), then their majority or parity."""
  if rule not in RULES:
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")
  fn = _majority_rule if rule == "majority" else _parity_rule
  return fn, lambda positions: {"positions": jnp.asarray(positions, jnp.int32)}


def vocab_rule(variables, tokens):
  """`frequent_sparse_task`'s rule on tokens: every token decoded to its nearest embedding,
  then score = sum of the frequent scores w_id (0 for sparse ids). variables: {"embeddings"
  [V, d], "scores" [V]} (`vocab_rule_variables`)."""
  ids = decode_nearest(tokens, variables["embeddings"])
  score = variables["scores"][ids].sum(-1)
  return jnp.stack([-score, score], -1)


def vocab_rule_variables(vocab: dict) -> dict:
  scores = np.concatenate([vocab["weights"], np.zeros(len(vocab["sparse_class"]), np.float32)])
  return {"embeddings": jnp.asarray(vocab["embeddings"]), "scores": jnp.asarray(scores)}
