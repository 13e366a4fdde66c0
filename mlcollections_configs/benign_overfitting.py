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

from xsens import choices
from xsens.config_utils import parse_arg
from xsens.errors import is_finite_number, is_int, require


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


MODELS = ("vit", "cnn")
DATA_KINDS = ("synthetic", "mnist")
SOLVERS = ("auto", "direct", "reduced")
PAD_TO = ("chunk", "grid")  # sweep.pad_to: a chunk's runs padded to its / the grid's max N.


def _positive_int(value) -> bool:
  return is_int(value) and value > 0


def _positive(value) -> bool:
  return is_finite_number(value) and value > 0


def validate(config) -> None:
  """Raises ConfigError naming `config.<field>` for any unusable value (every check of
  the study: it reads no file and builds no model)."""
  require(config.models and all(m in MODELS for m in config.models), "models",
        f"must be a non-empty list of {MODELS}, got {config.models!r}")
  d = config.data
  require(d.kind in DATA_KINDS, "data.kind", f"got {d.kind!r}; allowed: {', '.join(DATA_KINDS)}")
  require(d.layout in choices.SIGNAL_NOISE_LAYOUTS, "data.layout",
        f"got {d.layout!r}; allowed: {', '.join(choices.SIGNAL_NOISE_LAYOUTS)}")
  for f in ("d", "num_test"):
    require(_positive_int(d[f]), f"data.{f}", f"must be a positive int, got {d[f]!r}")
  require(_positive_int(d.num_tokens) and d.num_tokens >= 2, "data.num_tokens",
        f"must be an int >= 2 (signal + strong noise), got {d.num_tokens!r}")
  require(d.d >= 2, "data.d", f"must be >= 2 (μ₊ and μ₋ on e₁, e₂), got {d.d}")
  require(_positive(d.sigma_p), "data.sigma_p", f"must be > 0, got {d.sigma_p!r}")
  require(d.strong_noise_factor is None or _positive(d.strong_noise_factor),
        "data.strong_noise_factor", f"must be None (5√M) or > 0, got {d.strong_noise_factor!r}")
  require(isinstance(d.project_noise, bool), "data.project_noise",
        f"must be true or false, got {d.project_noise!r}")
  require(not (d.project_noise and d.kind == "mnist"), "data.project_noise",
        "projects off the coordinates of μ₊, μ₋ (e₁, e₂); it has no meaning for data.kind='mnist'")
  require(isinstance(d.label_flip, (int, float)) and 0 <= d.label_flip < 0.5, "data.label_flip",
        f"must be in [0, 0.5), got {d.label_flip!r}")
  if d.kind == "mnist":
    require(d.d == 784, "data.d", f"must be 784 (28×28 digits) for data.kind='mnist', got {d.d}")
    require(len(d.mnist_classes) == 2 and all(0 <= c <= 9 for c in d.mnist_classes)
          and d.mnist_classes[0] != d.mnist_classes[1], "data.mnist_classes",
          f"must be two distinct digits, got {tuple(d.mnist_classes)!r}")
  v = config.vit
  for f in ("d_h", "d_v"):
    require(_positive_int(v[f]), f"vit.{f}", f"must be a positive int, got {v[f]!r}")
  require(v.init in choices.ONE_LAYER_VIT_INITS, "vit.init", f"got {v.init!r}; allowed: {choices.ONE_LAYER_VIT_INITS}")
  require(_positive(v.init_divisor), "vit.init_divisor", f"must be > 0, got {v.init_divisor!r}")
  require(_positive(v.init_std), "vit.init_std", f"must be > 0, got {v.init_std!r}")
  c = config.cnn
  require(_positive_int(c.m), "cnn.m", f"must be a positive int, got {c.m!r}")
  require(_positive(c.q) and c.q >= 1, "cnn.q", f"must be >= 1, got {c.q!r}")
  require(_positive(c.sigma_0), "cnn.sigma_0", f"must be > 0, got {c.sigma_0!r}")
  require(_positive(c.learning_rate), "cnn.learning_rate",
        f"must be > 0, got {c.learning_rate!r}")
  t = config.train
  require(_positive(t.learning_rate), "train.learning_rate",
        f"must be > 0, got {t.learning_rate!r}")
  require(_positive_int(t.max_steps), "train.max_steps", f"must be a positive int, got "
        f"{t.max_steps!r}")
  require(t.solver in SOLVERS, "train.solver", f"got {t.solver!r}; allowed: {', '.join(SOLVERS)}")
  require(_positive(t.loss_threshold), "train.loss_threshold",
        f"must be > 0, got {t.loss_threshold!r}")
  s = config.sweep
  ns = list(s.n_values)
  require(ns and all(_positive_int(n) and n % 2 == 0 for n in ns), "sweep.n_values",
        f"must be a non-empty list of even positive ints (balanced classes), got {ns!r}")
  require(s.mu_norms and all(_positive(m) for m in s.mu_norms), "sweep.mu_norms",
        f"must be a non-empty list of ‖μ‖ > 0, got {list(s.mu_norms)!r}")
  require(_positive_int(s.trials), "sweep.trials", f"must be a positive int, got {s.trials!r}")
  require(_positive_int(s.chunk_size), "sweep.chunk_size",
        f"must be a positive int, got {s.chunk_size!r}")
  vs = s.vmap_size
  require(vs is None or (isinstance(vs, int) and not isinstance(vs, bool) and vs >= 0),
        "sweep.vmap_size", f"must be None (auto: 1 on CPU, the whole chunk on an "
        f"accelerator), 0 (the whole chunk) or a positive int, got {vs!r}")
  choices.check_streams("sweep.streams", s.streams)
  require(s.pad_to in PAD_TO, "sweep.pad_to",
        f"got {s.pad_to!r}; allowed: {', '.join(PAD_TO)}")
  require(d.num_test % 2 == 0, "data.num_test", f"must be even (balanced), got {d.num_test}")
  r = config.report
  require(_positive(r.cutoff), "report.cutoff", f"must be > 0, got {r.cutoff!r}")
  require(isinstance(r.bootstrap, int) and r.bootstrap >= 0, "report.bootstrap",
        f"must be an int >= 0, got {r.bootstrap!r}")
  for name, run in config.dynamics.runs.items():
    f = f"dynamics.runs.{name}"
    for k in ("d", "num_tokens", "n", "num_test", "d_h", "d_v", "steps", "trials"):
      require(_positive_int(run[k]), f"{f}.{k}", f"must be a positive int, got {run[k]!r}")
    require(run.num_tokens >= 2 and run.d >= 2, f"{f}.num_tokens",
          f"need num_tokens >= 2 and d >= 2, got {run.num_tokens}, {run.d}")
    require(run.n % 2 == 0, f"{f}.n", f"must be even, got {run.n}")
    for k in ("mu_norm", "sigma_p", "learning_rate", "init_divisor"):
      require(_positive(run[k]), f"{f}.{k}", f"must be > 0, got {run[k]!r}")
