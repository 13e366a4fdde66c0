"""Evaluators (`xsens.train.evaluators`): `over_split`, padded batches, masked sums, the
registry of kinds, config, trainer use."""

import functools
import json
import os
import socket
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests.helpers import REPO
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

def test_batch_sums_in_streams_sum_in_order_bit_for_bit():
  x = np.random.RandomState(1).normal(size=(37, 5)).astype(np.float32)
  y = (np.arange(37) % 3).astype(np.int32)
  w = jnp.asarray(np.random.RandomState(2).normal(size=(5, 3)), jnp.float32)
  step = lambda batch, variables: evaluators.classification_sums(
      _linear_apply, losses.cross_entropy, variables, batch)
  sums = {s: evaluators.over_split(step, evaluators.batches(
      x, y, 4, sharding.data_mesh()), args=({"w": w},), reduce="batch_sum", streams=s)
          for s in (1, 3)}
  assert sums[3] == sums[1] and sums[1]["count"] == 37.0


def _linear_apply(variables, inputs):
  return inputs @ variables["w"]


# ---------------------------------------------------------------------------- over_split


def _split(n=11):
  rng = np.random.RandomState(3)
  return {"image": rng.normal(size=(n, 5)).astype(np.float32),
          "label": (np.arange(n) % 3).astype(np.int32)}


def _per_example(batch, w):
  logits = batch["image"] @ w
  return {"correct": jnp.argmax(logits, -1) == batch["label"],
          "loss": losses.cross_entropy(logits, batch["label"]),
          "square": batch["image"] ** 2}


@pytest.mark.parametrize("limit", [None, 7])
def test_over_split_sums_per_example_statistics_over_the_real_examples(limit):
  """11 examples in batches of 4: the padded rows of the last batch count for nothing."""
  data = _split(11)
  w = np.random.RandomState(4).normal(size=(5, 3)).astype(np.float32)
  out = evaluators.over_split(_per_example, data, args=(jnp.asarray(w),), reduce="sum",
                              batch_size=4, limit=limit)
  m = 11 if limit is None else limit
  x, y = data["image"][:m], data["label"][:m]
  logits = x @ w
  assert out["correct"] == np.sum(logits.argmax(-1) == y)
  want_loss = np.sum(np.asarray(losses.cross_entropy(jnp.asarray(logits), jnp.asarray(y))))
  assert out["loss"] == pytest.approx(want_loss, rel=1e-5)
  np.testing.assert_allclose(out["square"], (x ** 2).sum(0), rtol=1e-5)
  assert out["square"].shape == (5,) and out["square"].dtype == np.float64


def test_over_split_concatenates_per_example_outputs_in_order_without_padding():
  data = _split(11)
  seen = []

  def fn(batch):
    seen.append(batch["image"].shape)
    return {"index": batch["index"], "mask": batch["mask"], "x0": batch["image"][:, 0],
            "label": batch["label"]}
  out = evaluators.over_split(fn, data, reduce="concat", batch_size=4, streams=1)
  np.testing.assert_array_equal(out["index"], np.arange(11))
  np.testing.assert_array_equal(out["mask"], np.ones(11))
  np.testing.assert_array_equal(out["x0"], data["image"][:, 0])
  np.testing.assert_array_equal(out["label"], data["label"])
  assert seen == [(4, 5)]  # One shape, traced once.
  out = evaluators.over_split(fn, data, reduce="concat", batch_size=4, limit=6, streams=3)
  np.testing.assert_array_equal(out["index"], np.arange(6))
  assert len(seen) == 1    # The same function compiles once across calls.


def test_over_split_results_do_not_depend_on_streams():
  data = _split(23)
  w = jnp.asarray(np.random.RandomState(5).normal(size=(5, 3)), jnp.float32)
  for reduce in ("sum", "concat"):
    one, three = (evaluators.over_split(_per_example, data, args=(w,), reduce=reduce,
                                        batch_size=4, streams=s) for s in (1, 3))
    for k in one:
      np.testing.assert_array_equal(one[k], three[k])


def test_over_split_sums_batch_totals_of_given_batches():
  """reduce="batch_sum" over `batches` (the evaluators' iterator): fn masks its own totals."""
  data = _split(10)
  fn = lambda batch: {"count": jnp.sum(batch["mask"]),
                      "x": jnp.sum(batch["image"] * batch["mask"][:, None], 0)}
  out = evaluators.over_split(fn, evaluators.batches(
      data["image"], data["label"], 4, sharding.data_mesh()), reduce="batch_sum")
  assert out["count"] == 10.0
  np.testing.assert_allclose(out["x"], data["image"].sum(0), rtol=1e-5)


def test_over_split_returns_each_batchs_totals_in_order():
  """reduce="per_batch": one host pytree per batch (10 examples in batches of 4: 4, 4, 2)."""
  data = _split(10)
  fn = lambda batch: {"count": jnp.sum(batch["mask"]),
                      "x": jnp.sum(batch["image"] * batch["mask"][:, None], 0)}
  outs = evaluators.over_split(fn, data, reduce="per_batch", batch_size=4)
  assert [float(o["count"]) for o in outs] == [4.0, 4.0, 2.0]
  for out, rows in zip(outs, (slice(0, 4), slice(4, 8), slice(8, 10))):
    np.testing.assert_allclose(out["x"], data["image"][rows].sum(0), rtol=1e-6)


def test_over_split_refuses_bad_arguments():
  data = _split(4)
  with pytest.raises(ValueError, match="reduce must be one of"):
    evaluators.over_split(_per_example, data, reduce="mean", batch_size=2)
  with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
    evaluators.over_split(_per_example, data)
  with pytest.raises(ValueError, match="no batch to evaluate"):
    evaluators.over_split(lambda b: b["mask"], data, batch_size=2, limit=0)


_OVER_SPLIT_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax
    import jax.numpy as jnp
    import numpy as np
    from xsens.train import evaluators, sharding
    sharding.maybe_initialize_distributed()
    seen = []

    def fn(batch):
      seen.append(batch["image"].shape)
      return {"x": batch["image"].sum(-1) * 2.0, "index": batch["index"],
              "hit": batch["label"] == 1}

    rng = np.random.default_rng(0)
    data = {"image": rng.normal(size=(37, 3)).astype(np.float32),
            "label": (np.arange(37) % 3).astype(np.int32)}
    cat = evaluators.over_split(fn, data, reduce="concat", batch_size=6)
    tot = evaluators.over_split(fn, data, reduce="sum", batch_size=6)
    np.testing.assert_allclose(cat["x"], data["image"].sum(-1) * 2.0, rtol=1e-6)
    np.testing.assert_array_equal(cat["index"], np.arange(37))
    assert tot["hit"] == 12.0, tot
    print("RESULT " + json.dumps({"devices": jax.device_count(), "seen": sorted(set(
        str(s) for s in seen)), "x": cat["x"].tolist(), "sum_x": float(tot["x"])}))
""")


def _run_over_split_script(num_processes: int, devices: int) -> list[dict]:
  """The script above as `num_processes` CPU processes of `devices` devices each."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                       f" --xla_force_host_platform_device_count={devices}").strip()}
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
               "XSENS_DISTRIBUTED"):
    env.pop(name, None)
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  procs = []
  for pid in range(num_processes):
    penv = dict(env)
    if num_processes > 1:
      penv.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                  JAX_NUM_PROCESSES=str(num_processes), JAX_PROCESS_ID=str(pid))
    procs.append(subprocess.Popen([sys.executable, "-c", _OVER_SPLIT_SCRIPT], cwd=REPO,
                                  env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True))
  results = []
  try:
    for p in procs:
      out, err = p.communicate(timeout=240)
      assert p.returncode == 0, err[-3000:]
      (line,) = [l for l in out.splitlines() if l.startswith("RESULT ")]
      results.append(json.loads(line[len("RESULT "):]))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return results


@pytest.mark.slow
def test_over_split_on_eight_devices_and_two_processes_equals_one_device():
  """Batches of 6 rounded up to 8 over 8 devices (one process) and over 2 processes of 2
  devices each: every process returns the outputs of the one-device run."""
  (one,) = _run_over_split_script(1, 1)
  (eight,) = _run_over_split_script(1, 8)
  assert one["seen"] == [str((6, 3))]
  assert eight["devices"] == 8 and eight["seen"] == [str((8, 3))]
  two = _run_over_split_script(2, 2)
  assert [r["devices"] for r in two] == [4, 4]
  assert two[0]["seen"] == [str((8, 3))]
  for r in (eight, *two):
    np.testing.assert_allclose(r["x"], one["x"], rtol=1e-6)
    assert r["sum_x"] == pytest.approx(one["sum_x"], rel=1e-5)
  assert two[0]["x"] == two[1]["x"] and two[0]["sum_x"] == two[1]["sum_x"]


# ------------------------------------------------------------------------------ registry


def test_a_registered_kind_is_built_by_name_and_named_in_the_unknown_kind_error():
  @evaluators.register("mean_x0", ("scale",))
  def make(ec, path, ctx, common):
    del path, ctx
    fn = lambda batch, variables: {"x": jnp.sum(batch["image"][:, 0] * batch["mask"]),
                                   "count": jnp.sum(batch["mask"])}
    scale = ec.get("scale", 1.0)
    return evaluators.Evaluator(**common, batch_fn=fn,
                                finish=lambda s: {"mean": scale * float(s["x"] / s["count"])})
  try:
    x, y = _data(10)
    (ev,) = evaluators.build({"m": {"kind": "mean_x0", "scale": 3.0, "limit": 5}},
                             apply_fn=_linear_apply, loss_fn=losses.cross_entropy,
                             default_every=2)
    assert (ev.kind, ev.every, ev.limit) == ("mean_x0", 2, 5)
    out = ev.run({"w": jnp.zeros((3, 2))}, x, y, 4, sharding.data_mesh(), step=0)
    assert out == {"eval/m_mean": pytest.approx(3.0 * x[:5, 0].mean())}
    with pytest.raises(ConfigError, match="config.evals.e.kind: unknown evaluator 'nope'; "
                       "allowed: classification, measure, subgroup, churn, cka, mean_x0$"):
      evaluators.build({"e": {"kind": "nope"}}, apply_fn=_linear_apply,
                       loss_fn=losses.cross_entropy, default_every=1)
    with pytest.raises(ConfigError, match="config.evals.e.worst_k: unknown field for a "
                       "mean_x0 evaluator; allowed: kind, split, every, limit, scale$"):
      evaluators.build({"e": {"kind": "mean_x0", "worst_k": 2}}, apply_fn=_linear_apply,
                       loss_fn=losses.cross_entropy, default_every=1)
  finally:
    del evaluators.REGISTRY["mean_x0"]
  assert tuple(evaluators.REGISTRY) == ("classification", "measure", "subgroup", "churn",
                                        "cka")


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
    ({"kind": "nope"}, "evals.e.kind", "unknown evaluator 'nope'; allowed: "
     "classification, measure, subgroup, churn, cka$"),
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
