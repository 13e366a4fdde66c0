"""What the processes of a multi-process run agree on, and how long one waits for the others.

- `StopAgreement`: every process learns at the same chunk boundary whether any process got
  a SIGTERM / SIGINT, through the coordination service of `jax.distributed` (a key per
  signalled process, then a barrier, then one read of the keys); all then stop at that step.
- `Watchdog`: a wait on the other processes (a barrier, a checkpoint's save and commit, a
  restore's agreement) that outlasts `timeout_s` ends the process with one line naming the
  step and what it waited for, and exit code `EXIT_PEER_LOST`.
- `WaitFailed`: the error a failed wait raises in the main thread (the CLI prints it as one
  line and exits with `EXIT_PEER_LOST`).

The timeout comes from `XSENS_WAIT_TIMEOUT_S` (seconds, default 120); the CLI checks it
before anything runs. One process: nothing here waits on anything.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping

import jax

from xsens import errors

TIMEOUT_ENV = "XSENS_WAIT_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 120.0
EXIT_PEER_LOST = errors.EXIT_UNAVAILABLE   # A rerun resumes the run.
# Text of the errors a collective or the coordination service raises when a peer is gone.
_PEER_FAILURE_MARKERS = ("gloo", "connection reset", "connection refused", "heartbeat",
                         "coordination", "barrier", "deadline_exceeded", "unavailable",
                         "socket closed", "broken pipe")


def wait_timeout_s(environ: Mapping[str, str] | None = None) -> float:
  """`XSENS_WAIT_TIMEOUT_S` in seconds (DEFAULT_TIMEOUT_S when unset or empty); a one-line
  ValueError naming the variable unless it is a positive number."""
  raw = (os.environ if environ is None else environ).get(TIMEOUT_ENV, "").strip()
  if not raw:
    return DEFAULT_TIMEOUT_S
  try:
    value = float(raw)
  except ValueError:
    value = float("nan")
  if not value > 0 or value == float("inf"):
    raise ValueError(f"{TIMEOUT_ENV}: must be a positive number of seconds, got {raw!r}")
  return value


class WaitFailed(errors.Unavailable):
  """A wait on the other processes of a run (or on a checkpoint's storage) failed or timed
  out at `step`."""

  def __init__(self, what: str, step: int | None, detail: str, process: int | None = None):
    """`process`: this process's index when JAX cannot be asked yet (before
    `jax.distributed.initialize` returns); None asks JAX."""
    self.what, self.step, self.detail = what, step, detail
    at = f" at step {step}" if step is not None else ""
    if process is not None or jax.process_count() > 1:
      process = jax.process_index() if process is None else process
      super().__init__(
          f"process {process} gave up waiting for {what}{at} ({detail}); another "
          "process stopped or hangs; rerun the same command on every process to resume from "
          "the newest checkpoint")
    else:
      super().__init__(f"gave up waiting for {what}{at} ({detail}); rerun the same command "
                       "to resume from the newest checkpoint")


def is_peer_failure(error: BaseException) -> bool:
  """Whether `error` (from a collective or the coordination service) says a peer is gone:
  a JaxRuntimeError naming a lost connection, barrier or heartbeat, or any error that a
  failed Gloo collective or the coordination service raised (e.g. a ValueError of
  `multihost_utils.process_allgather`)."""
  text = str(error).lower()
  if isinstance(error, jax.errors.JaxRuntimeError):
    return any(marker in text for marker in _PEER_FAILURE_MARKERS)
  return isinstance(error, Exception) and ("gloo" in text or "coordination service" in text)


def first_line(error: BaseException, limit: int = 200) -> str:
  """The first line of `error`'s message, a prefix repeated by nested errors said once."""
  text = " ".join((str(error).strip().splitlines() or [""])[0].split())
  text = re.sub(r"(\b[^:]{1,80}: )\1+", r"\1", text)
  return text if len(text) <= limit else text[:limit] + "..."


def _client():
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  client = distributed.global_state.client
  if client is None:
    raise RuntimeError("jax.distributed is not initialized")
  return client


# Agreements made by this process. Every process of a run makes the same sequence of them
# (the same program), so the n-th agreement has the same number everywhere; it names the
# keys of that agreement (a key is never reused, so a late reader sees the right values).
_AGREEMENTS = itertools.count()
_STOP_BARRIER = "xsens_stop"
AGREE_INTERVAL_S = 0.5   # Agreements are about this far apart in time (see StopAgreement).


class StopAgreement:
  """Whether to stop at a chunk boundary: the same answer on every process.

  `at(step, signum, boundary)` with this process's signal (None: none) returns the signal
  that stops every process at `step`, or None. One process: `signum`, at every boundary.
  Several: an agreement is made through JAX's coordination service at the boundaries where
  `boundary` is true (a checkpoint or the end of the run: the same on every process) and at
  least every `interval_s` of training: a signalled process writes its signal under the
  agreement's key, all meet at a barrier, then each reads the keys and returns the signal of
  the lowest process that got one. Process 0 also writes which step the next agreement is
  due at (`interval_s` of its measured steps/s ahead), so all make the next one at the same
  boundary; between agreements nothing is exchanged. WaitFailed if the barrier does not
  complete within `timeout_s`.
  """

  def __init__(self, timeout_s: float, interval_s: float = AGREE_INTERVAL_S):
    self.timeout_s = float(timeout_s)
    self.interval_s = float(interval_s)
    self.due = None          # The step from which the next agreement is made (None: now).
    self._last = None        # (step, time) of process 0's previous agreement.

  def at(self, step: int, signum: int | None, boundary: bool = False) -> int | None:
    if jax.process_count() == 1:
      return signum
    if not boundary and self.due is not None and step < self.due:
      return None
    client = _client()
    prefix = f"xsens/stop/{next(_AGREEMENTS)}/"
    try:
      if signum is not None:
        client.key_value_set(prefix + str(jax.process_index()), str(int(signum)))
      if jax.process_index() == 0:
        client.key_value_set(prefix + "due", str(self._next_due(step)))
      client.wait_at_barrier(_STOP_BARRIER, max(1, int(self.timeout_s * 1000)))
      entries = dict(client.key_value_dir_get(prefix))
    except jax.errors.JaxRuntimeError as e:
      raise WaitFailed("the other processes to agree whether to stop", step, first_line(e)
                       ) from None
    self.due = int(entries.pop(prefix + "due"))
    if not entries:
      return None
    _, value = min(entries.items(), key=lambda kv: int(kv[0].rsplit("/", 1)[-1]))
    return int(value)

  def _next_due(self, step: int) -> int:
    """Process 0's choice of the next agreement's step: `interval_s` ahead at the rate
    measured since its previous agreement (the next boundary the first time)."""
    now = time.monotonic()
    ahead = 1
    if self._last is not None and step > self._last[0]:
      rate = (step - self._last[0]) / max(now - self._last[1], 1e-9)
      ahead = max(1, int(self.interval_s * rate))
    self._last = (step, now)
    return step + ahead


class Watchdog:
  """Ends the process when a guarded wait outlasts `timeout_s`.

  `guard(what, step)` marks a wait (on other processes, or on a checkpoint's storage). A
  daemon thread checks about once a second; if a guard is still open `timeout_s` after it
  began, the thread prints `xsens: error: process P gave up waiting for <what> at step S
  ...` on stderr, calls `on_expiry` (which must be quick: e.g. release the workdir lock) and
  ends the process with `EXIT_PEER_LOST` (`os._exit`: the main thread is stuck in a call
  that cannot be interrupted, and JAX's exit handlers would wait on the same peers).
  """

  def __init__(self, timeout_s: float, on_expiry: Callable[[], None] | None = None,
               poll_s: float = 1.0):
    self.timeout_s = float(timeout_s)
    self._on_expiry = on_expiry
    self._poll_s = min(poll_s, self.timeout_s / 4)
    self._open = None          # (what, step, start time) of the open guard.
    self._stop = threading.Event()
    self._thread = None

  def __enter__(self) -> "Watchdog":
    self._thread = threading.Thread(target=self._watch, daemon=True, name="xsens-watchdog")
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()

  @contextlib.contextmanager
  def guard(self, what: str, step: int | None):
    outer = self._open
    if outer is None:
      self._open = (what, step, time.monotonic())
    try:
      yield
    finally:
      if outer is None:
        self._open = None

  def _watch(self) -> None:
    while not self._stop.wait(self._poll_s):
      current = self._open
      if current is not None and time.monotonic() - current[2] > self.timeout_s:
        what, step, _ = current
        error = WaitFailed(what, step, f"no progress for {self.timeout_s:.0f} s")
        print(f"xsens: error: {error}", file=sys.stderr, flush=True)
        if self._on_expiry is not None:
          _call_with_deadline(self._on_expiry, 10.0)
        sys.stdout.flush()
        os._exit(EXIT_PEER_LOST)  # pylint: disable=protected-access


def _call_with_deadline(fn: Callable[[], None], timeout_s: float) -> None:
  """Runs `fn` in a daemon thread and waits at most `timeout_s` for it (errors ignored)."""
  def target():
    try:
      fn()
    except Exception:  # pylint: disable=broad-except
      pass
  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  thread.join(timeout_s)
