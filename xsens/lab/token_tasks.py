"""The synthetic token tasks of the synthetic_sensitivity study (`xsens.data.sparse_tokens`):
a task's data and generating rule for one seed, and the token-wise sensitivity rows of a
model or of the rule (`xsens.measures.token_sensitivity`, common random numbers per σ)."""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xsens.data import sparse_tokens as st
from xsens.measures import sensitivity as sens_lib
from xsens.models import one_layer_attention as ola
from xsens.train.progress import progress

def attention_num_params(d: int, num_outputs: int, qk_dim=None, v_dim=None) -> int:
  """Parameters of `OneLayerAttention` on tokens of dimension d (no biases)."""
  qk, v = qk_dim or d, v_dim or d
  return 2 * d * qk + d * v + v * num_outputs


def matched_width(attention_config, token_shape, num_outputs: int) -> int:
  """The hidden width of the one-hidden-layer MLP on tokens of shape (n, d) whose parameter
  count is closest to the attention layer's (`attention_config`: qk_dim, v_dim) on them."""
  n, d = token_shape
  a = attention_config
  return ola.matched_mlp_width(n * d, num_outputs,
                               attention_num_params(d, num_outputs, a.qk_dim, a.v_dim))


# Token groups of each task family: (in the rule's support, the rest).
GROUPS = {"sparse": ("relevant", "other"), "vocab": ("sparse", "frequent")}


def _apply_of(owner):
  """A flax model's apply, or a rule's apply_fn itself."""
  return owner.apply if isinstance(owner, nn.Module) else owner


@functools.lru_cache(maxsize=None)
def init_fn(model):
  """jit (key, x) -> the model's params; one compilation per (equal) model and shape."""
  return jax.jit(lambda key, x: model.init(key, x)["params"])


@functools.lru_cache(maxsize=None)
def sensitivity_fn(owner, *, num_draws: int, chunk_size: int):
  """jit (variables, tokens [B, n, d], key, sigma) -> token_sensitivity's dict for `owner`
  (a flax model, cached by value, or a rule's apply_fn; the weights are an argument, not a
  constant of the compiled function, so one compilation serves every seed)."""
  apply_fn = _apply_of(owner)

  @jax.jit
  def measure(variables, tokens, key, sigma):
    return sens_lib.token_sensitivity(apply_fn, variables, tokens, key=key, sigma=sigma,
                                      num_draws=num_draws, chunk_size=chunk_size,
                                      example_chunk_size=None)
  return measure


@functools.lru_cache(maxsize=None)
def accuracy_fn(owner):
  apply_fn = _apply_of(owner)
  return jax.jit(lambda variables, x, y: jnp.mean(jnp.argmax(apply_fn(variables, x), -1) == y))


def task_data(sec, task: str, seed: int) -> dict:
  """The train / test sets of `task` for `seed` (`sec`: the study's `sparse` or `vocab`
  config section), the token groups of the training set
  ([N, n] bool: relevant or sparse tokens), and the generating rule (apply_fn, variables).

  "vocab_informative" also holds `shifted`: the test sequences with their sparse ids
  redrawn independently of the label (the same frequent tokens, positions and labels)."""
  if task == "sparse":
    s = sec
    positions = st.relevant_positions(int(s.n), int(s.k), seed)
    kw = dict(n=int(s.n), m=int(s.m), k=int(s.k), rule=s.rule,
              position_scale=float(s.position_scale), positions=positions)
    train = st.sparse_token_task(int(s.num_train), seed=seed * 2 + 1, **kw)
    test = st.sparse_token_task(int(s.num_test), seed=seed * 2 + 2, **kw)
    group = np.zeros(train["tokens"].shape[:2], bool)
    group[:, positions] = True
    fn, make_vars = st.sparse_rule(s.rule)
    return {"train": train, "test": test, "shifted": None, "group": group,
            "groups": GROUPS["sparse"], "rule": (fn, make_vars(positions)),
            "positions": positions.tolist()}
  v = sec
  cue = task[len("vocab_"):]
  vocab = st.vocabulary(num_frequent=int(v.num_frequent), num_sparse=int(v.num_sparse),
                        dim=int(v.dim), seed=seed * 3)
  kw = dict(vocab=vocab, n=int(v.n), sparse_per_sequence=int(v.sparse_per_sequence))
  train = st.frequent_sparse_task(int(v.num_train), sparse_cue=cue, seed=seed * 3 + 1, **kw)
  test = st.frequent_sparse_task(int(v.num_test), sparse_cue=cue, seed=seed * 3 + 2, **kw)
  shifted = None
  if cue == "informative":
    shifted = st.frequent_sparse_task(int(v.num_test), sparse_cue="uninformative",
                                      seed=seed * 3 + 2, **kw)
  return {"train": train, "test": test, "shifted": shifted, "group": train["is_sparse"],
          "groups": GROUPS["vocab"], "rule": (st.vocab_rule, st.vocab_rule_variables(vocab)),
          "positions": None}


def measure_rows(owner, variables, data, sec, seed: int, base: dict) -> tuple[list, dict]:
  """One row per σ (base + sensitivity, its s.e., per-group flip rates) and the per-position
  profile {σ: [n]} of `owner` (a flax model or a rule's apply_fn) on the training set."""
  x = jnp.asarray(data["train"]["tokens"])
  n, d = x.shape[1:]
  group = data["group"]
  g_in, g_out = data["groups"]
  token_norm = float(np.linalg.norm(data["train"]["tokens"], axis=-1).mean())
  measure = sensitivity_fn(owner, num_draws=int(sec.num_draws), chunk_size=int(n))
  rows, profile = [], {}
  for j, sigma in enumerate(progress(sec.sigmas, desc="σ sweep", unit="σ")):
    # Common random numbers: the same noise for every model and the rule at each sigma.
    out = measure(variables, x, jax.random.fold_in(jax.random.key(seed + 1000), j),
                  float(sigma))
    per_token = np.asarray(out["per_token"])
    profile[float(sigma)] = per_token.mean(0).tolist()
    rows.append({**base, "sigma": float(sigma),
                 "noise_to_token_norm": float(sigma) * math.sqrt(d) / token_norm,
                 "sensitivity": float(out["mean"]), "stderr": float(out["stderr"]),
                 f"{g_in}_tokens": float(per_token[group].mean()),
                 f"{g_out}_tokens": float(per_token[~group].mean())
                 if (~group).any() else float("nan")})
  return rows, profile
