"""Cloze evaluation of a masked LM (`xsens.models.mlm.RobertaMLM`): the `masked_lm`
objective term at one position per row, batched argmax accuracy, recall of a knowledge
base and the facts a model knows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xsens.train import objectives


MLM_TERM = objectives.make_term("mlm", "masked_lm", 1.0, {})


def mlm_loss(model, params, ids, positions, targets):
  """(loss, accuracy) of the `masked_lm` objective term at one position per row."""
  logits = model.apply({"params": params}, ids, positions, method=model.at_positions)
  loss, aux, _ = objectives.total_loss([MLM_TERM], None, params,
                                       {"logits": logits, "label": targets}, None, {})
  return loss, aux["mlm/accuracy"]


def make_accuracy(model, batch_size: int):
  """A jitted `(params, {"ids" [N, L], "position" [N], "target" [N]}) -> accuracy`, in
  batches of `batch_size` (a lax.map), and a jitted `(params, ids, positions) -> argmax
  token [N]`."""
  def predictions(params, ids, positions):
    n = ids.shape[0]
    pad = (-n) % batch_size
    ids_p = jnp.pad(ids, ((0, pad), (0, 0))).reshape(-1, batch_size, ids.shape[1])
    pos_p = jnp.pad(positions, (0, pad)).reshape(-1, batch_size)
    one = lambda a: jnp.argmax(model.apply({"params": params}, a[0], a[1],
                                           method=model.at_positions), -1)
    return jax.lax.map(one, (ids_p, pos_p)).reshape(-1)[:n]

  def acc(params, split):
    pred = predictions(params, split["ids"], split["position"])
    return jnp.mean((pred == split["target"]).astype(jnp.float32))

  return jax.jit(acc), jax.jit(predictions)


def recall(acc_fn, params, corp: dict, objects: np.ndarray) -> dict:
  """Sentence accuracy on every training-template sentence ("recall"), on the paraphrases
  ("recall_para") and on held-out background sentences ("background")."""
  out = {}
  for name, split in (("recall", corp["facts"]), ("recall_para", corp["para"])):
    target = jnp.asarray(objects[split["fact"]])
    out[name] = float(acc_fn(params, {"ids": jnp.asarray(split["ids"]),
                                      "position": jnp.asarray(split["position"]),
                                      "target": target}))
  out["background"] = float(acc_fn(params, jax.tree.map(jnp.asarray, corp["bg_test"])))
  return out


def known_facts(pred_fn, params, corp: dict, objects: np.ndarray, num_facts: int
                ) -> np.ndarray:
  """[F] bool: every training-template sentence of the fact is answered correctly."""
  f = corp["facts"]
  pred = np.asarray(pred_fn(params, jnp.asarray(f["ids"]), jnp.asarray(f["position"])))
  wrong = np.bincount(f["fact"], weights=pred != objects[f["fact"]], minlength=num_facts)
  seen = np.bincount(f["fact"], minlength=num_facts)
  return (wrong == 0) & (seen > 0)
