"""Metric sinks: a JSON-lines file and TensorBoard event files in the workdir."""

from __future__ import annotations

import json
import os

import numpy as np

METRICS_FILE = "metrics.jsonl"


class MetricWriter:
  """Writes `{"step": s, **scalars}` records to `workdir/metrics.jsonl` and `workdir/tb/`.

  Only the process that is given `enabled=True` (process 0) writes anything.
  """

  def __init__(self, workdir: str, enabled: bool = True, tensorboard: bool = True):
    self.enabled = enabled
    self._path = os.path.join(workdir, METRICS_FILE)
    self._tb = None
    if enabled and tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(os.path.join(workdir, "tb"), flush_secs=10)

  def write(self, step: int, scalars: dict) -> None:
    if not self.enabled:
      return
    clean = {k: float(np.asarray(v)) for k, v in scalars.items()}
    with open(self._path, "a") as f:
      f.write(json.dumps({"step": int(step), **clean}) + "\n")
    if self._tb is not None:
      for k, v in clean.items():
        self._tb.add_scalar(k, v, int(step))

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._tb = None


def read_metrics(workdir: str) -> list[dict]:
  """All records of `workdir/metrics.jsonl` (empty if absent)."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def truncate_metrics(workdir: str, last_step: int) -> None:
  """Drops records after `last_step`: a resumed run rewrites those steps."""
  records = read_metrics(workdir)
  kept = [r for r in records if r["step"] <= last_step]
  if len(kept) == len(records):
    return
  path = os.path.join(workdir, METRICS_FILE)
  with open(path + ".tmp", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in kept)
  os.replace(path + ".tmp", path)
