"""Offline sentence-pair tasks that need word order and segments (DIET study).

Each example is RoBERTa's pair template "<s> A </s></s> B </s>" (ids [2m + 4]), where A
is m distinct words drawn from `NUM_WORDS` (ids 4..4+NUM_WORDS−1, after the specials of
`xsens.data.text`) and B is always a permutation of A, so the bag of words of an example
carries no information about its label; only order (and which segment a word is in) does.
Labels (`TASKS`, the `data.name` of each):

  "text/pair_reversed": 1 iff B is A reversed; negatives: another permutation of A.
  "text/pair_rotation": 1 iff B is a rotation of A by r in 1..m−1; negatives: a
                        permutation of A that is no rotation (nor A itself).
  "text/pair_match":    1 iff token k of B equals token k of A (k = `MATCH_INDEX`);
                        B is a random permutation of A with that constraint.

An encoder without position information is permutation-equivariant, so its first-token
output is the same for both labels of any A: chance accuracy is its ceiling. Labels are
exactly balanced (alternating, before the loader shuffles); examples are deterministic
in (seed, stream). Our design, not the paper's (DIET evaluates on GLUE, XTREME and WMT).
"""

from __future__ import annotations

import numpy as np

from xsens.errors import ConfigError

# The special ids of xsens.data.text (<pad> 0, <s> 1, </s> 2, <unk> 3), kept equal by a test.
BOS_ID, EOS_ID, NUM_SPECIAL = 1, 2, 4
NUM_WORDS = 16
VOCAB_SIZE = NUM_SPECIAL + NUM_WORDS
MATCH_INDEX = 2
TASKS = {"text/pair_reversed": "reversed", "text/pair_rotation": "rotation",
         "text/pair_match": "match"}
MIN_WORDS = 4
# Pre-training (the DIET study's pre-train -> fine-tune path): `unlabeled_corpus` draws from
# stream CORPUS_STREAM (the loader's train and test splits are streams 0 and 1), and the
# masked LM hides a word behind MASK_ID, <unk>, which no pair sentence contains.
CORPUS_STREAM = 2
MASK_ID = 3


def words_per_sentence(max_length: int) -> int:
  """m: the length of A and B in a sequence of `max_length` tokens (2m + 4 <= max_length)."""
  return min(NUM_WORDS, (max_length - 4) // 2)


def validate(name: str, max_length) -> None:
  """ConfigError naming `data.max_length` when it cannot hold a pair of >= MIN_WORDS words."""
  if words_per_sentence(max_length) < MIN_WORDS:
    raise ConfigError("data.max_length", f"{max_length} cannot hold the pairs of {name!r} "
                      f"(2·m + 4 tokens, m >= {MIN_WORDS} words); use max_length >= "
                      f"{2 * MIN_WORDS + 4}")


def _is_rotation(a: np.ndarray, b: np.ndarray) -> bool:
  return any(np.array_equal(np.roll(a, r), b) for r in range(len(a)))


def _second(task: str, a: np.ndarray, positive: bool, rng) -> np.ndarray:
  """B for A under `task` with the given label."""
  m = len(a)
  if task == "reversed" and positive:
    return a[::-1].copy()
  if task == "rotation" and positive:
    return np.roll(a, int(rng.integers(1, m)))
  while True:
    b = rng.permutation(a)
    if task == "reversed" and not np.array_equal(b, a[::-1]):
      return b
    if task == "rotation" and not _is_rotation(a, b):
      return b
    if task == "match" and (b[MATCH_INDEX] == a[MATCH_INDEX]) == positive:
      return b


def pair_task(task: str, num_examples: int, seed: int, *, stream: int = 0,
              max_length: int = 20) -> tuple[np.ndarray, np.ndarray]:
  """(ids [N, max_length] int32 right-padded "<s> A </s></s> B </s>", labels [N] int32)
  of `task` ("reversed" | "rotation" | "match"), m = words_per_sentence(max_length)."""
  if task not in TASKS.values():
    raise ValueError(f"unknown pair task {task!r}; allowed: {', '.join(TASKS.values())}")
  m = words_per_sentence(max_length)
  rng = np.random.default_rng([seed, 11, stream, list(TASKS.values()).index(task)])
  labels = (np.arange(num_examples) % 2).astype(np.int32)
  ids = np.zeros((num_examples, max_length), np.int32)
  for n in range(num_examples):
    a = rng.choice(NUM_WORDS, size=m, replace=False) + NUM_SPECIAL
    b = _second(task, a, bool(labels[n]), rng)
    ids[n, :2 * m + 4] = [BOS_ID, *a, EOS_ID, EOS_ID, *b, EOS_ID]
  return ids, labels


def unlabeled_corpus(num_examples: int, seed: int, *, max_length: int = 20) -> np.ndarray:
  """ids [num_examples, max_length]: the sentences of every task of `TASKS` in turn
  (task n % 3 for row n), labels dropped, from stream `CORPUS_STREAM` (not the train or
  test examples). Reversed and rotated pairs make the order of B predictable from A."""
  names = list(TASKS.values())
  per_task = [pair_task(task, -(-num_examples // len(names)), seed, stream=CORPUS_STREAM,
                        max_length=max_length)[0] for task in names]
  return np.stack(per_task, axis=1).reshape(-1, max_length)[:num_examples]


def order_free_mlm_accuracy(inputs: np.ndarray, labels: np.ndarray) -> float:
  """The masked-LM accuracy of the best guesser that ignores word order (a yardstick).

  A and B hold the same m distinct words, so a word hidden in sentence S is one of
  H_S = (the pair's words) − (S's visible words), each equally likely at a given position
  when order is ignored: P(right) = 1/|H_S| if some word of H_S is visible in the other
  sentence, else 1/U with U the words visible in neither sentence (the candidates of
  `NUM_WORDS`). Returns the mean of that probability over the hidden positions.

  Args:
    inputs: ids [N, L] of "<s> A </s></s> B </s>" rows, hidden words replaced by an id
      < NUM_SPECIAL (e.g. MASK_ID).
    labels: [N, L], the hidden word at a hidden position, −1 elsewhere.
  """
  total, count = 0.0, 0
  for row, lab in zip(np.asarray(inputs), np.asarray(labels)):
    eos = np.flatnonzero(row == EOS_ID)
    if len(eos) < 3:
      continue
    sentences = [np.arange(1, eos[0]), np.arange(eos[1] + 1, eos[2])]
    visible = [set(row[s][row[s] >= NUM_SPECIAL].tolist()) for s in sentences]
    unseen = NUM_WORDS - len(visible[0] | visible[1])
    for s, (pos, mine) in enumerate(zip(sentences, visible)):
      hidden = int((lab[pos] >= 0).sum())
      if not hidden:
        continue
      known = visible[1 - s] - mine  # Hidden in S, visible in the other sentence.
      total += hidden * (1.0 / hidden if known else 1.0 / max(unseen, 1))
      count += hidden
  return total / count if count else float("nan")
