"""Batches of a cloze knowledge study (`xsens.data.knowledge`): the padded corpus, the
pre-training mix of fact and background sentences, and the sets of one edit (modified
sentences, replayed ones and the evaluation splits). Batches are pure functions of
(arrays, step, key)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xsens.data import knowledge
from xsens.data import text


def _widen(ids: np.ndarray, length: int) -> np.ndarray:
  return np.pad(ids, ((0, 0), (0, length - ids.shape[1])))


def corpus(data: knowledge.ClozeData, *, num_train: int, num_test: int, max_clauses: int,
           seed: int, validation_templates: int = 1) -> dict:
  """Every array of a cloze study at one sequence length L: {"facts": `data`'s training
  split ids/position/fact, "para": its held-out split, "para_val" / "para_test": that
  split cut by `knowledge.split_heldout(.., validation_templates)` (model choice /
  reported figures), "bg_train", "bg_test" (`num_train` / `num_test` background sentences
  of the synthetic language, ids/position/target), "length": L}; numpy."""
  length = max(data.max_length, text.synthetic_max_tokens(max_clauses))
  counts = {"train": num_train, "test": num_test}
  bg = {name: knowledge.background_cloze(counts[name], seed, stream=stream, length=length,
                                         max_clauses=max_clauses)
        for stream, name in enumerate(("train", "test"))}
  widen = lambda split: {**split, "ids": _widen(split["ids"], length)}
  para = widen(data.heldout)
  para_val, para_test = knowledge.split_heldout(para, validation_templates)
  return {"facts": widen(data.train), "para": para, "para_val": para_val,
          "para_test": para_test, "bg_train": bg["train"], "bg_test": bg["test"],
          "length": length}


def _sample(key, n: int, count: int) -> jax.Array:
  return jax.random.randint(key, (count,), 0, n)


def pretrain_batch(arrays: dict, step, key, num_facts_rows: int, num_bg_rows: int):
  """(ids, positions, targets) of step `step`: rows drawn uniformly with replacement from
  the fact sentences and the background sentences, from fold_in(key, step) only."""
  k = jax.random.fold_in(key, step)
  kf, kb = jax.random.split(k)
  parts = []
  if num_facts_rows:
    i = _sample(kf, arrays["f_ids"].shape[0], num_facts_rows)
    parts.append((arrays["f_ids"][i], arrays["f_pos"][i], arrays["f_target"][i]))
  if num_bg_rows:
    i = _sample(kb, arrays["b_ids"].shape[0], num_bg_rows)
    parts.append((arrays["b_ids"][i], arrays["b_pos"][i], arrays["b_target"][i]))
  return tuple(jnp.concatenate(x) for x in zip(*parts))


def pretrain_arrays(corp: dict, objects: np.ndarray) -> dict:
  f = corp["facts"]
  return {"f_ids": jnp.asarray(f["ids"]), "f_pos": jnp.asarray(f["position"]),
          "f_target": jnp.asarray(objects[f["fact"]]),
          "b_ids": jnp.asarray(corp["bg_train"]["ids"]),
          "b_pos": jnp.asarray(corp["bg_train"]["position"]),
          "b_target": jnp.asarray(corp["bg_train"]["target"])}


def edit_batch(arrays: dict, step, key, num_replay: int):
  """(ids, positions, targets, is_replay) of one edit step: every modified sentence (with
  its new object) then `num_replay` unmodified training sentences drawn uniformly with
  replacement from fold_in(key, step)."""
  ids, pos, tgt = arrays["s_ids"], arrays["s_pos"], arrays["s_target"]
  replay = jnp.zeros(ids.shape[0], bool)
  if num_replay:
    i = _sample(jax.random.fold_in(key, step), arrays["u_ids"].shape[0], num_replay)
    ids = jnp.concatenate([ids, arrays["u_ids"][i]])
    pos = jnp.concatenate([pos, arrays["u_pos"][i]])
    tgt = jnp.concatenate([tgt, arrays["u_target"][i]])
    replay = jnp.concatenate([replay, jnp.ones(num_replay, bool)])
  return ids, pos, tgt, replay


def edit_sets(corp: dict, data: knowledge.ClozeData, chosen: np.ndarray, new: np.ndarray,
              num_unmodified: int, seed: int) -> dict:
  """The arrays of one edit: S's training sentences ("s_*", new objects), the unmodified
  training sentences to replay ("u_*"), and the evaluation splits "eval": A_M / A_FS on
  the test paraphrases (`corp["para_test"]`, the reported figures), A_M_val / A_FS_val on
  the validation paraphrases (model choice), A_M_train / A_FS_train on the training
  sentences, `background`; the A_FS* sets hold `num_unmodified` sampled sentences of
  unmodified facts, each {"ids", "position", "target" (objects after the edit)}."""
  objects = knowledge.modified_objects(data.facts, chosen, new)
  unmodified = np.setdiff1d(np.arange(len(data.facts)), chosen)
  rng = np.random.default_rng([seed, 31])

  def take(split, rows):
    return {"ids": jnp.asarray(split["ids"][rows]),
            "position": jnp.asarray(split["position"][rows]),
            "target": jnp.asarray(objects[split["fact"][rows]])}

  def sample(rows):
    return np.sort(rng.permutation(rows)[:num_unmodified])

  facts = corp["facts"]
  s = take(facts, knowledge.sentences_of(facts, chosen))
  u = take(facts, knowledge.sentences_of(facts, unmodified))
  ev = {}
  for suffix, split in (("", corp["para_test"]), ("_val", corp["para_val"]),
                        ("_train", facts)):
    ev[f"A_M{suffix}"] = take(split, knowledge.sentences_of(split, chosen))
    ev[f"A_FS{suffix}"] = take(split, sample(knowledge.sentences_of(split, unmodified)))
  ev["background"] = jax.tree.map(jnp.asarray, corp["bg_test"])
  return {"s_ids": s["ids"], "s_pos": s["position"], "s_target": s["target"],
          "u_ids": u["ids"], "u_pos": u["position"], "u_target": u["target"], "eval": ev}
