"""The compute cost of a model: XLA's FLOP count of a forward pass, the attention share of
it, and the peak temporary memory and best-of-n time of one training step.

FLOPs are read off XLA's cost analysis of the compiled program, memory off its memory
analysis; the attention FLOPs are the model's minus those of the same model with every
attention sub-layer skipped (its pre-LayerNorm included).
"""

from __future__ import annotations

import time

import jax
import optax


def _cost(compiled) -> dict:
  ca = compiled.cost_analysis()
  if isinstance(ca, (list, tuple)):
    ca = ca[0] if ca else {}
  return ca or {}


def forward_flops(model, variables, images) -> float:
  """XLA's FLOP count of `model.apply(variables, images, train=False)`."""
  fn = jax.jit(lambda v, x: model.apply(v, x, train=False))
  return float(_cost(fn.lower(variables, images).compile()).get("flops", float("nan")))


def attention_flops(model, variables, images) -> float:
  """Forward FLOPs spent in the attention sub-layers (model minus attention-free model)."""
  no_attention = tuple(model.skip) + tuple((i, "attention") for i in range(model.depth))
  return (forward_flops(model, variables, images)
          - forward_flops(model.clone(skip=no_attention), variables, images))


def train_step_cost(model, variables, images, labels, *, repeats: int = 5) -> dict:
  """Peak temp memory (XLA memory analysis) and best-of-`repeats` time of loss+grads."""
  def loss(params, x, y):
    logits = model.apply({**variables, "params": params}, x, train=False)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  fn = jax.jit(jax.value_and_grad(loss))
  compiled = fn.lower(variables["params"], images, labels).compile()
  mem = compiled.memory_analysis()
  temp = float(getattr(mem, "temp_size_in_bytes", float("nan"))) if mem else float("nan")
  jax.block_until_ready(compiled(variables["params"], images, labels))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(variables["params"], images, labels))
    best = min(best, time.perf_counter() - t0)
  return {"peak_temp_mb": temp / 2**20, "step_ms": 1e3 * best}
