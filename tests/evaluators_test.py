"""Evaluators (`xsens.train.evaluators`): padded batches, masked sums, config, trainer use."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests.train_test import smoke_train
from xsens.data import batching
from xsens.errors import ConfigError
from xsens.measures import churn, similarity, subgroups
from xsens.train import evaluators, losses, sharding, trainer
from xsens.train.metrics import read_metrics


def _data(n=10):
  x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
  return x, (np.arange(n) % 2).astype(np.int32)


def test_batches_pad_the_last_batch_with_mask_zero():
  x, y = _data(10)
  out = list(evaluators.batches(x, y, 4, sharding.data_mesh(), limit=9))
  assert [b["image"].shape[0] for b in out] == [4, 4, 4]
  np.testing.assert_array_equal(np.asarray(out[-1]["mask"]), [1, 0, 0, 0])
  np.testing.assert_array_equal(np.asarray(out[-1]["image"])[1:], np.repeat(x[8:9], 3, 0))


def test_batches_follow_the_shared_padded_index_batches():
  x, y = _data(11)
  out = list(evaluators.batches(x, y, 4, sharding.data_mesh()))
  ref = list(batching.padded_index_batches(11, 4))
  assert len(out) == len(ref) == 3
  for b, (idx, mask) in zip(out, ref):
    np.testing.assert_array_equal(np.asarray(b["image"]), x[idx])
    np.testing.assert_array_equal(np.asarray(b["label"]), y[idx])
    np.testing.assert_array_equal(np.asarray(b["mask"]), mask)
  assert list(evaluators.batches(x, y, 4, sharding.data_mesh(), limit=0)) == []

def test_accumulate_in_streams_sums_in_order_bit_for_bit():
  x = np.random.RandomState(1).normal(size=(37, 5)).astype(np.float32)
  y = (np.arange(37) % 3).astype(np.int32)
  w = jnp.asarray(np.random.RandomState(2).normal(size=(5, 3)), jnp.float32)
  step = jax.jit(functools.partial(evaluators.classification_sums, _linear_apply,
                                   losses.cross_entropy))
  sums = {s: evaluators.accumulate(step, {"w": w}, evaluators.batches(
      x, y, 4, sharding.data_mesh()), streams=s) for s in (1, 3)}
  assert sums[3] == sums[1] and sums[1]["count"] == 37.0


def _linear_apply(variables, inputs):
  return inputs @ variables["w"]


def test_classification_evaluator_matches_a_direct_computation():
  x, y = _data(10)
  w = jnp.asarray(np.random.RandomState(0).normal(size=(3, 2)), jnp.float32)
  (ev,) = evaluators.build({"t": {"kind": "classification", "split": "test"}},
                           apply_fn=_linear_apply, loss_fn=losses.cross_entropy,
                           default_every=5)
  out = ev.run({"w": w}, x, y, 4, sharding.data_mesh(), step=5)
  logits = x @ np.asarray(w)
  assert out["eval/t_accuracy"] == pytest.approx(np.mean(logits.argmax(-1) == y))
  want = float(losses.cross_entropy(jnp.asarray(logits), jnp.asarray(y)).mean())
  assert out["eval/t_loss"] == pytest.approx(want, rel=1e-6)
  assert ev.due(5, False) and ev.due(3, True) and not ev.due(3, False)


def test_measure_evaluator_weights_batch_means_by_real_examples():
  """A masked-mean measure over 10 examples in padded batches of 4 = the plain mean."""
  def first_feature(apply_fn, variables, inputs, *, labels=None, key=None, mask=None,
                    scale=1.0):
    del apply_fn, variables, labels, key
    v = inputs[:, 0] * scale
    return {"mean_x0": jnp.sum(v * mask) / jnp.sum(mask), "per_example": v}
  x, y = _data(10)
  (ev,) = evaluators.build(
      {"m": {"kind": "measure", "measure": "first_feature", "options": {"scale": 2.0}}},
      apply_fn=_linear_apply, loss_fn=losses.cross_entropy, default_every=0,
      measures={"first_feature": first_feature})
  out = ev.run({"w": jnp.zeros((3, 2))}, x, y, 4, sharding.data_mesh(), step=0)
  assert out == {"eval/m_mean_x0": pytest.approx(2.0 * x[:, 0].mean())}


class _TwoLayer(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    h = nn.tanh(nn.Dense(6, name="hidden_0")(x))
    h = nn.tanh(nn.Dense(5, name="hidden_1")(h))
    return nn.Dense(3, name="head")(h)


def _two_layer(seed, n=21):
  model = _TwoLayer()
  x = np.random.RandomState(seed).normal(size=(n, 4)).astype(np.float32)
  y = (np.arange(n) % 3).astype(np.int32)
  variables = model.init(jax.random.key(seed), jnp.asarray(x))
  return functools.partial(model.apply, train=False), variables, x, y


def test_cka_evaluator_equals_minibatch_cka_over_the_real_examples():
  """Batches of 8 over 21 examples: 8 + 8 + 5 real (the padded batch counts its 5 real)."""
  apply_fn, variables, x, y = _two_layer(0)
  _, peer_vars, _, _ = _two_layer(1)
  peer = lambda path, flag: (apply_fn, peer_vars)
  layers = "hidden_[01]"
  evs = evaluators.build(
      {"self": {"kind": "cka", "layers": layers},
       "peer": {"kind": "cka", "layers": layers, "peer_workdir": "peer"}},
      apply_fn=apply_fn, loss_fn=losses.cross_entropy, default_every=0, load_peer=peer)
  out = {}
  for ev in evs:
    out.update(ev.run(variables, x, y, 8, sharding.data_mesh(), step=0))
  feats = lambda v: list(similarity.layer_features(apply_fn, v, jnp.asarray(x),
                                                   filter=layers).values())
  a, b = feats(variables), feats(peer_vars)
  for name, other in (("self", a), ("peer", b)):
    state = similarity.hsic_init(2, 2)
    for lo, hi in ((0, 8), (8, 16), (16, 21)):
      state = similarity.hsic_accumulate(state, [f[lo:hi] for f in a],
                                         [f[lo:hi] for f in other])
    want = np.asarray(similarity.cka_from_accumulated(state))
    for i in range(2):
      for j in range(2):
        assert out[f"eval/{name}_cka_{i}_{j}"] == pytest.approx(want[i, j], abs=1e-5)
  assert out["eval/self_cka_0_0"] == pytest.approx(1.0, abs=1e-5)
  assert out["eval/peer_cka_diagonal_mean"] == pytest.approx(
      (out["eval/peer_cka_0_0"] + out["eval/peer_cka_1_1"]) / 2)
  assert "eval/self_cka_diagonal_mean" not in out


def test_churn_and_subgroup_evaluators_match_whole_split_statistics():
  apply_fn, variables, x, y = _two_layer(0)
  _, peer_vars, _, _ = _two_layer(1)
  counts = np.asarray([10, 1, 5])
  evs = evaluators.build(
      {"churn": {"kind": "churn", "peer_workdir": "p", "edges": (0.0, 0.5, 1.0)},
       "groups": {"kind": "subgroup", "worst_k": 2, "head_fraction": 0.34}},
      apply_fn=apply_fn, loss_fn=losses.cross_entropy, default_every=0, num_classes=3,
      train_class_counts=counts, load_peer=lambda path, flag: (apply_fn, peer_vars))
  out = {}
  for ev in evs:
    out.update(ev.run(variables, x, y, 8, sharding.data_mesh(), step=0))
  z1 = np.asarray(apply_fn(variables, jnp.asarray(x)))
  z2 = np.asarray(apply_fn(peer_vars, jnp.asarray(x)))
  assert out["eval/churn_churn"] == pytest.approx(float(churn.churn(z1, z2)))
  rate, _ = churn.churn_by_confidence(z1, z2, jnp.asarray([0.0, 0.5, 1.0]))
  for b in range(2):
    np.testing.assert_allclose(out[f"eval/churn_churn_bin_{b}"], rate[b], rtol=1e-6)
  head = subgroups.head_mask(counts, 0.34)
  ref = subgroups.subgroup_report(z1, y, 3, head, worst_k=2)
  for key in ("accuracy", "balanced_accuracy", "worst_class", "worst_k_mean",
              "head_accuracy", "tail_accuracy"):
    assert out[f"eval/groups_{key}"] == pytest.approx(ref[key], abs=1e-6), key
  assert [out[f"eval/groups_class_{c}"] for c in range(3)] == pytest.approx(ref["per_class"])


@pytest.mark.parametrize("block,field,match", [
    ({"kind": "nope"}, "evals.e.kind", "unknown evaluator 'nope'"),
    ({"kind": "classification", "split": "val"}, "evals.e.split", "must be 'train' or"),
    ({"kind": "classification", "every": -1}, "evals.e.every", "must be an int >= 0"),
    ({"kind": "classification", "measure": "x"}, "evals.e.measure", "unknown field"),
    ({"kind": "measure", "measure": "no_such_measure"}, "evals.e.measure",
     "unknown measure 'no_such_measure'"),
    ({"kind": "churn"}, "evals.e.peer_workdir", "a churn evaluator needs a peer"),
    ({"kind": "churn", "peer_workdir": "p", "edges": (0.5, 0.2)}, "evals.e.edges",
     "must be >= 2 increasing"),
    ({"kind": "cka", "pooling": "max"}, "evals.e.pooling", "must be one of"),
    ({"kind": "subgroup", "worst_k": 0}, "evals.e.worst_k", "must be an int >= 1"),
    ({"kind": "subgroup", "head_fraction": 1.0}, "evals.e.head_fraction", "must be a "),
])
def test_bad_evaluators_are_refused(block, field, match):
  with pytest.raises(ConfigError, match=f"config.{field}: {match}"):
    evaluators.build({"e": block}, apply_fn=_linear_apply, loss_fn=losses.cross_entropy,
                     default_every=1, measures={}, num_classes=2,
                     load_peer=lambda path, flag: (_linear_apply, {}))


@pytest.mark.slow
def test_trainer_runs_configured_evaluators_on_their_own_schedules(tmp_path):
  config = smoke_train("mlp", total_steps=6, eval_every=2)
  config.evals = ml_collections.ConfigDict({
      "test": {"kind": "classification", "split": "test", "every": 3},
      "train": {"kind": "classification", "split": "train", "limit": 64}})
  trainer.train_and_evaluate(config, str(tmp_path))
  records = read_metrics(str(tmp_path))
  assert [r["step"] for r in records if "eval/test_accuracy" in r] == [3, 6]
  assert [r["step"] for r in records if "eval/train_accuracy" in r] == [2, 4, 6]


def test_target_accuracy_needs_a_train_classification_evaluator(tmp_path):
  config = smoke_train("mlp", target_train_accuracy=0.5)
  config.evals = ml_collections.ConfigDict({"test": {"kind": "classification"}})
  with pytest.raises(ConfigError, match="config.target_train_accuracy: needs a "):
    trainer.train_and_evaluate(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


@pytest.mark.slow
def test_trainer_logs_a_measure_evaluator_from_xsens_measures(tmp_path):
  """The README's example: token sensitivity of the test split every k steps."""
  config = smoke_train("vit", total_steps=4, eval_every=2)
  config.evals = ml_collections.ConfigDict({
      "test": {"kind": "classification", "split": "test"},
      "sens": {"kind": "measure", "measure": "token_sensitivity", "split": "test",
               "limit": 40, "every": 4,
               "options": {"sigma": 1.0, "patch_size": 7, "num_draws": 1}}})
  trainer.train_and_evaluate(config, str(tmp_path))
  records = [r for r in read_metrics(str(tmp_path)) if "eval/sens_mean" in r]
  assert [r["step"] for r in records] == [4]
  assert 0.0 <= records[0]["eval/sens_mean"] <= 1.0


@pytest.mark.slow
def test_trainer_runs_churn_and_cka_against_a_peer_run(tmp_path):
  """A second seed evaluated against the first: churn in [0, 1], CKA of a layer with the
  peer's same layer logged; a peer that is not a run is refused naming the flag."""
  peer = smoke_train("mlp", total_steps=2, eval_every=2)
  trainer.train_and_evaluate(peer, str(tmp_path / "peer"))
  config = smoke_train("mlp", total_steps=2, eval_every=2, seed=1)
  config.evals = ml_collections.ConfigDict({
      "test": {"kind": "classification"},
      "churn": {"kind": "churn", "peer_workdir": str(tmp_path / "peer")},
      "cka": {"kind": "cka", "peer_workdir": str(tmp_path / "peer"), "limit": 64}})
  trainer.train_and_evaluate(config, str(tmp_path / "run"))
  (last,) = [r for r in read_metrics(str(tmp_path / "run")) if "eval/churn_churn" in r]
  assert 0.0 <= last["eval/churn_churn"] <= 1.0
  assert -0.2 <= last["eval/cka_cka_diagonal_mean"] <= 1.0 + 1e-5
  config.evals.churn.peer_workdir = str(tmp_path / "nothing")
  with pytest.raises(ConfigError, match="config.evals.churn.peer_workdir: .*is not an xsens "
                     "run directory"):
    trainer.train_and_evaluate(config, str(tmp_path / "run2"))
