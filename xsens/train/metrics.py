"""Metric sinks: a JSON-lines file and TensorBoard event files in the workdir.

A kill during a write can leave a partial last line in metrics.jsonl: readers skip it, and
`truncate_metrics` (run by the loop before every start or resume) drops it with a message.
The TensorBoard event files are truncated the same way when the loop opens its writer
(`purge_step`, `truncate_events`); the writer also holds the run's hparams
(`write_hparams`, `flat_hparams` of its config).

A remote workdir (`gs://...`): an object store has no append, so metrics.jsonl is rewritten
whole at each record (it stays small: one line per logged step), and TensorBoard event files
are written through `etils.epath` by `EpathRecordWriter` (registered with tensorboardX for
the path's scheme; tensorboardX's own GCS writer needs google-cloud-storage and fails).
"""

from __future__ import annotations

import io
import json
import logging
import os
import struct
import sys
import time

import numpy as np

from xsens import paths
from xsens.errors import ConfigError

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
EVENTS_PREFIX = "events.out.tfevents."


class MetricWriter:
  """Writes `{"step": s, **scalars}` records to `workdir/metrics.jsonl` and `workdir/tb/`.

  Only the process that is given `enabled=True` (process 0) writes anything. Each record is
  one `write` of one line, flushed at once. `purge_step`: the summaries of earlier event
  files at steps >= it are removed from those files (`truncate_events`), and TensorBoard is
  told to drop them too (a SessionLog START), so a resumed run's steps appear exactly once.
  """

  def __init__(self, workdir: str, enabled: bool = True, tensorboard: bool = True,
               purge_step: int | None = None):
    self.enabled = enabled
    self._path = os.path.join(workdir, METRICS_FILE)
    self._remote_text = None  # A remote metrics.jsonl's content (rewritten whole).
    self._tb = None
    if enabled and tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      if paths.is_remote(workdir):
        register_epath_writer(workdir)
      if purge_step is not None:
        truncate_events(os.path.join(workdir, TB_DIR), purge_step)
      # tensorboardX names a file by the second: the nanosecond suffix keeps a writer
      # opened in the same second (a quick resume) from replacing the earlier file, and
      # keeps the files in the order TensorBoard reads them (sorted by name).
      self._tb = SummaryWriter(os.path.join(workdir, TB_DIR), flush_secs=10,
                               purge_step=purge_step, filename_suffix=f".{time.time_ns()}")

  def write(self, step: int, scalars: dict) -> None:
    if not self.enabled:
      return
    clean = {k: float(np.asarray(v)) for k, v in scalars.items()}
    line = json.dumps({"step": int(step), **clean}) + "\n"
    if paths.is_remote(self._path):
      if self._remote_text is None:
        self._remote_text = (paths.read_text(self._path) if paths.exists(self._path) else "")
      self._remote_text += line
      paths.write_text(self._path, self._remote_text)
    else:
      with open(self._path, "a") as f:
        f.write(line)
    if self._tb is not None:
      for k, v in clean.items():
        self._tb.add_scalar(k, v, int(step))

  def write_hparams(self, hparams: dict, step: int = 0) -> None:
    """The run's hyperparameters (`{name: bool | int | float | str}`, e.g. `flat_hparams`
    of its config) for TensorBoard's HParams tab, in this run's own event file (a
    session-start summary; the tab lists every scalar tag of the run as a metric)."""
    if self._tb is None:
      return
    from tensorboardX.summary import hparams as hparams_summary  # pylint: disable=g-import-not-at-top
    _, start, _ = hparams_summary(hparams, {})
    self._tb.file_writer.add_summary(start, int(step))

  def end_hparams_session(self, step: int) -> None:
    """Marks the HParams session finished (status SUCCESS) at `step`."""
    if self._tb is None:
      return
    from tensorboardX.summary import hparams as hparams_summary  # pylint: disable=g-import-not-at-top
    _, _, end = hparams_summary({}, {})
    self._tb.file_writer.add_summary(end, int(step))

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._tb = None


def _read(path: str) -> tuple[list[dict], bool]:
  """(records, whether a partial last line was skipped). A bad line elsewhere raises."""
  lines = paths.read_text(path).split("\n")
  records, partial = [], False
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      if i < len(lines) - 1 and any(l.strip() for l in lines[i + 1:]):
        raise ConfigError("workdir", f"line {i + 1} of {path} is not JSON (edited by hand, "
                          "or written by two processes); remove that line, or pass "
                          "--overwrite to start again") from None
      partial = True
  return records, partial


def read_metrics(workdir: str) -> list[dict]:
  """All records of `workdir/metrics.jsonl` (empty if absent; a partial last line, left by
  a kill during a write, is skipped)."""
  path = os.path.join(workdir, METRICS_FILE)
  if not paths.exists(path):
    return []
  return _read(path)[0]


def truncate_metrics(workdir: str, last_step: int) -> None:
  """Drops records after `last_step` (-1: all) and a partial last line, with a message for
  the latter: a restarted run rewrites those steps exactly once."""
  path = os.path.join(workdir, METRICS_FILE)
  if not paths.exists(path):
    return
  records, partial = _read(path)
  if partial:
    message = (f"xsens: dropped a partial last line of {path} (a write was interrupted); "
               f"the run rewrites the steps after {last_step}")
    logging.warning(message)
    print(message, file=sys.stderr)
  kept = [r for r in records if r["step"] <= last_step]
  if len(kept) == len(records) and not partial:
    return
  text = "".join(json.dumps(r) + "\n" for r in kept)
  if paths.is_remote(path):
    paths.write_text(path, text)
    return
  with open(path + ".tmp", "w") as f:
    f.write(text)
  os.replace(path + ".tmp", path)


def flat_hparams(config: dict, prefix: str = "") -> dict:
  """`{"a.b": value}` of a nested config dict, as TensorBoard's HParams tab takes them:
  bools, numbers and strings as they are, lists (tuples) as JSON text; None left out."""
  out = {}
  for key, value in config.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      out.update(flat_hparams(value, name + "."))
    elif isinstance(value, (bool, int, float, str)):
      out[name] = value
    elif value is not None:
      out[name] = json.dumps(value, default=str)
  return out


def _records(data: bytes) -> list[tuple[int, int]]:
  """(start, end) byte ranges of the whole TFRecords in an event file (a partial last
  record, left by a kill during a write, is not listed)."""
  out, pos = [], 0
  while pos + 12 <= len(data):
    (length,) = struct.unpack("<Q", data[pos:pos + 8])
    end = pos + 12 + length + 4
    if end > len(data):
      break
    out.append((pos, end))
    pos = end
  return out


def truncate_events(folder: str, first_dropped: int) -> None:
  """Removes every summary at a step >= `first_dropped` (0: all of them) from the event
  files in `folder`, and a partial last record; a file left without summaries is deleted.

  A resumed run rewrites the steps after its checkpoint: without this, a reader of the
  event files that does not apply TensorBoard's SessionLog START purge (one decoding them,
  as tests/faults_test.py does) sees those steps twice, e.g. train/loss at [2, 4, 6, 8, 8]
  after a kill between the write of step 8 and its checkpoint's commit.
  """
  if not paths.isdir(folder):
    return
  from google.protobuf import message  # pylint: disable=g-import-not-at-top
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  for name in sorted(paths.listdir(folder)):
    if not name.startswith(EVENTS_PREFIX):
      continue
    path = os.path.join(folder, name)
    data = paths.read_bytes(path)
    ranges = _records(data)
    kept, summaries = [], 0
    for i, (start, end) in enumerate(ranges):
      try:
        event = event_pb2.Event.FromString(data[start + 12:end - 4])
      except message.DecodeError:  # A damaged record: it and what follows are dropped.
        ranges = ranges[:i]
        break
      if event.HasField("summary"):
        if event.step >= first_dropped:
          continue
        summaries += 1
      kept.append(data[start:end])
    if not summaries:
      paths.remove(path)
    elif len(kept) < len(ranges) or ranges[-1][1] < len(data):
      paths.write_bytes(path, b"".join(kept))


class EpathRecordWriter:
  """A tensorboardX record sink for a remote event file: records accumulate in memory and
  each `flush` (tensorboardX's writer thread calls it every `flush_secs`, and on close)
  uploads the whole file through `etils.epath` (an object store has no append)."""

  def __init__(self, path: str):
    self.path = path
    self._buffer = io.BytesIO()
    self._uploaded = -1

  def write(self, data: bytes) -> None:
    self._buffer.write(data)

  def flush(self) -> None:
    if self._buffer.tell() != self._uploaded:
      paths.write_bytes(self.path, self._buffer.getvalue())
      self._uploaded = self._buffer.tell()

  def close(self) -> None:
    self.flush()


class _EpathWriterFactory:
  """tensorboardX's writer-factory interface (`record_writer.register_writer_factory`)."""

  def open(self, path: str) -> EpathRecordWriter:
    return EpathRecordWriter(path)

  def directory_check(self, path: str) -> None:
    del path  # Object stores need no directories.


def register_epath_writer(path: str) -> None:
  """Makes tensorboardX write event files under `path`'s scheme (`gs`, ...) through
  `EpathRecordWriter` (tensorboardX picks a factory by the text before the first `:`)."""
  from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
  scheme = os.fspath(path).split(":", 1)[0]
  if not isinstance(record_writer.REGISTERED_FACTORIES.get(scheme), _EpathWriterFactory):
    record_writer.register_writer_factory(scheme, _EpathWriterFactory())
