"""The `data` section of a text config and the synthetic language's sizes, without JAX or TFDS.

What config files (`mlcollections_configs/`) need from `xsens.data.text`, which re-exports
every name here; the datasets themselves are there.
"""

import ml_collections

from xsens.data.config import optional

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0..3 in every text dataset.
SYNTHETIC = "text/synthetic"
# Vocabulary size of the synthetic language: the 4 special tokens and its 64 words
# (`len(SPECIAL_TOKENS) + len(xsens.data.text.WORDS)`; tests/config_imports_test.py).
SYNTHETIC_VOCAB = 68
# Optional fields of `data.synthetic` (absent: the default in brackets): task ["polarity"],
# and, for task "weak_sum" only, margin [0.5] and label_noise [0.0].
SYNTHETIC_OPTIONAL = {"task": "polarity", "margin": 0.5, "label_noise": 0.0}


def synthetic_max_tokens(max_clauses: int) -> int:
  """Longest synthetic sequence: <s>, clauses of <= 5 words, conjunctions, ".", </s>."""
  return 2 + 5 * max_clauses + (max_clauses - 1) + 1


def default_text_data_config() -> ml_collections.ConfigDict:
  """All `data.*` fields of a text dataset with their defaults.

  Fields:
    name: "text/synthetic" | "glue/mrpc" | "glue/qqp" | "glue/rte" | a pair task of
      `xsens.data.pair_tasks` ("text/pair_reversed", "text/pair_rotation",
      "text/pair_match": sizes from `synthetic.num_train/num_test`, sentence length from
      max_length).
    data_dir: None (-> $TFDS_DATA_DIR or ~/tensorflow_datasets); holds GLUE and the
      tokenizer cache.
    train_split, test_split: "train" / "validation" (TFDS slicing such as "train[:10%]"
      works for GLUE).
    max_length: padded sequence length L (the paper's 128), specials included.
    vocab_size: BPE vocabulary size (GLUE only; the synthetic language has its own).
    num_train: None or a seeded random subset size of the training split.
    synthetic: sizes of the synthetic splits and the longest sentence (in clauses);
      `task` "polarity" (the default: `synthetic_sentences`) or "weak_sum"
      (`weak_sum_sentences`: the label is the sign of a sum of many weak word scores,
      with `margin` and `label_noise`).
  """
  return ml_collections.ConfigDict({
      "name": SYNTHETIC,
      "data_dir": optional(str),
      "train_split": "train",
      "test_split": "validation",
      "max_length": 128,
      "vocab_size": 8192,
      "num_train": optional(int),
      "synthetic": {"num_train": 4096, "num_test": 1024, "max_clauses": 4,
                    **SYNTHETIC_OPTIONAL},
  })

