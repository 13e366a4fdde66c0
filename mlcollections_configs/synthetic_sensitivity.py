"""One self-attention layer vs MLPs on synthetic token tasks; the generating rule's own
sensitivity as the yardstick; which part of the layer carries the low sensitivity; and the
Boolean spectral bias.

Vasudeva et al., "Transformers Learn Low Sensitivity Functions", ICLR 2025 (arXiv
2403.06925) §2–§3.1; set-up and results in docs/results.md. Of the paper's synthetic
experiment only the outline is known (a single attention layer with a linear decoder U; a
vocabulary of frequent and sparse tokens, the sparse ones made uninformative: a reviewer's
paraphrase). The "vocab" tasks follow that outline with details of ours; the "sparse" task
is entirely ours (see xsens/studies/synthetic_sensitivity.py and
xsens/data/sparse_tokens.py).

  xsens --config=mlcollections_configs/synthetic_sensitivity.py --workdir=workdirs/synthetic
  xsens --config=mlcollections_configs/synthetic_sensitivity.py:smoke --workdir=workdirs/syn_smoke
  xsens --config=mlcollections_configs/synthetic_sensitivity.py:sparse --workdir=...
  xsens --config=mlcollections_configs/synthetic_sensitivity.py:vocab --workdir=...
  xsens --config=mlcollections_configs/synthetic_sensitivity.py:boolean --workdir=...
  xsens --config=mlcollections_configs/synthetic_sensitivity.py:parity --workdir=...
  xsens --config=mlcollections_configs/synthetic_sensitivity.py:matched_loss=0.01 --workdir=...

Variants:
- default (CPU): all parts,
  3 seeds (`num_seeds`), the six models of
  `models` (attention, the big MLP, the MLP with the attention layer's parameter count,
  the attention layer with W_Q W_Kᵀ / W_V / U frozen at init) on the three token tasks
  ("sparse": ours; "vocab_uninformative": the paper's set-up as known; "vocab_informative":
  our control), attention and the big MLP on the Boolean task.
- `sparse` / `vocab` / `boolean`: only that part. `parity`: the sparse label is the parity
  of the k relevant signs instead of their majority. `matched_loss=0.01`: train every
  model until the train loss is also <= 0.01 (matched margins, not only matched accuracy).
- `smoke`: seconds; what the tests run.

Shows: results.md with, per task, model and σ, mean ± s.e. over seeds of steps to the
matched train accuracy, test accuracy, token-wise sensitivity (mean, per token group) and
the generating rule's own flip rate at the same σ (the yardstick); a table of the step at
which each Boolean component (degree 1, 2, 3) reaches 50 % / 90 % of its coefficient;
plots of the per-position sensitivity, sensitivity vs σ, and the learned coefficients and
degree spectrum W^k over training.
"""

import ml_collections

from xsens.config_utils import parse_arg


def get_config(arg=None):
  arg = parse_arg(arg, smoke=False, sparse=False, vocab=False, boolean=False, parity=False,
                  matched_loss=0.0)
  config = ml_collections.ConfigDict()
  config.study = "synthetic_sensitivity"
  config.seed = 0           # Seeds seed, seed + 1, ..., seed + num_seeds - 1.
  config.num_seeds = 3
  config.models = ("attention", "mlp", "mlp_matched", "attention_freeze_qk",
                   "attention_freeze_v", "attention_freeze_u")

  config.attention = ml_collections.ConfigDict({
      "qk_dim": ml_collections.FieldReference(None, field_type=int),
      "v_dim": ml_collections.FieldReference(None, field_type=int),
      "learning_rate": 1e-2})
  config.mlp = ml_collections.ConfigDict({"hidden_dims": (256, 256), "learning_rate": 1e-3})
  # One hidden layer, its width chosen per task to match the attention layer's parameters.
  config.mlp_matched = ml_collections.ConfigDict({"learning_rate": 1e-2})

  s = config.sparse = ml_collections.ConfigDict()
  s.enabled = True
  s.n = 16                  # tokens
  s.m = 8                   # content dims per token (d = m + n)
  s.k = 3                   # relevant tokens
  s.rule = "majority"
  s.position_scale = 1.0
  s.num_train = 512
  s.num_test = 2000
  s.target_train_accuracy = 1.0
  # Optional second criterion (matched margin): also train loss <= this; None = off.
  s.target_train_loss = ml_collections.FieldReference(None, field_type=float)
  s.max_steps = 4000
  s.eval_every = 25
  s.sigmas = (0.1, 0.2, 0.4)
  s.num_draws = 8

  # The paper's set-up as far as it is known (frequent + sparse tokens); details ours.
  v = config.vocab = ml_collections.ConfigDict()
  v.enabled = True
  v.cues = ("uninformative", "informative")   # The paper's (as known), our control.
  v.num_frequent = 8
  v.num_sparse = 32
  v.dim = 16
  v.n = 16
  v.sparse_per_sequence = 2
  v.num_train = 512
  v.num_test = 2000
  v.target_train_accuracy = 1.0
  v.target_train_loss = ml_collections.FieldReference(None, field_type=float)
  v.max_steps = 4000
  v.eval_every = 25
  v.sigmas = (0.1, 0.2, 0.3)   # Rule flip rate <= ~2 % (docs/results.md).
  v.num_draws = 8

  b = config.boolean = ml_collections.ConfigDict()
  b.enabled = True
  b.models = ("attention", "mlp")
  b.n = 10
  # f* = x0 + x1·x2 + x3·x4·x5: one monomial of each degree 1, 2, 3, equal weights.
  b.components = (((0,), 1.0), ((1, 2), 1.0), ((3, 4, 5), 1.0))
  b.position_scale = 1.0
  b.train_fraction = 1.0
  b.steps = 2000
  b.log_every = 10
  b.learned_fraction = 0.9

  if arg.sparse or arg.vocab or arg.boolean:
    s.enabled, v.enabled, b.enabled = arg.sparse, arg.vocab, arg.boolean
  if arg.parity:
    s.rule = "parity"
  if arg.matched_loss:
    s.target_train_loss = arg.matched_loss
    v.target_train_loss = arg.matched_loss
  if arg.smoke:
    config.num_seeds = 2
    config.models = ("attention", "mlp_matched", "attention_freeze_qk")
    config.mlp.hidden_dims = (32,)
    s.n, s.m, s.k = 6, 4, 3
    s.num_train, s.num_test = 64, 64
    s.max_steps, s.eval_every = 40, 10
    s.sigmas = (0.2, 0.4)
    s.num_draws = 2
    v.num_frequent, v.num_sparse, v.dim, v.n = 4, 4, 10, 6   # Tokens [6, 10], as "sparse".
    v.sparse_per_sequence = 1
    v.num_train, v.num_test = 64, 64
    v.max_steps, v.eval_every = 40, 10
    v.sigmas = (0.2,)
    v.num_draws = 2
    b.n = 6
    b.steps, b.log_every = 40, 10
  return config
