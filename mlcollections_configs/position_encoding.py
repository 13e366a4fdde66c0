"""DIET position encodings: position at the input vs per-head terms on the attention logits.

"A Simple and Effective Positional Encoding for Transformers" (Chen et al., EMNLP 2021,
arXiv 2104.08698); results in docs/results.md.

  xsens --config=mlcollections_configs/position_encoding.py --workdir=workdirs/position
  xsens --config=mlcollections_configs/position_encoding.py:smoke --workdir=workdirs/pe_smoke
  xsens --config=mlcollections_configs/position_encoding.py:setup=glue \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/pe_glue
  xsens --config=mlcollections_configs/position_encoding.py:diet_dims=all --workdir=workdirs/pe_dp
  xsens --config=mlcollections_configs/position_encoding.py:pretrain=1 --workdir=workdirs/pe_pt

Set-ups (`setup=`):
- `synthetic` (default, offline, CPU): a
  small RoBERTa-style encoder (2 layers, width 32, 8 heads, so d_h = 4; 2000 steps of
  batch 64, AdamW 3e-3) trained from scratch on the pair task "match" of
  `xsens.data.pair_tasks` ("<s> A </s></s> B </s>" with 4 words each, L = 12, B a
  permutation of A: does token 2 of B equal token 2 of A), for six position modes (all
  of `xsens.choices.POSITION_ENCODINGS` but "sinusoidal"), 5 training seeds each (30 runs;
  seeds are bimodal, so the report gives the fraction that learns beside the mean).
  `tasks=match+sentiment` adds the synthetic sentiment language (L = 26).
- `glue`: MRPC, QQP and RTE from TFDS in `data_dir` (never downloaded; BPE tokenizer
  trained offline), a 4-layer width-256 encoder, max length 128 (GPU/TPU-sized), each
  run pre-trained with the masked LM first (as the paper pre-trains BERT), on its own
  task's training sentences with the labels dropped (`pretrain.corpus="train_inputs"`:
  the corpora shipped with the package have their own vocabularies, not the BPE one).

Variants (comma-separated): `modes=none+absolute+diet_abs` keeps only these modes,
`tasks=reversed+match` these tasks, `seeds=N` training seeds per run, `steps=N` training
steps; `diet_dims=all` (or `diet_dims=4+64`) one DIET-ABS run per d_p in {4, 16, 64}
(`model.diet_dim`; DIET-REL has no d_p); `pretrain=1` pre-trains every run with the
masked LM (`config.pretrain`: the unlabeled sentences of all three pair tasks,
`xsens.data.pair_tasks.unlabeled_corpus`) before fine-tuning it on its task from that
checkpoint (`pretrain_steps=N` sets the pre-training steps and turns it on). Shows: results.md with test accuracy mean ± s.e. per (task, mode), parameters,
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
                  "baseline_mode", "learn_threshold")
DIET_DIMS = (4, 16, 64)                 # `diet_dims=all`: DIET-ABS's d_p sweep.
PRETRAIN_CORPORA = ("pair_tasks", "train_inputs")
PRETRAIN_FIELDS = ("steps", "batch_size", "mask_rate", "corpus", "num_examples",
                   "optimizer")


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
      # A seed "learns" when its test accuracy >= this (runs end either near chance or
      # >= 0.95 on the pair tasks; 0.9 lies in the gap).
      "learn_threshold": 0.9,
  })


def pretrain_config(steps: int = 0) -> ml_collections.ConfigDict:
  """`config.pretrain`: the masked-LM pre-training of every run's encoder (0 steps: off).

  Each run id (mode and seed) pre-trains a `xsens.models.mlm.RobertaMLM` with its own
  position encoding on `corpus` ("pair_tasks": `num_examples` unlabeled sentences of all
  three pair tasks; "train_inputs": the run's training inputs without labels), hiding
  each word token with probability `mask_rate` behind <unk> (`pair_tasks.MASK_ID`),
  then fine-tunes from that checkpoint (`train.pretrained`, head new).
  """
  return ml_collections.ConfigDict({
      "steps": steps, "batch_size": 64, "mask_rate": 0.15, "corpus": "pair_tasks",
      "num_examples": 12288,
      "optimizer": common.optimizer_config("adamw", 3e-3, weight_decay=0.01)})


def _diet_dims(names: str) -> list[int | None]:
  """[None] (d_p = d_h) or the d_p of `diet_dims=` ("all" or "4+16")."""
  if not names:
    return [None]
  if names == "all":
    return list(DIET_DIMS)
  try:
    dims = [int(d) for d in names.split("+")]
  except ValueError:
    dims = [0]
  if min(dims) < 1:
    raise ValueError(f"diet_dims={names!r}: use 'all' or ints >= 1 joined by '+'")
  return dims


def _run_names(task: str, mode: str, dims: list[int | None]) -> dict[str, int | None]:
  """{run name: DIET-ABS d_p (None: d_h)} of one (task, mode)."""
  if mode != "diet_abs" or dims == [None]:
    return {f"{task}_{mode}": None}
  return {f"{task}_{mode}_dp{d:02d}": d for d in dims}


def get_config(arg=None):
  arg = parse_arg(arg, setup="synthetic", smoke=False, modes="", tasks="", seeds=5,
                  steps=0, diet_dims="", pretrain=False, pretrain_steps=0)
  config = common.multi_run_config("position_encoding", arg.setup, SETUPS,
                                   target_train_accuracy=None)
  config.num_seeds = arg.seeds
  config.position_encoding = measure_config()
  config.pretrain = pretrain_config(
      arg.pretrain_steps or ((2000 if arg.setup == "synthetic" else 20000)
                             if arg.pretrain or arg.setup == "glue" else 0))
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
    config.pretrain.corpus = "train_inputs"
    config.pretrain.batch_size = 32
    config.pretrain.optimizer.learning_rate = 1e-4
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
    config.pretrain.update({"steps": 4 if config.pretrain.steps else 0, "batch_size": 16,
                            "num_examples": 64})
  dims = _diet_dims(arg.diet_dims)
  config.runs = ml_collections.ConfigDict({
      name: {"model": common.model_config("roberta", position=mode, diet_dim=d_p, **model),
             "data": _task_data(task_names[task], arg.setup)}
      for task in tasks for mode in modes
      for name, d_p in _run_names(task, mode, dims).items()})
  return config


def _block(config, name: str, fields, maker: str):
  """`config.<name>`, or a ConfigError naming the missing block or its missing field (the
  block comes from this file's `maker`)."""
  block = config.get(name)
  if block is None:
    raise ConfigError(name, f"missing; start from mlcollections_configs/position_encoding.py "
                      f"{maker}")
  for field in fields:
    if field not in block:
      raise ConfigError(f"{name}.{field}", "missing")
  return block


def validate(config) -> None:
  """ConfigError naming `position_encoding.<field>`; the runs' models are checked by the
  study (a RoBERTa on the einsum path)."""
  pc = _block(config, "position_encoding", MEASURE_FIELDS, "measure_config()")
  for field in ("rank_examples", "timing_batch", "timing_repeats"):
    if not (is_int(pc[field]) and pc[field] >= 1):
      raise ConfigError(f"position_encoding.{field}", f"must be an int >= 1, got "
                        f"{pc[field]!r}")
  if not (is_finite_number(pc.rank_rtol) and 0 < pc.rank_rtol < 1):
    raise ConfigError("position_encoding.rank_rtol", f"must be a number in (0, 1), got "
                      f"{pc.rank_rtol!r}")
  if not (is_finite_number(pc.learn_threshold) and 0 < pc.learn_threshold <= 1):
    raise ConfigError("position_encoding.learn_threshold", f"must be a number in (0, 1] "
                      f"(test accuracy), got {pc.learn_threshold!r}")
  validate_pretrain(config)
  modes = {run_config(config, name).model.position for name in config.runs}
  if pc.baseline_mode not in modes:
    raise ConfigError("position_encoding.baseline_mode", f"{pc.baseline_mode!r} is the "
                      f"mode of no run; allowed: {', '.join(sorted(modes))}")


def validate_pretrain(config) -> None:
  """ConfigError naming `pretrain.<field>` (the optimizer block is checked by the study)."""
  p = _block(config, "pretrain", PRETRAIN_FIELDS, "pretrain_config()")
  if not (is_int(p.steps) and p.steps >= 0):
    raise ConfigError("pretrain.steps", f"must be an int >= 0 (0: no pre-training), got "
                      f"{p.steps!r}")
  for field in ("batch_size", "num_examples"):
    if not (is_int(p[field]) and p[field] >= 1):
      raise ConfigError(f"pretrain.{field}", f"must be an int >= 1, got {p[field]!r}")
  if not (is_finite_number(p.mask_rate) and 0 < p.mask_rate < 1):
    raise ConfigError("pretrain.mask_rate", f"must be a number in (0, 1) (the share of "
                      f"word tokens hidden), got {p.mask_rate!r}")
  if p.corpus not in PRETRAIN_CORPORA:
    raise ConfigError("pretrain.corpus", f"unknown corpus {p.corpus!r}; allowed: "
                      f"{', '.join(PRETRAIN_CORPORA)}")
  if p.steps and p.corpus == "pair_tasks":
    for name in config.runs:
      data = run_config(config, name).data
      if data.name not in ("text/pair_reversed", "text/pair_rotation", "text/pair_match"):
        raise ConfigError("pretrain.corpus", f"'pair_tasks' writes pair-task ids, which "
                          f"run {name!r} (data.name={data.name!r}) does not read; use "
                          "'train_inputs'")
