"""Text classification data for the text models: int32 token ids [N, L], right-padded.

Datasets (`data.name`), loaded by `xsens.data.pipeline.load_split` like every other
dataset (it dispatches here for names starting with "text/" or "glue/"):

  * "text/synthetic" (the default; offline, no download, no tokenizer): a synthetic
    language, `synthetic_language`, with one of two label rules (`data.synthetic.task`):
    "polarity" (the default, `synthetic_sentences`: the majority polarity of 1 or 3
    possibly negated adjectives) or "weak_sum" (`weak_sum_sentences`: the sign of the sum
    of seeded weak scores of every content word, with a margin and label-noise control),
    over the same 64 words. No installable package we could find ships a real
    text-classification corpus (GLUE/IMDB/SST packages, nltk and sklearn corpora all
    download at run time), so the offline default is synthetic.
  * "text/pair_reversed", "text/pair_rotation", "text/pair_match" (offline): the
    sentence-pair order tasks of `xsens.data.pair_tasks` (DIET study).
  * "glue/mrpc", "glue/qqp" (and "glue/rte", DIET's GLUE subset): the paper's datasets
    (docs/papers/sensitivity.md §7), read through TFDS from
    `data_dir` (prepared elsewhere; xsens never downloads, a missing dataset is a
    ConfigError saying how to prepare it). Sentence pairs become
    "<s> A </s></s> B </s>" (RoBERTa's pair template) with a byte-level BPE tokenizer
    trained here on the training split (`tokenizers` package, no download), cached as
    JSON in `data_dir/xsens_tokenizers/` keyed by dataset, training split and vocab size.
    GLUE test labels are hidden (-1): evaluate on "validation".

Special token ids are shared by all datasets: <pad> 0, <s> 1, </s> 2, <unk> 3. Sequences
longer than `max_length` are truncated (longest sentence first); shorter ones are padded
on the right with 0, so `ids != 0` is the attention mask (`xsens.models.text`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Iterable, Sequence

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from xsens import paths
from xsens.data import pair_tasks
from xsens.data import splits
# The fields and sizes config files need (jax- and tfds-free), re-exported here.
from xsens.data.text_config import (SPECIAL_TOKENS, SYNTHETIC, SYNTHETIC_OPTIONAL,
                                    default_text_data_config, synthetic_max_tokens)
from xsens.errors import ConfigError, is_finite_number

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
GLUE = {"glue/mrpc": ("sentence1", "sentence2"), "glue/qqp": ("question1", "question2"),
        "glue/rte": ("sentence1", "sentence2")}
DATASETS = (SYNTHETIC, *GLUE, *pair_tasks.TASKS)
FIELDS = ("name", "data_dir", "train_split", "test_split", "max_length", "vocab_size",
          "num_train", "synthetic")
SYNTHETIC_FIELDS = ("num_train", "num_test", "max_clauses")
SYNTHETIC_TASKS = ("polarity", "weak_sum")
SYNTHETIC_SPLITS = ("train", "validation")
TOKENIZER_DIR = "xsens_tokenizers"
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # The byte alphabet plus the specials.
_READ_BATCH = 1024


# ------------------------------------------------------------------------------------------------
# The synthetic sentiment language.

_DETS = ("the", "a", "this", "that", "every", "one")
_NOUNS = ("movie", "film", "plot", "actor", "story", "script", "scene", "ending", "cast",
          "score", "director", "camera")
_VERBS = ("was", "seemed", "felt", "looked", "became", "remained")
_ENDINGS = ("ended", "started", "worked", "mattered")
_ADVS = ("very", "really", "quite", "rather", "truly", "so")
_POSITIVE = ("good", "great", "superb", "lovely", "fine", "brilliant", "charming", "clever")
_NEGATIVE = ("bad", "awful", "dull", "poor", "weak", "boring", "clumsy", "bland")
_NEUTRAL = ("long", "short", "old", "new", "loud", "quiet", "simple", "french")
_CONJS = ("and", "but", "while", "although")
WORDS = (_DETS + _NOUNS + _VERBS + _ADVS + _POSITIVE + _NEGATIVE + _NEUTRAL + _CONJS +
         _ENDINGS + ("not", "."))
SYNTHETIC_VOCAB = len(SPECIAL_TOKENS) + len(WORDS)
_WORD_ID = {w: i + len(SPECIAL_TOKENS) for i, w in enumerate(WORDS)}


def synthetic_sentences(num_examples: int, seed: int, *, stream: int = 0,
                        max_clauses: int = 4) -> tuple[list[list[str]], np.ndarray]:
  """Sentences of the synthetic sentiment language, as word lists, and their labels.

  A sentence is 1..max_clauses clauses, each "DET NOUN VERB [ADV] ADJ" or "DET [ADV] ADJ
  NOUN ENDING" with equal probability (so adjectives sit at varying distances from the
  end), joined by conjunctions and ended by ".". With probability 0.3 a clause takes the
  negated form "DET NOUN VERB not ADJ" instead, which flips the adjective's polarity.
  Adjectives are neutral except in k "sentiment" clauses: k = 1, or k in {1, 3} with
  equal probability when there are >= 3 clauses; their positions and effective
  polarities are uniform. The label is the majority effective polarity (1 = positive),
  so it depends on 1 or 3 adjectives (and a "not" before each) anywhere in the sentence
  and nothing else. Lengths are 5..synthetic_max_tokens(max_clauses) - 2 words.

  Our design (the paper's language data are MRPC and QQP); deterministic in
  (seed, stream); labels are balanced in expectation.
  """
  rng = np.random.default_rng([seed, 7, stream])
  sentences, labels = [], np.empty(num_examples, np.int32)
  pick = lambda words: words[rng.integers(len(words))]
  for n in range(num_examples):
    num_clauses = int(rng.integers(1, max_clauses + 1))
    k = int(rng.choice([1, 3])) if num_clauses >= 3 else 1
    sentiment = set(rng.choice(num_clauses, size=k, replace=False).tolist())
    polarity = rng.integers(0, 2, size=k)
    labels[n] = int(polarity.sum() * 2 > k)
    words, j = [], 0
    for c in range(num_clauses):
      if c:
        words.append(pick(_CONJS))
      negated = rng.random() < 0.3
      if c in sentiment:
        adjective = pick(_POSITIVE if bool(polarity[j]) != negated else _NEGATIVE)
        j += 1
      else:
        adjective = pick(_NEUTRAL)
      adverb = [pick(_ADVS)] if rng.random() < 0.5 else []
      if negated:
        words += [pick(_DETS), pick(_NOUNS), pick(_VERBS), "not", adjective]
      elif rng.random() < 0.5:
        words += [pick(_DETS), pick(_NOUNS), pick(_VERBS)] + adverb + [adjective]
      else:
        words += [pick(_DETS)] + adverb + [adjective, pick(_NOUNS), pick(_ENDINGS)]
    words.append(".")
    sentences.append(words)
  return sentences, labels


# The weak-sum language: the same words; function words score 0, content words a seeded
# N(0, 1) score each.
FUNCTION_WORDS = _DETS + _CONJS + ("not", ".")
CONTENT_WORDS = tuple(w for w in WORDS if w not in FUNCTION_WORDS)
WEAK_SUM_FUNCTION_PROB = 0.25   # Each word but the final "." is a function word w.p. 0.25.
WEAK_SUM_SIGNAL_FRACTION = 1 / 3  # Signal words: this top fraction of |score|.
MAX_WEAK_SUM_MARGIN = 3.0       # Rejection sampling keeps Pr[|z| >= margin] >= 0.27 %.
_MAX_RESAMPLES = 100_000


def weak_sum_scores(seed: int) -> np.ndarray:
  """[SYNTHETIC_VOCAB] float64 score of every token id in the weak-sum language: for the
  content words (`CONTENT_WORDS`), i.i.d. N(0, 1) draws from `seed` alone (so train and
  test share them), standardised to mean 0 and variance 1 over the content words (so a
  random sentence's sum has mean 0: balanced labels); 0 for function words and special
  tokens."""
  scores = np.zeros(SYNTHETIC_VOCAB)
  draws = np.random.default_rng([seed, 11]).standard_normal(len(CONTENT_WORDS))
  draws = (draws - draws.mean()) / draws.std()
  scores[[_WORD_ID[w] for w in CONTENT_WORDS]] = draws
  return scores


def weak_sum_sentences(num_examples: int, seed: int, *, stream: int = 0,
                       max_clauses: int = 4, margin: float = 0.5, label_noise: float = 0.0
                       ) -> tuple[list[list[str]], np.ndarray]:
  """Sentences of the weak-sum language, as word lists, and their labels.

  A sentence is W - 1 words and a final ".", W uniform in [W_max // 2, W_max] with
  W_max = synthetic_max_tokens(max_clauses) - 2 (the polarity language's longest
  sentence: 24 words at 4 clauses); each of the W - 1 words is a function word
  (`FUNCTION_WORDS`, score 0) with probability 0.25, else a uniform content word
  (`CONTENT_WORDS`, score s_w of `weak_sum_scores(seed)`). With n >= 1 content words and
  z = sum_w s_w / sqrt(n) (a standard normal for random sentences), a sentence is
  redrawn until |z| >= margin (the margin control: larger is easier), and its label is
  1 if the sum is > 0, then flipped with probability label_noise. So the evidence is
  spread over every content word (about 13 per sentence at 4 clauses), none decides the
  label alone, and a model must integrate the whole sentence: a running state of the
  polarity so far, as the polarity language allows, is not enough (a running sum is).

  Our design (the paper's language data are MRPC and QQP); deterministic
  in (seed, stream); labels are balanced in expectation.
  """
  if not (np.isfinite(margin) and 0 <= margin <= MAX_WEAK_SUM_MARGIN):
    raise ValueError(f"margin must be in [0, {MAX_WEAK_SUM_MARGIN}], got {margin!r}")
  if not 0 <= label_noise < 0.5:
    raise ValueError(f"label_noise must be in [0, 0.5), got {label_noise!r}")
  scores = weak_sum_scores(seed)
  rng = np.random.default_rng([seed, 13, stream])
  w_max = synthetic_max_tokens(max_clauses) - 2
  sentences, labels = [], np.empty(num_examples, np.int32)
  for n in range(num_examples):
    for _ in range(_MAX_RESAMPLES):
      num_words = int(rng.integers(w_max // 2, w_max + 1)) - 1
      function = rng.random(num_words) < WEAK_SUM_FUNCTION_PROB
      words = [FUNCTION_WORDS[rng.integers(len(FUNCTION_WORDS) - 1)] if f else
               CONTENT_WORDS[rng.integers(len(CONTENT_WORDS))] for f in function]
      s = np.asarray([scores[_WORD_ID[w]] for w in words])
      num_content = int((~function).sum())
      if num_content and abs(s.sum()) >= margin * np.sqrt(num_content):
        break
    else:  # Unreachable for margin <= MAX_WEAK_SUM_MARGIN.
      raise RuntimeError(f"no sentence with margin {margin} in {_MAX_RESAMPLES} draws")
    label = int(s.sum() > 0)
    if rng.random() < label_noise:
      label = 1 - label
    labels[n] = label
    sentences.append(words + ["."])
  return sentences, labels


def signal_token_ids(task: str, seed: int = 0) -> np.ndarray:
  """Token ids of the words the label rule of `task` reads ("signal words"), sorted.

  "polarity": the positive and negative adjectives and "not" (`synthetic_sentences`;
  neutral adjectives never count). "weak_sum": the content words with the largest
  |score| (`weak_sum_scores(seed)`), the top third (18 of 52); every content word counts
  a little, so this is the high-weight part of the rule. The rest are the other words and
  the special tokens.
  """
  if task == "polarity":
    words = _POSITIVE + _NEGATIVE + ("not",)
  elif task == "weak_sum":
    scores = weak_sum_scores(seed)
    content = np.asarray([_WORD_ID[w] for w in CONTENT_WORDS])
    k = int(np.ceil(len(content) * WEAK_SUM_SIGNAL_FRACTION))
    top = content[np.argsort(-np.abs(scores[content]), kind="stable")[:k]]
    return np.sort(top).astype(np.int32)
  else:
    raise ValueError(f"unknown synthetic task {task!r}; allowed: {', '.join(SYNTHETIC_TASKS)}")
  return np.sort(np.asarray([_WORD_ID[w] for w in words], np.int32))


def token_types(ids: np.ndarray, task: str, seed: int = 0) -> dict[str, np.ndarray]:
  """Boolean masks [N, L] of the real tokens of `ids` by type: "signal" (the words of
  `signal_token_ids(task, seed)`), "other" (every other word) and "special" (<s>, </s>,
  <unk>); with padding, they partition the real tokens."""
  ids = np.asarray(ids)
  special = np.isin(ids, (BOS_ID, EOS_ID, UNK_ID))
  signal = np.isin(ids, signal_token_ids(task, seed))
  real = ids != PAD_ID
  return {"signal": signal, "other": real & ~signal & ~special, "special": special}


def synthetic_language(num_examples: int, seed: int, *, stream: int = 0,
                       max_clauses: int = 4, max_length: int | None = None,
                       task: str = "polarity", margin: float = 0.5,
                       label_noise: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
  """The sentences of `task` ("polarity": `synthetic_sentences`; "weak_sum":
  `weak_sum_sentences` with margin and label_noise) as ids "<s> words </s>"
  [N, max_length] int32 (right-padded).

  max_length defaults to synthetic_max_tokens(max_clauses) (nothing is truncated).
  """
  length = synthetic_max_tokens(max_clauses) if max_length is None else max_length
  if task == "polarity":
    sentences, labels = synthetic_sentences(num_examples, seed, stream=stream,
                                            max_clauses=max_clauses)
  elif task == "weak_sum":
    sentences, labels = weak_sum_sentences(num_examples, seed, stream=stream,
                                           max_clauses=max_clauses, margin=margin,
                                           label_noise=label_noise)
  else:
    raise ValueError(f"unknown synthetic task {task!r}; allowed: {', '.join(SYNTHETIC_TASKS)}")
  ids = np.zeros((num_examples, length), np.int32)
  for n, words in enumerate(sentences):
    seq = [BOS_ID] + [_WORD_ID[w] for w in words][:length - 2] + [EOS_ID]
    ids[n, :len(seq)] = seq
  return ids, labels


def synthetic_decode(ids: Sequence[int], skip_special_tokens: bool = True) -> str:
  """Synthetic-language ids -> text (words joined by spaces)."""
  words = []
  for i in ids:
    i = int(i)
    if i < len(SPECIAL_TOKENS):
      if not skip_special_tokens:
        words.append(SPECIAL_TOKENS[i])
    else:
      words.append(WORDS[i - len(SPECIAL_TOKENS)])
  return " ".join(words)


# ------------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE trained offline with `tokenizers`.


def train_tokenizer(texts: Iterable[str], vocab_size: int):
  """A byte-level BPE tokenizer (RoBERTa/GPT-2 style) trained on `texts`.

  Special tokens take ids 0..3 (`SPECIAL_TOKENS`); the byte alphabet is always included,
  so there are no unknown tokens and decode(encode(text)) == text. Single sequences are
  wrapped "<s> A </s>", pairs "<s> A </s></s> B </s>" (RoBERTa's templates).
  """
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # pylint: disable=g-import-not-at-top
  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer=trainer)
  for i, token in enumerate(SPECIAL_TOKENS):
    if tok.token_to_id(token) != i:
      raise RuntimeError(f"special token {token!r} got id {tok.token_to_id(token)}, not {i}")
  tok.post_processor = processors.TemplateProcessing(
      single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
      special_tokens=[("<s>", BOS_ID), ("</s>", EOS_ID)])
  return tok


def tokenizer_path(data_dir: str, name: str, train_split: str, vocab_size: int) -> str:
  """Where the tokenizer of (dataset, training split, vocab size) is cached."""
  split = re.sub(r"[^A-Za-z0-9]+", "_", train_split).strip("_")
  digest = hashlib.sha1(train_split.encode()).hexdigest()[:8]
  base = f"{name.replace('/', '_')}-{split}-{digest}-bpe{int(vocab_size)}.json"
  return os.path.join(data_dir, TOKENIZER_DIR, base)


def load_or_train_tokenizer(path: str, texts_fn, vocab_size: int):
  """The tokenizer cached at `path`, or one trained on `texts_fn()` and saved there.

  `path` may be remote (`gs://...`, through `xsens.paths`). Every process of a multi-host
  run trains the same tokenizer (training is deterministic) and saves it: a local file
  through a per-process temporary name and `os.replace`, a remote object in one upload.
  """
  from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
  if paths.exists(path):
    return Tokenizer.from_str(paths.read_text(path))
  tok = train_tokenizer(texts_fn(), vocab_size)
  if paths.is_remote(path):
    paths.write_text(path, tok.to_str(pretty=True))
    return tok
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.{os.getpid()}.tmp"
  tok.save(tmp)
  os.replace(tmp, path)
  return tok


def encode(tok, first: Sequence[str], second: Sequence[str] | None,
           max_length: int) -> np.ndarray:
  """Texts (or text pairs) -> ids [N, max_length] int32, truncated and right-padded."""
  tok.enable_truncation(max_length=max_length, strategy="longest_first")
  tok.enable_padding(pad_id=PAD_ID, pad_token="<pad>", length=max_length)
  try:
    inputs = list(first) if second is None else list(zip(first, second))
    encodings = tok.encode_batch(inputs)
  finally:
    tok.no_truncation()
    tok.no_padding()
  if not encodings:
    return np.zeros((0, max_length), np.int32)
  return np.asarray([e.ids for e in encodings], np.int32)


# ------------------------------------------------------------------------------------------------
# Validation.


def _is_int(value) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _positive(field: str, value, minimum: int = 1) -> None:
  if not _is_int(value) or value < minimum:
    raise ConfigError(field, f"must be an int >= {minimum}, got {value!r}")


def _synthetic_config(dc) -> dict:
  cfg = dc["synthetic"]
  cfg = dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg or {})
  allowed = SYNTHETIC_FIELDS + tuple(SYNTHETIC_OPTIONAL)
  for key in cfg:
    if key not in allowed:
      raise ConfigError(f"data.synthetic.{key}", f"unknown field for {SYNTHETIC!r}; "
                        f"allowed: {', '.join(allowed)}")
  for key in SYNTHETIC_FIELDS:
    if key not in cfg:
      raise ConfigError(f"data.synthetic.{key}", "missing; start from "
                        "xsens.data.text.default_text_data_config()")
    _positive(f"data.synthetic.{key}", cfg[key])
  cfg = {**SYNTHETIC_OPTIONAL, **cfg}
  if cfg["task"] not in SYNTHETIC_TASKS:
    raise ConfigError("data.synthetic.task", f"unknown task {cfg['task']!r}; allowed: "
                      f"{', '.join(SYNTHETIC_TASKS)}")
  margin, noise = cfg["margin"], cfg["label_noise"]
  if not (is_finite_number(margin) and 0 <= margin <= MAX_WEAK_SUM_MARGIN):
    raise ConfigError("data.synthetic.margin", f"must be a number in [0, "
                      f"{MAX_WEAK_SUM_MARGIN}] (|sum of scores| / sqrt(content words)), "
                      f"got {margin!r}")
  if not (is_finite_number(noise) and 0 <= noise < 0.5):
    raise ConfigError("data.synthetic.label_noise", f"must be a probability in [0, 0.5), "
                      f"got {noise!r}")
  if cfg["task"] == "polarity":
    for key in ("margin", "label_noise"):
      if cfg[key] != SYNTHETIC_OPTIONAL[key]:
        raise ConfigError(f"data.synthetic.{key}", f"only used by task 'weak_sum', set to "
                          f"{cfg[key]!r} with task 'polarity'; leave it at "
                          f"{SYNTHETIC_OPTIONAL[key]!r} or set data.synthetic.task='weak_sum'")
  return cfg


def validate_text_data_config(dc) -> None:
  """Raises ConfigError for any bad `data.*` field of a text dataset (reads no examples;
  a GLUE dataset is opened, which reports it missing from data_dir)."""
  for field in FIELDS:
    if field not in dc:
      raise ConfigError(f"data.{field}", "missing; text datasets start from "
                        "xsens.data.text.default_text_data_config()")
  for field in dc:
    if field not in FIELDS:
      raise ConfigError(f"data.{field}", f"not a field of text datasets; allowed: "
                        f"{', '.join(FIELDS)}")
  name = dc["name"]
  if name not in DATASETS:
    raise ConfigError("data.name", f"unknown text dataset {name!r}; allowed: "
                      f"{', '.join(DATASETS)}")
  _positive("data.max_length", dc["max_length"], 4)
  _positive("data.vocab_size", dc["vocab_size"], MIN_VOCAB)
  if dc["num_train"] is not None:
    _positive("data.num_train", dc["num_train"])
  if dc["train_split"] == dc["test_split"]:
    raise ConfigError("data.test_split", f"must differ from data.train_split, both are "
                      f"{dc['test_split']!r}")
  if name in pair_tasks.TASKS:  # Sizes from data.synthetic; A, B from data.max_length.
    _synthetic_config(dc)
    pair_tasks.validate(name, dc["max_length"])
  if name == SYNTHETIC or name in pair_tasks.TASKS:
    cfg = _synthetic_config(dc)
    for role in splits.ROLES:
      if dc[f"{role}_split"] not in SYNTHETIC_SPLITS:
        raise ConfigError(f"data.{role}_split", f"{dc[f'{role}_split']!r} is not a split of "
                          f"{name!r}; allowed: {', '.join(SYNTHETIC_SPLITS)}")
    if name != SYNTHETIC:
      return
    need = synthetic_max_tokens(cfg["max_clauses"])
    if dc["max_length"] < need:
      raise ConfigError("data.max_length", f"{dc['max_length']} cannot hold the synthetic "
                        f"sentences of up to {cfg['max_clauses']} clauses ({need} tokens); "
                        f"use max_length >= {need} or fewer data.synthetic.max_clauses")
    return
  data_dir = splits.resolve_data_dir(dc)
  for role in splits.ROLES:
    field = f"data.{role}_split"
    if "test" in splits.split_names(dc[f"{role}_split"], field):
      raise ConfigError(field, "GLUE test labels are hidden (-1); use 'validation', or "
                        "disjoint slices of 'train' for both splits (train_split="
                        "'train[:90%]', test_split='train[90%:]')")
    _, features = open_glue(name, data_dir, dc[f"{role}_split"], field)
  missing = [k for k in GLUE[name] + ("label",) if k not in features]
  if missing:
    raise ConfigError("data.name", f"{name!r} in {data_dir!r} has no feature "
                      f"{missing[0]!r}; features: {', '.join(features.keys())}")


# ------------------------------------------------------------------------------------------------
# Loading.


def _prepared_dir(name: str, data_dir: str):
  """data_dir/<name>/<latest version> of a prepared TFDS dataset, or None."""
  base = epath.Path(data_dir).joinpath(*name.split("/"))
  if not base.is_dir():
    return None
  versions = [v for v in base.iterdir()
              if re.fullmatch(r"\d+\.\d+\.\d+", v.name) and (v / "dataset_info.json").exists()]
  if not versions:
    return None
  return max(versions, key=lambda v: tuple(int(x) for x in v.name.split(".")))


def open_glue(name: str, data_dir: str, split: str, field: str):
  """Opens one split of a prepared GLUE dataset: (random-access source, features).

  Reads the prepared directory with `tfds.builder_from_directory`: TFDS's own `glue`
  builder module imports TensorFlow, which xsens does not need to read ArrayRecord files.
  """
  splits.split_names(split, field)
  path = _prepared_dir(name, data_dir)
  if path is None:
    raise splits.not_found(name, data_dir)
  builder = tfds.builder_from_directory(os.fspath(path))
  splits.check_split_names(split, field, list(builder.info.splits.keys()))
  try:
    source = builder.as_data_source(split=split)
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError("data.name", f"cannot read {name!r} in {os.fspath(path)!r} without "
                      f"TensorFlow ({type(e).__name__}: {e}); prepare it as array_record: "
                      f"`tfds build {name} --data_dir={data_dir} --file_format=array_record`"
                      ) from e
  return source, builder.info.features


@functools.lru_cache(maxsize=8)
def _read_glue(name: str, data_dir: str, split: str) -> tuple[tuple, tuple, np.ndarray]:
  """(first texts, second texts, labels) of one GLUE split, in stored order."""
  source, _ = open_glue(name, data_dir, split, "data.name")
  key_a, key_b = GLUE[name]
  first, second, labels = [], [], []
  n = len(source)
  for start in range(0, n, _READ_BATCH):
    for e in splits.get_items(source, list(range(start, min(n, start + _READ_BATCH)))):
      first.append(_as_str(e[key_a]))
      second.append(_as_str(e[key_b]))
      labels.append(int(e["label"]))
  return tuple(first), tuple(second), np.asarray(labels, np.int64)


def _as_str(value) -> str:
  if isinstance(value, np.ndarray):
    value = value.item()
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def glue_tokenizer(dc):
  """The (cached) BPE tokenizer of a GLUE config, trained on both sentences of its
  training split."""
  name, data_dir = dc["name"], splits.resolve_data_dir(dc)

  def texts():
    first, second, _ = _read_glue(name, data_dir, dc["train_split"])
    return list(first) + list(second)

  path = tokenizer_path(data_dir, name, dc["train_split"], dc["vocab_size"])
  return load_or_train_tokenizer(path, texts, int(dc["vocab_size"]))


def _raw_ids(dc, role: str, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
  """(ids [N, L] int32, labels [N], vocab size) of one split before subsampling."""
  name = dc["name"]
  if name == SYNTHETIC:
    cfg = _synthetic_config(dc)
    n = cfg["num_train"] if role == "train" else cfg["num_test"]
    ids, labels = synthetic_language(n, seed, stream=splits.ROLES.index(role),
                                     max_clauses=cfg["max_clauses"],
                                     max_length=int(dc["max_length"]), task=cfg["task"],
                                     margin=float(cfg["margin"]),
                                     label_noise=float(cfg["label_noise"]))
    return ids, labels, SYNTHETIC_VOCAB
  if name in pair_tasks.TASKS:
    cfg = _synthetic_config(dc)
    ids, labels = pair_tasks.pair_task(pair_tasks.TASKS[name], cfg[f"num_{role}"], seed,
                                       stream=splits.ROLES.index(role),
                                       max_length=int(dc["max_length"]))
    return ids, labels, pair_tasks.VOCAB_SIZE
  tok = glue_tokenizer(dc)
  first, second, labels = _read_glue(name, splits.resolve_data_dir(dc), dc[f"{role}_split"])
  if len(labels) and labels.min() < 0:
    raise ConfigError(f"data.{role}_split", f"{dc[f'{role}_split']!r} of {name!r} has "
                      "hidden labels (-1); use 'validation'")
  ids = encode(tok, first, second, int(dc["max_length"]))
  return ids, labels.astype(np.int32), tok.get_vocab_size()


def load_text_split(dc, split: str, *, seed: int = 0) -> splits.Split:
  """Loads one split of a text dataset as `Split(inputs=ids [N, L] int32, labels,
  num_classes=2, vocab_size)`, in a random order fixed by `seed` and the role (as
  `pipeline.load_split`); `num_train` keeps a seeded random subset of the training split."""
  validate_text_data_config(dc)
  role = splits.split_role(dc, split)
  ids, labels, vocab = _raw_ids(dc, role, seed)
  if role == "train" and dc["num_train"] is not None:
    if dc["num_train"] > len(labels):
      raise ConfigError("data.num_train", f"asks for {dc['num_train']} examples but the "
                        f"train split has {len(labels)}; allowed: 1..{len(labels)}")
    keep = splits.subset_indices(len(labels), int(dc["num_train"]), seed)
    ids, labels = ids[keep], labels[keep]
  order = np.random.default_rng([seed, splits.ROLES.index(role), len(labels)]).permutation(
      len(labels))
  return splits.Split(inputs=np.ascontiguousarray(ids[order], dtype=np.int32),
                        labels=np.asarray(labels, np.int32)[order], num_classes=2,
                        vocab_size=int(vocab))
