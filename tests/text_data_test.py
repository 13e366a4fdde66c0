"""Tests for the text data (xsens/data/text.py): synthetic language, tokenizer, GLUE."""

import os

from etils import epath
import numpy as np
import pytest
import tensorflow_datasets as tfds

from xsens.data import pipeline
from xsens.data import text
from xsens.errors import ConfigError
from tests.remote_paths_test import fake_gcs  # pylint: disable=unused-import  (fixture)


def _config(**overrides):
  dc = text.default_text_data_config()
  dc.max_length = 32
  dc.synthetic.update({"num_train": 300, "num_test": 100})
  dc.update(overrides)
  return dc


def test_synthetic_language_follows_its_rule():
  sentences, labels = text.synthetic_sentences(400, seed=3, max_clauses=4)
  pos, neg = set(text._POSITIVE), set(text._NEGATIVE)  # pylint: disable=protected-access
  counts = []
  for words, label in zip(sentences, labels):
    # Effective polarity: a "not" right before the adjective flips it.
    votes = [(w in pos) != (i > 0 and words[i - 1] == "not")
             for i, w in enumerate(words) if w in pos | neg]
    assert len(votes) in (1, 3)
    assert label == int(2 * sum(votes) > len(votes))
    assert 5 <= len(words) <= text.synthetic_max_tokens(4) - 2 and words[-1] == "."
    counts.append(len(votes))
  assert 0.4 < labels.mean() < 0.6
  assert 3 in counts and 1 in counts
  assert any("not" in w for w in sentences)
  again, labels2 = text.synthetic_sentences(400, seed=3, max_clauses=4)
  assert again == sentences and np.array_equal(labels, labels2)
  other, _ = text.synthetic_sentences(400, seed=3, stream=1, max_clauses=4)
  assert other != sentences


def test_synthetic_ids_are_right_padded_with_specials():
  ids, labels = text.synthetic_language(50, seed=0, max_clauses=3, max_length=24)
  assert ids.shape == (50, 24) and ids.dtype == np.int32 and labels.shape == (50,)
  lengths = (ids != text.PAD_ID).sum(1)
  for row, n in zip(ids, lengths):
    assert row[0] == text.BOS_ID and row[n - 1] == text.EOS_ID
    assert (row[n:] == text.PAD_ID).all() and (row[1:n - 1] >= 4).all()
  assert ids.max() < text.SYNTHETIC_VOCAB
  sentences, _ = text.synthetic_sentences(50, seed=0, max_clauses=3)
  assert text.synthetic_decode(ids[0]) == " ".join(sentences[0])


def test_load_split_through_the_pipeline():
  dc = _config(num_train=200)
  train = pipeline.load_split(dc, "train", seed=1)
  test = pipeline.load_split(dc, "validation", seed=1)
  assert train.images.shape == (200, 32) and train.images.dtype == np.int32
  assert test.images.shape == (100, 32) and train.image_shape == (32,)
  assert train.num_classes == 2 and train.vocab_size == text.SYNTHETIC_VOCAB
  again = pipeline.load_split(dc, "train", seed=1)
  np.testing.assert_array_equal(again.images, train.images)
  np.testing.assert_array_equal(again.labels, train.labels)
  pipeline.validate_data_config(dc)


@pytest.mark.parametrize("overrides, field", [
    (dict(name="text/nope"), "data.name"),
    (dict(max_length=10), "data.max_length"),
    (dict(vocab_size=100), "data.vocab_size"),
    (dict(test_split="test"), "data.test_split"),
    (dict(test_split="train"), "data.test_split"),
    (dict(num_train=0), "data.num_train"),
    (dict(num_train=5000), "data.num_train"),
])
def test_bad_config_is_refused(overrides, field):
  with pytest.raises(ConfigError) as e:
    pipeline.load_split(_config(**overrides), "train")
  assert e.value.field == field


def test_unknown_and_missing_fields_are_refused():
  dc = _config()
  with dc.unlocked():
    dc.image_key = "image"
  with pytest.raises(ConfigError, match="data.image_key"):
    pipeline.validate_data_config(dc)
  dc = _config()
  with dc.unlocked():
    del dc["max_length"]
  with pytest.raises(ConfigError, match="data.max_length"):
    pipeline.validate_data_config(dc)


CORPUS = ["The movie was great, wasn't it?", "Über-naïve café owners — 42 times!",
          "tabs\tand  double spaces", "How do I learn JAX?", "What is a tokenizer?"] * 5


def test_tokenizer_round_trips_and_is_deterministic():
  tok = text.train_tokenizer(CORPUS, vocab_size=300)
  for sentence in set(CORPUS) | {"unseen wörds ✓ here"}:
    ids = tok.encode(sentence).ids
    assert ids[0] == text.BOS_ID and ids[-1] == text.EOS_ID
    assert tok.decode(ids, skip_special_tokens=True) == sentence
  assert text.train_tokenizer(CORPUS, vocab_size=300).to_str() == tok.to_str()
  pair = text.encode(tok, ["How do I learn JAX?"], ["What is a tokenizer?"], 40)[0]
  n = int((pair != text.PAD_ID).sum())
  assert (pair[n:] == 0).all() and pair[0] == text.BOS_ID and pair[n - 1] == text.EOS_ID
  sep = np.flatnonzero(pair == text.EOS_ID)
  assert len(sep) == 3 and sep[1] == sep[0] + 1  # <s> A </s></s> B </s>
  short = text.encode(tok, CORPUS[:3], CORPUS[3:6], 8)
  assert short.shape == (3, 8) and (short[:, -1] == text.EOS_ID).all()  # Truncated.
  assert tok.get_vocab_size() <= 300


def test_tokenizer_is_cached(tmp_path):
  path = text.tokenizer_path(str(tmp_path), "glue/mrpc", "train[:50%]", 300)
  assert path.startswith(os.path.join(str(tmp_path), text.TOKENIZER_DIR))
  assert path != text.tokenizer_path(str(tmp_path), "glue/mrpc", "train", 300)
  assert path != text.tokenizer_path(str(tmp_path), "glue/mrpc", "train[:50%]", 400)
  first = text.load_or_train_tokenizer(path, lambda: CORPUS, 300)
  assert os.path.exists(path)

  def never():
    raise AssertionError("the cached tokenizer must be reused")

  second = text.load_or_train_tokenizer(path, never, 300)
  assert second.to_str() == first.to_str()


def test_tokenizer_is_cached_in_a_remote_data_dir(fake_gcs, monkeypatch):
  """A `gs://` data_dir (in-memory fake store): the tokenizer is saved there, nothing
  lands on local disk (checked by the fixture), and the cached copy is reused."""
  monkeypatch.setattr(text, "_read_glue", lambda name, data_dir, split: (
      CORPUS[:20], CORPUS[20:], np.zeros(20, np.int64)))
  dc = _config(name="glue/mrpc", data_dir="gs://b/data", vocab_size=300)
  first = text.glue_tokenizer(dc)
  path = text.tokenizer_path("gs://b/data", "glue/mrpc", "train", 300)
  assert path.startswith("gs://b/data/" + text.TOKENIZER_DIR + "/")
  assert [k for k in fake_gcs.store if k.startswith("/b/data/")] == [path[len("gs:/"):]]

  def never():
    raise AssertionError("the cached tokenizer must be reused")

  assert text.load_or_train_tokenizer(path, never, 300).to_str() == first.to_str()
  assert first.to_str() == text.train_tokenizer(CORPUS, 300).to_str()


def test_glue_missing_from_data_dir_is_a_config_error(tmp_path):
  dc = _config(name="glue/mrpc", data_dir=str(tmp_path))
  with pytest.raises(ConfigError, match="not found in data_dir") as e:
    pipeline.validate_data_config(dc)
  assert e.value.field == "data.name"


class FakeGlue(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A tiny dataset with GLUE MRPC's name, layout and features, prepared without TF."""
  name = "glue"
  VERSION = tfds.core.Version("2.0.0")
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="mrpc")]
  code_path = epath.Path(__file__)  # As xsens.data.builders.mnist5k (TF-free installs).

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "sentence1": tfds.features.Text(), "sentence2": tfds.features.Text(),
        "label": tfds.features.ClassLabel(num_classes=2), "idx": np.int32}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(0, 64), "validation": self._generate_examples(64, 8),
            "test": self._generate_examples(72, 4, label=-1)}

  def _generate_examples(self, start, n, label=None):
    words = ["amrozi", "accused", "his", "brother", "referring", "witness", "café", "evidence"]
    for i in range(start, start + n):
      a = " ".join(words[(i + j) % len(words)] for j in range(3 + i % 5))
      b = " ".join(words[(2 * i + j) % len(words)] for j in range(2 + i % 4))
      yield i, {"sentence1": a, "sentence2": b,
                "label": i % 2 if label is None else label, "idx": i}


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("glue_data"))
  FakeGlue(data_dir=data_dir, config="mrpc", file_format="array_record").download_and_prepare(
      file_format="array_record")
  return data_dir


def test_glue_from_a_prepared_data_dir(glue_dir):
  dc = _config(name="glue/mrpc", data_dir=glue_dir, max_length=16, vocab_size=300)
  pipeline.validate_data_config(dc)
  train = pipeline.load_split(dc, "train", seed=0)
  val = pipeline.load_split(dc, "validation", seed=0)
  assert train.images.shape == (64, 16) and val.images.shape == (8, 16)
  assert train.images.dtype == np.int32 and train.vocab_size <= 300
  assert (train.images[:, 0] == text.BOS_ID).all()
  np.testing.assert_array_equal(np.sort(train.labels), [0] * 32 + [1] * 32)
  cached = os.listdir(os.path.join(glue_dir, text.TOKENIZER_DIR))
  assert len(cached) == 1 and cached[0].startswith("glue_mrpc-train-")
  # Every id decodes back to the two sentences (BPE round trip through the cache).
  tok = text.glue_tokenizer(dc)
  first, second, _ = text._read_glue("glue/mrpc", glue_dir, "validation")  # pylint: disable=protected-access
  ids = text.encode(tok, first, second, 64)
  for row, a, b in zip(ids, first, second):
    n = int((row != 0).sum())
    sep = np.flatnonzero(row[:n] == text.EOS_ID)[0]
    assert tok.decode(row[1:sep].tolist()) == a
    assert tok.decode(row[sep + 2:n - 1].tolist()) == b


def test_glue_test_split_is_refused(glue_dir):
  dc = _config(name="glue/mrpc", data_dir=glue_dir, test_split="test")
  with pytest.raises(ConfigError, match="hidden") as e:
    pipeline.validate_data_config(dc)
  assert e.value.field == "data.test_split"


def test_paper_setups_validate_on_glue_data(glue_dir):
  """The MRPC set-up (paper sizes) builds all four runs on GLUE-layout data (no training)."""
  from mlcollections_configs import sensitivity_language as sl_config  # pylint: disable=g-import-not-at-top
  from xsens.studies import sensitivity_language as sl  # pylint: disable=g-import-not-at-top
  config = sl_config.get_config("setup=mrpc")
  config.train.data.data_dir = glue_dir
  config.sensitivity.num_examples = 32
  experiments = sl.validate(config)
  assert set(experiments) == {"roberta", "roberta_relu", "gpt2", "lstm"}
  assert experiments["roberta_relu"].model.attention == "relu"
  assert experiments["roberta"].model.mlp_dim == 3072
  assert experiments["lstm"].train.images.shape == (64, 128)
  assert experiments["gpt2"].total_steps == 200  # 100 epochs of 64 // 32 steps.


def test_weak_sum_language_follows_its_rule_and_is_deterministic():
  scores = text.weak_sum_scores(5)
  sentences, labels = text.weak_sum_sentences(300, seed=5, max_clauses=4, margin=0.5)
  n_content = []
  for words, label in zip(sentences, labels):
    s = [scores[text._WORD_ID[w]] for w in words]  # pylint: disable=protected-access
    content = [w for w in words if w in text.CONTENT_WORDS]
    assert label == int(sum(s) > 0)
    assert abs(sum(s)) >= 0.5 * np.sqrt(len(content)) - 1e-12
    assert words[-1] == "." and len(words) <= text.synthetic_max_tokens(4) - 2
    n_content.append(len(content))
  assert np.mean(n_content) > 10 and 0.4 < labels.mean() < 0.6
  # Function words and specials score 0; content scores are standardised.
  content_ids = [text._WORD_ID[w] for w in text.CONTENT_WORDS]  # pylint: disable=protected-access
  assert np.count_nonzero(scores) == len(content_ids)
  np.testing.assert_allclose([scores[content_ids].mean(), scores[content_ids].std()], [0, 1],
                             atol=1e-12)
  again, labels2 = text.weak_sum_sentences(300, seed=5, max_clauses=4, margin=0.5)
  assert again == sentences and np.array_equal(labels, labels2)
  assert text.weak_sum_sentences(300, seed=5, stream=1)[0] != sentences
  assert not np.array_equal(text.weak_sum_scores(6), scores)
  # Label noise flips a fraction of the rule's labels, deterministically.
  _, noisy = text.weak_sum_sentences(300, seed=5, max_clauses=4, label_noise=0.2)
  _, clean = text.weak_sum_sentences(300, seed=5, max_clauses=4)
  assert 0.1 < (noisy != clean).mean() < 0.3


def test_weak_sum_through_the_pipeline_and_token_types():
  dc = _config()
  dc.synthetic.update({"task": "weak_sum", "margin": 1.0})
  train = pipeline.load_split(dc, "train", seed=2)
  scores = text.weak_sum_scores(2)
  for row, label in zip(train.images[:50], train.labels[:50]):
    assert label == int(scores[row].sum() > 0)
  types = text.token_types(train.images, "weak_sum", seed=2)
  real = train.images != text.PAD_ID
  total = types["signal"].astype(int) + types["other"] + types["special"]
  np.testing.assert_array_equal(total, real)  # A partition of the real tokens.
  signal = text.signal_token_ids("weak_sum", 2)
  assert len(signal) == 18 and np.abs(scores[signal]).min() >= np.abs(
      np.delete(scores, signal)).max()
  ids, _ = text.synthetic_language(20, seed=0)
  t = text.token_types(ids, "polarity")
  words = np.asarray(text.WORDS + ("",) * 4)[np.maximum(ids - 4, 0)]
  assert set(words[t["signal"]]) <= set(text._POSITIVE + text._NEGATIVE + ("not",))  # pylint: disable=protected-access
  assert t["special"].sum() == 40 and not (t["other"] & np.isin(words, text._POSITIVE)).any()  # pylint: disable=protected-access


@pytest.mark.parametrize("synthetic, field", [
    ({"task": "sum"}, "data.synthetic.task"),
    ({"task": "weak_sum", "margin": -1.0}, "data.synthetic.margin"),
    ({"task": "weak_sum", "margin": 4.0}, "data.synthetic.margin"),
    ({"task": "weak_sum", "label_noise": 0.5}, "data.synthetic.label_noise"),
    ({"margin": 1.0}, "data.synthetic.margin"),  # Only weak_sum reads it.
    ({"bogus": 1}, "data.synthetic.bogus"),
])
def test_bad_synthetic_task_fields_are_refused(synthetic, field):
  dc = _config()
  with dc.unlocked():
    dc.synthetic.update(synthetic)
  with pytest.raises(ConfigError) as e:
    pipeline.load_split(dc, "train")
  assert e.value.field == field
