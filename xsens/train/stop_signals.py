"""SIGTERM / SIGINT while no training loop runs (start-up, restore, evaluation, the report).

Inside the loop `xsens.train.loop` saves a checkpoint first; outside it there is nothing to
save, and the CLI stops at once. Imports nothing heavy: the CLI installs the handler before
JAX loads.
"""

import signal
import sys


def stop_outside_loop(signum, frame) -> None:
  """The CLI's SIGTERM / SIGINT handler while no training loop runs (start-up, restore,
  evaluation, the report): nothing to save (the newest checkpoint and every file written so
  far are complete); prints one line and exits with 128 + the signal number, running
  `finally` blocks (the workdir lock is released).

  The signal is also recorded: a handler's SystemExit is swallowed when the signal lands
  inside a callback the interpreter guards (a gc callback, a `__del__`), so the loop refuses
  to start (`exit_if_stopped_outside_loop`) while one is recorded.
  """
  del frame
  if not _SIGNALS_OUTSIDE_LOOP:
    print(f"xsens: {signal.Signals(signum).name} outside the training loop; stopped "
          "(nothing unsaved is lost); rerun the same command to resume", file=sys.stderr,
          flush=True)
  _SIGNALS_OUTSIDE_LOOP.append(signum)
  sys.exit(128 + signum)


def exit_if_stopped_outside_loop() -> None:
  """Exits with 128 + the first signal `stop_outside_loop` recorded, if any."""
  if _SIGNALS_OUTSIDE_LOOP:
    sys.exit(128 + _SIGNALS_OUTSIDE_LOOP[0])


def forget_signals_outside_loop() -> None:
  """Clears what `stop_outside_loop` recorded (its handler is no longer installed)."""
  _SIGNALS_OUTSIDE_LOOP.clear()


# What `stop_outside_loop` received, in order: the process's signals are process-wide.
_SIGNALS_OUTSIDE_LOOP: list[int] = []
