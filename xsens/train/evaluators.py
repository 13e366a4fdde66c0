"""Evaluators: named parts run by the loop during training (every k steps) and after it,
and `over_split`, the one evaluation of a function over a split.

`over_split(fn, split, args=, reduce=, ...)` runs a jit-friendly `fn(batch, *args)` over a
split in fixed-size, padded global batches `{name: [B, ...], "mask": [B]}` sharded over the
mesh's `data` axis (each process puts its slice of every batch) and reduces the outputs
over the split: per-example statistics summed over the real examples ("sum"), batch totals
summed over the batches ("batch_sum") or per-example outputs gathered in order without the
padding ("concat"); every process returns the same host arrays.

As in big_vision (`evaluators/common.py`), an evaluator is configured by name in
`config.evals` and yields scalars; here each is a small object

  Evaluator.run(variables, inputs, labels, batch_size, mesh, step)
      -> {"eval/<name>_<metric>": float}

whose batch function returns masked sums of one batch {"image", "label", "mask"}
(`over_split`, reduce "batch_sum"); the sums are divided on the host. Each kind is one
function registered by name (`register`) that checks its config block and builds the
evaluator.

Config (`config.evals`, a ConfigDict of name -> block; when absent, the trainer's default
is `train` and `test` classification):
  {"kind": "classification", "split": "test" | "train", "every": steps (default:
   config.eval_every), "limit": first-n examples or None}
  {"kind": "measure", "measure": a name in `xsens.measures.__all__`, "split", "every",
   "limit", "options": {keyword options of the measure}, "seed": int}
  {"kind": "subgroup", "split", "every", "limit", "worst_k": 3, "head_fraction": 0.5}
  {"kind": "churn", "split", "every", "limit", "peer_workdir": a finished xsens run,
   "edges": confidence bin edges (default `xsens.measures.churn.DEFAULT_EDGES`)}
  {"kind": "cka", "split", "every", "limit", "layers": regex of module paths (default
   `xsens.measures.similarity.DEFAULT_LAYER_PATTERN`), "pooling": "mean" | "cls" |
   "flatten", "peer_workdir": None (this model against itself) or a finished run}
A "measure" evaluator calls the measure in the one calling convention
`measure(apply_fn, variables, inputs, labels=, key=, mask=, **options) -> dict` and logs
every scalar it returns (masked means over the batch) averaged over the split, weighted by
each batch's count of real examples. The other kinds keep statistics that are not means of
batch means:
- "subgroup" sums `subgroup_accuracy`'s per-class correct counts over the split: logs
  accuracy, balanced_accuracy, worst_class, worst_k_mean, head_accuracy / tail_accuracy
  (head = the `head_fraction` most frequent classes of the train split) and class_<c>.
- "churn" runs `prediction_churn` against the peer run's variables (restored once, passed
  to the jitted batch function as an argument): logs churn and churn_bin_<b> (NaN for an
  empty confidence bin).
- "cka" accumulates unbiased HSIC terms over batches (minibatch CKA, Nguyen et al. 2021;
  `hsic_accumulate` with the padding mask) between the layers selected by `layers` of this
  model and of the peer (or itself): logs cka_<i>_<j> for layers i (this model) and j
  (peer) in forward order, and, with a peer, cka_diagonal_mean (same layer index).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from xsens.data import batching
from xsens.errors import ConfigError, check_kind_block
from xsens.measures import churn as churn_lib
from xsens.measures import similarity, subgroups
from xsens.train import sharding
from xsens.train import streams as streams_lib

_COMMON = ("split", "every", "limit")
REDUCTIONS = ("sum", "batch_sum", "concat", "per_batch")


def _global_batches(arrays: Mapping[str, Any], batch_size: int, mesh: jax.sharding.Mesh,
                    limit: int | None, with_index: bool) -> Iterator[dict]:
  """Global padded batches of `arrays` (each [N, ...]) + "mask" (+ "index"); each process
  contributes its slice of every batch (`jax.process_index()`)."""
  n = len(next(iter(arrays.values())))
  pc, pi = jax.process_count(), jax.process_index()
  local = slice(pi * batch_size // pc, (pi + 1) * batch_size // pc)
  for idx, mask in batching.padded_index_batches(n, batch_size, limit):
    batch = {k: a[idx[local]] for k, a in arrays.items()}
    batch["mask"] = mask[local]
    if with_index:
      batch["index"] = idx[local].astype(np.int32)
    yield sharding.global_batch(batch, mesh)


def batches(inputs: np.ndarray, labels: np.ndarray, batch_size: int,
            mesh: jax.sharding.Mesh, limit: int | None = None) -> Iterator[dict]:
  """Global padded batches {"image", "label", "mask"} over the first `limit` examples.

  `batch_size` is global (a multiple of the mesh size); the last batch repeats the last
  example with mask 0 (`xsens.data.batching.padded_index_batches`). Each host contributes
  its slice (`jax.process_index()`).
  """
  return _global_batches({"image": inputs, "label": labels}, batch_size, mesh, limit,
                         with_index=False)


def stream_batches(stream, mesh: jax.sharding.Mesh, limit: int | None = None
                   ) -> Iterator[dict]:
  """Global batches {"image", "label", "mask"} of a `xsens.data.streaming.Stream` (first
  `limit` examples of its order), same layout as `batches`: each host reads its slice."""
  if limit is not None:
    stream = dataclasses.replace(stream, indices=stream.indices[:int(limit)])
  for b in stream.batches():
    yield sharding.global_batch({k: b[k] for k in ("image", "label", "mask")}, mesh)


def _in_order(fn: Callable[[dict], Any], batch_iter: Iterable[dict], streams: int | None):
  """fn(batch) over the batches, in order; up to `streams` at once (`xsens.train.streams`;
  None: one per core on a single CPU device, else 1)."""
  streams = streams_lib.resolve(streams)
  if streams == 1:  # Asynchronous dispatch: the next batch is placed while one runs.
    return (fn(batch) for batch in batch_iter)
  return streams_lib.ordered_map(lambda batch: jax.block_until_ready(fn(batch)), batch_iter,
                                 streams)


def _summed(outs: Iterable[Any]):
  """The sum of the pytrees `outs`, in order, on device; host float64 arrays."""
  totals = None
  for out in outs:
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
  if totals is None:
    raise ValueError("the split has no batch to evaluate (no example, or limit 0)")
  return jax.tree.map(lambda v: np.asarray(v, np.float64), jax.device_get(totals))


@jax.jit
def _masked_sum(out, mask):
  """Σ over the batch axis of each leaf [B, ...] of `out`, weighted by `mask` [B]."""
  return jax.tree.map(lambda v: jnp.sum(
      v * mask.reshape(mask.shape + (1,) * (jnp.ndim(v) - 1)), axis=0), out)


def _to_host(tree):
  """Host NumPy copies of global arrays; gathered from every process when there are
  several (`process_allgather`, the batch axis tiled), so all processes hold the same."""
  if jax.process_count() > 1:
    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))
  return jax.tree.map(np.asarray, jax.device_get(tree))


def over_split(fn: Callable[..., Any], split: Mapping[str, Any] | Iterable[dict], *,
               args: tuple = (), reduce: str = "sum", batch_size: int | None = None,
               mesh: jax.sharding.Mesh | None = None, limit: int | None = None,
               streams: int | None = None):
  """`fn` over a split in fixed-size, padded, masked global batches, reduced over the split.

  Args:
    fn: jit-friendly `fn(batch, *args) -> pytree of arrays`, jitted here (`jax.jit(fn)`:
      pass the same function object on every call and it compiles once per shape).
      `batch` is a dict of global arrays batch-sharded over `mesh`: for a `split` of named
      arrays, each of them [B, ...], "mask" [B] float32 (1 real example, 0 padding) and
      "index" [B] int32 (positions in the split; padding rows repeat the last one); for a
      `split` of batches, those batches.
    split: {name: host array [N, ...]} (e.g. {"image": x, "label": y}), or an iterable of
      global batch dicts with a "mask" [B] (`batches`, `stream_batches`).
    args: passed to `fn` after the batch as traced arguments (e.g. variables, a key).
    reduce: "sum": `fn` returns per-example statistics [B, ...]; returns their sums over
      the real examples, host float64 [...]. "batch_sum": `fn` returns totals of its batch
      (masked by `fn` with batch["mask"]); returns their sums over the batches, host
      float64. "concat": `fn` returns per-example outputs [B, ...]; returns them over the
      real examples in split order, host [N, ...] (N = min(len, limit)). "per_batch":
      `fn` returns totals of its batch (masked by `fn`); returns the list of them, one
      host pytree per batch in order (e.g. to add float32 batch totals in float64).
    batch_size: global examples per batch, for named arrays; rounded up to a multiple of
      the mesh size. The last batch repeats the last example with mask 0.
    mesh: the devices a batch is split over (default `sharding.data_mesh()`: all).
    limit: only the first `limit` examples of named arrays (None: all).
    streams: batches at once (`xsens.train.streams`; None: one per core on a single CPU
      device, else 1); the results do not depend on it.

  Returns:
    The pytree of `fn`'s outputs reduced as above, the same on every process: each process
    puts its slice of each batch; sums and batch totals are replicated by XLA, per-example
    outputs are gathered from all processes (`process_allgather`).
  """
  if reduce not in REDUCTIONS:
    raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
  if isinstance(split, Mapping):
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
      raise ValueError(f"batch_size must be an int >= 1 for a split of arrays, got "
                       f"{batch_size!r}")
    mesh = sharding.data_mesh() if mesh is None else mesh
    size = sharding.round_to_devices(batch_size, mesh.size)
    split = _global_batches(split, size, mesh, limit, with_index=True)
  elif limit is not None:
    raise ValueError("limit applies to a split of arrays; limit the batches' source instead")
  step = jax.jit(fn)
  if reduce == "sum":
    return _summed(_in_order(lambda b: _masked_sum(step(b, *args), b["mask"]), split,
                             streams))
  if reduce == "batch_sum":
    return _summed(_in_order(lambda b: step(b, *args), split, streams))
  if reduce == "per_batch":
    outs = [jax.tree.map(np.asarray, jax.device_get(out))
            for out in _in_order(lambda b: step(b, *args), split, streams)]
    if not outs:
      raise ValueError("the split has no batch to evaluate (no example, or limit 0)")
    return outs
  parts = _in_order(lambda b: _to_host((step(b, *args), b["mask"])), split, streams)
  kept = [jax.tree.map(lambda v, keep=mask > 0: v[keep], out) for out, mask in parts]
  if not kept:
    raise ValueError("the split has no batch to evaluate (no example, or limit 0)")
  return jax.tree.map(lambda *v: np.concatenate(v), *kept)


def classification_sums(apply_fn, loss_fn, variables, batch) -> dict:
  """{"correct", "loss", "count"}: masked sums over one batch."""
  logits = apply_fn(variables, batch["image"])
  mask = batch["mask"]
  return {"correct": jnp.sum((jnp.argmax(logits, -1) == batch["label"]) * mask),
          "loss": jnp.sum(loss_fn(logits, batch["label"]) * mask),
          "count": jnp.sum(mask)}


def measure_sums(measure, options: dict, apply_fn, variables, batch, key) -> dict:
  """Each scalar of `measure(...)` times the batch's count of real examples, and the count
  (entries that are not arrays, e.g. an estimator's `plan`, are left out)."""
  out = measure(apply_fn, variables, batch["image"], labels=batch["label"], key=key,
                mask=batch["mask"], **options)
  count = jnp.sum(batch["mask"])
  sums = {k: v * count for k, v in out.items()
          if not isinstance(v, dict) and jnp.ndim(v) == 0 and k != "count"}
  sums["count"] = count
  return sums


def subgroup_sums(apply_fn, num_classes: int, variables, batch) -> dict:
  """Per-class masked sums {"correct_per_class" [K], "count_per_class" [K]} of one batch."""
  out = subgroups.subgroup_accuracy(apply_fn, variables, batch["image"],
                                    labels=batch["label"], mask=batch["mask"],
                                    num_classes=num_classes)
  return {k: out[k] for k in ("correct_per_class", "count_per_class")}


def churn_sums(apply_fn, peer_apply_fn, edges, variables, batch, peer_variables) -> dict:
  """Masked sums of disagreement, overall and per confidence bin, against the peer."""
  out = churn_lib.prediction_churn(apply_fn, variables, batch["image"], mask=batch["mask"],
                                   peer_apply_fn=peer_apply_fn,
                                   peer_variables=peer_variables, edges=edges)
  m = batch["mask"].astype(jnp.float32)
  count = out["bin_count"]
  return {"disagree": jnp.sum(out["per_example"] * m), "count": jnp.sum(m),
          "bin_disagree": jnp.where(count > 0, out["by_confidence"], 0.0) * count,
          "bin_count": count}


def cka_sums(apply_fn, peer_apply_fn, layers: str, pooling: str, variables, batch,
             peer_variables=None) -> dict:
  """Unbiased HSIC terms of one batch between the selected layers (`hsic_accumulate`)."""
  feats = lambda fn, v: list(similarity.layer_features(
      fn, v, batch["image"], filter=layers, pooling=pooling).values())
  a = feats(apply_fn, variables)
  b = a if peer_variables is None else feats(peer_apply_fn, peer_variables)
  if not a or not b:
    raise ValueError(f"the layer pattern {layers!r} selects no module of the model")
  return similarity.hsic_accumulate(similarity.hsic_init(len(a), len(b)), a, b,
                                    mask=batch["mask"])


@dataclasses.dataclass
class Evaluator:
  """One configured evaluator (see the module docstring)."""
  name: str
  kind: str
  every: int
  split: str
  limit: int | None
  batch_fn: Callable[..., dict]    # (batch, variables, [key], *extra_args) -> batch sums
  finish: Callable[[dict], dict]   # host sums -> {metric: value}
  needs_key: bool = False
  seed: int = 0
  extra_args: tuple = ()           # e.g. a peer's variables, after the variables

  def run(self, variables, inputs, labels, batch_size, mesh, step: int,
          batch_iter: Iterator[dict] | None = None) -> dict:
    """Runs over `batches(inputs, labels, ...)`, or over `batch_iter` (global batches, e.g.
    `stream_batches`) when given."""
    args = self.extra_args
    if self.needs_key:  # A fresh, reproducible key per evaluation step.
      args = (jax.random.fold_in(jax.random.key(self.seed), step),) + args
    if batch_iter is None:
      batch_iter = batches(inputs, labels, batch_size, mesh, self.limit)
    sums = over_split(self.batch_fn, batch_iter, args=(variables,) + args,
                      reduce="batch_sum")
    return {f"eval/{self.name}_{k}": v for k, v in self.finish(sums).items()}

  def due(self, step: int, last: bool) -> bool:
    return last or (bool(self.every) and step % self.every == 0)


def _classification_finish(sums: dict) -> dict:
  return {"accuracy": float(sums["correct"] / sums["count"]),
          "loss": float(sums["loss"] / sums["count"])}


def _measure_finish(sums: dict) -> dict:
  count = sums.pop("count")
  return {k: float(v / count) for k, v in sums.items()}


def _subgroup_finish(head: np.ndarray, worst_k: int, sums: dict) -> dict:
  counts, correct = sums["count_per_class"], sums["correct_per_class"]
  per_class = np.where(counts > 0, correct / np.maximum(counts, 1.0), np.nan)
  present = per_class[~np.isnan(per_class)]
  group = lambda sel: float(np.nanmean(per_class[sel])) if np.any(
      sel & (counts > 0)) else float("nan")
  out = {"accuracy": float(correct.sum() / counts.sum()),
         "balanced_accuracy": float(present.mean()),
         "worst_class": float(present.min()),
         "worst_k_mean": float(np.sort(present)[:worst_k].mean()),
         "head_accuracy": group(head), "tail_accuracy": group(~head)}
  out.update({f"class_{c}": float(a) for c, a in enumerate(per_class)})
  return out


def _churn_finish(sums: dict) -> dict:
  count = sums["bin_count"]
  rate = np.where(count > 0, sums["bin_disagree"] / np.maximum(count, 1.0), np.nan)
  out = {"churn": float(sums["disagree"] / sums["count"])}
  out.update({f"churn_bin_{b}": float(r) for b, r in enumerate(rate)})
  return out


def _cka_finish(with_peer: bool, sums: dict) -> dict:
  if sums["count"] < 1:
    raise ValueError("CKA needs a batch with at least 4 real examples; raise the split's "
                     "limit or the batch size")
  cka = np.asarray(similarity.cka_from_accumulated(
      {k: jnp.asarray(v, jnp.float32) for k, v in sums.items()}))
  out = {f"cka_{i}_{j}": float(cka[i, j]) for i in range(cka.shape[0])
         for j in range(cka.shape[1])}
  if with_peer:
    out["cka_diagonal_mean"] = float(np.mean(np.diag(cka)))
  return out


def _check_worst_k(ec, path: str) -> int:
  value = ec.get("worst_k", 3)
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ConfigError(f"{path}.worst_k", f"must be an int >= 1, got {value!r}")
  return value


def _check_head_fraction(ec, path: str) -> float:
  value = ec.get("head_fraction", 0.5)
  if (not isinstance(value, (int, float)) or isinstance(value, bool)
      or not 0 < value < 1):
    raise ConfigError(f"{path}.head_fraction", f"must be a number in (0, 1), got {value!r}")
  return float(value)


@dataclasses.dataclass(frozen=True)
class Context:
  """What `build` knows besides an evaluator's config block (see `build`'s arguments)."""
  apply_fn: Callable
  loss_fn: Callable
  measures: dict | None = None
  num_classes: int | None = None
  train_class_counts: Any = None
  load_peer: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Kind:
  """A registered evaluator kind: the fields its block may hold besides `_COMMON`, and
  `make(ec, path, ctx, common) -> Evaluator` (`common`: name, kind, every, split, limit)."""
  fields: tuple[str, ...]
  make: Callable[[Any, str, Context, dict], Evaluator]


REGISTRY: dict[str, Kind] = {}


def register(kind: str, fields: tuple[str, ...] = ()):
  """Decorator registering `make(ec, path, ctx, common) -> Evaluator` as evaluator `kind`,
  whose config block may hold `fields` besides "kind", "split", "every" and "limit"."""
  def wrap(make):
    REGISTRY[kind] = Kind(_COMMON + tuple(fields), make)
    return make
  return wrap


@register("classification")
def _classification(ec, path, ctx, common):
  del ec, path
  fn = lambda batch, variables: classification_sums(ctx.apply_fn, ctx.loss_fn, variables,
                                                    batch)
  return Evaluator(**common, batch_fn=fn, finish=_classification_finish)


@register("measure", ("measure", "options", "seed"))
def _measure(ec, path, ctx, common):
  measures = ctx.measures
  if measures is None:
    from xsens import measures as measures_lib  # pylint: disable=g-import-not-at-top
    measures = {n: getattr(measures_lib, n) for n in measures_lib.__all__}
  measure_name = ec.get("measure")
  if measure_name not in measures:
    raise ConfigError(f"{path}.measure", f"unknown measure {measure_name!r}; allowed: "
                      f"{', '.join(sorted(measures))}")
  measure, options = measures[measure_name], dict(ec.get("options") or {})
  fn = lambda batch, variables, key: measure_sums(measure, options, ctx.apply_fn, variables,
                                                  batch, key)
  return Evaluator(**common, batch_fn=fn, finish=_measure_finish, needs_key=True,
                   seed=int(ec.get("seed", 0)))


@register("subgroup", ("worst_k", "head_fraction"))
def _subgroup(ec, path, ctx, common):
  num_classes = ctx.num_classes
  if num_classes is None:
    raise ConfigError(f"{path}.kind", "a subgroup evaluator needs the number of classes "
                      "(run it through the trainer)")
  worst_k, head_fraction = _check_worst_k(ec, path), _check_head_fraction(ec, path)
  counts = (np.ones(num_classes) if ctx.train_class_counts is None
            else np.asarray(ctx.train_class_counts))
  head = subgroups.head_mask(counts, head_fraction)
  fn = lambda batch, variables: subgroup_sums(ctx.apply_fn, num_classes, variables, batch)
  return Evaluator(**common, batch_fn=fn, finish=functools.partial(
      _subgroup_finish, head, min(worst_k, num_classes)))


def _peer(ec, path: str, ctx: Context, required: bool) -> tuple[Callable, tuple]:
  """(peer apply_fn, (peer variables,)) of `peer_workdir`, or (apply_fn, ()) without one."""
  peer_path = ec.get("peer_workdir")
  if required and not peer_path:
    raise ConfigError(f"{path}.peer_workdir", "a churn evaluator needs a peer: the "
                      "workdir of a finished xsens run on the same data")
  if not peer_path:
    return ctx.apply_fn, ()
  if ctx.load_peer is None:
    raise ConfigError(f"{path}.peer_workdir", "peers are loaded by the trainer; run "
                      "this evaluator through it")
  peer_fn, peer_variables = ctx.load_peer(str(peer_path), f"{path}.peer_workdir")
  return peer_fn, (peer_variables,)


@register("churn", ("peer_workdir", "edges"))
def _churn(ec, path, ctx, common):
  peer_fn, extra = _peer(ec, path, ctx, required=True)
  edges = tuple(ec.get("edges") or churn_lib.DEFAULT_EDGES)
  if len(edges) < 2 or any(not 0 <= e <= 1 for e in edges) or list(edges) != sorted(
      set(edges)):
    raise ConfigError(f"{path}.edges", f"must be >= 2 increasing numbers in [0, 1], "
                      f"got {edges!r}")
  fn = lambda batch, variables, peer_variables: churn_sums(
      ctx.apply_fn, peer_fn, edges, variables, batch, peer_variables)
  return Evaluator(**common, batch_fn=fn, finish=_churn_finish, extra_args=extra)


@register("cka", ("layers", "pooling", "peer_workdir"))
def _cka(ec, path, ctx, common):
  peer_fn, extra = _peer(ec, path, ctx, required=False)
  pooling = ec.get("pooling", "mean")
  if pooling not in similarity.POOLINGS:
    raise ConfigError(f"{path}.pooling", f"must be one of {similarity.POOLINGS}, got "
                      f"{pooling!r}")
  layers = ec.get("layers") or similarity.DEFAULT_LAYER_PATTERN
  if not isinstance(layers, str):
    raise ConfigError(f"{path}.layers", f"must be a regex string, got {layers!r}")
  fn = lambda batch, variables, *peer: cka_sums(ctx.apply_fn, peer_fn, layers, pooling,
                                               variables, batch, *peer)
  return Evaluator(**common, batch_fn=fn,
                   finish=functools.partial(_cka_finish, bool(extra)), extra_args=extra)


def build(evals_config, *, apply_fn, loss_fn, default_every: int,
          measures: dict | None = None, num_classes: int | None = None,
          train_class_counts=None, load_peer: Callable | None = None) -> list[Evaluator]:
  """Evaluators from `config.evals` (ConfigError naming `evals.<name>.<field>`).

  Each block's "kind" names a registered kind (`REGISTRY`, filled by `register`).
  `num_classes` and `train_class_counts` [K] serve "subgroup"; `load_peer(workdir, flag)
  -> (peer_apply_fn, peer_variables)` serves "churn" and "cka" (the trainer's loads a
  finished xsens run, checked against this run's data; errors name `flag`).
  """
  ctx = Context(apply_fn, loss_fn, measures, num_classes, train_class_counts, load_peer)
  fields = {kind: k.fields for kind, k in REGISTRY.items()}
  out = []
  for name, ec in evals_config.items():
    path = f"evals.{name}"
    kind = check_kind_block(ec, path, fields, "evaluator")
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
    common = dict(name=name, kind=kind, every=every, split=split, limit=limit)
    out.append(REGISTRY[kind].make(ec, path, ctx, common))
  return out


def schedule_every(evals: list[Evaluator]) -> int:
  """The loop's evaluation period: the gcd of the evaluators' periods (0: only at the end)."""
  return functools.reduce(math.gcd, [e.every for e in evals if e.every], 0)
