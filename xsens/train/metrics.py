"""Metric sinks: a JSON-lines file and TensorBoard event files in the workdir.

A kill during a write can leave a partial last line in metrics.jsonl: readers skip it, and
`truncate_metrics` (run by the loop before every start or resume) drops it with a message.
The TensorBoard event files are truncated the same way when the loop opens its writer
(`purge_step`, `truncate_events`); the writer also holds the run's hparams
(`write_hparams`, `flat_hparams` of its config).

A remote workdir (`gs://...`): an object store has no append, so each flush uploads only
what was written since the last one, as a new object (a flush costs its new data, not the
run's length). Records go to numbered part files `metrics/part-000000.jsonl`, ... (one per
flush: every `flush_secs`, and on `flush` / `close`), which `read_metrics` and
`truncate_metrics` read as one stream after a local-style `metrics.jsonl` if one exists.
TensorBoard event files are written through `etils.epath` by `EpathRecordWriter`
(registered with tensorboardX for the path's scheme; tensorboardX's own GCS writer needs
google-cloud-storage and fails): each flush is an event file of its own, named after the
first with a numbered suffix so that the names sort in writing order (TensorBoard reads
every event file of tb/).
"""

from __future__ import annotations

import io
import json
import logging
import os
import struct
import sys
import threading
import time

import numpy as np

from xsens import paths
from xsens.errors import ConfigError, Unavailable

METRICS_FILE = "metrics.jsonl"
METRICS_PARTS_DIR = "metrics"   # A remote workdir's metric records: part-<n>.jsonl.
TB_DIR = "tb"
EVENTS_PREFIX = "events.out.tfevents."
FLUSH_SECS = 10.0               # How often remote records and events are uploaded.
_PART_PREFIX, _PART_SUFFIX = "part-", ".jsonl"


class MetricWriter:
  """Writes `{"step": s, **scalars}` records to `workdir/metrics.jsonl` and `workdir/tb/`.

  Only the process that is given `enabled=True` (process 0) writes anything. Locally each
  record is one `write` of one line, flushed at once; remotely records are uploaded every
  `flush_secs` as a part file (module docstring). `purge_step`: the summaries of earlier
  event files at steps >= it are removed from those files (`truncate_events`), and
  TensorBoard is told to drop them too (a SessionLog START), so a resumed run's steps
  appear exactly once.
  """

  def __init__(self, workdir: str, enabled: bool = True, tensorboard: bool = True,
               purge_step: int | None = None, flush_secs: float | None = None):
    """`flush_secs`: how often remote records and events are uploaded (default
    `FLUSH_SECS`)."""
    flush_secs = FLUSH_SECS if flush_secs is None else flush_secs
    self.enabled = enabled
    self._path = os.path.join(workdir, METRICS_FILE)
    self._parts = (PartLog(os.path.join(workdir, METRICS_PARTS_DIR), flush_secs)
                   if enabled and paths.is_remote(workdir) else None)
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
      self._tb = SummaryWriter(os.path.join(workdir, TB_DIR), flush_secs=flush_secs,
                               purge_step=purge_step, filename_suffix=f".{time.time_ns()}")

  def write(self, step: int, scalars: dict) -> None:
    if not self.enabled:
      return
    clean = {k: float(np.asarray(v)) for k, v in scalars.items()}
    line = json.dumps({"step": int(step), **clean}) + "\n"
    if self._parts is not None:
      paths.check_answering(self._path)   # A failed upload stops the run at once.
      self._parts.append(line)
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

  def flush(self) -> None:
    """Uploads (remote) or syncs every record and event written so far."""
    if self._parts is not None:
      self._parts.flush()
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    try:
      if self._parts is not None:
        self._parts.close()
        self._parts = None
    finally:
      if self._tb is not None:
        self._tb.close()
        self._tb = None


class PartLog:
  """Text appended to a remote log: kept in memory and uploaded, every `flush_secs` (a
  daemon thread; 0: only on `flush`) and on `flush` / `close`, as the next numbered part
  file `folder/part-<n>.jsonl` holding only the text since the previous upload. A failed
  upload keeps its text for the next one."""

  def __init__(self, folder: str, flush_secs: float | None = None):
    flush_secs = FLUSH_SECS if flush_secs is None else flush_secs
    self.folder = folder
    parts = part_files(folder)
    self._next = parts[-1][0] + 1 if parts else 0
    self._pending: list[str] = []
    self._lock = threading.Lock()          # Guards `_pending`.
    self._upload_lock = threading.Lock()   # One upload at a time, in part order.
    self._stop = threading.Event()
    self._thread = None
    if flush_secs > 0:
      self._thread = threading.Thread(target=self._run, args=(flush_secs,), daemon=True,
                                      name="xsens-metrics-upload")
      self._thread.start()

  def append(self, text: str) -> None:
    with self._lock:
      self._pending.append(text)

  def flush(self) -> None:
    with self._upload_lock:
      with self._lock:
        text, self._pending = "".join(self._pending), []
      if not text:
        return
      try:
        paths.write_text(os.path.join(self.folder, part_name(self._next)), text)
      except BaseException:
        with self._lock:
          self._pending.insert(0, text)
        raise
      self._next += 1

  def _run(self, flush_secs: float) -> None:
    while not self._stop.wait(flush_secs):
      try:
        self.flush()
      except Unavailable:
        return          # The bucket stopped answering: the run's next write says so.
      except Exception as e:  # pylint: disable=broad-except  (retried at the next flush)
        logging.warning("cannot upload metrics to %s (retried later): %s", self.folder, e)

  def close(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    self.flush()


def part_name(n: int) -> str:
  return f"{_PART_PREFIX}{n:06d}{_PART_SUFFIX}"


def part_files(folder: str) -> list[tuple[int, str]]:
  """(n, path) of the part files `part-<n>.jsonl` in `folder`, in order (empty if none)."""
  if not paths.isdir(folder):
    return []
  out = []
  for name in paths.listdir(folder):
    number = name[len(_PART_PREFIX):-len(_PART_SUFFIX)]
    if name.startswith(_PART_PREFIX) and name.endswith(_PART_SUFFIX) and number.isdigit():
      out.append((int(number), os.path.join(folder, name)))
  return sorted(out)


def metric_files(workdir: str) -> list[str]:
  """The files holding `workdir`'s metric records, in reading order: metrics.jsonl (if it
  exists), then the part files of metrics/."""
  path = os.path.join(workdir, METRICS_FILE)
  first = [path] if paths.exists(path) else []
  return first + [p for _, p in part_files(os.path.join(workdir, METRICS_PARTS_DIR))]


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
  """All records of `workdir`'s metrics (`metric_files`; empty if none; a partial last
  line, left by a kill during a write, is skipped)."""
  return [r for path in metric_files(workdir) for r in _read(path)[0]]


def truncate_metrics(workdir: str, last_step: int) -> None:
  """Drops records after `last_step` (-1: all) and a partial last line, with a message for
  the latter: a restarted run rewrites those steps exactly once. A part file left empty
  is removed."""
  for path in metric_files(workdir):
    records, partial = _read(path)
    if partial:
      message = (f"xsens: dropped a partial last line of {path} (a write was interrupted); "
                 f"the run rewrites the steps after {last_step}")
      logging.warning(message)
      print(message, file=sys.stderr)
    kept = [r for r in records if r["step"] <= last_step]
    if len(kept) == len(records) and not partial:
      continue
    text = "".join(json.dumps(r) + "\n" for r in kept)
    if paths.is_remote(path):
      if kept or os.path.basename(path) == METRICS_FILE:
        paths.write_text(path, text)
      else:
        paths.remove(path)
      continue
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
  uploads those written since the previous flush through `etils.epath` as an event file
  of their own: the first at `path`, the k-th at `part_path(path, k)` (an object store
  has no append; names sort in writing order)."""

  def __init__(self, path: str):
    self.path = path
    self._buffer = io.BytesIO()
    self._parts = 0

  def write(self, data: bytes) -> None:
    self._buffer.write(data)

  def flush(self) -> None:
    data = self._buffer.getvalue()
    if not data:
      return
    try:
      paths.write_bytes(part_path(self.path, self._parts), data)
    except Unavailable:
      # The bucket stopped answering: the records stay here, and the metric writer's
      # next write or close reports it (raised here, tensorboardX's writer thread and its
      # exit handler would print it as a traceback).
      return
    self._parts += 1
    self._buffer = io.BytesIO()

  def close(self) -> None:
    self.flush()


def part_path(path: str, k: int) -> str:
  """The name of the k-th upload of a remote event file `path` (k = 0: `path` itself)."""
  return path if k == 0 else f"{path}.{k:06d}"


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
