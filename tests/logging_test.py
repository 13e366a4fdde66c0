"""CLI logging: the training log line (step/total, loss, accuracy, steps/s, ETA), progress
bars that fall back to log lines off a terminal, `xsens --help` and `--print_config`."""

import io
import logging
import os

import pytest

from tests.helpers import run_cli
from tests.loop_test import _counter_program
from xsens.train import progress as progress_lib
from xsens.train import loop
from xsens.train.workdir import Workdir

TRAIN = "--config=mlcollections_configs/train.py:model=mlp,smoke"


def test_progress_line_format_with_eta():
  means = {"train/loss": 0.123456, "train/accuracy": 0.5, "train/steps_per_sec": 12.345}
  assert loop.progress_line("vit", 40, 100, means, 3725.4) == (
      "vit step 40/100: loss 0.1235, accuracy 0.5000, 12.3 steps/s, ETA 1:02:05")
  assert loop.progress_line("x", 1, 2, {}, None) == "x step 1/2: ETA ?"
  assert progress_lib.format_eta(59.6) == "0:01:00"


def test_the_loop_logs_a_line_every_log_every_steps(tmp_path, caplog):
  caplog.set_level(logging.INFO, logger="xsens")
  schedule = loop.Schedule(total_steps=6, log_every=2, max_chunk=2)
  loop.run(Workdir(str(tmp_path)), _counter_program(), schedule, desc="count")
  lines = [r.getMessage() for r in caplog.records if r.name == "xsens.train"]
  assert [line.split(":")[0] for line in lines] == [
      "count step 2/6", "count step 4/6", "count step 6/6"]
  for line in lines:
    assert "loss " in line and " steps/s, ETA " in line, line
  assert lines[-1].endswith("ETA 0:00:00")


def test_off_a_terminal_progress_is_log_lines_not_a_bar(monkeypatch, caplog):
  caplog.set_level(logging.INFO, logger="xsens")
  stderr = io.StringIO()                                      # Not a tty.
  monkeypatch.setattr("sys.stderr", stderr)
  assert isinstance(progress_lib.progress(desc="x", total=1), progress_lib.LogProgress)
  now = [0.0]
  bar = progress_lib.LogProgress(desc="σ sweep", total=4, unit="σ", clock=lambda: now[0])
  for _ in range(4):
    now[0] += 20.0               # 20 s per item: a line at most every LOG_S = 30 s.
    bar.update(1)
  bar.close()                    # 4/4 was logged already: no second final line.
  lines = [r.getMessage() for r in caplog.records if r.name == "xsens.progress"]
  assert lines == ["σ sweep: 2/4 (50%), 0.05 σ/s, ETA 0:00:40",
                   "σ sweep: 4/4 (100%), 0.05 σ/s, ETA 0:00:00"]
  assert stderr.getvalue() == ""                              # No bar drawn.
  caplog.clear()
  assert list(progress_lib.progress(range(3), desc="it")) == [0, 1, 2]
  assert [r.getMessage() for r in caplog.records] == [
      caplog.records[0].getMessage()] and "it: 3/3 (100%)" in caplog.records[0].getMessage()
  caplog.clear()
  assert list(progress_lib.progress(range(3), desc="off", enabled=False)) == [0, 1, 2]
  assert not caplog.records                                   # progress=False: nothing.


def test_on_a_terminal_progress_is_a_tqdm_bar(monkeypatch):
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top

  class Tty(io.StringIO):
    def isatty(self):
      return True

  monkeypatch.setattr("sys.stderr", Tty())
  bar = progress_lib.progress(range(2), desc="train")
  assert isinstance(bar, tqdm)
  assert list(bar) == [0, 1]


def test_help_lists_the_flags_and_how_to_print_a_config():
  proc = run_cli("--help", timeout=120)
  assert proc.returncode == 0, proc.stderr
  for text in ("--config=", "--workdir=", "--[no]overwrite", "--print_config",
               "--config.FIELD=VALUE", "--verbosity", "train.py", "robustness.py"):
    assert text in proc.stdout, text
  assert "Try --helpfull" not in proc.stdout


def test_print_config_prints_the_resolved_config_and_writes_nothing(tmp_path):
  workdir = tmp_path / "wd"
  proc = run_cli(TRAIN, "--config.train.total_steps=7", "--print_config",
                 f"--workdir={workdir}", timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert "study: train" in proc.stdout and "total_steps: 7" in proc.stdout
  assert not workdir.exists() and not os.listdir(tmp_path)


@pytest.mark.slow
def test_the_cli_logs_progress_lines_at_info_unless_verbosity_lowers_it(tmp_path):
  proc = run_cli(TRAIN, f"--workdir={tmp_path / 'a'}", timeout=300)
  assert proc.returncode == 0, proc.stderr
  lines = [l for l in proc.stderr.splitlines() if "] mlp step " in l]
  assert len(lines) == 2 and "mlp step 4/4: loss " in lines[-1], proc.stderr
  assert "checkpoint_manager" not in proc.stderr   # Other libraries: warnings only.
  quiet = run_cli(TRAIN, f"--workdir={tmp_path / 'b'}", "--verbosity=-1", timeout=300)
  assert quiet.returncode == 0 and " step 4/4" not in quiet.stderr, quiet.stderr
