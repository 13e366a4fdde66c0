"""One self-attention layer vs an MLP: sparse-token sensitivity and Boolean spectral bias.

Vasudeva et al., "Transformers Learn Low Sensitivity Functions", ICLR 2025 (arXiv
2403.06925) §2–§3.1; set-up in docs/results.md. The paper's synthetic
data model and settings are not known; the tasks here are ours (see
xsens/studies/synthetic_sensitivity.py and xsens/data/sparse_tokens.py).

  xsens --config=mlcollections_configs/synthetic_sensitivity.py --workdir=workdirs/synthetic
  xsens --config=mlcollections_configs/synthetic_sensitivity.py:smoke --workdir=/tmp/syn_smoke
  xsens --config=mlcollections_configs/synthetic_sensitivity.py:sparse --workdir=...
  xsens --config=mlcollections_configs/synthetic_sensitivity.py:boolean --workdir=...
  xsens --config=mlcollections_configs/synthetic_sensitivity.py:parity --workdir=...

Variants:
- default (CPU, about a minute): both parts, seed 0.
- `sparse` / `boolean`: only that part. `parity`: the sparse label is the parity of the k
  relevant signs instead of their majority. `matched_loss=0.01`: train both models until
  the train loss is also <= 0.01 (matched margins, not only matched accuracy).
- `smoke`: seconds; what the tests run.

Shows: results.md with, per model and σ, steps to the matched train accuracy, test
accuracy, token-wise sensitivity (mean, on the k relevant tokens, on the others); a table
of the step at which each Boolean component (degree 1, 2, 3) reaches 50 % / 90 % of its
coefficient; plots of the per-position sensitivity, sensitivity vs σ, and the learned
coefficients and degree spectrum W^k over training.
"""

import ml_collections

from xsens.config_utils import parse_arg


def get_config(arg=None):
  arg = parse_arg(arg, smoke=False, sparse=False, boolean=False, parity=False,
                  matched_loss=0.0)
  config = ml_collections.ConfigDict()
  config.study = "synthetic_sensitivity"
  config.seed = 0
  config.models = ("attention", "mlp")

  config.attention = ml_collections.ConfigDict({
      "qk_dim": ml_collections.FieldReference(None, field_type=int),
      "v_dim": ml_collections.FieldReference(None, field_type=int),
      "learning_rate": 1e-2})
  config.mlp = ml_collections.ConfigDict({"hidden_dims": (256, 256), "learning_rate": 1e-3})

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

  b = config.boolean = ml_collections.ConfigDict()
  b.enabled = True
  b.n = 10
  # f* = x0 + x1·x2 + x3·x4·x5: one monomial of each degree 1, 2, 3, equal weights.
  b.components = (((0,), 1.0), ((1, 2), 1.0), ((3, 4, 5), 1.0))
  b.position_scale = 1.0
  b.train_fraction = 1.0
  b.steps = 2000
  b.log_every = 10
  b.learned_fraction = 0.9

  if arg.sparse:
    b.enabled = False
  if arg.boolean:
    s.enabled = False
  if arg.parity:
    s.rule = "parity"
  if arg.matched_loss:
    s.target_train_loss = arg.matched_loss
  if arg.smoke:
    config.mlp.hidden_dims = (32,)
    s.n, s.m, s.k = 6, 4, 3
    s.num_train, s.num_test = 64, 64
    s.max_steps, s.eval_every = 40, 10
    s.sigmas = (0.2, 0.4)
    s.num_draws = 2
    b.n = 6
    b.steps, b.log_every = 40, 10
  return config
