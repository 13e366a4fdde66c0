"""Pieces of the modify_memories study: knowledge, projection, masks, replay, validation."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mlcollections_configs import modify_memories as mm_config
from xsens.data import cloze_batches, knowledge
from xsens.errors import ConfigError
from xsens.models import mlm
from xsens.studies import modify_memories as mm
from xsens.train import constraints, objectives


def _tree(seed=0):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  return {"a": jax.random.normal(k1, (5, 7)) * 3.0,
          "b": {"c": jax.random.normal(k2, (11,)) * 1e3, "d": jax.random.normal(k3, (3,))}}


# ------------------------------------------------------------------------------ projection


@pytest.mark.parametrize("delta", [0.0, 1e-6, 1e-3, 0.5])
def test_linf_projection_keeps_every_parameter_within_delta(delta):
  anchor, moved = _tree(0), _tree(1)
  out = constraints.project(moved, anchor, delta, "linf")
  for p, a, m in zip(jax.tree.leaves(out), jax.tree.leaves(anchor), jax.tree.leaves(moved)):
    lo, hi = a - jnp.float32(delta), a + jnp.float32(delta)   # The bounds, rounded once.
    assert bool(jnp.all((p >= lo) & (p <= hi)))
    # Inside the box nothing moves; outside, the parameter sits on the bound.
    inside = (m >= lo) & (m <= hi)
    np.testing.assert_array_equal(np.where(inside, p, 0), np.where(inside, m, 0))
    np.testing.assert_array_equal(np.where(m > hi, p, 0), np.where(m > hi, hi, 0))


def test_l2_projection_lands_on_the_ball_or_leaves_inside_points():
  anchor, moved = _tree(0), _tree(1)
  dist = float(constraints.distance(moved, anchor, "l2"))
  out = constraints.project(moved, anchor, 0.25 * dist, "l2")
  np.testing.assert_allclose(float(constraints.distance(out, anchor, "l2")), 0.25 * dist,
                             rtol=1e-5)
  same = constraints.project(moved, anchor, 2 * dist, "l2")
  for p, m in zip(jax.tree.leaves(same), jax.tree.leaves(moved)):
    np.testing.assert_allclose(p, m, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("norm", constraints.NORMS)
def test_delta_zero_changes_nothing(norm):
  anchor, moved = _tree(0), _tree(1)
  out = constraints.project(moved, anchor, 0.0, norm)
  for p, a in zip(jax.tree.leaves(out), jax.tree.leaves(anchor)):
    np.testing.assert_array_equal(p, a)   # Bit for bit.
  unconstrained = constraints.project(moved, anchor, jnp.inf, norm)
  for p, m in zip(jax.tree.leaves(unconstrained), jax.tree.leaves(moved)):
    np.testing.assert_array_equal(p, m)


def test_projection_transformation_holds_theta0_and_projects_every_step():
  anchor = _tree(0)
  delta = 1e-2
  tx = optax.chain(optax.sgd(1.0), constraints.projection(delta, "linf"))
  state = tx.init(anchor)
  params = anchor
  for step in range(3):
    grads = _tree(10 + step)
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    gap = float(constraints.distance(params, anchor, "linf"))
    # Up to one rounding of params + update (module doc): an ulp of the largest parameter.
    ulp = max(float(np.spacing(np.abs(np.asarray(x)).max())) for x in jax.tree.leaves(anchor))
    assert gap <= delta + ulp
  np.testing.assert_array_equal(state[1].anchor["a"], anchor["a"])


def test_projection_refuses_an_unknown_norm():
  with pytest.raises(ValueError, match="unknown norm 'l1'"):
    constraints.project(_tree(0), _tree(1), 1.0, "l1")


# ------------------------------------------------------------------------------ knowledge


def test_knowledge_base_is_reproducible_from_its_seed():
  a = knowledge.synthetic_knowledge(3, num_subjects=30, num_relations=4)
  b = knowledge.synthetic_knowledge(3, num_subjects=30, num_relations=4)
  c = knowledge.synthetic_knowledge(4, num_subjects=30, num_relations=4)
  assert a.vocab == b.vocab
  for split in ("train", "heldout"):
    for k in ("ids", "position", "fact"):
      np.testing.assert_array_equal(a.__dict__[split][k], b.__dict__[split][k])
  np.testing.assert_array_equal(a.facts, b.facts)
  assert not np.array_equal(a.facts, c.facts)


def _patterns(data, split, relation):
  """The set of sentence shapes (slots replaced) of one relation's sentences."""
  rows = split["ids"][data.facts[split["fact"], 1] == relation]
  out = set()
  for row in rows:
    words = [data.vocab[i] for i in row if i]
    out.add(" ".join("X" if w.startswith("subj") else "R" if w.startswith("rel") else w
                     for w in words))
  return out


def test_knowledge_splits_do_not_leak_and_are_well_formed():
  data = knowledge.synthetic_knowledge(0, num_subjects=20, num_relations=4,
                                       num_train_templates=3, num_heldout_templates=2)
  assert data.facts.shape == (80, 3)
  for r in range(4):
    train, held = _patterns(data, data.train, r), _patterns(data, data.heldout, r)
    assert len(train) == 3 and len(held) == 2 and not train & held
  for split in (data.train, data.heldout):
    assert np.all((split["ids"] == knowledge.MASK_ID).sum(1) == 1)
    assert np.all(split["ids"][np.arange(len(split["ids"])), split["position"]]
                  == knowledge.MASK_ID)
    # The object never appears in its own sentence.
    objects = data.facts[split["fact"], 2]
    assert not np.any(split["ids"] == objects[:, None])
  # Objects are relation-specific; the many-to-one relations have 5 objects.
  sets = [set(data.relation_objects(r)[0].tolist()) for r in range(4)]
  assert all(not sets[i] & sets[j] for i in range(4) for j in range(i + 1, 4))
  assert len(sets[0]) <= 5 and len(sets[3]) > 5


def test_choose_modified_draws_known_facts_and_other_objects_of_the_relation():
  data = knowledge.synthetic_knowledge(0, num_subjects=40, num_relations=4)
  known = np.ones(len(data.facts), bool)
  known[::3] = False
  chosen, new = knowledge.choose_modified(data, known, 25, seed=1)
  assert len(set(chosen.tolist())) == 25 and known[chosen].all()
  for f, o in zip(chosen, new):
    ids, _ = data.relation_objects(int(data.facts[f, 1]))
    assert o != data.facts[f, 2] and o in ids
  again = knowledge.choose_modified(data, known, 25, seed=1)
  np.testing.assert_array_equal(again[0], chosen)
  np.testing.assert_array_equal(again[1], new)
  with pytest.raises(ValueError, match="only"):
    knowledge.choose_modified(data, known, len(data.facts), seed=1)


def test_new_objects_follow_the_object_frequencies():
  data = knowledge.synthetic_knowledge(0, num_subjects=400, num_relations=1,
                                       many_to_one_fraction=1.0, many_to_one_objects=3)
  ids, counts = data.relation_objects(0)
  draws = []
  for seed in range(40):
    chosen, new = knowledge.choose_modified(data, np.ones(400, bool), 100, seed)
    old = data.facts[chosen, 2]
    draws += [(o, n) for o, n in zip(old, new)]
  draws = np.asarray(draws)
  # Among facts whose old object is ids[0], new objects are ids[1] vs ids[2] ∝ counts.
  sub = draws[draws[:, 0] == ids[0], 1]
  expected = counts[1] / (counts[1] + counts[2])
  assert abs(np.mean(sub == ids[1]) - expected) < 0.05


def test_background_cloze_masks_one_word_of_the_synthetic_language():
  bg = knowledge.background_cloze(50, 0, stream=0, length=16)
  rows = np.arange(50)
  assert np.all(bg["ids"][rows, bg["position"]] == knowledge.MASK_ID)
  assert np.all((bg["ids"] == knowledge.MASK_ID).sum(1) == 1)
  assert np.all((bg["target"] >= 4) & (bg["target"] < knowledge.MASK_ID))


def _write_lama(root):
  os.makedirs(os.path.join(root, "TREx"))
  with open(os.path.join(root, "relations.jsonl"), "w") as f:
    f.write(json.dumps({"relation": "P19", "template": "[X] was born in [Y] .",
                        "type": "N-1"}) + "\n")
    f.write(json.dumps({"relation": "P36", "template": "The capital of [X] is [Y] .",
                        "type": "1-1"}) + "\n")
  facts = [
      {"sub_label": "Ada Lovelace", "obj_label": "London", "predicate_id": "P19",
       "masked_sentences": ["Ada Lovelace was born in [MASK] in 1815 .",
                            "[MASK] , birthplace of Ada Lovelace ."]},
      {"sub_label": "Alan Turing", "obj_label": "Maida Vale", "predicate_id": "P19",
       "masked_sentences": ["Alan Turing was born in [MASK] ."]},       # Two-word object.
      {"sub_label": "Grace Hopper", "obj_label": "NYC", "predicate_id": "P19",
       "masked_sentences": ["[MASK] [MASK] Grace Hopper ."]},            # Two masks: no text.
  ]
  with open(os.path.join(root, "TREx", "P19.jsonl"), "w") as f:
    f.write("\n".join(json.dumps(x) for x in facts) + "\n")
  with open(os.path.join(root, "TREx", "P36.jsonl"), "w") as f:
    f.write(json.dumps({"sub_label": "France", "obj_label": "Paris",
                        "masked_sentences": ["Paris is [MASK] 's capital ."[0:0] +
                                             "The capital of France , [MASK] , is big ."]})
            + "\n")


def test_lama_trex_reader_on_fake_files(tmp_path):
  root = str(tmp_path / "lama")
  _write_lama(root)
  data = knowledge.read_lama_trex(root)
  assert data.relation_names == ("P19", "P36")
  assert data.subject_names == ("Ada Lovelace", "France")
  assert [data.vocab[o] for o in data.facts[:, 2]] == ["London", "Paris"]
  decode = lambda row: " ".join(data.vocab[i] for i in row if i)
  assert decode(data.train["ids"][0]) == "<s> Ada Lovelace was born in [MASK] in 1815 . </s>"
  assert data.train["fact"].tolist() == [0, 0, 1]
  assert decode(data.heldout["ids"][1]) == "<s> The capital of France is [MASK] . </s>"
  assert np.all(data.train["ids"][np.arange(3), data.train["position"]] == knowledge.MASK_ID)
  only = knowledge.read_lama_trex(root, relations=("P36",))
  assert only.relation_names == ("P36",) and len(only.facts) == 1


def test_lama_trex_reader_names_the_data_dir_when_missing(tmp_path):
  with pytest.raises(ConfigError, match=r"config\.data\.data_dir: .*relations\.jsonl"):
    knowledge.read_lama_trex(str(tmp_path))


# ------------------------------------------------------------------------------ model, loss


def test_part_masks_select_their_leaves():
  model = mlm.RobertaMLM(vocab_size=20, max_length=8, width=8, depth=3, num_heads=2,
                         mlp_dim=16)
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  flat = lambda part: {"/".join(str(k.key) for k in path): float(v) for path, v in
                       jax.tree_util.tree_leaves_with_path(mlm.part_mask(params, part, 3))}
  last = flat("last")
  assert all(v == (k.startswith("encoder/layers_2/")) for k, v in last.items())
  assert flat("block_2") == last
  assert all(v == (k.startswith("encoder/layers_0/")) for k, v in flat("first").items())
  ff = flat("feed_forward")
  assert ff["encoder/layers_1/intermediate/kernel"] == 1.0
  assert ff["encoder/layers_1/attention/query/kernel"] == 0.0
  head = flat("head")
  assert head["bias"] == 1.0 and head["dense/kernel"] == 1.0
  assert head["encoder/word_embeddings/embedding"] == 0.0
  assert flat("embeddings")["encoder/word_embeddings/embedding"] == 1.0
  assert all(v == 1.0 for v in flat("all").values())
  with pytest.raises(ConfigError, match="unknown part 'block_3'"):
    mlm.part_mask(params, "block_3", 3)


def test_mlm_logits_are_tied_to_the_word_embeddings():
  model = mlm.RobertaMLM(vocab_size=20, max_length=8, width=8, depth=1, num_heads=2,
                         mlp_dim=16)
  ids = jnp.asarray([[1, 5, 6, 2, 0, 0, 0, 0]], jnp.int32)
  v = model.init(jax.random.key(0), ids)
  full = model.apply(v, ids)
  at = model.apply(v, ids, jnp.asarray([2]), method=model.at_positions)
  np.testing.assert_allclose(at[0], full[0, 2], rtol=1e-5, atol=1e-6)
  table = v["params"]["encoder"]["word_embeddings"]["embedding"]
  bumped = jax.tree.map(lambda x: x, v)
  bumped["params"]["encoder"]["word_embeddings"]["embedding"] = table.at[7, 0].add(1.0)
  # Token 7 is not in the input: only its output logit changes.
  diff = np.asarray(model.apply(bumped, ids)[0, 2] - full[0, 2])
  assert abs(diff[7]) > 1e-3 and np.all(np.delete(diff, 7) == 0)


def test_masked_lm_term_matches_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 4, 6)).astype(np.float32)
  labels = np.array([[-1, 2, -1, -1], [0, -1, -1, 5], [-1, -1, -1, -1]])
  term = objectives.make_term("mlm", "masked_lm", 1.0, {})
  loss, aux = term.fn(None, None, {"logits": jnp.asarray(logits), "label": jnp.asarray(labels)},
                      None, None)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  picked = [(0, 1, 2), (1, 0, 0), (1, 3, 5)]
  np.testing.assert_allclose(float(loss), -np.mean([logp[i] for i in picked]), rtol=1e-5)
  hits = [logits[b, t].argmax() == y for b, t, y in picked]
  np.testing.assert_allclose(float(aux["accuracy"]), np.mean(hits))


# ------------------------------------------------------------------------------ edits


def _edit_arrays():
  data = knowledge.synthetic_knowledge(0, num_subjects=20, num_relations=3)
  para_val, para_test = knowledge.split_heldout(data.heldout, 1)
  corp = {"facts": data.train, "para": data.heldout, "para_val": para_val,
          "para_test": para_test,
          "bg_test": knowledge.background_cloze(8, 0, stream=1, length=11)}
  chosen, new = knowledge.choose_modified(data, np.ones(60, bool), 5, seed=0)
  return data, chosen, new, cloze_batches.edit_sets(corp, data, chosen, new, 40, seed=0)


@pytest.mark.parametrize("ratio", [0.5, 1.0, 2.0])
def test_replay_mixes_the_stated_ratio(ratio):
  data, chosen, new, arrays = _edit_arrays()
  n_s = arrays["s_ids"].shape[0]
  assert n_s == 5 * 3   # Every training template of every modified fact.
  n_replay = knowledge.replay_count(n_s, ratio)
  key = jax.random.key(0)
  ids, pos, tgt, replay = cloze_batches.edit_batch(arrays, 3, key, n_replay)
  assert int(replay.sum()) == round(ratio * n_s) and int((~replay).sum()) == n_s
  np.testing.assert_array_equal(tgt[:n_s], np.repeat(new, 3))
  # Replayed rows are unmodified facts with their old objects.
  replayed = {tuple(r) for r in np.asarray(ids[n_s:])}
  modified = {tuple(r) for r in np.asarray(arrays["s_ids"])}
  assert not replayed & modified
  old = dict(zip(map(tuple, data.train["ids"].tolist()), data.facts[data.train["fact"], 2]))
  assert all(old[tuple(r)] == t for r, t in zip(np.asarray(ids[n_s:]).tolist(),
                                                np.asarray(tgt[n_s:])))
  again = cloze_batches.edit_batch(arrays, 3, key, n_replay)
  np.testing.assert_array_equal(again[0], ids)   # A pure function of the step.
  assert not np.array_equal(cloze_batches.edit_batch(arrays, 4, key, n_replay)[0], ids)


def _rows(ids):
  return {tuple(r) for r in np.asarray(ids).tolist()}


def test_edit_evaluation_sets_do_not_mix_modified_and_unmodified_facts():
  data, chosen, new, arrays = _edit_arrays()
  ev = arrays["eval"]
  fact_of = {}
  for split in (data.train, data.heldout):
    fact_of.update(zip(map(tuple, split["ids"].tolist()), split["fact"].tolist()))
  for suffix in ("", "_val", "_train"):
    s_facts = {fact_of[r] for r in _rows(ev[f"A_M{suffix}"]["ids"])}
    u_facts = {fact_of[r] for r in _rows(ev[f"A_FS{suffix}"]["ids"])}
    assert s_facts == set(chosen.tolist()) and not u_facts & s_facts
    assert ev[f"A_FS{suffix}"]["ids"].shape[0] == 40
    np.testing.assert_array_equal(   # Modified facts are scored against their new object.
        ev[f"A_M{suffix}"]["target"], new[np.searchsorted(chosen, [
            fact_of[tuple(r)] for r in np.asarray(ev[f"A_M{suffix}"]["ids"]).tolist()])])
  # One validation and one test paraphrase per modified fact, 3 training sentences.
  assert ev["A_M"]["ids"].shape[0] == ev["A_M_val"]["ids"].shape[0] == 5
  assert ev["A_M_train"]["ids"].shape[0] == 5 * 3


def test_primary_metrics_are_the_test_paraphrases():
  """A_M / A_FS (the reported figures) hold only test-paraphrase sentences; the `_val` sets
  only validation ones; the `_train` sets the training sentences (A_M_train: exactly what
  the edit trains on)."""
  data, chosen, new, arrays = _edit_arrays()
  ev = arrays["eval"]
  val, test = knowledge.split_heldout(data.heldout, 1)
  train, val, test = _rows(data.train["ids"]), _rows(val["ids"]), _rows(test["ids"])
  for metric in ("A_M", "A_FS"):
    assert _rows(ev[metric]["ids"]) <= test
    assert _rows(ev[f"{metric}_val"]["ids"]) <= val
    assert _rows(ev[f"{metric}_train"]["ids"]) <= train
  assert _rows(ev["A_M_train"]["ids"]) == _rows(arrays["s_ids"])
  assert mm.METRICS[:2] == ("A_M", "A_FS") and mm.SELECT_BY == "A_bar_val"
  assert mm.HEADLINE_COLUMNS[5:11] == ("A_M", "A_M_se", "A_FS", "A_FS_se", "A_bar",
                                       "A_bar_se")
  raw = [{"base": "b", "size": 4, "seed": s, "method": "finetune", "variant": "v",
          "part": "all", "delta": np.inf, "lr": 1e-3, "distance": 0.0,
          **{k: 0.0 for k in mm.METRICS}, "A_M": 1.0, "A_FS": 0.5, "A_M_train": 1.0,
          "A_FS_train": 1.0, "A_M_val": 0.5, "A_FS_val": 0.5} for s in range(2)]
  row, = mm.summary_rows(raw)
  assert (row["A_bar"], row["A_bar_val"], row["A_bar_train"]) == (0.75, 0.5, 1.0)


def test_validation_and_test_paraphrases_are_disjoint():
  data = knowledge.synthetic_knowledge(0, num_subjects=20, num_relations=4,
                                       num_train_templates=3, num_heldout_templates=3)
  for k in (1, 2):
    val, test = knowledge.split_heldout(data.heldout, k)
    assert len(val["fact"]) == 80 * k and len(test["fact"]) == 80 * (3 - k)
    assert not _rows(val["ids"]) & _rows(test["ids"])
    assert not (_rows(val["ids"]) | _rows(test["ids"])) & _rows(data.train["ids"])
    for r in range(4):   # No sentence pattern of a relation is in both splits.
      assert not _patterns(data, val, r) & _patterns(data, test, r)
      assert len(_patterns(data, val, r)) == k
  with pytest.raises(ValueError, match="test split .* is empty"):
    knowledge.split_heldout(data.heldout, 3)
  # One template (LAMA's probe): split by fact, even facts validation.
  one = {**data.heldout, "template": np.zeros_like(data.heldout["template"])}
  val, test = knowledge.split_heldout(one, 1)
  assert set(val["fact"] % 2) == {0} and set(test["fact"] % 2) == {1}
  assert len(val["fact"]) + len(test["fact"]) == len(one["fact"])


def test_selection_picks_the_best_validation_score_per_method_and_part():
  """A fake sweep: the chosen row of each group is the argmax of A_bar_val (not of the test
  A_bar), the first one on ties; parts are chosen per part."""
  def row(method, variant, val, test, part="all"):
    return {"base": "pretrained", "|S|": 32, "method": method, "variant": variant,
            "part": part, "A_bar_val": val, "A_bar": test}
  rows = [row("linf", "δ=0.001", 0.50, 0.90), row("linf", "δ=0.003", 0.80, 0.60),
          row("linf", "δ=0.01", 0.70, 0.95), row("l2", "δ=1", 0.6, 0.1),
          row("l2", "δ=2", 0.6, 0.9), row("parts", "block_0 δ=0.01", 0.3, 0.3, "block_0"),
          row("parts", "block_0 δ=0.03", 0.4, 0.2, "block_0"),
          row("parts", "block_3 δ=0.01", 0.9, 0.1, "block_3"),
          {**row("linf", "δ=0.003", 0.1, 0.99), "|S|": 128}]
  chosen = mm.select_on_validation(rows)
  assert [(r["|S|"], r["method"], r["variant"]) for r in chosen] == [
      (32, "linf", "δ=0.003"), (32, "l2", "δ=1"), (32, "parts", "block_0 δ=0.03"),
      (32, "parts", "block_3 δ=0.01"), (128, "linf", "δ=0.003")]
  assert all(r["chosen_by"] == "A_bar_val" for r in chosen)


def test_variants_cover_every_method_at_every_learning_rate():
  config = mm_config.get_config("smoke")
  specs = mm.variants(config, ("finetune", "linf", "l2", "parts"))
  methods = [v["method"] for v in specs]
  lrs = len(config.edit.learning_rates)
  assert methods.count("finetune") == lrs
  assert methods.count("linf") == len(config.edit.linf_deltas) * lrs
  assert methods.count("l2") == len(config.edit.l2_deltas) * lrs
  assert methods.count("parts") == len(config.edit.parts) * len(config.edit.parts_deltas) * lrs
  assert specs[0]["delta"] == np.inf and specs[0]["lr"] == config.edit.learning_rates[0]
  assert len({(v["method"], v["label"]) for v in specs}) == len(specs)   # One per setting.
  assert {v["lr"] for v in mm.variants(config, ("replay",))} == set(config.edit.learning_rates)


# ------------------------------------------------------------------------------ validation


@pytest.mark.parametrize("field, value, names, message", [
    ("edit.linf_deltas", (1e-3, -1e-3), "edit.linf_deltas", "δ >= 0"),
    ("edit.l2_deltas", (-1.0,), "edit.l2_deltas", "δ >= 0"),
    ("edit.parts_deltas", (-0.1,), "edit.parts_deltas", "δ >= 0"),
    ("edit.learning_rates", (1e-3, 0.0), "edit.learning_rates", "learning rates > 0"),
    ("edit.learning_rates", (), "edit.learning_rates", "non-empty"),
    ("eval.validation_templates", 2, "eval.validation_templates", "the rest are the test"),
    ("eval.validation_templates", 0, "eval.validation_templates", "positive int"),
    ("edit.sizes", (32, 100000), "edit.sizes", "exceeds the knowledge base"),
    ("edit.parts", ("block_0", "decoder"), "edit.parts", "unknown part 'decoder'"),
    ("edit.methods", ("finetune", "rome"), "edit.methods", "must be distinct names"),
    ("edit.optimizer.weight_decay", 0.1, "edit.optimizer.weight_decay", "must be 0"),
    ("data.source", "wikidata", "data.source", "unknown source"),
    ("model.num_heads", 3, "model.num_heads", "must divide"),
])
def test_bad_input_is_a_one_line_config_error(field, value, names, message):
  config = mm_config.get_config()
  *parents, leaf = field.split(".")
  block = config
  for p in parents:
    block = block[p]
  block[leaf] = value
  with pytest.raises(ConfigError) as info:
    mm.validate(config)
  assert info.value.field == names
  assert message in str(info.value) and "\n" not in str(info.value)


def test_the_configs_validate():
  for arg in (None, "smoke", "sizes=all", "phases", "smoke,phases"):
    mm.validate(mm_config.get_config(arg))
  config = mm_config.get_config("setup=lama")
  with pytest.raises(ConfigError, match="data.data_dir"):
    mm.validate(config)
