"""Benign overfitting of a one-layer ViT: the N × SNR phase diagram, dynamics, CNN baseline.

Jiang et al., "Unveil Benign Overfitting for Transformer in Vision", NeurIPS 2024
(arXiv 2409.19345), Fig. 1; baselines Cao et al., NeurIPS 2022 (arXiv 2202.06526) and Kou
et al., ICML 2023 (PMLR 202:17615–17659).

  xsens --config=mlcollections_configs/benign_overfitting.py --workdir=workdirs/benign_overfitting
  xsens --config=mlcollections_configs/benign_overfitting.py:smoke --workdir=/tmp/bo_smoke
  xsens --config=mlcollections_configs/benign_overfitting.py:paper --workdir=workdirs/bo_paper
  xsens --config=mlcollections_configs/benign_overfitting.py:cnn,q=3 --workdir=workdirs/bo_cnn
  xsens --config=mlcollections_configs/benign_overfitting.py:cnn,q=2,steps=3000 --workdir=workdirs/bo_cnn_q2
  xsens --config=mlcollections_configs/benign_overfitting.py:kou --workdir=workdirs/bo_kou
  xsens --config=mlcollections_configs/benign_overfitting.py:mnist --workdir=workdirs/bo_mnist

Variants:
- default (CPU): d=128, M=16, σ_p = 6.4/√128 (so SNR(‖μ‖) and the
  noise norms equal the paper's d=1024, σ_p=0.2 grid), d_h=d_v=64, N=2..20 step 2, 12 ‖μ‖
  values (1..256), 10 trials, ≤300 GD steps; ViT and CNN sweeps, harmful/benign dynamics at d=256.
- `paper` (GPU/TPU): the authors' Fig. 1 grid: d=1024, M=16, σ_p=0.2, N=2..20, ‖μ‖=1..100,
  10 trials, η=0.1, ≤1000 steps, ε=0.01, d_h=d_v=512, init /16, 100 test samples; the
  dynamics runs at the authors' d=2048, M=3, N=10, η=0.01, 500 steps, 10 runs.
- `cnn`: only Cao et al.'s two-layer CNN (σ(z)=max(0,z)^q, `q=` sets q) on the default grid.
- `kou`: Kou et al.'s ReLU CNN with label noise (ICML 2023; rebuttal A4–A5): q = 1, two
  tokens [ỹμ, ξ] with ξ ⟂ μ of std σ_p (no strong token), ±μ layout, 10 % of the training
  labels flipped (test labels clean); ‖μ‖ ∈ 0.25..16, η = 10/max(‖μ‖², σ_p² d), ≤ 4,000
  steps; theory N·SNR⁴ = const at fixed d.
- `steps=N`: at most N GD steps per run (train.max_steps; default 300), e.g.
  `cnn,q=2,steps=3000` so that the q = 2 runs reach train loss ε.
- `mnist`: the signal token is an mnist5k digit (0 vs 1, unit-norm × ‖μ‖, d=784) among
  Gaussian noise tokens; the same N × ‖μ‖ sweep.
- `smoke`: seconds; what the tests run.

Shows: results.md with, per model, the fitted boundary exponent k of N·SNR^k = c (theory:
2 for the ViT, q for the CNN) with a bootstrap 95 % CI, from the per-N interpolated crossings
and, beside it, from a logistic fit of 1[test loss < cutoff] on (log N, log SNR) over all runs;
heat maps of the mean test loss and of loss < 0.2 with the fitted, theoretical and logistic
curves and (ViT) the paper's Fig. 1 curve N·SNR² = 1000; the ViT/CNN boundary overlay; and the
training dynamics (loss, pooled attention, V projections, QK logits, stable rank of W_V) of a
harmful (‖μ‖=1) and a benign (‖μ‖=25) run; per model, the GD steps to train loss < ε
against SNR (steps_<model>.png) and their power-law fit on N and ‖μ‖. Theory exponents:
2 (ViT), q (Cao's CNN), 4 (Kou's ReLU CNN, q = 1).
"""

import math

import ml_collections

from xsens.config_utils import parse_arg


def _dynamics_run(**overrides) -> ml_collections.ConfigDict:
  # The authors' harmful-regime script (docs/papers/benign_overfitting.md §6): M=3, d=2048, N=10,
  # ‖μ‖=1, σ_p=0.05, σ̃_p=1.
  run = dict(d=2048, num_tokens=3, n=10, num_test=100, mu_norm=1.0, sigma_p=0.05,
             strong_std=1.0, d_h=1024, d_v=512, init_divisor=32.0, learning_rate=0.01,
             steps=500, trials=10)
  run.update(overrides)
  return ml_collections.ConfigDict(run)


def _scaled_dynamics(d: int, d_h: int, d_v: int, **overrides) -> ml_collections.ConfigDict:
  """The authors' dynamics setting at dimension d with the same SNR and noise norms."""
  s = math.sqrt(2048 / d)
  return _dynamics_run(d=d, d_h=d_h, d_v=d_v, sigma_p=0.05 * s, strong_std=1.0 * s, **overrides)


def get_config(arg=None):
  arg = parse_arg(arg, paper=False, cnn=False, kou=False, mnist=False, smoke=False, q=3.0,
                  steps=0)
  config = ml_collections.ConfigDict()
  config.study = "benign_overfitting"
  config.seed = 0
  config.models = ("vit", "cnn")

  d = config.data = ml_collections.ConfigDict()
  d.kind = "synthetic"
  d.d = 128
  d.num_tokens = 16
  d.sigma_p = 6.4 / math.sqrt(128)  # σ_p √d = 6.4 as in the paper's d=1024, σ_p=0.2.
  d.strong_noise_factor = ml_collections.FieldReference(None, field_type=float)  # None: 5√M
  d.layout = "two_vectors"
  d.project_noise = False  # True: noise ⟂ span{μ₊, μ₋} (the paper's Def. 3.1); scripts: False.
  d.label_flip = 0.0
  d.num_test = 100
  d.mnist_classes = (0, 1)

  v = config.vit = ml_collections.ConfigDict()
  v.d_h = 64
  v.d_v = 64
  v.init = "torch_scaled"
  v.init_divisor = 16.0
  v.init_std = 1e-3

  c = config.cnn = ml_collections.ConfigDict()
  c.m = 10
  c.q = float(arg.q)
  c.sigma_0 = 0.01
  # GD step of the CNN: learning_rate / max(‖μ‖², σ̃_p² d) (see the study's cnn_lr_scale).
  c.learning_rate = 1.0
  c.normalize_lr = True

  t = config.train = ml_collections.ConfigDict()
  t.learning_rate = 0.1
  t.max_steps = 300
  t.loss_threshold = 0.01
  # "auto": the exact reduced-state ViT solver when d > N·M (paper: 1024 > 320), else direct.
  t.solver = "auto"

  s = config.sweep = ml_collections.ConfigDict()
  s.n_values = tuple(range(2, 21, 2))
  s.mu_norms = (1.0, 4.0, 8.0, 16.0, 24.0, 32.0, 45.0, 64.0, 90.0, 128.0, 181.0, 256.0)
  s.trials = 10
  s.chunk_size = 120  # Runs per program call and per checkpoint.
  # Runs vmapped together inside a chunk, the groups in sequence: None = auto (1 on CPU,
  # where it makes the chunk 2-4x faster, docs/benchmarks.md; 0 on an accelerator), 0 = the
  # whole chunk in one vmap (sweeps written before this field existed resume with 0).
  s.vmap_size = ml_collections.FieldReference(None, field_type=int)
  # The N a chunk's runs are padded to (one program per value): "grid" = the grid's largest
  # (one program), "chunk" = the chunk's largest (a chunk of this grid holds one N: 1.8x
  # less GD work, one compile per N; slower on CPU at these sizes, docs/benchmarks.md).
  s.pad_to = "grid"
  # Concurrent streams a chunk's groups are split over (host threads; xsens.train.streams):
  # None = auto (one per core on a single CPU device, docs/benchmarks.md; 1 on an
  # accelerator). Results are bit-identical for any value.
  s.streams = ml_collections.FieldReference(None, field_type=int)

  r = config.report = ml_collections.ConfigDict()
  r.cutoff = 0.2
  r.bootstrap = 200

  dyn = config.dynamics = ml_collections.ConfigDict()
  dyn.enabled = True
  dyn.runs = ml_collections.ConfigDict({
      "harmful": _scaled_dynamics(256, 128, 64, steps=300, trials=5),
      "benign": _scaled_dynamics(256, 128, 64, mu_norm=25.0, steps=300, trials=5),
  })

  if arg.paper:
    d.d, d.num_tokens, d.sigma_p = 1024, 16, 0.2
    v.d_h = v.d_v = 512
    t.max_steps = 1000
    s.mu_norms = tuple(float(m) for m in range(1, 101))
    s.trials = 10
    s.chunk_size = 500
    # Chunks of 500 runs of up to 1,000 steps: a compile per N is small beside the padding
    # it saves (the reduced solver's cost grows as (N·M)², docs/benchmarks.md).
    s.pad_to = "chunk"
    dyn.runs = ml_collections.ConfigDict({
        "harmful": _dynamics_run(), "benign": _dynamics_run(mu_norm=25.0)})
  if arg.cnn:
    config.models = ("cnn",)
    dyn.enabled = False
  if arg.kou:
    # Kou et al. (ICML 2023) as docs/papers/benign_overfitting.md §8 reads them: Cao's CNN with
    # ReLU (q = 1), x = [ỹμ, ξ] with ξ ⟂ μ at σ_p (no strong token), labels flipped with
    # probability 0.1; the test set keeps clean labels. Theory: benign iff n‖μ‖⁴ ≳ d σ_p⁴, i.e.
    # N·SNR⁴ = const.
    config.models = ("cnn",)
    c.q = 1.0
    d.num_tokens = 2
    d.layout = "plus_minus"
    d.project_noise = True
    d.strong_noise_factor = 1.0
    d.label_flip = 0.1
    # The boundary sits at SNR ≈ 0.2–0.5 (no strong token), so a finer grid below ‖μ‖ = 16.
    s.mu_norms = (0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0, 5.7, 8.0, 16.0)
    # η = 10 / max(‖μ‖², σ_p² d): a constant inside Cao/Kou's Õ(·) bound; ReLU is
    # 1-homogeneous, so it does not overflow, and at 1 memorising the flipped labels takes
    # more than 3,000 steps (probed at N = 10, 20).
    c.learning_rate = 10.0
    t.max_steps = 4000
    dyn.enabled = False
  if arg.mnist:
    config.models = ("vit",)
    d.kind = "mnist"
    d.d = 784
    d.sigma_p = 6.4 / math.sqrt(784)
    s.mu_norms = (4.0, 8.0, 16.0, 32.0, 64.0, 100.0, 140.0, 200.0, 280.0, 400.0)
    s.trials = 3
    dyn.enabled = False
  if arg.smoke:
    d.d = 32
    d.num_tokens = 2 if arg.kou else 4
    d.sigma_p = 6.4 / math.sqrt(32)
    d.num_test = 40
    v.d_h = v.d_v = 16
    c.m = 4
    t.max_steps = 60
    s.n_values = (2, 8)
    s.mu_norms = (1.0, 64.0)
    s.trials = 2
    s.chunk_size = 4
    r.bootstrap = 0
    dyn.runs = ml_collections.ConfigDict({
        "harmful": _scaled_dynamics(32, 16, 16, steps=20, trials=2, num_test=20),
        "benign": _scaled_dynamics(32, 16, 16, mu_norm=25.0, steps=20, trials=2, num_test=20)})
    if arg.mnist:
      d.d = 784
      d.sigma_p = 6.4 / math.sqrt(784)
  if arg.steps:
    t.max_steps = int(arg.steps)
  return config
