"""Cloze knowledge for the `modify_memories` study (Zhu et al., arXiv 2012.00363).

Two sources give the same `ClozeData` (numpy, int32 token ids right-padded with 0):

  * `synthetic_knowledge(seed, ...)` (the offline default): a knowledge base of
    `num_subjects` x `num_relations` facts (subject, relation, object), deterministic from
    the seed. Each relation has its own object set; a fraction of the relations is
    "many-to-one" (a few objects shared by many subjects), the others draw from a larger
    set; objects follow a Zipf law (p_k ∝ 1 / (k + 1)), so object frequencies differ, as
    the paper's new-object sampling (∝ frequency) needs. Each relation renders its facts
    through `num_train_templates` training templates and `num_heldout_templates` held-out
    paraphrases, drawn per relation from `PATTERNS` by an independent permutation, so a
    relation's held-out patterns are never rendered for it in training text. A held-out
    pattern is usually a training pattern of some other relation, but nothing enforces
    it: for some seeds (e.g. 3 and 4 of the default sizes) a pattern is held out
    everywhere it is drawn, and its paraphrases use wording the model never saw. Subjects, relation words and objects are single tokens.
  * `read_lama_trex(data_dir, ...)`: a LAMA / T-REx cloze set in LAMA's layout (below).

Token ids: 0..3 are the shared specials of `xsens.data.text` (<pad>, <s>, </s>, <unk>),
4..67 the words of its synthetic language (so background sentences of
`xsens.data.text.synthetic_language` keep their ids), `MASK_ID` = 68 the [MASK] token,
then the knowledge tokens. A cloze sentence is "<s> words </s>" with one [MASK].

`ClozeData` fields (N sentences of length L):
  vocab         tuple of V token strings (index = id)
  facts         [F, 3] int32: subject index, relation index, object token id
  train         {"ids" [N, L], "position" [N] (the [MASK]), "fact" [N]}: training text
  heldout       the same for the held-out paraphrases (LAMA: the relation's template probe),
                plus "template" [N]: the paraphrase's index among its relation's held-out
                templates (LAMA: 0); `split_heldout` cuts it into validation and test
  relation_names, subject_names: strings of the relation / subject indices
A sentence's target is `facts[fact, 2]`; an edit replaces that column (`modified_objects`).

LAMA layout (github.com/facebookresearch/LAMA, data/; the files its download script
unpacks):
  data_dir/relations.jsonl    one JSON per line: {"relation": "P19",
                              "template": "[X] was born in [Y] .", "type": "N-1", ...}
  data_dir/TREx/<relation>.jsonl   one fact per line: {"sub_label": "...", "obj_label":
                              "...", "predicate_id": "P19", "masked_sentences": ["... [MASK]
                              ..."], ...}
Text is split into words and punctuation (`word_tokens`); facts whose object is not one
word, and evidence sentences without exactly one [MASK], are skipped; the evidence
sentences are the training text (the paper's "supporting facts") and the relation's
template with [X] = subject, [Y] = [MASK] the held-out probe, as in the first author's
benchmark code (github.com/zhuchen03/modifying-memory, modify_trex.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence

import numpy as np

from xsens import paths
from xsens.data import text
from xsens.errors import ConfigError

MASK = "[MASK]"
MASK_ID = text.SYNTHETIC_VOCAB
BASE_VOCAB = (*text.SPECIAL_TOKENS, *text.WORDS, MASK)
# Sentence patterns: X the subject, R the relation word, M the [MASK] (the object).
PATTERNS = (
    "the R of X is M .",
    "X 's R is M .",
    "M is the R of X .",
    "for X , the R is M .",
    "X has the R M .",
    "we know the R of X : M .",
    "the R for X was M .",
    "X , its R : M .",
)


@dataclasses.dataclass(frozen=True)
class ClozeData:
  """A knowledge base rendered as cloze sentences (module docstring)."""
  vocab: tuple
  facts: np.ndarray
  train: dict
  heldout: dict
  relation_names: tuple
  subject_names: tuple

  @property
  def mask_id(self) -> int:
    return MASK_ID

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  @property
  def max_length(self) -> int:
    return int(self.train["ids"].shape[1])

  def relation_objects(self, relation: int) -> tuple[np.ndarray, np.ndarray]:
    """(object token ids, their counts among the facts) of one relation, ids sorted."""
    objects = self.facts[self.facts[:, 1] == relation, 2]
    ids, counts = np.unique(objects, return_counts=True)
    return ids.astype(np.int32), counts.astype(np.int64)


def _pad(rows: Sequence[Sequence[int]], length: int) -> np.ndarray:
  out = np.zeros((len(rows), length), np.int32)
  for n, row in enumerate(rows):
    out[n, :len(row)] = row
  return out


def _sentences(rows: list, facts: list, length: int, templates: list | None = None) -> dict:
  """Token rows (each with one MASK_ID) -> {"ids", "position", "fact"[, "template"]}."""
  ids = _pad(rows, length)
  position = np.argmax(ids == MASK_ID, axis=1).astype(np.int32)
  out = {"ids": ids, "position": position, "fact": np.asarray(facts, np.int32)}
  if templates is not None:
    out["template"] = np.asarray(templates, np.int32)
  return out


def synthetic_knowledge(seed: int, *, num_subjects: int = 200, num_relations: int = 6,
                        many_to_one_fraction: float = 0.5, many_to_one_objects: int = 5,
                        objects_per_relation: int = 20, num_train_templates: int = 3,
                        num_heldout_templates: int = 2) -> ClozeData:
  """The synthetic knowledge base (module docstring); deterministic in all arguments.

  Relations 0 .. round(many_to_one_fraction * R) - 1 take `many_to_one_objects` objects,
  the rest `objects_per_relation`. Every subject has one object per relation. Sentences are
  fact-major: fact f = subject * R + relation, its training sentences in template order.
  """
  if num_train_templates + num_heldout_templates > len(PATTERNS):
    raise ValueError(f"at most {len(PATTERNS)} templates per relation, got "
                     f"{num_train_templates} + {num_heldout_templates}")
  rng = np.random.default_rng([seed, 19])
  vocab = list(BASE_VOCAB)
  index = {w: i for i, w in enumerate(vocab)}

  def token(word: str) -> int:
    if word not in index:
      index[word] = len(vocab)
      vocab.append(word)
    return index[word]

  for pattern in PATTERNS:
    for word in pattern.split():
      if word not in ("X", "R", "M"):
        token(word)
  relation_words = [token(f"rel{r}") for r in range(num_relations)]
  subject_words = [token(f"subj{s}") for s in range(num_subjects)]
  num_many = int(round(many_to_one_fraction * num_relations))
  facts = np.zeros((num_subjects * num_relations, 3), np.int32)
  for r in range(num_relations):
    k = many_to_one_objects if r < num_many else objects_per_relation
    objects = np.asarray([token(f"obj{r}_{j}") for j in range(k)])
    zipf = 1.0 / np.arange(1, k + 1)
    drawn = rng.choice(objects, size=num_subjects, p=zipf / zipf.sum())
    rows = np.arange(num_subjects) * num_relations + r
    facts[rows] = np.stack([np.arange(num_subjects), np.full(num_subjects, r), drawn], 1)
  templates = [rng.permutation(len(PATTERNS)) for _ in range(num_relations)]
  train_of = [t[:num_train_templates] for t in templates]
  heldout_of = [t[num_train_templates:num_train_templates + num_heldout_templates]
                for t in templates]

  def render(f: int, pattern: int) -> list[int]:
    s, r, _ = facts[f]
    slot = {"X": subject_words[s], "R": relation_words[r], "M": MASK_ID}
    body = [slot[w] if w in slot else index[w] for w in PATTERNS[pattern].split()]
    return [text.BOS_ID, *body, text.EOS_ID]

  length = max(len(p.split()) for p in PATTERNS) + 2
  out = {}
  for name, chosen in (("train", train_of), ("heldout", heldout_of)):
    rows, owners, slots = [], [], []
    for f in range(len(facts)):
      for slot, pattern in enumerate(chosen[facts[f, 1]]):
        rows.append(render(f, int(pattern)))
        owners.append(f)
        slots.append(slot)
    out[name] = _sentences(rows, owners, length, slots if name == "heldout" else None)
  return ClozeData(tuple(vocab), facts, out["train"], out["heldout"],
                   tuple(f"rel{r}" for r in range(num_relations)),
                   tuple(f"subj{s}" for s in range(num_subjects)))


# ------------------------------------------------------------------------------------------
# LAMA / T-REx from a data_dir.

_WORD = re.compile(r"\[MASK\]|\w+|[^\w\s]")


def word_tokens(sentence: str) -> list[str]:
  """Words and punctuation marks of `sentence`; "[MASK]" stays one token."""
  return _WORD.findall(sentence)


def _read_jsonl(path: str) -> list[dict]:
  return [json.loads(line) for line in paths.read_text(path).splitlines() if line.strip()]


def read_lama_trex(data_dir: str, *, relations: Sequence[str] | None = None,
                   max_facts_per_relation: int | None = None, max_length: int = 32
                   ) -> ClozeData:
  """A LAMA / T-REx cloze set from `data_dir` (layout in the module docstring).

  relations: the relation ids to read (None: every relation of relations.jsonl with a
  TREx file). Facts are read in file order (the first `max_facts_per_relation`); word
  tokens enter the vocabulary in order of first appearance after `BASE_VOCAB`. Sentences
  longer than `max_length` tokens (<s>, </s> included) are skipped; a fact without
  training text is skipped. Raises ConfigError naming `data.data_dir` when the layout is
  missing or holds no usable fact.
  """
  rel_file = os.path.join(data_dir, "relations.jsonl")
  if not paths.exists(rel_file):
    raise ConfigError("data.data_dir", f"{data_dir!r} holds no relations.jsonl; prepare "
                      "LAMA's data/ folder there (relations.jsonl and TREx/P*.jsonl, from "
                      "github.com/facebookresearch/LAMA) or use data.source='synthetic'")
  templates = {r["relation"]: r["template"] for r in _read_jsonl(rel_file)}
  chosen = list(templates) if relations is None else list(relations)
  vocab = list(BASE_VOCAB)
  index = {w: i for i, w in enumerate(vocab)}

  def ids_of(words: list[str]) -> list[int]:
    out = []
    for w in words:
      if w not in index:
        index[w] = len(vocab)
        vocab.append(w)
      out.append(index[w])
    return [text.BOS_ID, *out, text.EOS_ID]

  facts, subjects, rel_names = [], {}, []
  rows = {"train": ([], []), "heldout": ([], [])}
  for rel in chosen:
    path = os.path.join(data_dir, "TREx", f"{rel}.jsonl")
    if rel not in templates or not paths.exists(path):
      continue
    r = len(rel_names)
    rel_names.append(rel)
    template = templates[rel].replace("[Y]", MASK)
    for n, item in enumerate(_read_jsonl(path)):
      if max_facts_per_relation is not None and n >= max_facts_per_relation:
        break
      obj = word_tokens(item["obj_label"])
      train = [word_tokens(s) for s in item.get("masked_sentences", [])]
      train = [t for t in train if t.count(MASK) == 1 and len(t) + 2 <= max_length]
      probe = word_tokens(template.replace("[X]", item["sub_label"]))
      if len(obj) != 1 or not train or len(probe) + 2 > max_length:
        continue
      f = len(facts)
      s = subjects.setdefault(item["sub_label"], len(subjects))
      facts.append((s, r, ids_of(obj)[1]))
      for t in train:
        rows["train"][0].append(ids_of(t))
        rows["train"][1].append(f)
      rows["heldout"][0].append(ids_of(probe))
      rows["heldout"][1].append(f)
  if not facts:
    raise ConfigError("data.data_dir", f"{data_dir!r} holds no usable T-REx fact (relations "
                      f"{chosen!r}: a one-word object and a sentence with one [MASK])")
  length = max(len(row) for rs, _ in rows.values() for row in rs)
  split = {k: _sentences(rs, fs, length, [0] * len(fs) if k == "heldout" else None)
           for k, (rs, fs) in rows.items()}
  return ClozeData(tuple(vocab), np.asarray(facts, np.int32), split["train"],
                   split["heldout"], tuple(rel_names), tuple(subjects))


def split_heldout(heldout: dict, num_validation: int) -> tuple[dict, dict]:
  """(validation, test): disjoint row subsets of a held-out split ({"ids", "position",
  "fact", "template"}, N rows). Rows whose `template` < `num_validation` are validation,
  the rest test, so no paraphrase template of a relation is in both. A split with a
  single template (LAMA: one probe per fact) is cut by fact instead: even fact indices
  validation, odd ones test. Raises ValueError when either part is empty."""
  template = heldout["template"]
  if template.max(initial=0) == 0:
    is_val = heldout["fact"] % 2 == 0
  else:
    is_val = template < num_validation
  parts = tuple({k: v[rows] for k, v in heldout.items()}
                for rows in (np.flatnonzero(is_val), np.flatnonzero(~is_val)))
  for name, part in zip(("validation", "test"), parts):
    if not len(part["fact"]):
      raise ValueError(f"the {name} split of the held-out paraphrases is empty "
                       f"({num_validation} validation templates of "
                       f"{int(template.max(initial=0)) + 1})")
  return parts


# ------------------------------------------------------------------------------------------
# Background text, edits and replay.


def background_cloze(num_examples: int, seed: int, *, stream: int, length: int,
                     max_clauses: int = 2) -> dict:
  """Synthetic-language sentences (`xsens.data.text.synthetic_language`) with one word
  masked: {"ids" [N, length], "position" [N], "target" [N]}. The masked word is uniform
  over the sentence's words (not <s> / </s>), drawn from (seed, stream)."""
  ids, _ = text.synthetic_language(num_examples, seed, stream=stream,
                                   max_clauses=max_clauses, max_length=length)
  lengths = (ids != text.PAD_ID).sum(1)
  rng = np.random.default_rng([seed, 23, stream])
  position = (1 + np.floor(rng.random(num_examples) * (lengths - 2))).astype(np.int32)
  rows = np.arange(num_examples)
  target = ids[rows, position].copy()
  ids = ids.copy()
  ids[rows, position] = MASK_ID
  return {"ids": ids, "position": position, "target": target.astype(np.int32)}


def choose_modified(data: ClozeData, known: np.ndarray, num_modified: int, seed: int
                    ) -> tuple[np.ndarray, np.ndarray]:
  """(fact indices S [num_modified], their new objects [num_modified]) as the paper's
  benchmark code (docs/papers/google_papers.md §G): shuffle the facts the model knows (`known` [F]
  bool), take the first `num_modified`; each new object is drawn from the other objects of the same
  relation with probability ∝ their frequency among the facts (the old object excluded).
  Facts of a relation with a single object cannot change and are never chosen."""
  rng = np.random.default_rng([seed, 29, num_modified])
  changeable = np.asarray([len(data.relation_objects(r)[0]) > 1 for r in range(
      len(data.relation_names))])
  candidates = np.flatnonzero(known & changeable[data.facts[:, 1]])
  if num_modified > len(candidates):
    raise ValueError(f"{num_modified} facts to modify, but only {len(candidates)} are known "
                     "and changeable")
  chosen = np.sort(rng.permutation(candidates)[:num_modified]).astype(np.int32)
  new = np.empty(num_modified, np.int32)
  for n, f in enumerate(chosen):
    ids, counts = data.relation_objects(int(data.facts[f, 1]))
    keep = ids != data.facts[f, 2]
    p = counts[keep] / counts[keep].sum()
    new[n] = rng.choice(ids[keep], p=p)
  return chosen, new


def modified_objects(facts: np.ndarray, chosen: np.ndarray, new: np.ndarray) -> np.ndarray:
  """[F] object token of every fact after the edit (`new` at the facts `chosen`)."""
  objects = facts[:, 2].copy()
  objects[chosen] = new
  return objects


def sentences_of(split: dict, fact_set: np.ndarray) -> np.ndarray:
  """Indices of the sentences of `split` whose fact is in `fact_set`."""
  return np.flatnonzero(np.isin(split["fact"], fact_set)).astype(np.int32)


def replay_count(num_modified_sentences: int, ratio: float) -> int:
  """Replayed unmodified sentences per step: round(ratio x modified sentences)."""
  return int(round(ratio * num_modified_sentences))
