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
Each returns the flip rate per token [T]. For the plan rows of bench_sensitivity.py
(`bench_model`), the registry's CNN and MLP and the RoBERTa encoder in the same shapes, timed
with the batched pattern at a given number of tokens per forward call (`batched_chunks`).
The weights are PyTorch's own initialisation (timings depend only on the shapes).
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


def untokenize(tokens, patch: int, channels: int):
  """tokens [B, T, p²C] (row-major p × p patches of a square image) -> images [B, C, H, W]."""
  b, t, _ = tokens.shape
  g = int(round(t ** 0.5))
  x = tokens.reshape(b, g, g, patch, patch, channels)
  return x.permute(0, 5, 1, 3, 2, 4).reshape(b, channels, g * patch, g * patch)


class TokenCNN(torch.nn.Module):
  """tokens [B, T, p²C] -> logits: the registry's small CNN (`xsens.models.cnn.CNN`,
  defaults): 3×3 SAME convs 32, 64, 64 with ReLU, 2×2 max-pools after the first two,
  flatten, dense 128 + ReLU, linear head."""

  def __init__(self, patch: int, channels: int, side: int, *, num_classes: int,
               features=(32, 64, 64), dense_dim: int = 128):
    super().__init__()
    self.patch, self.channels = patch, channels
    layers, c = [], channels
    for i, f in enumerate(features):
      layers += [torch.nn.Conv2d(c, f, 3, padding=1), torch.nn.ReLU()]
      if i < len(features) - 1:
        layers.append(torch.nn.MaxPool2d(2))
        side //= 2
      c = f
    self.convs = torch.nn.Sequential(*layers)
    self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(c * side * side,
                                    dense_dim), torch.nn.ReLU(),
                                    torch.nn.Linear(dense_dim, num_classes))

  def forward(self, tokens):
    return self.head(self.convs(untokenize(tokens, self.patch, self.channels)))


class TokenMLP(torch.nn.Module):
  """tokens [B, T, p²C] -> logits: the registry's MLP (`xsens.models.mlp.MLP`, defaults)
  on the flattened input: dense 512, 128 with ReLU, linear head."""

  def __init__(self, input_dim: int, *, num_classes: int, hidden=(512, 128)):
    super().__init__()
    layers, d = [torch.nn.Flatten()], input_dim
    for h in hidden:
      layers += [torch.nn.Linear(d, h), torch.nn.ReLU()]
      d = h
    self.net = torch.nn.Sequential(*layers, torch.nn.Linear(d, num_classes))

  def forward(self, tokens):
    return self.net(tokens)


class TokenText(torch.nn.Module):
  """embeddings [B, L, width] -> logits: the RoBERTa encoder of `xsens.models.text`
  (`encode`): `depth` post-LN blocks (GELU MLP), first token -> dense + tanh -> head."""

  def __init__(self, *, width: int, depth: int, num_heads: int, mlp_dim: int,
               num_classes: int):
    super().__init__()
    layer = torch.nn.TransformerEncoderLayer(width, num_heads, mlp_dim, dropout=0.0,
                                             activation="gelu", batch_first=True,
                                             norm_first=False, layer_norm_eps=1e-5)
    self.encoder = torch.nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
    self.dense = torch.nn.Linear(width, width)
    self.head = torch.nn.Linear(width, num_classes)

  def forward(self, x):
    return self.head(torch.tanh(self.dense(self.encoder(x)[:, 0])))


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


@torch.no_grad()
def batched_chunks(model, tokens, sigma: float, chunk: int):
  """The batched pattern with `chunk` tokens noised per forward call (forward batch
  B * chunk, each copy one noised token; R = 1); flip rate per token [T]."""
  b, t, d = tokens.shape
  clean = model(tokens).argmax(-1)
  flips = torch.zeros(t)
  for q0 in range(0, t, chunk):
    ids = torch.arange(q0, min(q0 + chunk, t))
    xn = tokens[:, None].repeat(1, len(ids), 1, 1)                  # [B, c, T, D]
    xn[:, torch.arange(len(ids)), ids] += sigma * torch.randn(b, len(ids), d)
    out = model(xn.reshape(b * len(ids), t, d)).argmax(-1).reshape(b, len(ids))
    flips[ids] = (out != clean[:, None]).float().mean(0)
  return flips.numpy()


def bench_model(model, tokens_np: np.ndarray, *, sigma: float, chunk: int, rounds: int,
                compile_model: bool = True) -> dict:
  """`batched_chunks` of `model` on tokens_np [B, T, D], eager and under torch.compile
  (R = 1); {"batched_eager_evals_per_s", "batched_compiled_evals_per_s", ...}."""
  threads = set_threads()
  model = model.eval()
  tokens = torch.from_numpy(np.array(tokens_np, np.float32))
  b, t, _ = tokens.shape
  out = {"torch_version": torch.__version__, "torch_threads": threads, "chunk": chunk}
  batched_chunks(model, tokens, sigma, chunk)                       # Warm-up.
  s = best_time(lambda: batched_chunks(model, tokens, sigma, chunk), rounds)
  out["batched_eager_evals_per_s"] = b * t / s
  if compile_model:
    compiled = torch.compile(model, dynamic=False)
    t0 = time.perf_counter()
    batched_chunks(compiled, tokens, sigma, chunk)   # Compiles (the last chunk's size too).
    out["compile_s"] = time.perf_counter() - t0
    s = best_time(lambda: batched_chunks(compiled, tokens, sigma, chunk), rounds)
    out["batched_compiled_evals_per_s"] = b * t / s
  return out


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
