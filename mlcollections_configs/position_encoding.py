"""DIET position encodings: position at the input vs per-head terms on the attention logits.

"A Simple and Effective Positional Encoding for Transformers" (Chen et al., EMNLP 2021,
arXiv 2104.08698); results in docs/results.md.

  xsens --config=mlcollections_configs/position_encoding.py --workdir=workdirs/position
  xsens --config=mlcollections_configs/position_encoding.py:smoke --workdir=workdirs/pe_smoke
  xsens --config=mlcollections_configs/position_encoding.py:setup=glue \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/pe_glue

Set-ups (`setup=`):
- `synthetic` (default, offline, CPU; 18 runs): a
  small RoBERTa-style encoder (2 layers, width 32, 8 heads, so d_h = 4; 2000 steps of
  batch 64, AdamW 3e-3) trained from scratch on the pair task "match" of
  `xsens.data.pair_tasks` ("<s> A </s></s> B </s>" with 4 words each, L = 12, B a
  permutation of A: does token 2 of B equal token 2 of A), for six position modes (all
  of `xsens.choices.POSITION_ENCODINGS` but "sinusoidal"), 3 training seeds each.
  `tasks=match+sentiment` adds the synthetic sentiment language (L = 26).
- `glue`: MRPC, QQP and RTE from TFDS in `data_dir` (never downloaded; BPE tokenizer
  trained offline), a 4-layer width-256 encoder, max length 128 (GPU/TPU-sized; the
  paper pre-trains BERT-BASE with MLM first, which we do not).

Variants (comma-separated): `modes=none+absolute+diet_abs` keeps only these modes,
`tasks=reversed+match` these tasks, `seeds=N` training seeds per run, `steps=N` training
steps. Shows: results.md with test accuracy mean ± s.e. per (task, mode), parameters,
forward FLOPs (XLA cost analysis) and train-step time per mode with ratios to the input-PE
("absolute") model, the numerical rank of the attention logits per mode (Theorem 1), and
plots accuracy.png, diet_abs_maps.png (P_Q P_Kᵀ per head), diet_rel_maps.png (the
Toeplitz R_{i−j} per head). The paper's anchors: GLUE average 84.8 (input PE) vs 85.2
(DIET-ABS, DIET-REL); step time +0–1 % for DIET vs +13–65 % for Shaw et al.
"""

import ml_collections

from mlcollections_configs import common
from xsens import choices
from xsens.config_utils import parse_arg, run_config
from xsens.data import text_config as text
from xsens.errors import ConfigError, is_finite_number, is_int

SETUPS = ("synthetic", "glue")
SYNTHETIC_TASKS = {"reversed": "text/pair_reversed", "rotation": "text/pair_rotation",
                   "match": "text/pair_match", "sentiment": text.SYNTHETIC}
GLUE_TASKS = {"mrpc": "glue/mrpc", "qqp": "glue/qqp", "rte": "glue/rte"}
# The CPU default: the pair task "match", six modes, 3 seeds;
# `tasks=`, `modes=` add "sentiment", "reversed", "rotation" and "sinusoidal".
DEFAULT_TASKS = {"synthetic": "match"}
PAIR_LENGTH = 12
DEFAULT_MODES = "none+absolute+shaw+t5+diet_abs+diet_rel"
MEASURE_FIELDS = ("rank_examples", "rank_rtol", "timing_batch", "timing_repeats",
                  "baseline_mode")


def _pick(names: str, allowed: dict | tuple, what: str) -> list[str]:
  keep = list(allowed) if not names else names.split("+")
  unknown = [k for k in keep if k not in allowed]
  if unknown:
    raise ValueError(f"unknown {what} {unknown[0]!r}; allowed: {', '.join(allowed)}")
  return keep


def _task_data(name: str, setup: str) -> dict:
  """A run's data overrides: the pair tasks use m = 4 words per sentence (L = 12)."""
  if setup == "synthetic" and name.startswith("text/pair_"):
    return {"name": name, "max_length": PAIR_LENGTH}
  return {"name": name}


def measure_config() -> ml_collections.ConfigDict:
  """`config.position_encoding`: what the study measures after training."""
  return ml_collections.ConfigDict({
      "rank_examples": 64,      # Test examples whose logit ranks are measured.
      "rank_rtol": 1e-4,        # Singular values above rtol · the largest count.
      "timing_batch": 64,       # Batch of the FLOP count and the step-time measurement.
      "timing_repeats": 20,     # Best of this many timed train steps (loss + grads).
      "baseline_mode": "absolute",
  })


def get_config(arg=None):
  arg = parse_arg(arg, setup="synthetic", smoke=False, modes="", tasks="", seeds=3,
                  steps=0)
  config = common.multi_run_config("position_encoding", arg.setup, SETUPS,
                                   target_train_accuracy=None)
  config.num_seeds = arg.seeds
  config.position_encoding = measure_config()
  c = config.train
  c.data = text.default_text_data_config()
  c.optimizer.name = "adamw"
  c.optimizer.weight_decay = 0.01
  c.checkpoint_every = 100000
  c.progress = False
  if arg.setup == "synthetic":
    task_names = SYNTHETIC_TASKS
    c.data.max_length = text.synthetic_max_tokens(c.data.synthetic.max_clauses)  # 26.
    c.data.synthetic.update({"num_train": 4096, "num_test": 512})
    c.optimizer.learning_rate = 3e-3
    c.batch_size = 64
    c.total_steps = arg.steps or 2000
    # d_h = 4: Theorem 1 caps input-PE logits at rank 4 of L = 12 (pair tasks).
    model = dict(vocab_size=text.SYNTHETIC_VOCAB, max_length=c.data.max_length, width=32,
                 depth=2, num_heads=8, mlp_dim=64, dropout_rate=0.0)
  else:
    task_names = GLUE_TASKS
    c.data.max_length = 128
    c.data.vocab_size = 8192
    c.optimizer.learning_rate = 1e-4
    c.batch_size = 32
    c.total_steps = arg.steps or 20000
    model = dict(vocab_size=c.data.vocab_size, max_length=128, width=256, depth=4,
                 num_heads=8, mlp_dim=1024, dropout_rate=0.1)
  c.eval_every = c.total_steps
  c.log_every = max(1, c.total_steps // 4)
  c.eval_batch_size = 512
  tasks = _pick(arg.tasks or DEFAULT_TASKS.get(arg.setup, ""), task_names, "task")
  modes = _pick(arg.modes or DEFAULT_MODES, choices.POSITION_ENCODINGS, "mode")
  if arg.smoke:
    tasks = _pick(arg.tasks or "match", task_names, "task")
    modes = _pick(arg.modes or "absolute+diet_abs+diet_rel", choices.POSITION_ENCODINGS, "mode")
    config.num_seeds = 1
    c.total_steps, c.eval_every, c.log_every, c.batch_size = 4, 4, 2, 16
    c.data.synthetic.update({"num_train": 64, "num_test": 32})
    model.update(width=8, depth=1, num_heads=2, mlp_dim=16)
    config.position_encoding.update({"rank_examples": 4, "timing_batch": 4,
                                     "timing_repeats": 1})
  config.runs = ml_collections.ConfigDict({
      f"{task}_{mode}": {"model": common.model_config("roberta", position=mode, **model),
                         "data": _task_data(task_names[task], arg.setup)}
      for task in tasks for mode in modes})
  return config


def validate(config) -> None:
  """ConfigError naming `position_encoding.<field>`; the runs' models are checked by the
  study (a RoBERTa on the einsum path)."""
  pc = config.get("position_encoding")
  if pc is None:
    raise ConfigError("position_encoding", "missing; start from "
                      "mlcollections_configs/position_encoding.py measure_config()")
  for field in MEASURE_FIELDS:
    if field not in pc:
      raise ConfigError(f"position_encoding.{field}", "missing")
  for field in ("rank_examples", "timing_batch", "timing_repeats"):
    if not (is_int(pc[field]) and pc[field] >= 1):
      raise ConfigError(f"position_encoding.{field}", f"must be an int >= 1, got "
                        f"{pc[field]!r}")
  if not (is_finite_number(pc.rank_rtol) and 0 < pc.rank_rtol < 1):
    raise ConfigError("position_encoding.rank_rtol", f"must be a number in (0, 1), got "
                      f"{pc.rank_rtol!r}")
  modes = {run_config(config, name).model.position for name in config.runs}
  if pc.baseline_mode not in modes:
    raise ConfigError("position_encoding.baseline_mode", f"{pc.baseline_mode!r} is the "
                      f"mode of no run; allowed: {', '.join(sorted(modes))}")
