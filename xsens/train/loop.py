"""The one training loop: `run(workdir, program, schedule)`.

Every study trains through it: the data-parallel trainer (one step per call),
co-distillation (one step over two models' parameters), grokking (a `lax.scan` chunk of
full-batch epochs, seeds vmapped), the benign-overfitting sweep (a chunk of vmapped GD runs)
and the synthetic study (chunks of full-batch steps). What differs is the `Program`:

  init()                          -> state            a fresh state (already sharded)
  advance(state, step, length)    -> (state, sums, logs)
      advances `length` steps starting at `step`; `sums` are scalar metrics summed over
      those steps (the loop logs their means under `train/` and stops on a non-finite one),
      `logs` are per-step arrays whose LAST axis has `length` entries (the workdir keeps
      them as array logs), either may be None.

What the loop owns (and no study repeats): restore of the newest checkpoint that restores
(`Workdir.restore_latest`: a damaged one is named and moved aside) into the abstract
state's shapes and shardings, or `init()`; truncation of the logs to the restored step
(all of them on a start from step 0; the TensorBoard event files too, so each step is
written once); the run's config as TensorBoard hparams (on a fresh start); the step counter;
the log / evaluation / checkpoint schedule, with `advance` never crossing a boundary; the
divergence stop that keeps the last good checkpoint; the training-data iterator state
(`Program.data_state`, saved with every checkpoint and handed back on a resume); hooks;
early stop; the progress bar (`xsens.train.progress`) and, at every log step, one INFO
line `desc step s/total: loss l, accuracy a, r steps/s, ETA h:mm:ss` (process 0, logger
`xsens.train`); preemption; the final commit of asynchronous saves and the release of the
workdir lock.

Preemption: while `run` is active, SIGTERM and SIGINT (Cloud TPU / GCE preemption, most
schedulers, Ctrl-C) do not kill the process. The loop finishes the current chunk, flushes
the metrics, saves a checkpoint at that step, waits for every save to commit and raises
`Preempted` (the CLI prints one line and exits with 128 + the signal number: 143 for
SIGTERM, 130 for SIGINT). A second signal ends the process at once (128 + the signal; the
newest committed checkpoint is what a rerun restores).

Several processes (`jax.distributed`): at chunk boundaries about half a second apart, and at
every checkpoint, all processes agree whether any of them got a signal
(`multihost.StopAgreement`: a barrier of the coordination service), so all stop at the same
step, save one checkpoint together and exit with the same code.
Every wait on the other processes (that agreement, a checkpoint's save and commit, the
restore's agreement) is bounded by `wait_timeout_s`; a collective that fails because a
process is gone, or a wait that runs out, raises `multihost.WaitFailed` (the CLI: one line,
exit 75), and a wait stuck inside a call ends the process from the watchdog's thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from xsens import errors, paths
from xsens.train import multihost
from xsens.train import progress as progress_lib
from xsens.train import stop_signals
from xsens.train import workdir as workdir_lib
from xsens.train.metrics import flat_hparams
from xsens.train.workdir import CHECKPOINT_DIR, CONFIG_FILE, Workdir

Hook = Callable[[int, Any], "dict | None"]
log = logging.getLogger("xsens.train")


class TrainingDivergedError(RuntimeError):
  """The training loss became NaN or inf; the last good checkpoint is kept."""


class Preempted(RuntimeError):
  """A SIGTERM / SIGINT stopped the run after a checkpoint at `step` was committed."""

  def __init__(self, step: int, signum: int, workdir: str):
    self.step, self.signum = step, signum
    self.exit_code = 128 + signum
    super().__init__(f"preempted ({signal.Signals(signum).name}) at step {step}; checkpoint "
                     f"saved in {workdir}; rerun the same command to resume")


class _SignalFlag:
  """Records SIGTERM / SIGINT while installed (main thread only; elsewhere a no-op).

  The first signal is recorded in `signum` (the loop stops at the next chunk boundary all
  processes agree on). A second one ends the process at once with 128 + the signal number,
  the workdir locks released, even while the main thread waits inside a call Python cannot
  interrupt (a collective, a barrier): a thread reads the signals from
  `signal.set_wakeup_fd`, which the interpreter writes to as each signal arrives.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.signum = None
    self._previous = {}
    self._wakeup = None   # (read fd, write fd, previous wakeup fd, reader thread)

  def _handle(self, signum, frame):
    del signum, frame     # The reader thread acts; this keeps the default action away.

  def _read_signals(self, fd: int) -> None:
    while True:
      try:
        data = os.read(fd, 64)
      except OSError:
        return
      if not data:
        return
      for signum in data:
        if signum == 0:               # uninstall()'s sentinel
          return
        if signum in self.SIGNALS:
          self._received(signum)

  def _received(self, signum: int) -> None:
    name = signal.Signals(signum).name
    if self.signum is None:
      self.signum = signum
      print(f"xsens: {name} received; saving a checkpoint after the current step (send "
            "it again to stop at once)", file=sys.stderr, flush=True)
      return
    print(f"xsens: {name} received again; stopping now without a checkpoint (the newest "
          "committed one is kept; rerun the same command to resume)", file=sys.stderr,
          flush=True)
    workdir_lib.release_held_locks()
    sys.stdout.flush()
    os._exit(128 + signum)  # pylint: disable=protected-access

  @contextlib.contextmanager
  def installed(self):
    if threading.current_thread() is not threading.main_thread():
      yield self
      return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    reader = threading.Thread(target=self._read_signals, args=(read_fd,), daemon=True,
                              name="xsens-signals")
    reader.start()
    self._wakeup = (read_fd, write_fd, previous_fd, reader)
    self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
    try:
      stop_signals.exit_if_stopped_outside_loop()
      yield self
    finally:
      self.uninstall()

  def uninstall(self):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous = {}
    if self._wakeup is not None:
      read_fd, write_fd, previous_fd, reader = self._wakeup
      self._wakeup = None
      signal.set_wakeup_fd(previous_fd)
      os.write(write_fd, b"\0")
      reader.join()
      os.close(read_fd)
      os.close(write_fd)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """When things happen, in steps (0: only at the end). `max_chunk`: the most steps one
  call of `advance` may take (1 for a per-batch step, k for a `lax.scan` chunk)."""
  total_steps: int
  log_every: int = 0
  eval_every: int = 0
  checkpoint_every: int = 0
  max_chunk: int = 1

  def chunk_end(self, step: int) -> int:
    """The step at which the chunk starting at `step` ends: no boundary is crossed."""
    end = min(self.total_steps, step + self.max_chunk)
    for every in (self.log_every, self.eval_every, self.checkpoint_every):
      if every:
        end = min(end, (step // every + 1) * every)
    return end


@dataclasses.dataclass
class Program:
  """What a study trains (see the module docstring)."""
  init: Callable[[], Any]
  abstract_state: Any                     # jax.ShapeDtypeStruct tree with shardings.
  advance: Callable[[Any, int, int], tuple]
  evaluate: Callable[[Any, int], dict] | None = None   # Scalars under their own names.
  should_stop: Callable[[int, dict], str | None] | None = None  # On evaluate's scalars.
  log_scalars: Callable[[int], dict] | None = None     # Extra train/ scalars at a flush.
  on_chunk: Callable[[int, int, Any, float], None] | None = None  # (start, end, logs, s).
  # The training-data iterator's state (bytes), saved with each checkpoint, and its
  # restore (called with None when the restored checkpoint holds none).
  data_state: Callable[[], bytes] | None = None
  set_data_state: Callable[[bytes | None], None] | None = None


@dataclasses.dataclass
class LoopResult:
  state: Any
  step: int
  stop_reason: str | None        # "max_steps", a should_stop reason, or None (interrupted).
  restored_step: int | None
  new_steps: int
  wall_s: float                  # Time spent in advance (device time of new steps).


def run(workdir: Workdir, program: Program, schedule: Schedule, *,
        hooks: Sequence[Hook] = (),
        finished_reason: str | Callable[[int], str | None] | None = None,
        progress: bool = False, desc: str = "train",
        max_chunks: int | None = None, wait_timeout_s: float | None = None) -> LoopResult:
  """Runs (or resumes) `program` in `workdir` until `schedule.total_steps` or a stop.

  `finished_reason(restored_step)` (or a constant): the run already finished at that
  checkpoint for this reason (e.g. a target accuracy), so nothing is trained. Each hook is
  called as `hook(step, state)` at step 0 of a fresh run and after every chunk; its scalars
  are written at that step. `max_chunks` stops after that many chunks (an interruption, for
  tests), with the last chunk checkpointed. `wait_timeout_s` (default:
  `multihost.wait_timeout_s()`) bounds each wait on other processes or on a checkpoint's
  storage. Raises `Preempted` after a SIGTERM / SIGINT (module docstring),
  `TrainingDivergedError`, and `xsens.errors.Unavailable` (e.g. `multihost.WaitFailed`) when
  another process or the workdir's bucket stopped answering.
  """
  if wait_timeout_s is None:
    wait_timeout_s = multihost.wait_timeout_s()
  try:
    with multihost.Watchdog(wait_timeout_s, workdir_lib.release_held_locks) as watchdog:
      return _run(workdir, program, schedule, hooks, finished_reason, progress, desc,
                  max_chunks, watchdog)
  finally:
    workdir.release_lock()


def _run(workdir, program, schedule, hooks, finished_reason, progress, desc, max_chunks,
         watchdog):
  workdir.acquire_lock()
  guard = watchdog.guard
  state, restored = workdir.restore_latest(program.abstract_state, guard=guard)
  if restored is None:
    state, step = program.init(), 0
    workdir.truncate(-1)   # Logs of an earlier start that saved no checkpoint.
  else:
    step = restored
    if program.set_data_state is not None:
      program.set_data_state(workdir.restore_data_state(restored))
    workdir.truncate(restored)
    log.info("Resumed %s from step %d", workdir.path, restored)
  writer = workdir.metric_writer(purge_step=step + 1 if restored is not None else 0)
  hparams = _hparams(workdir)
  if restored is None and hparams:
    writer.write_hparams(hparams, step=0)
  total = schedule.total_steps
  stop_reason = None
  if restored is not None:
    stop_reason = (finished_reason(restored) if callable(finished_reason)
                   else finished_reason)
  if stop_reason is None and step >= total:
    stop_reason = "max_steps"
  # The flush lines below report progress off a terminal, so the bar logs only its end.
  bar = (progress_lib.progress(desc=desc, total=total, initial=step, unit="step",
                               enabled=progress, log_s=None if schedule.log_every else
                               progress_lib.LOG_S)
         if stop_reason is None else None)
  t_start = time.time()
  pending, window_start, t_window = None, step, time.time()
  # Seconds spent evaluating (evaluators, hooks) and checkpointing since the last log line:
  # logged apart, and left out of the training throughput.
  aside = {"eval": 0.0, "checkpoint": 0.0}
  last_good, chunks, wall, start_step = restored, 0, 0.0, step

  def run_hooks(at):
    for hook in hooks:
      scalars = hook(at, state)
      if scalars:
        writer.write(at, scalars)

  def flush(at):
    nonlocal pending, window_start, t_window
    if pending is None:
      return
    sums = jax.device_get(pending)
    n = at - window_start
    means = {f"train/{k}": float(v) / n for k, v in sums.items()}
    if not all(math.isfinite(v) for v in means.values()):
      with guard(f"the commit of checkpoint {last_good}", at):
        workdir.close()  # Commit the last good (async) checkpoint.
      writer.close()
      kept = (f"The last good checkpoint (step {last_good}) is kept in "
              f"{workdir.file(CHECKPOINT_DIR)}" if last_good is not None else
              "No checkpoint was saved before it")
      raise TrainingDivergedError(
          f"training diverged ({_describe(means)}) between steps {window_start} and {at}; "
          f"stopped. {kept}")
    spent = aside["eval"] + aside["checkpoint"]
    means["train/steps_per_sec"] = n / max(time.time() - t_window - spent, 1e-9)
    for what, seconds in aside.items():
      if seconds:
        means[f"time/{what}_s"] = seconds
    if program.log_scalars is not None:
      means.update({f"train/{k}": v for k, v in program.log_scalars(at).items()})
    writer.write(at, means)
    if jax.process_index() == 0:
      eta = (total - at) * (time.time() - t_start) / max(at - start_step, 1)
      log.info("%s", progress_line(desc, at, total, means, eta))
    if bar is not None and "train/loss" in means:
      postfix = {"loss": f"{means['train/loss']:.4f}"}
      if "train/accuracy" in means:
        postfix["acc"] = f"{means['train/accuracy']:.3f}"
      bar.set_postfix(**postfix)
    pending, window_start, t_window = None, at, time.time()
    aside.update(eval=0.0, checkpoint=0.0)

  def timed_aside(what: str, fn, *args):
    """fn(*args), its seconds added to `aside[what]` (the training steps before it finished
    first, so they are not counted as its time)."""
    jax.block_until_ready(state)
    t = time.perf_counter()
    try:
      return fn(*args)
    finally:
      aside[what] += time.perf_counter() - t

  flag = _SignalFlag()
  agreement = multihost.StopAgreement(watchdog.timeout_s)
  lost = False   # Another process is gone: nothing waits on it any more.
  try:
    with flag.installed():
      if restored is None and stop_reason is None:
        run_hooks(0)
      while stop_reason is None:
        end = schedule.chunk_end(step)
        t0 = time.perf_counter()
        state, sums, logs = program.advance(state, step, end - step)
        if logs is not None:
          logs = jax.device_get(logs)
          workdir.write_step_log(step, end, logs)
        if sums is not None:
          pending = sums if pending is None else jax.tree.map(jnp.add, pending, sums)
        dt = time.perf_counter() - t0
        wall += dt
        if program.on_chunk is not None:
          program.on_chunk(step, end, logs, dt)
        step, chunks = end, chunks + 1
        if bar is not None:
          bar.update(end - bar.n)
        last = step >= total
        if last or _at(step, schedule.log_every):
          flush(step)
        if program.evaluate is not None and (last or _at(step, schedule.eval_every)):
          scalars = timed_aside("eval", program.evaluate, state, step)
          if scalars:
            writer.write(step, scalars)
          if program.should_stop is not None:
            stop_reason = program.should_stop(step, scalars)
        if hooks:
          timed_aside("eval", run_hooks, step)
        if last and stop_reason is None:
          stop_reason = "max_steps"
        if stop_reason is not None and hparams:
          writer.end_hparams_session(step)
        interrupted = max_chunks is not None and chunks >= max_chunks
        checkpoint = bool(stop_reason or interrupted or _at(step, schedule.checkpoint_every))
        with guard("the other processes to agree whether to stop", step):
          signum = agreement.at(step, flag.signum, boundary=checkpoint)
        if checkpoint or signum is not None:
          flush(step)  # Never checkpoint a state whose loss went non-finite.
          writer.flush()  # Every record up to a checkpoint is stored before it.
          with guard(f"the save of checkpoint {step}", step):
            if program.data_state is not None:
              timed_aside("checkpoint", workdir.save, step, state, program.data_state())
            else:
              timed_aside("checkpoint", workdir.save, step, state)
          last_good = step
        if signum is not None:
          with guard(f"the commit of checkpoint {step}", step):
            workdir.close()  # Waits until the checkpoint is committed.
          raise Preempted(step, signum, workdir.path)
        if interrupted:
          break
  except errors.Unavailable:   # Another process, or the workdir's bucket, is gone.
    lost = True
    raise
  except Exception as e:  # pylint: disable=broad-except  (a failed collective: re-raised)
    if jax.process_count() == 1 or not multihost.is_peer_failure(e):
      raise
    lost = True
    raise multihost.WaitFailed("a collective with the other processes", step,
                               multihost.first_line(e)) from None
  finally:
    if bar is not None:
      bar.close()
    if lost:
      workdir.abandon()
    else:
      with guard("the commit of the last checkpoint", step):
        workdir.close()
    writer.close()
  return LoopResult(state, step, stop_reason, restored, step - start_step, wall)


def _hparams(workdir: Workdir) -> dict:
  """The run's config (its fingerprint in config.json), flattened for TensorBoard."""
  if not workdir.is_writer or not paths.exists(workdir.file(CONFIG_FILE)):
    return {}
  return flat_hparams(workdir.read_json(CONFIG_FILE))


def _at(step: int, every: int) -> bool:
  return bool(every) and step % every == 0


def _describe(means: dict) -> str:
  bad = [f"{k} {v}" for k, v in means.items() if not math.isfinite(v)]
  shown = [f"mean loss {means['train/loss']}"] if "train/loss" in means else []
  if "train/param_norm" in means:
    shown.append(f"weight norm {means['train/param_norm']}")
  return ", ".join(shown or bad)


def progress_line(desc: str, step: int, total: int, means: dict, eta_s: float | None
                  ) -> str:
  """The INFO line of a flush: `desc step s/total: loss l, accuracy a, r steps/s, ETA t`
  (`means` holds `train/<name>` window means; loss and accuracy only where present)."""
  shown = []
  for name, fmt in (("loss", ".4g"), ("accuracy", ".4f")):
    if f"train/{name}" in means:
      shown.append(f"{name} {means[f'train/{name}']:{fmt}}")
  if "train/steps_per_sec" in means:
    shown.append(f"{means['train/steps_per_sec']:.3g} steps/s")
  shown.append(f"ETA {progress_lib.format_eta(eta_s)}")
  return f"{desc} step {step}/{total}: " + ", ".join(shown)
