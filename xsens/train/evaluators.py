"""Evaluators: named parts run by the loop during training (every k steps) and after it.

As in big_vision (`evaluators/common.py`), an evaluator is configured by name in
`config.evals` and yields scalars; here each is a small object

  Evaluator.run(apply_fn, variables, step) -> {"eval/<name>_<metric>": float}

that iterates over ONE kind of batch iterator (`batches`): fixed-size, padded global batches
`{"image", "label", "mask"}` sharded over the mesh's `data` axis (each host reads its own
slice), accumulates masked `(sum, count)` on device and divides on the host. The jitted
batch function is built once per evaluator from the stable `apply_fn(variables, inputs)`.

Config (`config.evals`, a ConfigDict of name -> block; when absent, the trainer's default
is `train` and `test` classification):
  {"kind": "classification", "split": "test" | "train", "every": steps (default:
   config.eval_every), "limit": first-n examples or None}
  {"kind": "measure", "measure": a name in `xsens.measures.__all__`, "split", "every",
   "limit", "options": {keyword options of the measure}, "seed": int}
A "measure" evaluator calls the measure in the one calling convention
`measure(apply_fn, variables, inputs, labels=, key=, mask=, **options) -> dict` and logs
every scalar it returns (masked means over the batch) averaged over the split, weighted by
each batch's count of real examples.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from xsens.data import batching
from xsens.errors import ConfigError, check_kind_block
from xsens.train import sharding

_FIELDS = {"classification": ("split", "every", "limit"),
           "measure": ("split", "every", "limit", "measure", "options", "seed")}
KINDS = tuple(_FIELDS)


def batches(inputs: np.ndarray, labels: np.ndarray, batch_size: int,
            mesh: jax.sharding.Mesh, limit: int | None = None) -> Iterator[dict]:
  """Global padded batches {"image", "label", "mask"} over the first `limit` examples.

  `batch_size` is global (a multiple of the mesh size); the last batch repeats the last
  example with mask 0 (`xsens.data.batching.padded_index_batches`). Each host contributes
  its slice (`jax.process_index()`).
  """
  pc, pi = jax.process_count(), jax.process_index()
  local = slice(pi * batch_size // pc, (pi + 1) * batch_size // pc)
  for idx, mask in batching.padded_index_batches(len(inputs), batch_size, limit):
    yield sharding.global_batch({"image": inputs[idx[local]], "label": labels[idx[local]],
                                 "mask": mask[local]}, mesh)


def accumulate(batch_fn: Callable[[Any, dict], dict], variables, batch_iter) -> dict:
  """Sums the dicts `batch_fn(variables, batch)` over batches on device; host floats."""
  totals = None
  for batch in batch_iter:
    out = batch_fn(variables, batch)
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
  return {k: float(v) for k, v in jax.device_get(totals).items()}


def classification_sums(apply_fn, loss_fn, variables, batch) -> dict:
  """{"correct", "loss", "count"}: masked sums over one batch."""
  logits = apply_fn(variables, batch["image"])
  mask = batch["mask"]
  return {"correct": jnp.sum((jnp.argmax(logits, -1) == batch["label"]) * mask),
          "loss": jnp.sum(loss_fn(logits, batch["label"]) * mask),
          "count": jnp.sum(mask)}


def measure_sums(measure, options: dict, apply_fn, variables, batch, key) -> dict:
  """Each scalar of `measure(...)` times the batch's count of real examples, and the count."""
  out = measure(apply_fn, variables, batch["image"], labels=batch["label"], key=key,
                mask=batch["mask"], **options)
  count = jnp.sum(batch["mask"])
  sums = {k: v * count for k, v in out.items() if jnp.ndim(v) == 0 and k != "count"}
  sums["count"] = count
  return sums


@dataclasses.dataclass
class Evaluator:
  """One configured evaluator (see the module docstring)."""
  name: str
  kind: str
  every: int
  split: str
  limit: int | None
  batch_fn: Callable[[Any, dict], dict]     # jitted (variables, batch) -> sums
  finish: Callable[[dict], dict]            # host sums -> {metric: value}
  needs_key: bool = False
  seed: int = 0

  def run(self, variables, inputs, labels, batch_size, mesh, step: int) -> dict:
    fn = self.batch_fn
    if self.needs_key:  # A fresh, reproducible key per evaluation step.
      key = jax.random.fold_in(jax.random.key(self.seed), step)
      fn = lambda v, b: self.batch_fn(v, b, key)
    sums = accumulate(fn, variables, batches(inputs, labels, batch_size, mesh, self.limit))
    return {f"eval/{self.name}_{k}": v for k, v in self.finish(sums).items()}

  def due(self, step: int, last: bool) -> bool:
    return last or (bool(self.every) and step % self.every == 0)


def _classification_finish(sums: dict) -> dict:
  return {"accuracy": sums["correct"] / sums["count"], "loss": sums["loss"] / sums["count"]}


def _measure_finish(sums: dict) -> dict:
  count = sums.pop("count")
  return {k: v / count for k, v in sums.items()}


def build(evals_config, *, apply_fn, loss_fn, default_every: int,
          measures: dict | None = None) -> list[Evaluator]:
  """Evaluators from `config.evals` (ConfigError naming `evals.<name>.<field>`)."""
  out = []
  for name, ec in evals_config.items():
    path = f"evals.{name}"
    kind = check_kind_block(ec, path, _FIELDS, "evaluator")
    split = ec.get("split", "test")
    if split not in ("train", "test"):
      raise ConfigError(f"{path}.split", f"must be 'train' or 'test', got {split!r}")
    every = ec.get("every", default_every)
    if not isinstance(every, int) or every < 0:
      raise ConfigError(f"{path}.every", f"must be an int >= 0 (0: only at the end), got "
                        f"{every!r}")
    limit = ec.get("limit")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
      raise ConfigError(f"{path}.limit", f"must be None or an int >= 1, got {limit!r}")
    if kind == "classification":
      fn = jax.jit(functools.partial(classification_sums, apply_fn, loss_fn))
      out.append(Evaluator(name, kind, every, split, limit, fn, _classification_finish))
      continue
    if measures is None:
      from xsens import measures as measures_lib  # pylint: disable=g-import-not-at-top
      measures = {n: getattr(measures_lib, n) for n in measures_lib.__all__}
    measure_name = ec.get("measure")
    if measure_name not in measures:
      raise ConfigError(f"{path}.measure", f"unknown measure {measure_name!r}; allowed: "
                        f"{', '.join(sorted(measures))}")
    options = dict(ec.get("options") or {})
    fn = jax.jit(lambda v, b, k, m=measures[measure_name], o=options: measure_sums(
        m, o, apply_fn, v, b, k))
    out.append(Evaluator(name, kind, every, split, limit, fn, _measure_finish, needs_key=True,
                         seed=int(ec.get("seed", 0))))
  return out


def schedule_every(evals: list[Evaluator]) -> int:
  """The loop's evaluation period: the gcd of the evaluators' periods (0: only at the end)."""
  return functools.reduce(math.gcd, [e.every for e in evals if e.every], 0)
