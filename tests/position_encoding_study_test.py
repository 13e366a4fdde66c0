"""The `position_encoding` study (DIET, issues 18 D and 41): smoke run end to end, config
errors, the learn fraction, and pre-train (masked LM) -> fine-tune."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from mlcollections_configs import position_encoding as pe_config
from xsens import models, studies
from xsens.config_utils import run_config
from xsens.data import pair_tasks
from xsens.errors import ConfigError
from xsens.lab import multirun
from xsens.models import mlm, position, pretrained, text
from xsens.studies import position_encoding as study
from xsens.train import trainer
from xsens.train import workdir as workdir_lib

from tests import text_data_test


@pytest.mark.slow
def test_smoke_study_writes_the_report(tmp_path):
  config = pe_config.get_config("smoke")
  out = studies.run(config, str(tmp_path))
  rows = {r["run"]: r for r in out["rows"]}
  assert set(rows) == {"match_absolute", "match_diet_abs", "match_diet_rel"}
  for name in rows:
    assert workdir_lib.Workdir(os.path.join(tmp_path, "runs", name)).latest_step() == 4
    assert 0.0 <= rows[name]["test_accuracy"] <= 1.0
  # Theorem 1 on the smoke model (width 8, 2 heads: d_h = 4; L = 12): input PE <= d_h,
  # DIET-ABS <= d_h + d_p + 2 segment blocks, DIET-REL up to L.
  assert rows["match_absolute"]["logit_rank_max"] <= 4
  assert 4 < rows["match_diet_abs"]["logit_rank_max"] <= 10
  assert rows["match_diet_rel"]["logit_rank_max"] > 10
  costs = {c["mode"]: c for c in out["costs"]}
  for c in costs.values():   # ratios to the input-PE baseline, from the measured columns
    assert c["flops_ratio"] == pytest.approx(c["forward_flops"]
                                             / costs["absolute"]["forward_flops"])
    assert c["step_time_ratio"] == pytest.approx(c["step_ms"] / costs["absolute"]["step_ms"])
  # DIET-REL adds an L × L bias per head and layer to the scores: more forward FLOPs.
  assert costs["diet_rel"]["forward_flops"] > costs["absolute"]["forward_flops"]
  # Parameters: the input table (L_max · D) is replaced by each mode's own terms.
  m = config.runs.match_absolute.model
  d_h = m.width // m.num_heads
  extra_abs = 2 * m.num_heads * m.max_length * d_h + 4 * m.num_heads
  extra_rel = m.depth * (m.num_heads * (2 * m.max_length - 1) + 4 * m.num_heads)
  table = m.max_length * m.width
  assert costs["diet_abs"]["params"] == costs["absolute"]["params"] - table + extra_abs
  assert costs["diet_rel"]["params"] == costs["absolute"]["params"] - table + extra_rel
  for name in ("results.md", "accuracy.png", "diet_abs_maps.png", "diet_rel_maps.png"):
    assert os.path.exists(tmp_path / name), name


def test_config_variants_and_errors(tmp_path):
  config = pe_config.get_config("")
  assert config.num_seeds == 5 and config.pretrain.steps == 0
  modes = {r.model.position for r in config.runs.values()}
  assert modes <= set(position.POSITIONS) and {"absolute", "diet_abs", "diet_rel"} <= modes
  glue = pe_config.get_config("setup=glue")
  assert {r.data.name for r in glue.runs.values()} == {"glue/mrpc", "glue/qqp", "glue/rte"}
  with pytest.raises(ValueError, match="unknown mode 'alibi'"):
    pe_config.get_config("modes=absolute+alibi")
  config = pe_config.get_config("smoke")
  config.runs.match_diet_abs.model.position = "alibi"
  with pytest.raises(ConfigError, match=r"runs\.match_diet_abs\.model\.position") as e:
    studies.run(config, str(tmp_path))
  assert "\n" not in str(e.value)
  config = pe_config.get_config("smoke")
  config.position_encoding.baseline_mode = "t5"
  with pytest.raises(ConfigError, match=r"position_encoding\.baseline_mode"):
    studies.run(config, str(tmp_path))
  assert not os.listdir(tmp_path)


def test_learn_fraction_and_per_seed_values_against_a_known_table():
  accs = [0.97, 0.98, 0.50, 0.62, 1.00]   # Bimodal seeds, as the pair tasks give.
  assert study.learned(accs, 0.9).tolist() == [True, True, False, False, True]
  assert study.learn_fraction(accs, 0.9) == pytest.approx(0.6)
  assert study.learn_fraction(accs, 0.5) == 1.0          # >=: the threshold itself learns.
  assert study.learn_fraction([0.5, 0.54], 0.9) == 0.0
  assert math.isnan(study.learn_fraction([], 0.9))
  ids = {"a": ("a", 0), "a_seed1": ("a", 1), "a_seed2": ("a", 2), "b": ("b", 0)}
  rows = [{"run": r, "test_accuracy": v} for r, v in
          [("a_seed2", 0.3), ("b", 0.9), ("a", 0.1), ("a_seed1", 0.2)]]
  assert study.seed_values(rows, ids, "test_accuracy") == {"a": [0.1, 0.2, 0.3], "b": [0.9]}


def test_rank_bound_is_theorem_1():
  m = dict(num_classes=2, vocab_size=20, max_length=12, width=32, num_heads=8)   # d_h = 4
  bound = lambda mode, **kw: study.rank_bound(text.RoBERTa(**m, position=mode, **kw), 12)
  assert bound("absolute") == bound("none") == bound("sinusoidal") == 4
  assert bound("diet_abs") == 10 and bound("diet_abs", diet_dim=16) == 12   # capped at L
  assert bound("diet_rel") == bound("shaw") == bound("t5") == 12


def test_variants_diet_dims_and_pretrain():
  config = pe_config.get_config("diet_dims=all,modes=absolute+diet_abs+diet_rel")
  dims = {n: r.model.get("diet_dim") for n, r in config.runs.items()}
  assert dims == {"match_absolute": None, "match_diet_abs_dp04": 4,
                  "match_diet_abs_dp16": 16, "match_diet_abs_dp64": 64,
                  "match_diet_rel": None}
  assert study.run_label(config, "match_diet_abs_dp16") == "diet_abs d_p=16"
  assert study.run_label(config, "match_diet_rel") == "diet_rel"
  assert study.baseline_label(config) == "absolute"
  config.position_encoding.baseline_mode = "diet_abs"
  assert study.baseline_label(config) == "diet_abs d_p=4"
  assert list(pe_config.get_config("diet_dims=4+64,modes=diet_abs").runs) == [
      "match_diet_abs_dp04", "match_diet_abs_dp64"]
  with pytest.raises(ValueError, match="diet_dims='x'"):
    pe_config.get_config("diet_dims=x")
  assert pe_config.get_config("pretrain=1").pretrain.steps == 2000
  assert pe_config.get_config("pretrain_steps=300").pretrain.steps == 300
  glue = pe_config.get_config("setup=glue")
  assert glue.pretrain.steps > 0 and glue.pretrain.corpus == "train_inputs"
  pe_config.validate(glue)


@pytest.mark.parametrize("field, value, message", [
    ("pretrain.steps", -1, "must be an int >= 0 (0: no pre-training), got -1"),
    ("pretrain.batch_size", 0, "must be an int >= 1, got 0"),
    ("pretrain.mask_rate", 1.0, "must be a number in (0, 1) (the share of word tokens "
     "hidden), got 1.0"),
    ("pretrain.corpus", "wiki", "unknown corpus 'wiki'; allowed: pair_tasks, train_inputs"),
    ("position_encoding.learn_threshold", 1.5, "must be a number in (0, 1] (test "
     "accuracy), got 1.5"),
])
def test_new_fields_are_refused_in_one_line(field, value, message):
  config = pe_config.get_config("smoke,pretrain=1")
  block, leaf = field.split(".")
  config[block][leaf] = value
  with pytest.raises(ConfigError) as e:
    pe_config.validate(config)
  assert str(e.value) == f"config.{field}: {message}"


def test_pair_corpus_needs_pair_tasks_and_the_optimizer_is_checked(tmp_path):
  config = pe_config.get_config("tasks=sentiment,pretrain=1")
  with pytest.raises(ConfigError, match=r"config\.pretrain\.corpus: 'pair_tasks' writes "
                     r"pair-task ids, which run 'sentiment_absolute'"):
    pe_config.validate(config)
  config.pretrain.corpus = "train_inputs"
  pe_config.validate(config)
  config = pe_config.get_config("smoke,pretrain=1")
  config.pretrain.optimizer.learning_rate = -1.0
  with pytest.raises(ConfigError, match=r"pretrain\.optimizer\.learning_rate") as e:
    studies.run(config, str(tmp_path))
  assert "\n" not in str(e.value) and not os.listdir(tmp_path)


def test_unlabeled_corpus_and_mlm_batch():
  corpus = pair_tasks.unlabeled_corpus(7, 0, max_length=12)
  assert corpus.shape == (7, 12)
  for n, task in enumerate(["reversed", "rotation", "match"]):   # Tasks in turn, stream 2.
    ids, _ = pair_tasks.pair_task(task, 3, 0, stream=pair_tasks.CORPUS_STREAM, max_length=12)
    np.testing.assert_array_equal(corpus[n], ids[0])
    np.testing.assert_array_equal(corpus[n + 3], ids[1])
  assert not (corpus == pair_tasks.MASK_ID).any()
  ids, labels = study.mlm_batch(jnp.asarray(corpus), 5, jax.random.key(0), 256, 0.5)
  ids, labels = np.asarray(ids), np.asarray(labels)
  hidden = labels >= 0
  assert hidden.any() and (ids[hidden] == pair_tasks.MASK_ID).all()
  assert (labels[hidden] >= pair_tasks.NUM_SPECIAL).all()     # Only words are hidden.
  assert (ids[~hidden] != pair_tasks.MASK_ID).all()
  # Each row is a corpus row with its hidden words restored.
  restored = np.where(hidden, labels, ids)
  assert all((restored[i] == corpus).all(axis=1).any() for i in range(len(ids)))
  assert 0.4 < hidden.sum() / (restored >= pair_tasks.NUM_SPECIAL).sum() < 0.6   # rate 0.5


def test_order_free_mlm_accuracy_known_answers():
  """The order-blind yardstick: 1/|hidden in S| when a hidden word is visible in the other
  sentence, 1/(words visible in neither) when it is hidden in both."""
  row = np.array([1, 4, 5, 6, 7, 2, 2, 7, 6, 5, 4, 2])        # A = 4 5 6 7, B reversed.

  def hide(*positions):
    ids, labels = row.copy(), np.full_like(row, -1)
    for p in positions:
      ids[p], labels[p] = pair_tasks.MASK_ID, row[p]
    return ids[None], labels[None]

  assert pair_tasks.order_free_mlm_accuracy(*hide(2)) == 1.0           # 5, seen in B.
  assert pair_tasks.order_free_mlm_accuracy(*hide(1, 2)) == 0.5        # 4 or 5 in A.
  unseen = pair_tasks.NUM_WORDS - 3                                     # 5, 6, 7 visible.
  assert math.isclose(pair_tasks.order_free_mlm_accuracy(*hide(1, 10)), 1 / unseen)
  assert math.isclose(pair_tasks.order_free_mlm_accuracy(
      np.concatenate([hide(2)[0], hide(1, 10)[0]]),
      np.concatenate([hide(2)[1], hide(1, 10)[1]])), (1 + 2 / unseen) / 3)


@pytest.mark.parametrize("mode", ["absolute", "diet_abs", "diet_rel"])
def test_pretrained_encoder_restores_into_the_classifier(tmp_path, mode):
  """The MLM's encoder leaves load unchanged into the classifier; the head is new."""
  clf = models.get_model("roberta", 2, (12,), vocab_size=20, max_length=12, width=16,
                         depth=2, num_heads=2, mlp_dim=32, dropout_rate=0.0, position=mode)
  lm = mlm.for_classifier(clf)
  ids = jnp.asarray(pair_tasks.unlabeled_corpus(4, 0, max_length=12))
  lm_params = lm.init(jax.random.key(3), ids)["params"]
  lm_params = jax.tree.map(lambda x: x + 0.1, lm_params)   # Not an init clf would draw.
  path = str(tmp_path / "encoder.npz")
  mlm.save_checkpoint(path, lm_params)
  key = jax.random.key(9)
  loaded = models.REGISTRY["roberta"].load_pretrained(path, clf, (12,), reinit_head=True,
                                                      key=key)["params"]
  fresh = clf.init({"params": key}, ids)["params"]
  flat, enc = pretrained.flatten(loaded), pretrained.flatten(lm_params["encoder"])
  assert set(flat) == set(pretrained.flatten(fresh))
  heads = {k for k in flat if k.startswith(("head_dense/", "head_out/"))}
  assert heads and set(flat) - heads == set(enc)
  for k in enc:
    np.testing.assert_array_equal(flat[k], enc[k])
  for k in heads:   # New: the classifier's own init under the key.
    np.testing.assert_array_equal(flat[k], pretrained.flatten(fresh)[k])
  # The loaded classifier runs, and the same encoder gives the MLM's hidden states.
  h_lm = lm.apply({"params": lm_params}, ids, method=lm.hidden)
  segments = None if mode == "absolute" else position.segment_ids(ids)
  h_clf = clf.apply({"params": loaded}, clf.apply({"params": loaded}, ids,
                                                   method=clf.embed),
                    text.padding_mask(ids), False, segments, method=clf.hidden_states)
  np.testing.assert_allclose(h_clf, h_lm, rtol=1e-5, atol=1e-5)
  with pytest.raises(pretrained.CheckpointError, match="no classifier head"):
    models.REGISTRY["roberta"].load_pretrained(path, clf, (12,), reinit_head=False)
  other = models.get_model("roberta", 2, (12,), vocab_size=20, max_length=12, width=16,
                           depth=2, num_heads=2, mlp_dim=32, position="t5")
  with pytest.raises(pretrained.CheckpointError, match="missing"):
    models.REGISTRY["roberta"].load_pretrained(path, other, (12,), reinit_head=True, key=key)


def test_trainer_fine_tunes_from_the_mlm_checkpoint(tmp_path):
  """`train.pretrained.path` on an MLM checkpoint: the run's initial params hold its
  encoder (trainer.load_pretrained, the loop's init)."""
  config = pe_config.get_config("smoke")
  exp_config = run_config(config, "match_diet_abs")
  exp = trainer.build_experiment(exp_config)
  lm = mlm.for_classifier(exp.model)
  ids = jnp.asarray(exp.train.inputs[:2])
  lm_params = jax.tree.map(lambda x: x + 0.1, lm.init(jax.random.key(1), ids)["params"])
  path = str(tmp_path / "encoder.npz")
  mlm.save_checkpoint(path, lm_params)
  exp_config.pretrained.path = path
  exp = trainer.build_experiment(exp_config)
  loaded = trainer.load_pretrained(exp.config, exp.model, exp.train.input_shape,
                                   jax.random.key(0))
  np.testing.assert_array_equal(loaded["position_bias"]["p_query"],
                                lm_params["encoder"]["position_bias"]["p_query"])
  np.testing.assert_array_equal(loaded["layers_0"]["attention"]["query"]["kernel"],
                                lm_params["encoder"]["layers_0"]["attention"]["query"]["kernel"])


class FakeMrpc(text_data_test.FakeGlue, skip_registration=True):
  """tests/text_data_test.py's TF-free fake GLUE MRPC."""
  name = "glue"


@pytest.mark.slow
def test_glue_setup_pretrains_then_fine_tunes_on_mock_data(tmp_path):
  data_dir = str(tmp_path / "tfds")
  FakeMrpc(data_dir=data_dir, config="mrpc", file_format="array_record"
           ).download_and_prepare(file_format="array_record")
  config = pe_config.get_config("setup=glue,tasks=mrpc,modes=absolute+diet_abs,seeds=1,"
                                "steps=2,pretrain_steps=3")
  c = config.train
  c.data.data_dir, c.data.max_length, c.data.vocab_size = data_dir, 24, 300
  c.data.test_split, c.batch_size, c.eval_batch_size = "validation", 8, 8
  for run in config.runs.values():
    run.model.update(vocab_size=300, max_length=24, width=16, depth=1, num_heads=2,
                     mlp_dim=32)
  config.pretrain.batch_size = 8
  config.position_encoding.update({"rank_examples": 4, "timing_batch": 4,
                                   "timing_repeats": 1})
  out = studies.run(config, str(tmp_path / "wd"))
  assert set(out["pretrain"]) == {"mrpc_absolute", "mrpc_diet_abs"}
  for name, res in out["pretrain"].items():
    assert os.path.exists(res["checkpoint"]) and 0 <= res["mlm_accuracy"] <= 1
    wd = workdir_lib.Workdir(os.path.join(tmp_path, "wd", "runs", name))
    assert wd.latest_step() == 2
    assert wd.read_json(workdir_lib.CONFIG_FILE)["pretrained"]["path"] == res["checkpoint"]
  rows = {r["run"]: r for r in out["rows"]}
  assert rows["mrpc_diet_abs"]["task"] == "glue/mrpc" and "mlm_accuracy" in rows["mrpc_diet_abs"]


@pytest.mark.slow
def test_runs_of_one_model_seed_and_corpus_share_one_pretraining(tmp_path, monkeypatch):
  config = pe_config.get_config("smoke,pretrain=1,tasks=match+reversed,modes=absolute+diet_abs")
  config.num_seeds = 2
  experiments = {rid: trainer.build_experiment(multirun.seeded_run_config(config, rid, ids))
                 for ids in [multirun.run_ids(config)] for rid in ids}
  calls = []
  real = study.pretrain_run

  def counted(path, *args, **kwargs):
    calls.append(os.path.basename(path))
    return real(path, *args, **kwargs)

  monkeypatch.setattr(study, "pretrain_run", counted)
  rebuilt, out = study.pretrain_all(config, str(tmp_path), experiments)
  # The pair corpus is one stream for every task: one pre-training per mode and seed.
  assert sorted(calls) == ["match_absolute", "match_absolute_seed1", "match_diet_abs",
                           "match_diet_abs_seed1"]
  for mode in ("absolute", "diet_abs"):
    for suffix in ("", "_seed1"):
      shared = out[f"reversed_{mode}{suffix}"]
      assert shared is out[f"match_{mode}{suffix}"]
      assert rebuilt[f"reversed_{mode}{suffix}"].config.pretrained.path == shared["checkpoint"]
  assert out["match_absolute"]["checkpoint"] != out["match_absolute_seed1"]["checkpoint"]
  # The key separates what differs: the seed, the model, the corpus.
  model = mlm.for_classifier(experiments["match_absolute"].model)
  corpus = np.zeros((4, 12), np.int32)
  key = study.pretrain_key(model, corpus, 0)
  assert key == study.pretrain_key(model, corpus.copy(), 0)
  assert key != study.pretrain_key(model, corpus, 1)
  assert key != study.pretrain_key(model, corpus + 1, 0)
  assert key != study.pretrain_key(mlm.for_classifier(experiments["match_diet_abs"].model),
                                   corpus, 0)
