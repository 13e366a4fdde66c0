"""The study a workdir belongs to (`xsens.train.study_record`): another study is refused in
one line, the same one resumes, `--overwrite` removes the old study's outputs only."""

import json
import os
import shutil

import pytest

from mlcollections_configs import compare_vision as compare_cfg
from tests.helpers import run_cli
from xsens import studies
from xsens.errors import ConfigError
from xsens.train import study_record

TRAIN = "--config=mlcollections_configs/train.py:model=mlp,smoke"
GROKKING = "--config=mlcollections_configs/grokking.py:smoke,seeds=1,epochs=10"


def _write(path, text="x"):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)


def _contents(path) -> dict:
  """{relative path: bytes} of every file below `path`, and {relative path/: None} of
  every folder."""
  out = {}
  for root, dirs, files in os.walk(path):
    for name in dirs:
      out[os.path.relpath(os.path.join(root, name), path) + "/"] = None
    for name in files:
      with open(os.path.join(root, name), "rb") as f:
        out[os.path.relpath(os.path.join(root, name), path)] = f.read()
  return out


def _record(path) -> dict:
  with open(os.path.join(path, study_record.STUDY_FILE)) as f:
    return json.load(f)


def _refusal(path, old, new) -> str:
  return (f"--workdir: {str(path)!r} holds results of study {old!r}; this config runs study "
          f"{new!r}; pass --overwrite to replace them, or choose another --workdir")


# ------------------------------------------------------------------ the record (in process)


def test_claim_records_the_study_and_what_was_there_before(tmp_path):
  _write(tmp_path / "notes.txt")
  _write(tmp_path / "photo.png")      # A user's file, in a folder that holds no run.
  claim = study_record.claim(str(tmp_path), "train")
  assert claim.wrote
  assert _record(tmp_path) == {"study": "train", "others": ["notes.txt", "photo.png"]}
  assert not study_record.claim(str(tmp_path), "train").wrote   # Same study: unchanged.


def test_another_study_is_refused_and_nothing_changes(tmp_path):
  study_record.claim(str(tmp_path), "train")
  _write(tmp_path / "results.md", "# old")
  before = _contents(tmp_path)
  with pytest.raises(ConfigError) as e:
    study_record.claim(str(tmp_path), "compare")
  assert f"{e.value.flag}: {e.value.message}" == _refusal(tmp_path, "train", "compare")
  assert _contents(tmp_path) == before


def test_overwrite_removes_every_entry_of_the_old_study_and_nothing_else(tmp_path):
  _write(tmp_path / "notes.txt", "mine")
  study_record.claim(str(tmp_path), "sensitivity_vision")
  for name in ("results.md", "results.json", "sensitivity_bar.png", "runs/vit/config.json",
               "runs/vit/checkpoints/4/x", "tb/events.out.tfevents.1.h.results", "summary.txt"):
    _write(tmp_path / name)
  study_record.claim(str(tmp_path), "train", overwrite=True)
  assert sorted(os.listdir(tmp_path)) == ["notes.txt", "study.json"]
  assert (tmp_path / "notes.txt").read_text() == "mine"
  assert _record(tmp_path) == {"study": "train", "others": ["notes.txt"]}


def test_a_run_written_before_the_record_is_taken_as_this_studys(tmp_path):
  for name in ("config.json", "checkpoints/4/x", "results.md", "results.json", "plot.png",
               "logs.npz", "runs/a/config.json", "runs/a/tb/e", "notes.txt", "photos/a.png",
               "code/config.json"):
    _write(tmp_path / name)
  study_record.claim(str(tmp_path), "compare")   # Accepted: nothing says which study wrote it.
  assert _record(tmp_path) == {"study": "compare", "others": ["code", "notes.txt", "photos"]}
  study_record.claim(str(tmp_path), "train", overwrite=True)
  assert sorted(os.listdir(tmp_path)) == ["code", "notes.txt", "photos", "study.json"]


def test_the_record_of_a_study_that_wrote_nothing_is_removed(tmp_path):
  fresh = tmp_path / "new"
  claim = study_record.claim(str(fresh), "train")
  claim.release_if_unused()
  assert not fresh.exists()
  claim = study_record.claim(str(tmp_path), "train")
  _write(tmp_path / "results.md")
  claim.release_if_unused()
  assert _record(tmp_path)["study"] == "train"


def test_studies_run_refuses_another_study_before_it_starts(tmp_path):
  study_record.claim(str(tmp_path), "train")
  before = _contents(tmp_path)
  with pytest.raises(ConfigError) as e:
    studies.run(compare_cfg.get_config("smoke"), str(tmp_path))
  assert e.value.field == "workdir" and "'train'" in e.value.message
  assert _contents(tmp_path) == before


def test_bad_config_leaves_no_record(tmp_path):
  config = compare_cfg.get_config("smoke")
  config.train.batch_size = 0
  with pytest.raises(ConfigError):
    studies.run(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


# ------------------------------------------------------------------ the command line


@pytest.fixture(scope="module")
def grokking_workdir(tmp_path_factory):
  """A finished grokking workdir (plots, array logs, checkpoints, TensorBoard) that also
  holds a user's file written before the study first ran."""
  workdir = tmp_path_factory.mktemp("grokking") / "wd"
  _write(workdir / "notes.txt", "mine")
  proc = run_cli(GROKKING, f"--workdir={workdir}", timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (workdir / "grokking.png").exists()
  return workdir


def _copy(src, dst):
  shutil.copytree(src, dst)
  return dst


@pytest.mark.slow
def test_cli_refuses_another_study_in_one_line_and_changes_nothing(grokking_workdir,
                                                                   tmp_path):
  workdir = _copy(grokking_workdir, tmp_path / "wd")
  before = _contents(workdir)
  proc = run_cli(TRAIN, f"--workdir={workdir}", timeout=120)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.splitlines() == [
      "xsens: error: " + _refusal(workdir, "grokking", "train")]
  assert _contents(workdir) == before


@pytest.mark.slow
def test_cli_overwrite_replaces_the_old_study_and_leaves_no_old_plot(grokking_workdir,
                                                                     tmp_path):
  workdir = _copy(grokking_workdir, tmp_path / "wd")
  old_events = set(os.listdir(workdir / "tb"))
  old_plots = {n for n in os.listdir(workdir) if n.endswith((".png", ".npz"))}
  assert old_plots
  proc = run_cli(TRAIN, f"--workdir={workdir}", "--overwrite", timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  names = set(os.listdir(workdir))
  assert not old_plots & names, names
  # Only the train study's own figure.
  assert {n for n in names if n.endswith((".png", ".npz"))} == {"training_curves.png"}, names
  assert not {"logs", "lock.json"} & names
  assert not old_events & set(os.listdir(workdir / "tb"))
  assert (workdir / "notes.txt").read_text() == "mine"
  assert _record(workdir) == {"study": "train", "others": ["notes.txt"]}
  with open(workdir / "results.json") as f:
    assert json.load(f)["rows"][0]["model"] == "mlp"
  assert "grokking" not in (workdir / "results.md").read_text()


@pytest.mark.slow
def test_cli_same_study_resumes_and_another_is_refused(tmp_path):
  workdir = tmp_path / "wd"
  first = run_cli(TRAIN, f"--workdir={workdir}", timeout=120)
  assert first.returncode == 0, first.stderr[-3000:]
  record = _record(workdir)
  again = run_cli(TRAIN, f"--workdir={workdir}", timeout=120)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "Results in" in again.stdout and _record(workdir) == record == {
      "study": "train", "others": []}
  before = _contents(workdir)
  proc = run_cli("--config=mlcollections_configs/compare_vision.py:smoke",
                 f"--workdir={workdir}", timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.splitlines() == ["xsens: error: " + _refusal(workdir, "train", "compare")]
  assert _contents(workdir) == before
