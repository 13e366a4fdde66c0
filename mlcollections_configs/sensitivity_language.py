"""Token-wise sensitivity of language models: RoBERTa vs GPT-2 vs LSTM over training.

"Transformers Learn Low Sensitivity Functions" (ICLR 2025, arXiv 2403.06925), §5.

  xsens --config=mlcollections_configs/sensitivity_language.py --workdir=workdirs/sens_lang
  xsens --config=mlcollections_configs/sensitivity_language.py:smoke --workdir=workdirs/sl_smoke
  xsens --config=mlcollections_configs/sensitivity_language.py:setup=mrpc \
        --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/sl_mrpc

Set-ups (`setup=`):
- `synthetic` (default, offline, CPU): the synthetic sentiment
  language of `xsens.data.text` (labels set by 1 or 3 adjectives, possibly negated,
  anywhere in a sentence of 5-24 words); 2-layer, width-64 RoBERTa, GPT-2 and LSTM, each
  trained 1500 steps of batch 32 (all reach >= 0.99 train accuracy); a report every 100
  steps on 256 fixed training examples.
- `mrpc`, `qqp`: the paper's GLUE tasks from TFDS in `data_dir` (never downloaded), with a
  BPE tokenizer trained on the training split; the paper's models (4 layers, width 256,
  8 heads, RoBERTa intermediate 3072), max length 128, batch 32, AdamW lr 1e-4,
  StepLR(γ 0.9 per epoch), 100 epochs, R = 3, σ² = 15, and "RoBERTa (ReLU)" too
  (GPU/TPU-sized; docs/papers/sensitivity.md §8).
Add `relu` to also train RoBERTa with ReLU attention on the synthetic set-up.

Variants (comma-separated, combinable):
- `task=weak_sum`: the second synthetic language (`xsens.data.text.weak_sum_sentences`):
  label = sign of the sum of seeded weak scores of ~13 content words per sentence
  (margin 0.5: |sum| / sqrt(#content words) >= 0.5; `margin=`, `label_noise=` set them),
  so the evidence is spread over the whole sentence. Default `task=polarity`.
- `seeds=N`: N training seeds per run (`config.num_seeds`; init, order and dropout seeds
  shifted, data unchanged); results.md adds mean ± s.e. over the seeds.
- `target=ACC`: matched train accuracy: each run trains until its accuracy on 1024
  training examples (checked every 100 steps) is >= ACC, at most `steps=` steps (default
  3000); without it every run trains the fixed 1500 steps (`steps=` also sets that).
- `placement=before_norm`: noise before the embedding LayerNorm (on the raw embedding
  sum; GPT-2, without one, is unchanged) instead of after it (the paper's).
- `official_lstm`: adds the run `lstm_official`, the official code's LSTM as released:
  embedding, LayerNorm and head frozen at initialisation, only the LSTM layers train
  (docs/papers/sensitivity.md §8 defect 5; `model.official_frozen`).
- `noise_scale=token_rms`: σ in units of each model's clean-token RMS.
- `only=lstm+roberta`: keep only these runs (e.g. to train the models of one study in
  parallel processes, one workdir each).

Shows: results.md with, per model, train/test accuracy, token-wise sensitivity (pooled,
per-sentence mean, content tokens only), global sensitivity and the recency ratio,
sensitivity_vs_examples.png (sensitivity and accuracy over training) and
sensitivity_per_position.png (flip probability by position from the sequence end). The
paper's claim: transformers have lower, position-uniform sensitivity; LSTMs are more
sensitive to recent tokens.
"""

import math

import ml_collections

from mlcollections_configs import common
from xsens import choices
from xsens.config_utils import parse_arg
from xsens.data import text_config as text
from xsens.errors import ConfigError, is_finite_number, is_int

SETUPS = ("synthetic", "mrpc", "qqp")
_GLUE_TRAIN = {"mrpc": 3668, "qqp": 363846}
# Where the noise enters (`xsens.studies.sensitivity_language.NOISE_PLACEMENTS`).
NOISE_PLACEMENTS = ("after_norm", "before_norm")


def _runs(vocab_size: int, max_length: int, width: int, depth: int, heads: int,
          mlp_dim: int, roberta_mlp_dim: int, relu: bool, official_lstm: bool = False
          ) -> ml_collections.ConfigDict:
  shared = dict(vocab_size=vocab_size, width=width, depth=depth, dropout_rate=0.1)
  runs = {
      "roberta": dict(name="roberta", max_length=max_length, num_heads=heads,
                      mlp_dim=roberta_mlp_dim, **shared),
      "gpt2": dict(name="gpt2", max_length=max_length, num_heads=heads, mlp_dim=mlp_dim,
                   **shared),
      "lstm": dict(name="lstm", hidden_dim=width, **shared),
  }
  if relu:
    runs["roberta_relu"] = dict(runs["roberta"], attention="relu")
  if official_lstm:
    runs["lstm_official"] = dict(runs["lstm"], official_frozen=True)
  return ml_collections.ConfigDict(
      {name: {"model": common.model_config(**m)} for name, m in runs.items()})


def get_config(arg=None):
  arg = parse_arg(arg, setup="synthetic", smoke=False, relu=False, task="polarity",
                  margin=0.5, label_noise=0.0, seeds=1, target=0.0, steps=0,
                  placement="after_norm", official_lstm=False, noise_scale="absolute",
                  only="")
  config = common.multi_run_config("sensitivity_language", arg.setup, SETUPS)
  config.num_seeds = arg.seeds  # Training seeds per run (xsens.lab.multirun.run_ids).
  c = config.train
  c.data = text.default_text_data_config()
  c.optimizer.name = "adamw"
  c.optimizer.weight_decay = 0.01
  c.batch_size = 32
  c.eval_batch_size = 512

  sc = config.sensitivity = ml_collections.ConfigDict()
  sc.seed = 0
  # The code's --embedding_noise_variance 15 is a variance (docs/papers/sensitivity.md §8): σ = √15
  # ≈ 3.87.
  sc.sigma = math.sqrt(15.0)
  sc.num_draws = 2              # Draws per position at each report during training.
  sc.final_num_draws = 3        # The code's replace_size R = 3, for the final models.
  sc.global_sigma = 1.0         # The code's LSTM QQP global runs (variance 1).
  sc.global_num_draws = 4
  sc.num_examples = 256         # Fixed training examples measured at every report.
  sc.every_steps = 100
  sc.batch_size = 64
  sc.chunk_size = ml_collections.FieldReference(None, field_type=int)
  sc.include_special_tokens = True
  # "absolute" (the paper's) or "token_rms": σ times the RMS coordinate of each model's
  # clean tokens (GPT-2's raw wte + wpe are far smaller than LayerNorm outputs).
  sc.noise_scale = arg.noise_scale
  # "after_norm" (the paper's) or "before_norm" (on the raw embedding sum).
  sc.noise_placement = arg.placement

  if arg.setup == "synthetic":
    c.data.name = text.SYNTHETIC
    c.data.max_length = text.synthetic_max_tokens(c.data.synthetic.max_clauses)
    c.optimizer.learning_rate = 1e-3
    # Fixed length: the task is learnt to ~0.99 train accuracy in a few hundred steps, and
    # sensitivity keeps moving after that (the paper trains 100 epochs).
    c.total_steps = 1500
    c.target_train_accuracy = None
    c.eval_every = 100
    c.eval_train_examples = 1024
    c.checkpoint_every = 1000
    c.data.synthetic.task = arg.task
    if arg.task != "polarity":
      c.data.synthetic.update({"margin": arg.margin, "label_noise": arg.label_noise})
    if arg.target:  # Matched train accuracy, at most `steps` (default 3000) steps.
      c.target_train_accuracy = arg.target
      c.total_steps = arg.steps or 3000
    elif arg.steps:
      c.total_steps = arg.steps
    config.runs = _runs(text.SYNTHETIC_VOCAB, c.data.max_length, width=64, depth=2, heads=4,
                        mlp_dim=128, roberta_mlp_dim=128, relu=arg.relu,
                        official_lstm=arg.official_lstm)
  else:
    c.data.name = f"glue/{arg.setup}"
    c.data.max_length = 128
    c.data.vocab_size = 8192
    c.optimizer.learning_rate = 1e-4
    c.optimizer.weight_decay = 0.01 if arg.setup == "mrpc" else 1e-4
    steps_per_epoch = _GLUE_TRAIN[arg.setup] // c.batch_size
    c.optimizer.schedule = "step"
    c.optimizer.step_every = steps_per_epoch
    c.optimizer.step_gamma = 0.9
    c.total_steps = None
    c.total_epochs = 100.0
    c.target_train_accuracy = None
    c.eval_every = steps_per_epoch
    c.eval_train_examples = 10000
    c.checkpoint_every = steps_per_epoch
    # The code's sets (docs/papers/sensitivity.md §8).
    sc.num_examples = 408 if arg.setup == "mrpc" else 640
    sc.chunk_size = 32   # (position, draw) pairs per forward: bounds memory at length 128.
    sc.every_steps = max(1, (500 if arg.setup == "mrpc" else 5000) // c.batch_size)
    sc.num_draws = 3
    config.runs = _runs(c.data.vocab_size, 128, width=256, depth=4, heads=8, mlp_dim=1024,
                        roberta_mlp_dim=3072, relu=True)

  if arg.smoke:
    c.data.name = text.SYNTHETIC
    c.data.max_length = text.synthetic_max_tokens(2)
    c.data.synthetic.update({"num_train": 128, "num_test": 64, "max_clauses": 2})
    c.data.synthetic.task = arg.task
    if arg.task != "polarity":
      c.data.synthetic.update({"margin": arg.margin, "label_noise": arg.label_noise})
    c.data.vocab_size = 8192
    c.total_steps = 4
    c.total_epochs = None
    c.target_train_accuracy = None
    c.optimizer.schedule = "constant"
    c.eval_every = 2
    c.eval_train_examples = None
    c.log_every = 2
    c.checkpoint_every = 2
    c.eval_batch_size = 128
    c.progress = False
    sc.num_examples = 12
    sc.every_steps = 2
    sc.num_draws = 1
    sc.final_num_draws = 1
    sc.global_num_draws = 2
    sc.batch_size = 8
    if arg.target:
      c.target_train_accuracy = arg.target
      c.eval_train_examples = 128
    config.runs = _runs(text.SYNTHETIC_VOCAB, c.data.max_length, width=8, depth=1, heads=2,
                        mlp_dim=16, roberta_mlp_dim=16, relu=arg.relu,
                        official_lstm=arg.official_lstm)
  if arg.only:
    keep = arg.only.split("+")
    unknown = [k for k in keep if k not in config.runs]
    if unknown:
      raise ValueError(f"unknown run {unknown[0]!r} in only=; allowed: "
                       f"{', '.join(config.runs)}")
    config.runs = ml_collections.ConfigDict({k: config.runs[k].to_dict() for k in keep})
  return config


def validate(config) -> None:
  """ConfigError for a bad field of `config.sensitivity`; the runs (text models on a text
  dataset) and `sensitivity.num_examples` against their training examples are checked by
  the study."""
  sc = config.sensitivity
  for field in ("sigma", "global_sigma"):
    if not (is_finite_number(sc[field]) and sc[field] >= 0):
      raise ConfigError(f"sensitivity.{field}", f"must be a standard deviation >= 0, got "
                        f"{sc[field]!r}")
  for field in ("num_draws", "final_num_draws", "global_num_draws", "num_examples",
                "batch_size"):
    if not isinstance(sc[field], int) or isinstance(sc[field], bool) or sc[field] < 1:
      raise ConfigError(f"sensitivity.{field}", f"must be an int >= 1, got {sc[field]!r}")
  if not isinstance(sc.every_steps, int) or sc.every_steps < 0:
    raise ConfigError("sensitivity.every_steps", f"must be an int >= 0 (0: only before "
                      f"and after training), got {sc.every_steps!r}")
  if sc.chunk_size is not None and not (is_int(sc.chunk_size) and sc.chunk_size >= 1):
    raise ConfigError("sensitivity.chunk_size", f"must be an int >= 1 or None, got "
                      f"{sc.chunk_size!r}")
  if sc.noise_scale not in choices.NOISE_SCALES:
    raise ConfigError("sensitivity.noise_scale", f"unknown value {sc.noise_scale!r}; "
                      f"allowed: {', '.join(choices.NOISE_SCALES)}")
  if not isinstance(sc.include_special_tokens, bool):
    raise ConfigError("sensitivity.include_special_tokens",
                      f"must be True or False, got {sc.include_special_tokens!r}")
  if sc.noise_placement not in NOISE_PLACEMENTS:
    raise ConfigError("sensitivity.noise_placement", f"unknown value {sc.noise_placement!r}; "
                      f"allowed: {', '.join(NOISE_PLACEMENTS)}")
