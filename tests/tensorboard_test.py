"""TensorBoard: no duplicate steps after a resume, hparams per run, study results as
scalars and text (event files decoded as tests/faults_test.py does)."""

import json
import os
import shutil
import time

from tensorboardX.proto import plugin_hparams_pb2

from tests.faults_test import _events
from tests.loop_test import _counter_program
from tests.remote_paths_test import _scalars, fake_gcs, stored  # pylint: disable=unused-import
from xsens.report import tables
from xsens.train import loop
from xsens.train.metrics import flat_hparams, truncate_events
from xsens.train.workdir import Workdir

SCHEDULE = loop.Schedule(total_steps=8, log_every=2, eval_every=2, checkpoint_every=2,
                         max_chunk=2)


def _steps(folder, tag="train/loss"):
  """Per event file, the steps at which `tag` was written."""
  return [[e.step for e in f if any(v.tag == tag for v in e.summary.value)]
          for f in _events(folder)]


def _hparams(folder):
  """The session-start hparams of the event files in `folder`, in order."""
  out = []
  for f in _events(folder):
    for e in f:
      for v in e.summary.value:
        if v.tag == "_hparams_/session_start_info":
          data = plugin_hparams_pb2.HParamsPluginData.FromString(
              v.metadata.plugin_data.content)
          out.append({k: getattr(h, h.WhichOneof("kind"))
                      for k, h in data.session_start_info.hparams.items()})
  return out


def test_a_resume_after_a_lost_checkpoint_writes_each_step_once(tmp_path):
  loop.run(Workdir(str(tmp_path)), _counter_program(), SCHEDULE)
  assert _steps(str(tmp_path / "tb")) == [[2, 4, 6, 8]]
  # A kill after step 8 was logged but before its checkpoint committed.
  shutil.rmtree(tmp_path / "checkpoints" / "8")
  time.sleep(1.1)                              # Event files are named by the second.
  out = loop.run(Workdir(str(tmp_path)), _counter_program(), SCHEDULE)
  assert out.restored_step == 6 and out.step == 8
  steps = _steps(str(tmp_path / "tb"))
  assert sorted(sum(steps, [])) == [2, 4, 6, 8]   # Not [2, 4, 6, 8, 8].
  assert steps == [[2, 4, 6], [8]]
  evals = sum(_steps(str(tmp_path / "tb"), "eval/x"), [])
  assert sorted(evals) == [2, 4, 6, 8]


def test_truncate_events_drops_later_steps_and_a_partial_record(tmp_path):
  loop.run(Workdir(str(tmp_path)), _counter_program(), SCHEDULE)
  [name] = os.listdir(tmp_path / "tb")
  with open(tmp_path / "tb" / name, "ab") as f:
    f.write(b"\x10\x00\x00")                   # A kill during a write.
  truncate_events(str(tmp_path / "tb"), 5)
  assert _steps(str(tmp_path / "tb")) == [[2, 4]]
  truncate_events(str(tmp_path / "tb"), 0)     # A restart from step 0.
  assert not os.listdir(tmp_path / "tb")


def test_hparams_are_the_flattened_config_in_the_runs_own_event_file(tmp_path):
  config = {"model": {"width": 8, "dims": [1, 2]}, "lr": 0.5, "fsdp": False, "name": "x",
            "seed": None}
  assert flat_hparams(config) == {"model.width": 8, "model.dims": "[1, 2]", "lr": 0.5,
                                  "fsdp": False, "name": "x"}
  wd = Workdir.open(str(tmp_path), config)
  loop.run(wd, _counter_program(), SCHEDULE, max_chunks=2)
  assert os.listdir(tmp_path / "tb") == [n for n in os.listdir(tmp_path / "tb")
                                         if n.startswith("events.out.tfevents.")]
  assert len(os.listdir(tmp_path / "tb")) == 1   # No add_hparams subfolder.
  assert _hparams(str(tmp_path / "tb")) == [
      {"model.width": 8.0, "model.dims": "[1, 2]", "lr": 0.5, "fsdp": False, "name": "x"}]
  time.sleep(1.1)
  loop.run(Workdir(str(tmp_path)), _counter_program(), SCHEDULE)   # A resume: no second.
  assert len(_hparams(str(tmp_path / "tb"))) == 1
  ends = [e.step for f in _events(str(tmp_path / "tb")) for e in f
          for v in e.summary.value if v.tag == "_hparams_/session_end_info"]
  assert ends == [8]


def test_study_results_are_scalars_and_text_and_a_rewrite_replaces_them(tmp_path):
  rows = [{"run": "vit", "mCE": 0.75, "FGSM": 0.5, "stop_reason": "max_steps", "ok": True},
          {"run": "cnn", "mCE": 1.0, "FGSM": float("nan")}]
  extra = {"wall_s": 12.5, "timings_s": {"a": 1.0}, "source": "x"}
  assert tables.headline_scalars(rows, extra) == {
      "results/vit/mCE": 0.75, "results/vit/FGSM": 0.5, "results/cnn/mCE": 1.0,
      "results/wall_s": 12.5}
  for _ in range(2):                           # A rerun replaces the results' event file.
    md = tables.write_results(str(tmp_path), "Robustness", rows, extra=extra)
  files = _events(str(tmp_path / "tb"))
  assert len(files) == 1
  scalars = {v.tag: v.simple_value for e in files[0] for v in e.summary.value
             if v.HasField("simple_value")}
  assert scalars == {"results/vit/mCE": 0.75, "results/vit/FGSM": 0.5,
                     "results/cnn/mCE": 1.0, "results/wall_s": 12.5}
  [text] = [v for e in files[0] for v in e.summary.value if v.tag.startswith("results")
            and v.metadata.plugin_data.plugin_name == "text"]
  assert text.tensor.string_val[0].decode() == md
  assert json.loads((tmp_path / "results.json").read_text())["rows"][0]["run"] == "vit"
  assert all(e.step == 0 for e in files[0] if e.HasField("summary"))


def test_a_remote_resume_truncates_the_remote_event_files(fake_gcs):
  wd = Workdir.open("gs://b/run", {"a": 1})
  writer = wd.metric_writer()
  for step in (1, 2, 3):
    writer.write(step, {"loss": step / 10})
  writer.close()
  time.sleep(1.1)                              # Event files are named by the second.
  wd.metric_writer(purge_step=3).close()       # A resume from step 2.
  # The first writer's uploads (one event file each), read together.
  scalars = set().union(*(_scalars(fake_gcs.store["/b/run/" + n].getvalue())
                          for n in stored(fake_gcs) if n.startswith("tb/events")))
  assert scalars == {("loss", 1), ("loss", 2)}
  wd.release_lock()


def test_a_damaged_record_and_what_follows_are_dropped(tmp_path):
  loop.run(Workdir(str(tmp_path)), _counter_program(), SCHEDULE)
  [name] = os.listdir(tmp_path / "tb")
  path = tmp_path / "tb" / name
  data = path.read_bytes()
  records = []
  pos = 0
  while pos < len(data):   # Record boundaries (TFRecord: length, crc, payload, crc).
    records.append(pos)
    pos += 12 + int.from_bytes(data[pos:pos + 8], "little") + 4
  i = records[-2]          # Garble the payload of the second-to-last record.
  path.write_bytes(data[:i + 12] + b"\xff" * (records[-1] - i - 16) + data[records[-1] - 4:])
  truncate_events(str(tmp_path / "tb"), 100)
  assert len(path.read_bytes()) == i
