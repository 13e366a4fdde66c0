"""Real PyTorch baselines for experiments/bench_sensitivity.py (`pip install -e ".[bench]"`).

The token-wise sensitivity of the benchmark's ViT (28×28×1 images cut into p×p patch
tokens, width 128, depth 6, 4 heads, MLP 256, pre-LN, CLS pooling) written in PyTorch with
the same shapes, and three ways to estimate it in PyTorch:
  * per_example: the official code's pattern (estija/sensitivity, language/utils.py
    `embedding_label_sensitivity`): for each example, token and draw, clone the example,
    add N(0, σ²) to that token and run the model on that single input;
  * batched: for each (token, draw) one forward of the whole batch with that token noised
    (the natural batched PyTorch version), eager;
  * compiled: the batched pattern with the model under `torch.compile`.
Each returns the flip rate per token [T]. The weights are PyTorch's own initialisation (timings depend only on the shapes).
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import torch


class TokenViT(torch.nn.Module):
  """tokens [B, T, p²C] -> logits [B, classes]: linear patch embedding, learned positions,
  CLS token, `depth` pre-LN encoder blocks (GELU MLP), final LayerNorm, linear head."""

  def __init__(self, token_dim: int, num_tokens: int, *, width: int, depth: int,
               num_heads: int, mlp_dim: int, num_classes: int):
    super().__init__()
    self.embed = torch.nn.Linear(token_dim, width)
    self.pos = torch.nn.Parameter(0.02 * torch.randn(1, num_tokens, width))
    self.cls = torch.nn.Parameter(torch.zeros(1, 1, width))
    layer = torch.nn.TransformerEncoderLayer(width, num_heads, mlp_dim, dropout=0.0,
                                             activation="gelu", batch_first=True,
                                             norm_first=True)
    self.encoder = torch.nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
    self.norm = torch.nn.LayerNorm(width)
    self.head = torch.nn.Linear(width, num_classes)

  def forward(self, tokens):
    x = self.embed(tokens) + self.pos
    x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1)
    return self.head(self.norm(self.encoder(x))[:, 0])


def set_threads() -> int:
  """Uses every core, like XLA's CPU backend; returns the thread count."""
  torch.set_num_threads(os.cpu_count())
  return torch.get_num_threads()


@torch.no_grad()
def per_example(model, tokens, sigma: float, num_draws: int, num_examples: int):
  """The official pattern on the first `num_examples` examples; flip rate per token [T]."""
  n, t, d = num_examples, tokens.shape[1], tokens.shape[2]
  flips = torch.zeros(t)
  for b in range(n):
    x1 = tokens[b:b + 1]
    y1 = model(x1).argmax(-1)
    for q in range(t):
      for _ in range(num_draws):
        xn = x1.clone()
        xn[:, q] += sigma * torch.randn(d)
        flips[q] += (model(xn).argmax(-1) != y1).float().sum()
  return (flips / (n * num_draws)).numpy()


@torch.no_grad()
def batched(model, tokens, sigma: float, num_draws: int):
  """One forward of the whole batch per (token, draw); flip rate per token [T]."""
  b, t, d = tokens.shape
  clean = model(tokens).argmax(-1)
  flips = torch.zeros(t)
  for q in range(t):
    for _ in range(num_draws):
      xn = tokens.clone()
      xn[:, q] += sigma * torch.randn(b, d)
      flips[q] += (model(xn).argmax(-1) != clean).float().mean()
  return (flips / num_draws).numpy()


def best_time(fn, rounds: int) -> float:
  best = float("inf")
  for _ in range(rounds):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def bench(tokens_np: np.ndarray, *, sigma: float, num_draws: int, vit_kw: dict,
          num_classes: int, rounds: int, per_example_n: int, compile_model: bool = True):
  """Times the three PyTorch patterns on `tokens_np` [B, T, D]; {pattern: evals/s, ...}."""
  threads = set_threads()
  torch.manual_seed(0)
  b, t, d = tokens_np.shape
  model = TokenViT(d, t, num_classes=num_classes, **vit_kw).eval()
  tokens = torch.from_numpy(np.array(tokens_np, np.float32))
  out = {"torch_version": torch.__version__, "torch_threads": threads}
  per_example(model, tokens, sigma, 1, 1)  # Warm-up.
  s = best_time(lambda: per_example(model, tokens, sigma, num_draws, per_example_n), rounds)
  out["per_example_evals_per_s"] = per_example_n * t * num_draws / s
  batched(model, tokens, sigma, 1)
  s = best_time(lambda: batched(model, tokens, sigma, num_draws), rounds)
  out["batched_eager_evals_per_s"] = b * t * num_draws / s
  if compile_model:
    compiled = torch.compile(model)
    t0 = time.perf_counter()
    batched(compiled, tokens, sigma, 1)  # Compiles (both batch shapes are B).
    out["compile_s"] = time.perf_counter() - t0
    s = best_time(lambda: batched(compiled, tokens, sigma, num_draws), rounds)
    out["batched_compiled_evals_per_s"] = b * t * num_draws / s
  return out


def bench_streams(batches_np: np.ndarray, *, sigma: float, vit_kw: dict, num_classes: int,
                  rounds: int) -> dict:
  """The batched pattern (eager and `torch.compile`, R = 1) over S batches of tokens
  ([S, B, T, D]): one batch after another with every core's thread (the pattern as
  written), and S Python threads of one torch thread each, one batch per thread (what
  the pattern reaches with one stream per batch, as the JAX side is timed). evals/s."""
  threads = set_threads()
  torch.manual_seed(0)
  s, b, t, d = batches_np.shape
  model = TokenViT(d, t, num_classes=num_classes, **vit_kw).eval()
  batches = [torch.from_numpy(np.array(x, np.float32)) for x in batches_np]
  out = {"torch_version": torch.__version__, "torch_threads": threads, "batches": s}
  for name, m in (("eager", model), ("compiled", torch.compile(model, dynamic=False))):
    batched(m, batches[0], sigma, 1)  # Warm-up (compiles: every batch has shape B).
    one_by_one = best_time(lambda m=m: [batched(m, x, sigma, 1) for x in batches], rounds)
    torch.set_num_threads(1)

    def in_threads(m=m):
      workers = [threading.Thread(target=batched, args=(m, x, sigma, 1)) for x in batches]
      for w in workers:
        w.start()
      for w in workers:
        w.join()

    in_threads()
    concurrent = best_time(in_threads, rounds)
    torch.set_num_threads(threads)
    out[f"{name}_evals_per_s"] = s * b * t / one_by_one
    out[f"{name}_threads_evals_per_s"] = s * b * t / concurrent
  return out
