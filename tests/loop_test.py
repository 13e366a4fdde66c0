"""The one loop (`xsens.train.loop`) and the one `Workdir`: chunks, schedule, resume, hooks."""

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xsens.errors import ConfigError
from xsens.train import loop
from xsens.train.metrics import read_metrics
from xsens.train.workdir import MAY_CHANGE_ON_RESUME, Workdir, config_fingerprint


def test_chunks_never_cross_a_boundary():
  s = loop.Schedule(total_steps=23, log_every=5, eval_every=0, checkpoint_every=10,
                    max_chunk=4)
  ends, step = [], 0
  while step < 23:
    step = s.chunk_end(step)
    ends.append(step)
  assert ends == [4, 5, 9, 10, 14, 15, 19, 20, 23]
  assert loop.Schedule(7).chunk_end(3) == 4  # One step per call by default.


def _counter_program(calls=None, lr=0.5):
  """State x ← x·(1 − lr) + step per step, advanced `length` steps at once (a lax.scan)."""
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = {"x": jax.ShapeDtypeStruct((), jnp.float32, sharding=device),
              "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=device)}

  def body(state, t):
    x = state["x"] * (1 - lr) + t.astype(jnp.float32)
    return {"x": x, "step": state["step"] + 1}, x

  def advance(state, step, length):
    if calls is not None:
      calls.append((step, length))
    steps = step + jnp.arange(length, dtype=jnp.int32)
    state, xs = jax.lax.scan(body, state, steps)
    return state, {"loss": jnp.sum(xs)}, {"x": xs}

  return loop.Program(
      init=lambda: {"x": jnp.ones((), jnp.float32), "step": jnp.zeros((), jnp.int32)},
      abstract_state=abstract, advance=advance,
      evaluate=lambda state, step: {"eval/x": float(state["x"])})


def test_evaluation_and_checkpoint_time_are_logged_apart_from_throughput(tmp_path):
  """An evaluation that takes 0.3 s is logged as `time/eval_s` in the next log window and
  left out of that window's `train/steps_per_sec`; checkpoint time likewise."""
  program = _counter_program()
  slow = lambda state, step: (time.sleep(0.3), {"eval/x": float(state["x"])})[1]
  program = dataclasses.replace(program, evaluate=slow)
  schedule = loop.Schedule(total_steps=8, log_every=2, eval_every=4, checkpoint_every=4)
  wd = Workdir(str(tmp_path / "run"))
  loop.run(wd, program, schedule)
  records = {r["step"]: r for r in read_metrics(wd.path) if "train/loss" in r}
  assert sorted(records) == [2, 4, 6, 8]
  assert "time/eval_s" not in records[4] and "time/eval_s" not in records[2]
  assert records[6]["time/eval_s"] >= 0.3           # The evaluation at step 4.
  assert records[6]["time/checkpoint_s"] > 0        # The checkpoint at step 4.


def test_chunked_run_resumes_exactly_with_logs_truncated(tmp_path):
  schedule = loop.Schedule(total_steps=12, log_every=3, eval_every=6, checkpoint_every=4,
                           max_chunk=4)
  straight = loop.run(Workdir(str(tmp_path / "a")), _counter_program(), schedule)
  assert straight.stop_reason == "max_steps" and straight.step == 12

  calls = []
  wd = Workdir(str(tmp_path / "b"))
  first = loop.run(wd, _counter_program(calls), schedule, max_chunks=2)
  assert first.stop_reason is None and first.step == 4  # Chunks [0,3) [3,4) then saved.
  assert calls == [(0, 3), (3, 1)]
  # A crash after more logs were written than checkpointed: the resume drops them.
  wd.write_step_log(4, 6, {"x": np.zeros(2, np.float32)})
  with open(wd.file("metrics.jsonl"), "a") as f:
    f.write(json.dumps({"step": 6, "train/loss": 99.0}) + "\n")
  resumed = loop.run(wd, _counter_program(calls), schedule)
  assert resumed.restored_step == 4 and resumed.new_steps == 8
  assert float(resumed.state["x"]) == float(straight.state["x"])
  a, b = read_metrics(str(tmp_path / "a")), read_metrics(str(tmp_path / "b"))
  strip = lambda rs: [{k: v for k, v in r.items()
                       if "steps_per_sec" not in k and not k.startswith("time/")} for r in rs]
  assert strip(a) == strip(b)
  logs_a = Workdir(str(tmp_path / "a")).read_step_log(12, ["x"])
  logs_b = wd.read_step_log(12, ["x"])
  np.testing.assert_array_equal(logs_a["x"], logs_b["x"])
  assert not np.isnan(logs_b["x"]).any()
  # A finished run trains no more.
  again = loop.run(wd, _counter_program(calls), schedule)
  assert again.new_steps == 0 and again.stop_reason == "max_steps"


def test_hooks_run_at_step_zero_once_and_after_every_chunk(tmp_path):
  seen = []
  hook = lambda step, state: seen.append(step) or {"hook/x": float(state["x"])}
  schedule = loop.Schedule(total_steps=6, checkpoint_every=2, max_chunk=2)
  wd = Workdir(str(tmp_path))
  loop.run(wd, _counter_program(), schedule, hooks=[hook], max_chunks=2)
  assert seen == [0, 2, 4]
  loop.run(wd, _counter_program(), schedule, hooks=[hook])
  assert seen == [0, 2, 4, 6]  # No second step-0 call on resume.
  assert [r["step"] for r in read_metrics(str(tmp_path)) if "hook/x" in r] == [0, 2, 4, 6]


def test_divergence_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  program = _counter_program()
  good = program.advance
  program.advance = lambda s, step, n: (good(s, step, n)[0], {"loss": jnp.where(
      step >= 4, jnp.nan, 1.0)}, None)
  wd = Workdir(str(tmp_path))
  with pytest.raises(loop.TrainingDivergedError, match=r"last good checkpoint \(step 4\)"):
    loop.run(wd, program, loop.Schedule(10, log_every=2, checkpoint_every=2, max_chunk=2))
  assert wd.latest_step() == 4


def test_should_stop_ends_early_and_checkpoints(tmp_path):
  program = _counter_program()
  program.should_stop = lambda step, scalars: "enough" if step >= 4 else None
  wd = Workdir(str(tmp_path))
  out = loop.run(wd, program, loop.Schedule(100, eval_every=2, max_chunk=2))
  assert (out.step, out.stop_reason, wd.latest_step()) == (4, "enough", 4)
  again = loop.run(wd, program, loop.Schedule(100, eval_every=2, max_chunk=2),
                   finished_reason="enough")
  assert again.new_steps == 0


def test_workdir_guard_allows_only_the_listed_fields_to_change(tmp_path):
  config = {"model": {"width": 8}, "progress": True, "train": {"epochs": 10}}
  wd = Workdir.open(str(tmp_path), config)
  wd.save(1, {"x": jnp.zeros(())})
  wd.close()
  assert "progress" in MAY_CHANGE_ON_RESUME and "train.epochs" in MAY_CHANGE_ON_RESUME
  Workdir.open(str(tmp_path), dict(config, progress=False, train={"epochs": 20}))
  with pytest.raises(ConfigError, match="differing fields: model.width"):
    Workdir.open(str(tmp_path), dict(config, model={"width": 16}))
  # A field added later with a None default matches a workdir written before it existed.
  Workdir.open(str(tmp_path), dict(config, objective=None))
  assert "progress" not in config_fingerprint(config)


def test_model_field_added_later_at_its_default_matches_an_old_workdir(tmp_path):
  """A ViT run written before `tokenizer`/`attention` existed resumes under a config that
  holds their defaults (the trainer's workdir reads every model field's default from
  `xsens.model_defaults`), and is refused under a config that changes them."""
  import dataclasses
  from mlcollections_configs import train as train_cfg
  from xsens.models.vit import ViT
  from xsens.train import trainer
  config = train_cfg.get_config("smoke").train
  assert config.model.name == "vit" and config.model.tokenizer == "patch"
  old = json.loads(config.to_json_best_effort())
  del old["model"]["tokenizer"], old["model"]["attention"]
  wd = trainer.make_workdir(str(tmp_path), config)
  wd.write_json("config.json", old)
  wd.save(1, {"x": jnp.zeros(())})
  wd.close()
  trainer.make_workdir(str(tmp_path), config).check(config)
  assert {f.name: f.default for f in dataclasses.fields(ViT)}["attention"] == "mha"
  config.model.attention = "lsa"
  with pytest.raises(ConfigError, match="differing fields: model.attention"):
    trainer.make_workdir(str(tmp_path), config).check(config)


def test_workdir_writes_atomically_and_overwrite_clears_the_run(tmp_path):
  wd = Workdir.open(str(tmp_path), {"a": 1})
  wd.write_json("out/result.json", {"v": 1})
  wd.write_step_log(0, 2, {"x": np.arange(2)})
  wd.save(2, {"x": jnp.zeros(())})
  wd.close()
  assert wd.read_json("out/result.json") == {"v": 1}
  assert not [n for n in os.listdir(tmp_path / "out") if n.endswith(".tmp")]
  Workdir.open(str(tmp_path), {"a": 2}, overwrite=True)
  assert wd.latest_step() is None and wd.step_log_files() == []
  assert wd.read_json("config.json") == {"a": 2}


def test_leftovers_of_a_killed_write_do_not_break_a_resume(tmp_path):
  wd = Workdir(str(tmp_path))
  wd.write_step_log(0, 2, {"x": np.arange(2, dtype=np.float32)})
  folder = tmp_path / "logs"
  (folder / "epochs_0000002_0000004.npz.tmp.npz").write_bytes(b"partial")
  (folder / ".tmp.epochs_0000002_0000004.npz").write_bytes(b"partial")
  assert [(a, b) for a, b, _ in wd.step_log_files()] == [(0, 2)]
  np.testing.assert_array_equal(wd.read_step_log(2, ["x"])["x"], [0, 1])


def test_divergence_before_any_checkpoint_says_so(tmp_path):
  program = _counter_program()
  good = program.advance
  program.advance = lambda s, step, n: (good(s, step, n)[0], {"loss": jnp.nan}, None)
  with pytest.raises(loop.TrainingDivergedError, match="No checkpoint was saved before it"):
    loop.run(Workdir(str(tmp_path)), program, loop.Schedule(10, log_every=2, max_chunk=2))
