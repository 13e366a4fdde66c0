"""The modular-addition transformer of the grokking study
(`xsens.models.grokking_transformer`): initial weights in the official layout, the
sensitivity of its embeddings and its weight norm."""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from xsens import paths
from xsens.errors import require
from xsens.measures import sensitivity as sens_lib
from xsens.models import grokking_transformer as gt


def load_init_npz(config) -> dict:
  """`model.init_npz` -> our params tree, every leaf float32 [S, ...] (S = train.num_seeds).

  The file holds the official state_dict arrays (`grokking_transformer.official_shapes`),
  each of the official shape (broadcast to every seed) or [S, *shape]. ConfigError naming
  `model.init_npz` for a missing file or key, an extra key, a shape of other sizes or
  seeds, or a non-finite value.
  """
  path, m = config.model.init_npz, config.model
  p, num_seeds = int(config.data.modulus), int(config.train.num_seeds)
  require(paths.isfile(path), "model.init_npz", f"no file {path!r}")
  shapes = gt.official_shapes(p + 1, p + 1, int(m.width), int(m.mlp_dim))
  state = paths.load_npz(path)
  missing, extra = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
  require(not missing and not extra, "model.init_npz",
          f"{path!r} must hold exactly the official keys {sorted(shapes)}; missing {missing}, "
          f"unexpected {extra}")
  stacked = all(state[k].shape == (num_seeds, *shapes[k]) for k in shapes)
  for k, shape in shapes.items():
    ok = state[k].shape == shape or state[k].shape == (num_seeds, *shape)
    require(ok and (stacked or state[k].shape == shape), "model.init_npz",
            f"{path!r}: {k!r} has shape {state[k].shape}; data.modulus={p}, model.width="
            f"{m.width}, model.mlp_dim={m.mlp_dim} and train.num_seeds={num_seeds} need "
            f"{shape} (every seed) or {(num_seeds, *shape)} (one per seed), the same for "
            "every key")
    require(np.issubdtype(state[k].dtype, np.floating) and np.all(np.isfinite(state[k])),
            "model.init_npz", f"{path!r}: {k!r} must hold finite floats")
  state = {k: np.asarray(v, np.float32) if stacked else
           np.broadcast_to(np.asarray(v, np.float32), (num_seeds, *v.shape))
           for k, v in state.items()}
  return gt.from_official(state)


def file_sha256(path: str) -> str:
  return hashlib.sha256(paths.read_bytes(path)).hexdigest()


# ------------------------------------------------------------------------------------------
# Model, optimiser and the jitted chunk of epochs.


def weight_norm(params) -> jax.Array:
  """sqrt(sum of squares of every parameter) (the notebook's total_norm)."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(params)))


def embedding_sensitivity(apply_fn, variables, inputs, *, labels, key, sigma, token_mask):
  """Flip fraction of argmax apply_fn(variables, inputs + E) vs `labels` [B], one draw each.

  inputs: the embeddings [B, T, d]; apply_fn: the model's from-embeddings method (bound
  with `method=`). E = sigma * normal(fold_in(key, 0), [B, T, d]) on the positions where
  token_mask [T] is True, zero elsewhere (`global_sensitivity` with num_draws = 1, one
  forward call): the official code's noise on the embeddings of a and b together, "="
  untouched (docs/papers/sensitivity.md §5).
  """
  out = sens_lib.global_sensitivity(apply_fn, variables, inputs, labels=labels, key=key,
                                    sigma=sigma, num_draws=1, token_mask=token_mask,
                                    chunk_size=None, example_chunk_size=None)
  return out["mean"]


def embedding_rms(model, params, ids, positions) -> jax.Array:
  """Root-mean-square coordinate of the embeddings (token + position) that the
  sensitivity noise is added to: positions `positions` of every row of `ids` [B, T]. The
  sensitivity's noise-to-signal ratio is sigma / this (it changes as training shrinks the
  embeddings)."""
  tokens = model.apply({"params": params}, ids, method=model.embed)
  return jnp.sqrt(jnp.mean(jnp.square(tokens[:, list(positions)])))
