"""A SIGTERM outside the training loop stops the process even when its SystemExit is lost."""

import signal
import subprocess
import sys
import textwrap

import pytest

# The handler's SystemExit raised inside `__del__` is printed as "Exception ignored" and
# dropped, as it is inside a gc callback (seen in CI during JAX start-up); the loop must
# then refuse to start.
_SWALLOWED = textwrap.dedent("""
    import signal
    from xsens.train import loop, stop_signals
    signal.signal(signal.SIGTERM, stop_signals.stop_outside_loop)

    class Guarded:
      def __del__(self):
        signal.raise_signal(signal.SIGTERM)

    Guarded()
    print("still running", flush=True)
    with loop._SignalFlag().installed():
      print("the loop ran", flush=True)
""")


def test_a_swallowed_exit_still_stops_the_process_before_the_loop():
  done = subprocess.run([sys.executable, "-c", _SWALLOWED], capture_output=True, text=True,
                        timeout=120, check=False)
  assert done.returncode == 128 + signal.SIGTERM, done.stderr
  assert done.stdout == "still running\n"
  assert "Exception ignored" in done.stderr
  assert done.stderr.count("xsens: SIGTERM outside the training loop; stopped") == 1


def test_a_recorded_signal_exits_until_forgotten():
  from xsens.train import stop_signals  # pylint: disable=g-import-not-at-top
  stop_signals.exit_if_stopped_outside_loop()   # nothing recorded: returns
  with pytest.raises(SystemExit) as stopped:
    stop_signals.stop_outside_loop(signal.SIGINT, None)
  assert stopped.value.code == 130
  with pytest.raises(SystemExit) as again:
    stop_signals.exit_if_stopped_outside_loop()
  assert again.value.code == 130
  stop_signals.forget_signals_outside_loop()
  stop_signals.exit_if_stopped_outside_loop()
