"""Progress of long host-side work: a tqdm bar on a terminal, log lines elsewhere.

`progress(iterable, desc, total)` is the one helper every long loop uses (the training loop,
σ sweeps, corruption sweeps, study stages). Where stderr is a terminal it is a tqdm bar;
where it is not (a log file, a batch job, a notebook's captured stderr) there is no bar and,
instead, one INFO line `desc: n/total (p%), r it/s, ETA h:mm:ss` at most every `log_s`
seconds and one at the end. `enabled=False` (a config's `progress=False`) and processes
other than 0 show nothing. Log lines go to the `xsens` logger (the CLI shows them at its
default verbosity; `--verbosity=-1` hides them).
"""

from __future__ import annotations

import datetime
import logging
import sys
import time
from typing import Iterable, Iterator

log = logging.getLogger("xsens.progress")

LOG_S = 30.0   # Off a terminal: at most one progress line this often.


def format_eta(seconds: float | None) -> str:
  """`h:mm:ss` (whole seconds), or `?` when unknown."""
  if seconds is None or not seconds >= 0 or seconds == float("inf"):
    return "?"
  return str(datetime.timedelta(seconds=int(round(seconds))))


def is_terminal(stream=None) -> bool:
  """Whether `stream` (default: stderr, where bars are drawn) is a terminal."""
  stream = sys.stderr if stream is None else stream
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError):  # A closed or replaced stream.
    return False


def _process_zero() -> bool:
  if "jax" not in sys.modules:  # No JAX yet: a single process.
    return True
  return sys.modules["jax"].process_index() == 0


class LogProgress:
  """tqdm's small interface (`update`, `set_postfix`, `close`, iteration, `n`), drawn as INFO
  log lines: at most one every `log_s` seconds (None: only the last) and, at `close`, one
  for the count reached unless already logged."""

  def __init__(self, iterable: Iterable | None = None, desc: str = "",
               total: int | None = None, initial: int = 0, unit: str = "it",
               log_s: float | None = LOG_S, clock=time.monotonic):
    """`clock`: seconds (monotonic); tests pass a fake one."""
    self.iterable, self.desc, self.total, self.unit = iterable, desc, total, unit
    self.n, self.log_s, self._clock = initial, log_s, clock
    self._start_n, self._t0 = initial, clock()
    self._last_log, self._logged_n = self._t0, initial
    self._postfix = ""
    self._closed = False

  def __iter__(self) -> Iterator:
    try:
      for item in self.iterable:
        yield item
        self.update(1)
    finally:
      self.close()

  def __len__(self) -> int:
    return self.total if self.total is not None else len(self.iterable)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def set_postfix(self, **kwargs) -> None:
    self._postfix = ", ".join(f"{k}={v}" for k, v in kwargs.items())

  def set_description(self, desc: str) -> None:
    self.desc = desc

  def update(self, n: int = 1) -> None:
    self.n += n
    now = self._clock()
    if self.log_s is not None and now - self._last_log >= self.log_s:
      self._log(now)

  def close(self) -> None:
    if not self._closed:
      self._closed = True
      if self.n > self._start_n and self.n != self._logged_n:
        self._log(self._clock())

  def line(self, now: float | None = None) -> str:
    """`desc: n/total (p%), r unit/s, ETA h:mm:ss[, postfix]`."""
    now = self._clock() if now is None else now
    elapsed = max(now - self._t0, 1e-9)
    rate = (self.n - self._start_n) / elapsed
    if self.total:
      eta = (self.total - self.n) / rate if rate > 0 else None
      text = (f"{self.desc}: {self.n}/{self.total} ({100.0 * self.n / self.total:.0f}%), "
              f"{rate:.3g} {self.unit}/s, ETA {format_eta(eta)}")
    else:
      text = f"{self.desc}: {self.n} {self.unit}, {rate:.3g} {self.unit}/s"
    return text + (f", {self._postfix}" if self._postfix else "")

  def _log(self, now: float) -> None:
    self._last_log, self._logged_n = now, self.n
    log.info("%s", self.line(now))


class _Silent(LogProgress):
  """Counts, shows nothing."""

  def _log(self, now: float) -> None:
    del now


def progress(iterable: Iterable | None = None, desc: str = "", total: int | None = None, *,
             enabled: bool = True, initial: int = 0, unit: str = "it",
             log_s: float | None = LOG_S, leave: bool = False):
  """A progress bar over `iterable` (or one to `update` by hand when it is None).

  A tqdm bar when stderr is a terminal, else a `LogProgress` (module docstring); silent
  when `enabled` is False or on a process other than 0. `total` defaults to
  `len(iterable)` where it has one. `log_s`: seconds between log lines off a terminal
  (None: only the final line, for loops that log their own lines).
  """
  if total is None and iterable is not None and hasattr(iterable, "__len__"):
    total = len(iterable)
  if not enabled or not _process_zero():
    return _Silent(iterable, desc, total, initial, unit, log_s=None)
  if is_terminal():
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    return tqdm(iterable, desc=desc, total=total, initial=initial, unit=unit,
                dynamic_ncols=True, leave=leave, mininterval=0.5)
  return LogProgress(iterable, desc, total, initial, unit, log_s=log_s)
