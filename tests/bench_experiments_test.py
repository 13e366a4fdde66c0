"""The measurement scripts in experiments/: the convergence-time study and the PyTorch
baselines of the benchmarks (those run only where the `bench` extra installed torch)."""

import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import benign_convergence_time


@pytest.mark.slow
def test_convergence_time_runs_the_study_per_eta_eps_and_fits(tmp_path):
  root = str(tmp_path / "conv")
  argv = [f"--root={root}", "--variant=smoke", "--n=2,8", "--mu=8,64", "--trials=2",
          "--eta=0.1,0.2", "--eps=0.1,0.03", "--max_steps=400"]
  fit, median_eta_t = benign_convergence_time.main(argv)
  assert sorted(os.listdir(root))[:4] == ["convergence_time.json", "convergence_time.md",
                                          "convergence_time.png", "eta0.1_eps0.03"]
  assert median_eta_t.shape == (2, 2) and fit["runs"] > 0
  # Halving ε cannot make GD reach it sooner: per η, the median time grows with 1/ε.
  assert np.all(median_eta_t[:, 1] >= median_eta_t[:, 0])
  with open(os.path.join(root, "convergence_time.json")) as f:
    assert json.load(f)["fit"]["runs"] == fit["runs"]
  # A rerun reads the saved sweeps (same numbers).
  again, _ = benign_convergence_time.main(argv)
  assert again == fit


@pytest.mark.slow
def test_authors_pytorch_loop_ends_at_the_jax_gd_weights():
  torch = pytest.importorskip("torch")
  del torch
  from experiments import bench_benign_overfitting as bench  # pylint: disable=import-outside-toplevel
  from xsens.data import signal_noise as sn  # pylint: disable=import-outside-toplevel
  from xsens.models import one_layer_vit as vit  # pylint: disable=import-outside-toplevel
  from xsens.train import full_batch_gd as gd  # pylint: disable=import-outside-toplevel
  keys = jax.random.split(jax.random.key(0), 2)
  x, y, _ = jax.vmap(lambda k: sn.sample(k, 6, num_tokens=4, d=16, mu_norm=3.0,
                                         sigma_p=0.5))(keys)
  params, w_o = jax.vmap(lambda k: vit.init(k, 16, 8, 8))(keys)
  mask = jnp.ones((2, 6))

  def jax_loop(p, w, x, y, m):
    return jax.lax.fori_loop(0, 7, lambda _, p: gd.gd_step(vit.apply, p, w, x, y, m, 0.5)[1], p)

  want = np.asarray(jax.vmap(jax_loop)(params, w_o, x, y, mask)["wv"][0])
  rate, got = bench.torch_authors_loop(params, w_o, x, y, 0.5, 7, 2)
  assert rate > 0
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_early_stop_sweep_times_the_study_groups_one_vmap_and_per_n_on_mixed_grid_points():
  from experiments import bench_benign_overfitting as bench  # pylint: disable=import-outside-toplevel
  out = bench.early_stop_sweep("smoke", runs=4, torch_runs=3)
  assert out["sweep_runs"] == 4 and out["sweep_vmap_size"] in (0, 1)
  assert 1 <= out["sweep_max_steps"] <= 60 and out["sweep_mean_steps"] <= out["sweep_max_steps"]
  assert out["sweep_grouped_runs_per_s"] > 0 and out["sweep_one_vmap_runs_per_s"] > 0
  # The runs grouped by N without padding stop where the padded ones stop.
  assert out["sweep_per_n_runs_per_s"] > 0 and out["sweep_per_n_same_steps_frac"] == 1.0
  # In the study's concurrent streams (pieces of whole groups): the same stops.
  assert out["sweep_streams"] >= 1 and out["sweep_streams_same_steps_frac"] == 1.0
  assert out["sweep_streams_runs_per_s"] > 0 and out["sweep_per_n_streams_runs_per_s"] > 0
  if "sweep_torch_runs_per_s" in out:  # The `bench` extra: the authors' loop, same rule.
    assert out["sweep_torch_runs"] == 3 and out["sweep_torch_same_steps_frac"] == 1.0
    assert out["sweep_torch_processes_runs_per_s"] > 0


def test_pytorch_sensitivity_patterns_count_flips():
  torch = pytest.importorskip("torch")
  from experiments import torch_baselines  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  model = torch_baselines.TokenViT(4, 5, width=16, depth=1, num_heads=2, mlp_dim=32,
                                   num_classes=3).eval()
  tokens = torch.randn(6, 5, 4)
  assert model(tokens).shape == (6, 3)
  for fn in (lambda s: torch_baselines.per_example(model, tokens, s, 2, 3),
             lambda s: torch_baselines.batched(model, tokens, s, 2)):
    np.testing.assert_array_equal(fn(0.0), np.zeros(5))  # No noise: nothing flips.
    loud = fn(1e4)
    assert loud.shape == (5,) and loud.max() > 0 and loud.max() <= 1


@pytest.mark.slow
def test_pytorch_batched_pattern_in_threads_times_both_ways():
  pytest.importorskip("torch")
  from experiments import torch_baselines  # pylint: disable=import-outside-toplevel
  tokens = np.random.default_rng(0).standard_normal((2, 3, 5, 4)).astype(np.float32)
  out = torch_baselines.bench_streams(tokens, sigma=1.0, num_classes=3, rounds=1, vit_kw=dict(
      width=16, depth=1, num_heads=2, mlp_dim=32))
  assert out["batches"] == 2 and all(out[f"{k}_evals_per_s"] > 0 for k in (
      "eager", "eager_threads", "compiled", "compiled_threads"))


@pytest.mark.slow
def test_verification_benchmark_runs_both_solvers_and_writes_its_table(tmp_path):
  from experiments import bench_verification  # pylint: disable=import-outside-toplevel
  table = bench_verification.main([f"--root={tmp_path}", "--widths=16", "--examples=1",
                                   "--properties=2", "--train_steps=5", "--max_iters=300"])
  row = table[16]
  assert row["properties"] == 2 and row["unsound_duals"] == 0
  assert row["max_primal_minus_lp"] < 1e-2          # the same relaxation, the same optimum
  for name in ("bench_verification.json", "bench_verification.md", "bench_verification.png"):
    assert os.path.getsize(tmp_path / name) > 0


@pytest.mark.slow
def test_hard_verification_benchmark_compares_both_steps_with_highs(tmp_path):
  from experiments import bench_verification_hard  # pylint: disable=import-outside-toplevel
  out = bench_verification_hard.main([f"--root={tmp_path}", "--sets=r20x1_0.1", "--nets=1",
                                      "--budgets=600", "--repeats=1"])
  rows = out["r20x1_0.1"]["rows"]
  assert out["r20x1_0.1"]["properties"] == 9
  assert rows["fista@600"]["unsound"] == 0 and rows["kink@600"]["unsound"] == 0
  assert rows["kink@600"]["primal_1e-3"] == 1.0       # the same relaxation, the same optimum
  for name in ("bench_verification_hard.json", "bench_verification_hard.md"):
    assert os.path.getsize(tmp_path / name) > 0


def test_sensitivity_matmul_ceiling_weights_the_vit_forward_shapes(capsys):
  from experiments import bench_sensitivity  # pylint: disable=import-outside-toplevel
  timer = bench_sensitivity.Timer()
  timer.sample_peak()
  rows = bench_sensitivity.matmul_ceiling(timer, batch=2, patch=7, rounds=1)
  # Per token and layer (width 128, MLP 256, T = 16 + CLS): 4·128² projection MACs,
  # 2·128·256 MLP MACs, 2·T·128 attention MACs.
  per_token = 4 * 128**2 + 2 * 128 * 256 + 2 * 17 * 128
  shares = [r["flop_share"] for r in rows[:-1]]
  assert shares[0] == pytest.approx(4 * 128**2 / per_token)
  assert shares[3] == pytest.approx(17 * 128 / per_token)
  assert sum(shares) == pytest.approx(1.0)
  weighted = 1 / sum(r["flop_share"] / r["gflops"] for r in rows[:-1])
  assert rows[-1]["gflops"] == pytest.approx(weighted)
  assert all(r["gflops"] > 0 for r in rows)
  assert "FLOP-weighted" in capsys.readouterr().out


def test_hlo_profile_times_the_instructions_of_a_compiled_program():
  from experiments import hlo_profile  # pylint: disable=import-outside-toplevel
  a = jnp.ones((3, 64, 32))
  b = jnp.ones((3, 32, 16))
  compiled = jax.jit(lambda a, b: jnp.tanh(a @ b)).lower(a, b).compile()
  names = hlo_profile.instructions(compiled)
  times = hlo_profile.instruction_times(names, lambda: compiled(a, b), calls=2)
  if not times:
    pytest.skip("the profiler wrote no trace on this backend")
  assert set(times) <= set(names) and all(t >= 0 for t in times.values())
  labels = [hlo_profile.describe(names[n]) for n in times]
  assert any("f32[3,64,16]" in label for label in labels), labels
  dot = ('%dot.1 = f32[3,64,16]{2,1,0} dot(%a, %b), lhs_batch_dims={0}, '
         'lhs_contracting_dims={2}, metadata={op_name="jit(f)/dot_general"}')
  assert hlo_profile.describe(dot) == "dot f32[3,64,16]{2,1,0} lhs_contracting={2} jit(f)/dot_general"


@pytest.mark.slow
def test_sensitivity_plan_rows_show_the_default_beside_explicit_plans():
  from experiments import bench_sensitivity  # pylint: disable=import-outside-toplevel
  out = bench_sensitivity.main(["--plans", "--quick"])
  rows = out["plans"]
  models = list(dict.fromkeys(r["model"] for r in rows))
  assert len(models) == 4 and models[-1].startswith("RoBERTa")
  has_torch = importlib.util.find_spec("torch") is not None
  for model in models:
    mine = [r for r in rows if r["model"] == model and not r["plan"].startswith("PyTorch")]
    assert mine[0]["plan"] == "default ('auto')" and len(mine) >= 3
    assert max(r["vs_best"] for r in mine) == 1.0
    theirs = [r for r in rows if r["model"] == model and r["plan"].startswith("PyTorch")]
    # Eager PyTorch at forward batch B and at the default plan's, where torch is installed.
    assert {r["forward_batch"] for r in theirs} == (
        {8, 8 * mine[0]["forward_batch"] // 8} if has_torch else set()), theirs
    assert all(r["forward_batch"] >= 1 and r["evals_per_s"] > 0 for r in mine + theirs)
