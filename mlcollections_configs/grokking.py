"""Grokking modular addition with a one-block transformer; sensitivity every epoch.

Vasudeva et al., "Transformers Learn Low Sensitivity Functions", ICLR 2025 (arXiv
2403.06925), official code estija/sensitivity language/sens_addition.py and
sens_modular_addition.ipynb; set-up in docs/results.md (grokking).

  xsens --config=mlcollections_configs/grokking.py --workdir=workdirs/grokking
  xsens --config=mlcollections_configs/grokking.py:paper --workdir=workdirs/grokking_paper
  xsens --config=mlcollections_configs/grokking.py:smoke --workdir=/tmp/grokking_smoke
  xsens --config=mlcollections_configs/grokking.py:epochs=4000,seeds=3 --workdir=...
  xsens --config=mlcollections_configs/grokking.py:paper,seeds=5 --workdir=workdirs/grokking_p5
  xsens --config=mlcollections_configs/grokking.py:paper,init_npz=official_init.npz --workdir=...

Variants:
- default (CPU): CPU_DEFAULTS below — the paper's architecture
  (d 128, 4 heads, MLP 512), AdamW with weight decay 1.0, 30 % split, sensitivity (σ = 0.1
  on positions 0 and 1) and rolling window, at p = 59 (1,044 training pairs; epoch cost against p:
  `experiments/bench_grokking.py`) and lr 3e-3 (3×
  the paper's, so weight decay acts 3× faster per epoch), 7,500 epochs. Seed 42 memorises
  by epoch ~30 and groks (test accuracy ≥ 0.5) at epoch 5,600 (docs/results.md); lr 1e-2
  collapses (train accuracy falls to chance after epoch ~2,000).
- `paper`: the official code: p = 113, d = 128, 4 heads, MLP 512, AdamW lr 1e-3, weight
  decay 1.0, 20,000 epochs (the script; the notebook runs 17,000), seeds 42, 43, 44 (the
  notebook's; the script runs 5), test every 100 epochs, plot markers at 500, 3000, 9800.
- `smoke`: seconds; what the tests run.
- `epochs=N`, `seeds=S`, `modulus=p`, `lr=x` override those fields; `paper,seeds=5` is the
  script's five seeds 42..46 (vmapped; resumes from its last 500-epoch chunk; results in
  docs/results.md).
- `init_npz=PATH` (`model.init_npz`): start from the official model's weights in an .npz
  (its state_dict's keys; each array of the official shape, or [seeds, ...] one per seed),
  written by `python -m experiments.official_grokking_init --out=PATH` (PyTorch; seeds
  42..46 stacked); the mapping is in xsens/models/grokking_transformer.py.
  `--config.model.init_npz=PATH` does the same, and `--config.model.init_npz=None` goes back
  to the seeds' own draws.

Shows: results.md with, per seed, the epochs at which the model memorises (train acc ≥
0.99), sensitivity peaks and falls (≤ 0.9 and ≤ 0.5 × peak of its rolling mean), test
accuracy reaches 0.5 and 0.95 (`report.grok_thresholds`), the leads (grokked − sensitivity
falls), whether it grokked within the run, final accuracies, sensitivity and weight norm;
across seeds, per threshold, the fraction that grokked and mean ± s.e. (n) of the grokking
epoch and the lead; grokking.png: loss, accuracy, sensitivity (%) and weight norm
over epochs (rolling window 50) with the two events marked.
"""

import ml_collections

from xsens import choices
from xsens.config_utils import parse_arg
from xsens.errors import is_finite_number, is_int, require

# The CPU default, chosen from measured timings (docs/results.md, "Grokking").
CPU_DEFAULTS = dict(modulus=59, width=128, num_heads=4, mlp_dim=512, learning_rate=3e-3,
                    epochs=7500)


def get_config(arg=None):
  arg = parse_arg(arg, paper=False, smoke=False, epochs=0, seeds=0, modulus=0, lr=0.0,
                  init_npz="")
  config = ml_collections.ConfigDict()
  config.study = "grokking"
  config.seed = 42

  d = config.data = ml_collections.ConfigDict()
  d.modulus = CPU_DEFAULTS["modulus"]
  d.train_fraction = 0.3

  m = config.model = ml_collections.ConfigDict()
  m.width = CPU_DEFAULTS["width"]
  m.num_heads = CPU_DEFAULTS["num_heads"]
  m.mlp_dim = CPU_DEFAULTS["mlp_dim"]
  # None: each seed draws its own weights; a path: the official layout's weights (above).
  m.init_npz = ml_collections.FieldReference(None, field_type=str)

  # torch.optim.AdamW defaults: betas (0.9, 0.999), eps 1e-8; weight decay on all params.
  o = config.optimizer = ml_collections.ConfigDict()
  o.learning_rate = CPU_DEFAULTS["learning_rate"]
  o.weight_decay = 1.0
  o.b1 = 0.9
  o.b2 = 0.999
  o.eps = 1e-8

  t = config.train = ml_collections.ConfigDict()
  t.epochs = CPU_DEFAULTS["epochs"]
  t.chunk_epochs = 250
  t.test_every = 100
  t.num_seeds = 1
  t.keep_checkpoints = 2

  s = config.sensitivity = ml_collections.ConfigDict()
  s.sigma = 0.1
  s.positions = (0, 1)

  r = config.report = ml_collections.ConfigDict()
  r.window = 50
  # Test accuracies that count as grokked; the first (0.5) gives grok_epoch / lead_epochs.
  r.grok_thresholds = (0.5, 0.95)
  r.fall_fraction = 0.5
  r.markers = ()

  if arg.paper:
    d.modulus = 113
    m.width, m.num_heads, m.mlp_dim = 128, 4, 512
    o.learning_rate = 1e-3
    t.epochs = 20000
    t.chunk_epochs = 500
    t.num_seeds = 3
    r.markers = (500, 3000, 9800)
  if arg.smoke:
    d.modulus = 11
    m.width, m.num_heads, m.mlp_dim = 16, 2, 32
    t.epochs = 30
    t.chunk_epochs = 10
    t.test_every = 5
    t.num_seeds = 2
    r.window = 5
  if arg.epochs:
    t.epochs = arg.epochs
  if arg.seeds:
    t.num_seeds = arg.seeds
  if arg.modulus:
    d.modulus = arg.modulus
  if arg.lr:
    o.learning_rate = arg.lr
  if arg.init_npz:
    m.init_npz = arg.init_npz
  return config


def validate(config) -> None:
  """Raises ConfigError naming `config.<field>` for any unusable value (the file of
  `model.init_npz` is read by the study)."""
  d = config.data
  require(is_int(d.modulus) and d.modulus >= 2, "data.modulus",
        f"must be an int >= 2, got {d.modulus!r}")
  require(is_finite_number(d.train_fraction) and 0 < d.train_fraction < 1, "data.train_fraction",
        f"must be in (0, 1), got {d.train_fraction!r}")
  if is_int(d.modulus):
    n_train = int(d.train_fraction * d.modulus ** 2)
    require(1 <= n_train < d.modulus ** 2, "data.train_fraction",
          f"gives {n_train} training pairs of {d.modulus ** 2}; need at least one of each split")
  m = config.model
  for f in ("width", "num_heads", "mlp_dim"):
    require(is_int(m[f]) and m[f] >= 1, f"model.{f}", f"must be a positive int, got {m[f]!r}")
  require(m.width % m.num_heads == 0, "model.num_heads",
        f"must divide model.width={m.width}, got {m.num_heads}")
  require(m.init_npz is None or (isinstance(m.init_npz, str) and m.init_npz), "model.init_npz",
          f"must be None or the path of an .npz file, got {m.init_npz!r}")
  o = config.optimizer
  require(is_finite_number(o.learning_rate) and o.learning_rate > 0, "optimizer.learning_rate",
        f"must be > 0, got {o.learning_rate!r}")
  require(is_finite_number(o.weight_decay) and o.weight_decay >= 0, "optimizer.weight_decay",
        f"must be >= 0, got {o.weight_decay!r}")
  for f in ("b1", "b2"):
    require(is_finite_number(o[f]) and 0 <= o[f] < 1, f"optimizer.{f}",
            f"must be in [0, 1), got {o[f]!r}")
  require(is_finite_number(o.eps) and o.eps > 0, "optimizer.eps", f"must be > 0, got {o.eps!r}")
  t = config.train
  for f in ("epochs", "chunk_epochs", "test_every", "num_seeds", "keep_checkpoints"):
    require(is_int(t[f]) and t[f] >= 1, f"train.{f}", f"must be a positive int, got {t[f]!r}")
  require(is_int(config.seed) and config.seed >= 0, "seed",
        f"must be an int >= 0, got {config.seed!r}")
  s = config.sensitivity
  require(is_finite_number(s.sigma) and s.sigma >= 0, "sensitivity.sigma",
        f"must be a standard deviation >= 0, got {s.sigma!r}")
  pos = list(s.positions)
  require(pos and all(is_int(p) and 0 <= p < choices.GROKKING_SEQ_LEN for p in pos) and len(set(pos)) == len(pos),
        "sensitivity.positions", f"must be distinct positions in [0, {choices.GROKKING_SEQ_LEN}) "
        f"(0 = a, 1 = b, 2 = '='), got {pos!r}")
  r = config.report
  require(is_int(r.window) and r.window >= 1, "report.window",
        f"must be a positive int, got {r.window!r}")
  th = r.grok_thresholds
  require(isinstance(th, (tuple, list)) and th and len(set(th)) == len(th)
          and all(is_finite_number(x) and 0 < x <= 1 for x in th), "report.grok_thresholds",
          f"must be distinct test accuracies in (0, 1] (the first gives grok_epoch), got {th!r}")
  require(is_finite_number(r.fall_fraction) and 0 < r.fall_fraction < 1, "report.fall_fraction",
        f"must be in (0, 1), got {r.fall_fraction!r}")
  require(all(is_int(e) and e >= 0 for e in r.markers), "report.markers",
        f"must be epochs (ints >= 0), got {list(r.markers)!r}")
