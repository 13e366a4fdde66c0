"""Synthetic token tasks whose label depends on a few tokens (our design; spec §6).

The sensitivity paper's synthetic data model (§3.1) is not known (spec §6, §10); this is
ours. A sequence has n tokens x_i = [c_i ; p e_i] in R^{m + n}:

  * c_i in R^m: the content, m i.i.d. uniform signs scaled by 1/sqrt(m) (unit norm);
  * p e_i: a one-hot position code of scale p (`position_scale`), because a mean-pooled
    attention layer is permutation invariant and could not tell positions apart otherwise.

Sparse-token classification (`sparse_token_task`): k fixed relevant positions K (drawn
once per seed); b_j = sign of the first content coordinate of token j; the label is

  rule "majority": y = 1[sum_{j in K} b_j > 0]   (k odd, so no ties)
  rule "parity":   y = 1[prod_{j in K} b_j > 0]

Boolean-cube tokens (`boolean_tokens`): for f on {±1}^n, token i = [x_i ; p e_i] (m = 1,
content unscaled), so a model of the tokens is a function of x in {±1}^n whose Fourier
spectrum `xsens.measures.boolean` measures exactly over all 2^n inputs.
"""

from __future__ import annotations

import numpy as np

from xsens import boolean_cube

RULES = ("majority", "parity")


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
