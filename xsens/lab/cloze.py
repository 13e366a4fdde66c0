"""Cloze evaluation of a masked LM (`xsens.models.mlm.RobertaMLM`): the `masked_lm`
objective term at one position per row, the argmax accuracy of a split inside a jitted
program, and, over a split on the host (`evaluators.over_split`), recall of a knowledge
base and the facts a model knows."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from xsens.train import evaluators, objectives


MLM_TERM = objectives.make_term("mlm", "masked_lm", 1.0, {})


def mlm_loss(model, params, ids, positions, targets):
  """(loss, accuracy) of the `masked_lm` objective term at one position per row."""
  logits = model.apply({"params": params}, ids, positions, method=model.at_positions)
  loss, aux, _ = objectives.total_loss([MLM_TERM], None, params,
                                       {"logits": logits, "label": targets}, None, {})
  return loss, aux["mlm/accuracy"]


def make_accuracy(model, batch_size: int):
  """A jitted `(params, {"ids" [N, L], "position" [N], "target" [N]}) -> accuracy` that
  traces inside another jitted program (e.g. vmapped over a grid of params): the split
  is padded to batches of `batch_size` and mapped with `lax.map`."""
  def acc(params, split):
    ids, positions = split["ids"], split["position"]
    n = ids.shape[0]
    pad = (-n) % batch_size
    ids_p = jnp.pad(ids, ((0, pad), (0, 0))).reshape(-1, batch_size, ids.shape[1])
    pos_p = jnp.pad(positions, (0, pad)).reshape(-1, batch_size)
    one = lambda a: jnp.argmax(model.apply({"params": params}, a[0], a[1],
                                           method=model.at_positions), -1)
    pred = jax.lax.map(one, (ids_p, pos_p)).reshape(-1)[:n]
    return jnp.mean((pred == split["target"]).astype(jnp.float32))

  return jax.jit(acc)


@functools.lru_cache(maxsize=None)
def _cloze_fn(model):
  """`fn(batch, params)` -> {"pred" [B] argmax token at batch["position"], "correct" [B]
  float32 against batch["target"]}; one per model (modules hash by value)."""
  def fn(batch, params):
    logits = model.apply({"params": params}, batch["ids"], batch["position"],
                         method=model.at_positions)
    pred = jnp.argmax(logits, -1)
    return {"pred": pred, "correct": (pred == batch["target"]).astype(jnp.float32)}
  return fn


def accuracy(model, params, split: dict, batch_size: int) -> float:
  """Argmax accuracy of `params` on `split` {"ids" [N, L], "position" [N], "target" [N]}
  (host arrays), over batches of `batch_size`; the float32 quotient of the correct count
  and N, as `make_accuracy`'s mean."""
  arrays = {k: np.asarray(split[k]) for k in ("ids", "position", "target")}
  sums = evaluators.over_split(_cloze_fn(model), arrays, args=(params,), reduce="sum",
                               batch_size=batch_size)
  return float(np.float32(sums["correct"]) / np.float32(len(arrays["target"])))


def recall(model, params, corp: dict, objects: np.ndarray, batch_size: int) -> dict:
  """Sentence accuracy on every training-template sentence ("recall"), on the paraphrases
  ("recall_para") and on held-out background sentences ("background")."""
  out = {}
  for name, split in (("recall", corp["facts"]), ("recall_para", corp["para"])):
    out[name] = accuracy(model, params, {"ids": split["ids"], "position": split["position"],
                                         "target": objects[split["fact"]]}, batch_size)
  out["background"] = accuracy(model, params, corp["bg_test"], batch_size)
  return out


def known_facts(model, params, corp: dict, objects: np.ndarray, num_facts: int,
                batch_size: int) -> np.ndarray:
  """[F] bool: every training-template sentence of the fact is answered correctly."""
  f = corp["facts"]
  split = {"ids": np.asarray(f["ids"]), "position": np.asarray(f["position"]),
           "target": np.asarray(objects[f["fact"]])}
  pred = evaluators.over_split(_cloze_fn(model), split, args=(params,), reduce="concat",
                               batch_size=batch_size)["pred"]
  wrong = np.bincount(f["fact"], weights=pred != objects[f["fact"]], minlength=num_facts)
  seen = np.bincount(f["fact"], minlength=num_facts)
  return (wrong == 0) & (seen > 0)
