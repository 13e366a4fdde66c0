"""Per-class (subgroup) accuracy and teacher reliability, for the distillation-bias study.

"Teacher's pet: understanding and mitigating biases in distillation" (Lukasik, Bhojanapalli,
Menon, Kumar; TMLR 2022, arXiv 2106.10494; docs/papers/google_papers.md §B) reports that
distillation raises overall accuracy but can harm subgroups such as "classes with few
associated samples". The paper's exact metrics are not known (spec); ours are the spec's
reasonable defaults, with the subgroups being the classes:

- per-class accuracy acc(c) = mean_{i: y_i = c} 1[argmax f(x_i) = c] (NaN for a class with
  no example);
- worst-class accuracy min_c acc(c) and the mean of the k worst classes;
- head / tail accuracy: the mean per-class accuracy over the head classes (the
  `head_fraction` most frequent classes of the long-tailed *train* split, ties broken by
  class id) and over the other (tail) classes (`head_mask`). On a balanced train split the
  split by frequency is meaningless (it falls back to class ids) and only reported for
  completeness;
- the teacher's per-class probability margin γ(c) = mean_{i: y_i = c} (p_y − max_{k≠y} p_k)
  in [−1, 1] (negative where the teacher is wrong on average).

All functions are pure and jittable (`num_classes`, `k` static); shapes in the docstrings.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


@functools.partial(jax.jit, static_argnames=("num_classes",))
def class_counts(labels: Array, num_classes: int, mask: Array | None = None) -> Array:
  """Examples per class. labels [N] int, mask [N] (1 = counted) -> [K] float32."""
  onehot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  if mask is not None:
    onehot = onehot * mask[:, None]
  return onehot.sum(0)


@functools.partial(jax.jit, static_argnames=("num_classes",))
def per_class_mean(values: Array, labels: Array, num_classes: int) -> Array:
  """Mean of `values` [N] over the examples of each class -> [K] (NaN for an empty class)."""
  onehot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  total = onehot.T @ values.astype(jnp.float32)
  count = onehot.sum(0)
  return jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan)


def per_class_accuracy(logits: Array, labels: Array, num_classes: int) -> Array:
  """acc(c) = fraction of class-c examples predicted c. logits [N, K], labels [N] -> [K]."""
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  return per_class_mean(correct, labels, num_classes)


def probability_margin(logits: Array, labels: Array) -> Array:
  """p_y − max_{k≠y} p_k of softmax(logits), in [−1, 1]. logits [N, K], labels [N] -> [N]."""
  p = jax.nn.softmax(logits.astype(jnp.float32), -1)
  p_true = jnp.take_along_axis(p, labels[:, None], 1)[:, 0]
  others = jnp.where(jax.nn.one_hot(labels, p.shape[-1], dtype=bool), -jnp.inf, p)
  return p_true - others.max(-1)


def per_class_margin(logits: Array, labels: Array, num_classes: int) -> Array:
  """Mean probability margin per class. logits [N, K], labels [N] -> [K] (NaN if empty)."""
  return per_class_mean(probability_margin(logits, labels), labels, num_classes)


@functools.partial(jax.jit, static_argnames=("k",))
def worst_k_mean(per_class: Array, k: int) -> Array:
  """Mean of the k smallest entries of [K] (NaN entries, i.e. empty classes, ignored).

  k = 1 is the worst-class accuracy. If fewer than k classes are non-empty, their mean.
  """
  clean = jnp.where(jnp.isnan(per_class), jnp.inf, per_class)
  smallest = -jax.lax.top_k(-clean, k)[0]
  valid = jnp.isfinite(smallest)
  return jnp.sum(jnp.where(valid, smallest, 0.0)) / jnp.maximum(valid.sum(), 1)


def head_mask(train_counts, head_fraction: float = 0.5) -> np.ndarray:
  """The head classes: the ceil(head_fraction·K) most frequent in the train split.

  Ties are broken by class id (a stable sort), so on a balanced split the head is the
  first classes by id. train_counts [K] -> [K] bool (host NumPy; not traced).
  """
  counts = np.asarray(train_counts, np.float64)
  if not 0 < head_fraction < 1:
    raise ValueError(f"head_fraction must be in (0, 1), got {head_fraction}")
  num_head = int(np.ceil(head_fraction * len(counts)))
  order = np.argsort(-counts, kind="stable")
  mask = np.zeros(len(counts), bool)
  mask[order[:num_head]] = True
  return mask


def group_mean(per_class: Array, mask) -> Array:
  """Mean of [K] per-class values over the classes in `mask` [K] bool (NaN ignored)."""
  mask = jnp.asarray(mask) & ~jnp.isnan(per_class)
  return jnp.sum(jnp.where(mask, per_class, 0.0)) / jnp.maximum(mask.sum(), 1)


def subgroup_report(logits, labels, num_classes: int, head: np.ndarray, *,
                    worst_k: int = 3) -> dict:
  """Host summary of one model on one split (Python floats and a per-class list).

  logits [N, K], labels [N]; `head` [K] bool from `head_mask`. Keys: accuracy (overall),
  balanced_accuracy (mean per class), worst_class, worst_k_mean, head_accuracy,
  tail_accuracy, per_class ([K] list).
  """
  logits, labels = jnp.asarray(logits), jnp.asarray(labels)
  acc = per_class_accuracy(logits, labels, num_classes)
  return {
      "accuracy": float(jnp.mean(jnp.argmax(logits, -1) == labels)),
      "balanced_accuracy": float(jnp.nanmean(acc)),
      "worst_class": float(worst_k_mean(acc, 1)),
      "worst_k_mean": float(worst_k_mean(acc, min(worst_k, num_classes))),
      "head_accuracy": float(group_mean(acc, head)),
      "tail_accuracy": float(group_mean(acc, ~np.asarray(head))),
      "per_class": [float(a) for a in np.asarray(acc)],
  }


def subgroup_accuracy(apply_fn, variables, inputs: Array, *, labels: Array,
                      key: Array | None = None, mask: Array | None = None,
                      num_classes: int) -> dict:
  """Per-class (subgroup) accuracy and margin on one batch, in the one measure convention.

  `apply_fn(variables, inputs) -> logits [B, K]`; `mask` [B] marks real examples. Returns
  masked sums that add up over batches — "correct_per_class" [K], "margin_sum_per_class"
  [K], "count_per_class" [K] — and this batch's "accuracy", "per_class_accuracy" [K] (NaN
  for an absent class), "count". `key` is unused. (The worst class is a statistic of the
  whole split: take it from the summed per-class counts, not from one batch.)
  """
  del key
  logits = apply_fn(variables, inputs)
  m = jnp.ones(labels.shape, jnp.float32) if mask is None else mask.astype(jnp.float32)
  onehot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32) * m[:, None]
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  counts = onehot.sum(0)
  correct_per_class = onehot.T @ correct
  per_class = jnp.where(counts > 0, correct_per_class / jnp.maximum(counts, 1.0), jnp.nan)
  return {"correct_per_class": correct_per_class,
          "margin_sum_per_class": onehot.T @ probability_margin(logits, labels),
          "count_per_class": counts,
          "accuracy": jnp.sum(correct * m) / jnp.maximum(jnp.sum(m), 1.0),
          "per_class_accuracy": per_class, "count": jnp.sum(m)}
