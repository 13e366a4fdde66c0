"""Tests for xsens/measures/planning.py: chunk plans, the speed target, tuning, the plan entry."""

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.sensitivity_test import KEY, mlp_apply, mlp_params, random_tokens, token0_model
from xsens.measures import planning
from xsens.measures import sensitivity as sens
from xsens.measures import sensitivity_loop
from xsens.measures import smooth_sensitivity

jax.config.update("jax_disable_most_optimizations", True)


def test_plan_chunks():
  mib = 2**20
  per_input = planning.FORWARD_BYTES_PER_INPUT_BYTE
  # 1 KiB inputs, a budget of 8 inputs per forward call.
  plan = lambda **kw: planning.plan_chunks(
      4, 100, 1024, memory_budget_bytes=8 * 1024 * per_input, **kw)
  assert plan() == (2, None)                           # 4 examples x 2 copies
  assert plan(chunk_size=None) == (None, 1)            # 100 copies: 1 example
  assert plan(chunk_size=3) == (3, 2)
  assert plan(example_chunk_size=1) == (8, 1)
  assert plan(example_chunk_size=None) == (2, None)
  assert plan(chunk_size=5, example_chunk_size=None) == (5, None)  # explicit
  # The whole batch does not fit: one copy per call, blocks of 8 examples.
  assert planning.plan_chunks(20, 100, 1024,
                          memory_budget_bytes=8 * 1024 * per_input) == (1, 8)
  # Everything fits: all copies in one call (clipped to num_items).
  assert planning.plan_chunks(4, 10, 1024, memory_budget_bytes=mib * per_input) \
      == (10, None)
  # A budget below one input still evaluates one input per call.
  assert planning.plan_chunks(4, 10, 1024, memory_budget_bytes=1) == (1, 1)
  for bad in (dict(chunk_size=0), dict(chunk_size="big"),
              dict(memory_budget_bytes=0), dict(example_chunk_size=-1)):
    with pytest.raises(ValueError):
      planning.plan_chunks(4, 10, 1024, **bad)


@pytest.mark.slow
def test_auto_chunks_are_bounded_and_match_explicit():
  b, t, d, draws = 6, 5, 4, 4
  tok = random_tokens(40, b, t, d)
  params = mlp_params(jax.random.key(41), t, d)
  item = t * d * 4                                    # float32 bytes per copy
  # Room for 10 inputs per forward call.
  budget = 10 * item * planning.FORWARD_BYTES_PER_INPUT_BYTE
  kw = dict(sigma=1.5, num_draws=draws)
  ref = sensitivity_loop.token_sensitivity_loop(mlp_apply, params, tok, key=KEY, **kw)
  assert 0.05 < float(ref["mean"]) < 0.95
  for budget_bytes, expect in ((budget, 6), (budget // 4, 2)):
    batches = []

    def counting(v, x):
      batches.append(x.shape[0])
      return mlp_apply(v, x)

    run = jax.jit(lambda v, x, key: [sens.token_sensitivity(
        counting, v, x, key=key, memory_budget_bytes=budget_bytes,
        chunk_size=c, example_chunk_size=e, **kw)
        for c, e in (("auto", "auto"),
                     planning.plan_chunks(b, t * draws, item,
                                      memory_budget_bytes=budget_bytes))])
    auto, explicit = run(params, tok, KEY)
    # budget: the batch fits, 10 // 6 = 1 copy per call (6 inputs); a quarter
    # of it: 2 inputs per call, blocks of 2 examples.
    assert max(batches) == expect, batches
    assert max(batches) * item * planning.FORWARD_BYTES_PER_INPUT_BYTE <= \
        budget_bytes
    for out in (auto, explicit):
      for name in ("per_token", "flips", "count"):
        np.testing.assert_array_equal(out[name], ref[name], err_msg=name)
      np.testing.assert_allclose(out["per_example"], ref["per_example"],
                                 rtol=1e-6)
  # The default budget does not cut a small problem: one forward call.
  assert planning.plan_chunks(b, t * draws, item) == (t * draws, None)


def test_plan_chunks_near_a_target_within_the_memory_cap():
  per_input = planning.FORWARD_BYTES_PER_INPUT_BYTE
  budget = 1000 * 1024 * per_input                     # 1000 inputs of 1 KiB.
  plan = lambda b, n, target, **kw: planning.plan_chunks(
      b, n, 1024, memory_budget_bytes=budget, target_batch=target, **kw)
  assert plan(64, 49, 64) == (1, None)                 # 64 inputs per call.
  assert plan(64, 16, 188) == (3, None)                # 192 is nearest.
  assert plan(64, 10, 100) == (2, None)                # 128 (x1.28) beats 64 (x1.56).
  assert plan(64, 49, 40) == (1, 32)                   # Two blocks of 32.
  assert plan(64, 49, 5000) == (15, None)              # 960: the memory cap binds.
  assert plan(64, 49, 50, chunk_size=2) == (2, 22)     # 2 x 22 = 44 inputs.
  assert plan(64, 49, 50, example_chunk_size=16) == (3, 16)
  assert plan(64, 49, 50, chunk_size=4, example_chunk_size=None) == (4, None)
  assert plan(2000, 49, 5000) == (1, 1000)             # Nothing larger fits.
  assert planning.plan_sizes(64, 49, None, None) == dict(
      chunk_size=49, example_chunk_size=64, forward_batch=3136)
  assert planning.plan_sizes(64, 49, 1, 40) == dict(
      chunk_size=1, example_chunk_size=32, forward_batch=32)


def test_speed_target_from_the_rows_of_the_models_matmuls():
  tok = random_tokens(50, b=3, t=5, d=4)
  v = dict(w=jax.random.normal(jax.random.key(51), (4, 8)),
           h=jax.random.normal(jax.random.key(52), (8, 2)))

  def per_token_dense(v, x):                 # [B, T, 4] @ [4, 8]: T rows each.
    h = jnp.tanh(x @ v["w"])
    att = jnp.einsum("btd,bsd->bts", h, h)   # Activations x activations: not rows.
    return (att @ h).mean(1) @ v["h"]

  rows = planning.matmul_rows_per_example
  assert rows(per_token_dense, v, (tok,)) == 5
  assert rows(mlp_apply, mlp_params(jax.random.key(53), 5, 4), (tok,)) == 1
  assert rows(token0_model, None, (tok,)) is None      # No matmul: no target.
  cores = len(os.sched_getaffinity(0))
  assert planning.forward_batch_target(5, "cpu") == \
      planning.CPU_MATMUL_ROWS_PER_CORE * cores // 5
  assert planning.forward_batch_target(5, "gpu") is None
  assert planning.forward_batch_target(None, "cpu") is None


@pytest.mark.slow
def test_every_plan_gives_the_same_numbers_and_the_result_says_its_sizes(
    monkeypatch, caplog):
  monkeypatch.setattr(planning, "TUNED_FORWARD_BATCH", {})
  timings = []
  timed = planning._time_forward_batches
  monkeypatch.setattr(planning, "_time_forward_batches",
                      lambda *a: timings.append(a[-1]) or timed(*a))
  tok = random_tokens(54, b=6, t=5, d=4)
  images = jax.random.normal(jax.random.key(55), (6, 4, 4, 1))
  params = mlp_params(jax.random.key(56), 5, 4)
  image_params = mlp_params(jax.random.key(57), 4, 4)
  image_apply = lambda v, x: mlp_apply(v, x.reshape(x.shape[0], 4, 4))
  plans = (("auto", "auto"), ("tune", "auto"), (1, 1), (None, None), (3, 4))
  estimators = {
      "token": (sens.token_sensitivity, mlp_apply, params, tok, {}),
      "global": (sens.global_sensitivity, mlp_apply, params, tok, {}),
      "smooth": (smooth_sensitivity.smooth_token_sensitivity, mlp_apply, params, tok, {}),
      "scattered": (sens.scattered_pixel_sensitivity, image_apply, image_params,
                    images, dict(num_pixels=3)),
  }
  with caplog.at_level(logging.DEBUG, logger="xsens.measures"):
    for name, (fn, apply, v, x, kw) in estimators.items():
      run = jax.jit(lambda v, x, key: [fn(
          apply, v, x, key=key, sigma=1.5, num_draws=4, chunk_size=c,
          example_chunk_size=e, **kw) for c, e in plans])
      outs = run(v, x, KEY)
      n = 5 * 4 if name in ("token", "smooth") else 4
      for (c, e), out in zip(plans, outs):
        if c not in ("auto", "tune"):
          assert {k: int(s) for k, s in out["plan"].items()} == \
              planning.plan_sizes(6, n, c, e), (name, c, e)
        for k in ("per_token", "per_example", "flips", "count"):
          if k in out:
            want, got = outs[3][k], out[k]
            if name == "smooth":       # Batch-size dependent float rounding only.
              np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)
            else:
              np.testing.assert_array_equal(got, want, err_msg=f"{name} {c} {e}")
  assert "token_sensitivity plan: chunk_size=" in caplog.text
  assert "tuned forward batch" in caplog.text
  # One timing per (model, input shape): token, global and smooth share the model.
  assert len(timings) == 2, timings
  jax.jit(lambda v, x, key: sens.token_sensitivity(
      mlp_apply, v, x, key=key, sigma=1.0, num_draws=2, chunk_size="tune"))(
          params, tok, KEY)
  assert len(timings) == 2                            # Cached in the process.
