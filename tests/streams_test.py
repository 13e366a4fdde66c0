"""xsens.train.streams: ordered, bounded concurrent calls."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import run_cli
from xsens.train import streams


def test_ordered_map_keeps_order_and_bounds_calls_in_flight():
  lock, running, peak = threading.Lock(), [0], [0]

  def fn(i):
    with lock:
      running[0] += 1
      peak[0] = max(peak[0], running[0])
    time.sleep(0.02 * (5 - i % 5))  # Later items finish first.
    with lock:
      running[0] -= 1
    return i * i

  consumed = []
  items = (consumed.append(i) or i for i in range(10))
  assert streams.ordered_map(fn, items, 3) == [i * i for i in range(10)]
  assert peak[0] == 3 and consumed == list(range(10))
  peak[0] = 0
  assert streams.ordered_map(fn, range(4), 1) == [0, 1, 4, 9] and peak[0] == 1


def test_ordered_map_raises_and_starts_no_later_item():
  started = []

  def fn(i):
    started.append(i)
    if i == 2:
      raise ValueError("item 2")
    time.sleep(0.01)
    return i

  with pytest.raises(ValueError, match="item 2"):
    streams.ordered_map(fn, range(20), 2)
  assert max(started) <= 4  # At most `streams` items beyond the failing one's turn.


def test_jitted_calls_in_streams_equal_a_plain_loop():
  f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=1))
  xs = [jax.random.normal(jax.random.key(i), (64, 32)) for i in range(6)]
  want = [np.asarray(f(x)) for x in xs]
  got = streams.ordered_map(lambda x: np.asarray(f(x)), xs, 2)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)


def test_resolve(monkeypatch):
  monkeypatch.delenv(streams.ENV_VAR, raising=False)
  assert streams.resolve(3) == 3
  single_cpu = jax.default_backend() == "cpu" and jax.device_count() == 1
  assert streams.resolve(None) == (streams.available_cores() if single_cpu else 1)
  assert streams.available_cores() >= 1


def test_environment_sets_the_default_not_an_explicit_count(monkeypatch):
  monkeypatch.setenv(streams.ENV_VAR, "3")
  assert streams.resolve(None) == 3 and streams.resolve(1) == 1


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_bad_environment_value_is_one_line(monkeypatch, value):
  monkeypatch.setenv(streams.ENV_VAR, value)
  with pytest.raises(ValueError, match="XSENS_STREAMS=.*must be a positive int") as err:
    streams.resolve(None)
  assert "\n" not in str(err.value)


def test_cli_refuses_a_bad_environment_value_with_exit_code_2(tmp_path):
  proc = run_cli("--config=mlcollections_configs/train.py:smoke",
                 f"--workdir={tmp_path / 'wd'}", env_extra={streams.ENV_VAR: "0"})
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip().splitlines() == [
      "xsens: error: XSENS_STREAMS='0': must be a positive int (concurrent streams per "
      "process) or unset (one per core on a CPU)"]
  assert not (tmp_path / "wd").exists()
