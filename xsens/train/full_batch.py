"""Full-batch training on one device: the one optax step of the full-batch studies, the
one-device loop set-up, and cross-entropy training to a target accuracy.

`optax_step` is the update of grokking (AdamW, seeds vmapped), synthetic_sensitivity
(Adam, cross-entropy and Boolean MSE) and modify_memories (pre-training and the vmapped
grid of edits): `loss_fn(params, *args)` -> gradients -> an optional map of them (e.g. a
0/1 mask of frozen leaves) -> `tx.update` -> new params. A pure function of arrays, so it
vmaps over seeds or variants and scans over steps.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from xsens import paths
from xsens.train import loop
from xsens.train.metrics import read_metrics
from xsens.train.sharding import abstract_with_shardings
from xsens.train.workdir import Workdir

SUMMARY_FILE = "train_summary.json"
CHECKPOINT_CHUNKS = 20   # train_to_accuracy: a checkpoint every 20 chunks (and at the stop).
_LOSS, _ACC = "eval/train_loss", "eval/train_accuracy"


def optax_step(loss_fn: Callable, tx: optax.GradientTransformation, params, opt_state,
               *args, has_aux: bool = False, grad_map: Callable | None = None):
  """One optax update of `params` on `loss_fn(params, *args)`.

  `loss_fn` returns a scalar, or (scalar, aux) with `has_aux`; `grad_map(grads) -> grads`
  is applied before `tx.update`. Returns (params, opt_state, loss, aux) (aux None without
  `has_aux`).
  """
  (loss, aux), grads = jax.value_and_grad(
      loss_fn if has_aux else lambda *a: (loss_fn(*a), None), has_aux=True)(params, *args)
  if grad_map is not None:
    grads = grad_map(grads)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss, aux


def one_device_abstract(abstract):
  """`jax.ShapeDtypeStruct`s of `abstract` on the first device (what a checkpoint of a
  one-device run restores into)."""
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return abstract_with_shardings(abstract, jax.tree.map(lambda _: device, abstract))


def run_one_device(wd: Workdir | str, init: Callable[[], Any], advance: Callable,
                   schedule: loop.Schedule, *, abstract=None, evaluate=None,
                   should_stop=None, on_chunk=None, **run_kwargs) -> loop.LoopResult:
  """`loop.run` of a one-device `loop.Program` in `wd` (a Workdir, or a path: created,
  one checkpoint kept). `abstract` defaults to `jax.eval_shape(init)`; `run_kwargs` go to
  `loop.run` (desc, max_chunks, finished_reason)."""
  if not isinstance(wd, Workdir):
    paths.makedirs(wd)
    wd = Workdir(wd, keep_checkpoints=1)
  program = loop.Program(
      init=init, abstract_state=one_device_abstract(
          jax.eval_shape(init) if abstract is None else abstract),
      advance=advance, evaluate=evaluate, should_stop=should_stop, on_chunk=on_chunk)
  return loop.run(wd, program, schedule, **run_kwargs)


def scan_advance(one_step: Callable) -> Callable:
  """`advance(state, start, length) -> (state, logs, None)` for `run_one_device`:
  `one_step(state, t) -> (state, {name: scalar})` scanned over steps t = start, ...,
  start + length − 1 in one jitted `lax.scan` (one compile per chunk length), each log
  summed over the chunk."""

  @functools.partial(jax.jit, static_argnums=2)
  def chunk(state, start, length):
    state, logs = jax.lax.scan(one_step, state, start + jnp.arange(length, dtype=jnp.int32))
    return state, {k: v.sum() for k, v in logs.items()}

  def advance(state, start, length):
    return (*chunk(state, jnp.int32(start), length), None)

  return advance


def record_train_s(wd: Workdir, out: loop.LoopResult) -> float:
  """Seconds spent training the run so far (a resumed run adds the interrupted part's),
  written with the step and stop reason to `train_summary.json`."""
  before = wd.read_json(SUMMARY_FILE) or {}
  prev = before.get("train_s", 0.0) if before.get("steps") == out.restored_step else 0.0
  train_s = prev + out.wall_s
  wd.write_json(SUMMARY_FILE, {"steps": out.step, "stop_reason": out.stop_reason,
                               "train_s": train_s})
  return train_s


@functools.lru_cache(maxsize=None)
def _ce_chunk(model, tx):
  """jit (state, x, y, length) -> the state after `length` full-batch steps, with the loss
  and accuracy at its end; one compiled function per (model, optimiser) and shape."""
  def loss_fn(p, x, y):
    logits = model.apply({"params": p}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @functools.partial(jax.jit, static_argnums=3)
  def chunk(state, x, y, length):
    def body(carry, _):
      p, opt, loss, _ = optax_step(loss_fn, tx, *carry, x, y)
      return (p, opt), loss
    (p, opt), _ = jax.lax.scan(body, (state["params"], state["opt"]), None, length=length)
    logits = model.apply({"params": p}, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return {"params": p, "opt": opt, "loss": loss,
            "accuracy": jnp.mean(jnp.argmax(logits, -1) == y)}
  return chunk


def train_to_accuracy(wd: Workdir, model, params, tx, x, y, *, target: float,
                      eval_every: int, max_steps: int, target_loss=None,
                      max_chunks: int | None = None):
  """Full-batch steps of `tx` on the cross-entropy of `model` on (x, y), through the one
  loop, resumed from `wd`.

  Chunks of `eval_every` steps (a `lax.scan`); after each, the train loss and accuracy;
  stops when the accuracy is >= target (and, when `target_loss` is set, the loss is <=
  target_loss) or after `max_steps` (rounded up to whole chunks). Checkpoints every
  `CHECKPOINT_CHUNKS` chunks and at the stop. `max_chunks`: stop after that many chunks
  (an interruption, for tests). Returns (params, steps, train accuracy, curve
  [(step, loss, accuracy)] of every chunk, train_s).
  """
  chunk = _ce_chunk(model, tx)

  def init():
    return {"params": params, "opt": tx.init(params), "loss": jnp.float32(jnp.nan),
            "accuracy": jnp.float32(0.0)}

  def reached(scalars):
    return scalars[_ACC] >= target and (target_loss is None or scalars[_LOSS] <= target_loss)

  def finished(restored):
    done = [r for r in read_metrics(wd.path) if _ACC in r and r["step"] <= restored]
    return ("target_train_accuracy" if done and done[-1]["step"] == restored
            and reached(done[-1]) else None)

  total = -(-max_steps // eval_every) * eval_every  # Whole chunks, as many as reach max_steps.
  out = run_one_device(
      wd, init, lambda state, step, length: (chunk(state, x, y, length), None, None),
      loop.Schedule(total, eval_every=eval_every, max_chunk=eval_every,
                    checkpoint_every=eval_every * CHECKPOINT_CHUNKS),
      evaluate=lambda state, step: {_LOSS: float(state["loss"]),
                                    _ACC: float(state["accuracy"])},
      should_stop=lambda step, scalars: "target_train_accuracy" if reached(scalars) else None,
      finished_reason=finished, max_chunks=max_chunks)
  curve = [(r["step"], r[_LOSS], r[_ACC]) for r in read_metrics(wd.path) if _ACC in r]
  return out.state["params"], out.step, curve[-1][2], curve, record_train_s(wd, out)
