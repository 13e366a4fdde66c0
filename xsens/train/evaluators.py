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
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from xsens.data import batching
from xsens.errors import ConfigError, check_kind_block
from xsens.measures import churn as churn_lib
from xsens.measures import similarity, subgroups
from xsens.train import sharding
from xsens.train import streams as streams_lib

_COMMON = ("split", "every", "limit")
_FIELDS = {"classification": _COMMON,
           "measure": _COMMON + ("measure", "options", "seed"),
           "subgroup": _COMMON + ("worst_k", "head_fraction"),
           "churn": _COMMON + ("peer_workdir", "edges"),
           "cka": _COMMON + ("layers", "pooling", "peer_workdir")}
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


def stream_batches(stream, mesh: jax.sharding.Mesh, limit: int | None = None
                   ) -> Iterator[dict]:
  """Global batches {"image", "label", "mask"} of a `xsens.data.streaming.Stream` (first
  `limit` examples of its order), same layout as `batches`: each host reads its slice."""
  if limit is not None:
    stream = dataclasses.replace(stream, indices=stream.indices[:int(limit)])
  for b in stream.batches():
    yield sharding.global_batch({k: b[k] for k in ("image", "label", "mask")}, mesh)


def accumulate(batch_fn: Callable[[Any, dict], dict], variables, batch_iter,
               streams: int | None = None) -> dict:
  """Sums the dicts `batch_fn(variables, batch)` over batches, in order, on device; host
  float64. Up to `streams` batches run at once (`xsens.train.streams`; None: one per core
  on a single CPU device, else 1); the sums do not depend on it."""
  streams = streams_lib.resolve(streams)
  if streams == 1:  # Asynchronous dispatch: the next batch is placed while one runs.
    outs = (batch_fn(variables, batch) for batch in batch_iter)
  else:
    outs = streams_lib.ordered_map(
        lambda batch: jax.block_until_ready(batch_fn(variables, batch)), batch_iter, streams)
  totals = None
  for out in outs:
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
  return {k: np.asarray(v, np.float64) for k, v in jax.device_get(totals).items()}


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
  batch_fn: Callable[[Any, dict], dict]     # jitted (variables, batch) -> sums
  finish: Callable[[dict], dict]            # host sums -> {metric: value}
  needs_key: bool = False
  seed: int = 0
  extra_args: tuple = ()                    # e.g. a peer's variables, after the batch

  def run(self, variables, inputs, labels, batch_size, mesh, step: int,
          batch_iter: Iterator[dict] | None = None) -> dict:
    """Runs over `batches(inputs, labels, ...)`, or over `batch_iter` (global batches, e.g.
    `stream_batches`) when given."""
    args = self.extra_args
    if self.needs_key:  # A fresh, reproducible key per evaluation step.
      args = (jax.random.fold_in(jax.random.key(self.seed), step),) + args
    fn = lambda v, b: self.batch_fn(v, b, *args)
    if batch_iter is None:
      batch_iter = batches(inputs, labels, batch_size, mesh, self.limit)
    sums = accumulate(fn, variables, batch_iter)
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


def build(evals_config, *, apply_fn, loss_fn, default_every: int,
          measures: dict | None = None, num_classes: int | None = None,
          train_class_counts=None, load_peer: Callable | None = None) -> list[Evaluator]:
  """Evaluators from `config.evals` (ConfigError naming `evals.<name>.<field>`).

  `num_classes` and `train_class_counts` [K] serve "subgroup"; `load_peer(workdir, flag)
  -> (peer_apply_fn, peer_variables)` serves "churn" and "cka" (the trainer's loads a
  finished xsens run, checked against this run's data; errors name `flag`).
  """
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
    common = (name, kind, every, split, limit)
    if kind == "classification":
      fn = jax.jit(functools.partial(classification_sums, apply_fn, loss_fn))
      out.append(Evaluator(*common, fn, _classification_finish))
      continue
    if kind == "subgroup":
      if num_classes is None:
        raise ConfigError(f"{path}.kind", "a subgroup evaluator needs the number of classes "
                          "(run it through the trainer)")
      worst_k, head_fraction = _check_worst_k(ec, path), _check_head_fraction(ec, path)
      counts = (np.ones(num_classes) if train_class_counts is None
                else np.asarray(train_class_counts))
      head = subgroups.head_mask(counts, head_fraction)
      fn = jax.jit(functools.partial(subgroup_sums, apply_fn, num_classes))
      out.append(Evaluator(*common, fn, functools.partial(
          _subgroup_finish, head, min(worst_k, num_classes))))
      continue
    if kind in ("churn", "cka"):
      peer_path = ec.get("peer_workdir")
      if kind == "churn" and not peer_path:
        raise ConfigError(f"{path}.peer_workdir", "a churn evaluator needs a peer: the "
                          "workdir of a finished xsens run on the same data")
      peer_fn, extra = apply_fn, ()
      if peer_path:
        if load_peer is None:
          raise ConfigError(f"{path}.peer_workdir", "peers are loaded by the trainer; run "
                            "this evaluator through it")
        peer_fn, peer_variables = load_peer(str(peer_path), f"{path}.peer_workdir")
        extra = (peer_variables,)
      if kind == "churn":
        edges = tuple(ec.get("edges") or churn_lib.DEFAULT_EDGES)
        if len(edges) < 2 or any(not 0 <= e <= 1 for e in edges) or list(edges) != sorted(
            set(edges)):
          raise ConfigError(f"{path}.edges", f"must be >= 2 increasing numbers in [0, 1], "
                            f"got {edges!r}")
        fn = jax.jit(functools.partial(churn_sums, apply_fn, peer_fn, edges))
        out.append(Evaluator(*common, fn, _churn_finish, extra_args=extra))
        continue
      pooling = ec.get("pooling", "mean")
      if pooling not in similarity.POOLINGS:
        raise ConfigError(f"{path}.pooling", f"must be one of {similarity.POOLINGS}, got "
                          f"{pooling!r}")
      layers = ec.get("layers") or similarity.DEFAULT_LAYER_PATTERN
      if not isinstance(layers, str):
        raise ConfigError(f"{path}.layers", f"must be a regex string, got {layers!r}")
      fn = jax.jit(functools.partial(cka_sums, apply_fn, peer_fn, layers, pooling))
      out.append(Evaluator(*common, fn, functools.partial(_cka_finish, bool(peer_path)),
                           extra_args=extra))
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
    out.append(Evaluator(*common, fn, _measure_finish, needs_key=True,
                         seed=int(ec.get("seed", 0))))
  return out


def schedule_every(evals: list[Evaluator]) -> int:
  """The loop's evaluation period: the gcd of the evaluators' periods (0: only at the end)."""
  return functools.reduce(math.gcd, [e.every for e in evals if e.every], 0)
