"""Modifying memories in a masked LM: fine-tuning, replay, ℓ∞ / ℓ2-constrained and per-part edits.

Zhu et al., "Modifying Memories in Transformer Models" (arXiv 2012.00363); set-up in
xsens/studies/modify_memories.py and docs/results.md (modify_memories).

  xsens --config=mlcollections_configs/modify_memories.py --workdir=workdirs/modify_memories
  xsens --config=mlcollections_configs/modify_memories.py:smoke --workdir=workdirs/mm_smoke
  xsens --config=mlcollections_configs/modify_memories.py:sizes=all --workdir=...
  xsens --config=mlcollections_configs/modify_memories.py:phases --workdir=...
  xsens --config=mlcollections_configs/modify_memories.py:setup=lama,data_dir=PATH --workdir=...

Variants:
- default (CPU; scale chosen so pre-training reaches >= 95 % recall): a synthetic
  knowledge base of 200 subjects x 6 relations (1,200 facts; 3 many-to-one relations with
  5 objects, 3 with 20), 3 training templates and 2 held-out paraphrases per relation,
  2,000 background sentences; a RoBERTa MLM (width 64, depth 4, 4 heads, MLP 128, tied
  embeddings) pre-trained 2,000 steps (batch 128, 25 % background, Adam 2e-3 cosine);
  edits of |S| = 32 facts, 3 seeds, 50 full-batch Adam steps at lr in (3e-4, 1e-3,
  3e-3): fine-tuning, replay 1:1, ℓ∞ δ in (1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 3e-2), ℓ2 δ in
  (0.3, 1, 2, 4, 10), and each block / the embeddings / all attention / all feed-forward
  sublayers alone at ℓ∞ δ in (1e-2, 3e-2). Every setting (δ, part, lr) is chosen per
  method on the validation paraphrases (`eval.validation_templates`); the test
  paraphrases give the reported A_M, A_F\\S and Ā
  (1,000 subjects x 10 relations: `--config.data.synthetic.num_subjects=1000
  --config.data.synthetic.num_relations=10`, with more pre-training steps).
- `sizes=all`: |S| in (32, 128, 512) (with the full grid, hours on 2 CPU cores; docs/results.md
  gives the smaller grids it ran at 128 and 512).
- `phases`: adds a second training phase (2,000 steps of batches of 90 % background
  sentences, 10 % fact sentences: `phases.fact_fraction`) and repeats the edits from that
  model (the paper's question on training phases). With fact_fraction 0 the facts are
  forgotten (recall 0.014 after 2,000 steps, docs/results.md) and too few are known to edit.
- `setup=lama,data_dir=PATH`: LAMA / T-REx cloze data from PATH (layout in
  xsens/data/knowledge.py); the model is pre-trained on its evidence sentences.
- `smoke`: seconds; what the tests run.
- `seeds=N`, `steps=N` (edit steps), `pretrain_steps=N` override those fields.
- `lrs=A+B`: the edit learning rates (e.g. `lrs=0.001`, one rate: no lr sweep).
"""

import ml_collections

from mlcollections_configs import common
from xsens.config_utils import parse_arg
from xsens.data import knowledge
from xsens.errors import is_finite_number, is_int, require

SETUPS = ("synthetic", "lama")


def get_config(arg=None):
  arg = parse_arg(arg, smoke=False, sizes="", phases=False, setup="synthetic", data_dir="",
                  seeds=0, steps=0, pretrain_steps=0, lrs="")
  if arg.setup not in SETUPS:
    raise ValueError(f"unknown setup {arg.setup!r}; allowed: {', '.join(SETUPS)}")
  config = ml_collections.ConfigDict()
  config.study = "modify_memories"
  config.seed = 0

  d = config.data = ml_collections.ConfigDict()
  d.source = "synthetic"
  d.data_dir = ml_collections.FieldReference(None, field_type=str)
  s = d.synthetic = ml_collections.ConfigDict()
  s.num_subjects = 200
  s.num_relations = 6
  s.many_to_one_fraction = 0.5
  s.many_to_one_objects = 5
  s.objects_per_relation = 20
  s.num_train_templates = 3
  s.num_heldout_templates = 2
  d.lama = ml_collections.ConfigDict({"relations": (), "max_facts_per_relation": 0})
  d.background = ml_collections.ConfigDict({"num_train": 2000, "num_test": 500,
                                            "max_clauses": 2})

  m = config.model = ml_collections.ConfigDict()
  m.width = 64
  m.depth = 4
  m.num_heads = 4
  m.mlp_dim = 128

  p = config.pretrain = ml_collections.ConfigDict()
  p.steps = 2000
  p.batch_size = 128
  p.background_fraction = 0.25
  p.chunk_steps = 500
  p.target_recall = 0.95   # Reported: whether pre-training reached it.
  p.optimizer = common.optimizer_config("adam", 2e-3, schedule="cosine", warmup_steps=100)

  # Optional second phase: `finetune_steps` steps on batches of background sentences and a
  # fraction `fact_fraction` of fact sentences (0: background only).
  config.phases = ml_collections.ConfigDict({"finetune_steps": 0, "fact_fraction": 0.1})

  e = config.edit = ml_collections.ConfigDict()
  e.methods = ("finetune", "replay", "linf", "l2", "parts")
  e.sizes = (32,)
  e.num_seeds = 3
  e.steps = 50
  e.eval_every = 25
  e.linf_deltas = (1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 3e-2)
  e.l2_deltas = (0.3, 1.0, 2.0, 4.0, 10.0)
  e.parts = ("embeddings", "block_0", "block_1", "block_2", "block_3", "attention",
             "feed_forward")
  e.parts_deltas = (1e-2, 3e-2)   # ℓ∞ radii of the per-part edits.
  e.replay_ratio = 1.0
  # Every variant runs at each rate (the optimizer's schedule scaled so its peak is the
  # rate); the rate is chosen on the validation paraphrases with δ and the part.
  e.learning_rates = (3e-4, 1e-3, 3e-3)
  e.optimizer = common.optimizer_config("adam", 1e-3)

  # validation_templates: the first k held-out paraphrase templates of each relation are
  # the validation split (model choice), the others the test split (reported figures).
  config.eval = ml_collections.ConfigDict({"num_unmodified": 512, "batch_size": 256,
                                           "validation_templates": 1})

  if arg.setup == "lama":
    d.source = "lama_trex"
    d.data_dir = arg.data_dir or None
    d.lama.max_facts_per_relation = 200
  if arg.sizes == "all":
    e.sizes = (32, 128, 512)
  elif arg.sizes:
    e.sizes = tuple(int(x) for x in arg.sizes.split("+"))
  if arg.phases:
    config.phases.finetune_steps = 2000
  if arg.smoke:
    s.num_subjects, s.num_relations = 24, 4
    s.objects_per_relation = 6
    d.background.num_train, d.background.num_test = 64, 32
    m.width, m.depth, m.num_heads, m.mlp_dim = 16, 2, 2, 32
    p.steps, p.batch_size, p.chunk_steps = 60, 32, 30
    p.optimizer.warmup_steps = 5
    e.sizes = (4,)
    e.num_seeds = 2
    e.steps, e.eval_every = 6, 3
    e.linf_deltas, e.l2_deltas = (0.0, 1e-2), (0.0, 0.5)
    e.parts = ("first", "last", "embeddings")
    e.parts_deltas = (1e-2,)
    e.learning_rates = (1e-3, 1e-2)
    config.eval.num_unmodified, config.eval.batch_size = 64, 64
    if arg.phases:
      config.phases.finetune_steps = 20
  if arg.seeds:
    e.num_seeds = arg.seeds
  if arg.steps:
    e.steps = arg.steps
  if arg.pretrain_steps:
    p.steps = arg.pretrain_steps
  if arg.lrs:
    e.learning_rates = tuple(float(x) for x in str(arg.lrs).split("+"))
  return config


METHODS = ("finetune", "replay", "linf", "l2", "parts")
SOURCES = ("synthetic", "lama_trex")


def _positive_int(value, field: str) -> None:
  require(is_int(value) and value >= 1, field, f"must be a positive int, got {value!r}")


def _deltas(values, field: str) -> None:
  require(isinstance(values, (tuple, list)) and len(values) > 0
          and all(is_finite_number(d) and d >= 0 for d in values), field,
          f"must be a non-empty tuple of radii δ >= 0 (finite), got {values!r}")


def num_facts_of(config) -> int | None:
  """The knowledge base's fact count from the config alone (None for LAMA: read later)."""
  if config.data.source != "synthetic":
    return None
  s = config.data.synthetic
  return int(s.num_subjects) * int(s.num_relations)


def validate(config) -> None:
  """Raises ConfigError naming `config.<field>` for any unusable value. The optimizer
  blocks and the names of `edit.parts` (parts of the model) are checked by the study."""
  d = config.data
  require(d.source in SOURCES, "data.source",
          f"unknown source {d.source!r}; allowed: {', '.join(SOURCES)}")
  if d.source == "lama_trex":
    require(isinstance(d.data_dir, str) and d.data_dir, "data.data_dir",
            "must be the folder holding LAMA's relations.jsonl and TREx/ for source "
            "'lama_trex'")
  s = d.synthetic
  for f in ("num_subjects", "num_relations", "many_to_one_objects", "objects_per_relation",
            "num_train_templates", "num_heldout_templates"):
    _positive_int(s[f], f"data.synthetic.{f}")
  require(s.num_train_templates + s.num_heldout_templates <= len(knowledge.PATTERNS),
          "data.synthetic.num_heldout_templates", f"train + held-out templates must be <= "
          f"{len(knowledge.PATTERNS)}, got {s.num_train_templates} + {s.num_heldout_templates}")
  require(s.many_to_one_objects >= 2 and s.objects_per_relation >= 2,
          "data.synthetic.many_to_one_objects", "relations need >= 2 objects (an edit "
          "changes the object)")
  require(is_finite_number(s.many_to_one_fraction) and 0 <= s.many_to_one_fraction <= 1,
          "data.synthetic.many_to_one_fraction",
          f"must be in [0, 1], got {s.many_to_one_fraction!r}")
  for f in ("num_train", "num_test", "max_clauses"):
    _positive_int(d.background[f], f"data.background.{f}")
  m = config.model
  for f in ("width", "depth", "num_heads", "mlp_dim"):
    _positive_int(m[f], f"model.{f}")
  require(m.width % m.num_heads == 0, "model.num_heads",
          f"must divide model.width={m.width}, got {m.num_heads}")
  p = config.pretrain
  for f in ("steps", "batch_size", "chunk_steps"):
    _positive_int(p[f], f"pretrain.{f}")
  require(is_finite_number(p.target_recall) and 0 < p.target_recall <= 1,
          "pretrain.target_recall", f"must be in (0, 1], got {p.target_recall!r}")
  require(is_finite_number(p.background_fraction) and 0 <= p.background_fraction < 1,
          "pretrain.background_fraction", f"must be in [0, 1), got {p.background_fraction!r}")
  require(is_int(config.phases.finetune_steps) and config.phases.finetune_steps >= 0,
          "phases.finetune_steps", f"must be an int >= 0 (0: no second phase), got "
          f"{config.phases.finetune_steps!r}")
  frac = config.phases.fact_fraction
  require(is_finite_number(frac) and 0 <= frac < 1, "phases.fact_fraction",
          f"must be in [0, 1) (the fact sentences' share of phase-2 batches), got {frac!r}")
  e = config.edit
  methods = tuple(e.methods)
  require(methods and all(x in METHODS for x in methods) and len(set(methods)) == len(methods),
          "edit.methods", f"must be distinct names from {', '.join(METHODS)}, got {methods!r}")
  sizes = tuple(e.sizes)
  require(sizes and all(is_int(x) and x >= 1 for x in sizes), "edit.sizes",
          f"must be positive ints (|S|), got {sizes!r}")
  total = num_facts_of(config)
  if total is not None:
    require(max(sizes) <= total, "edit.sizes", f"|S| = {max(sizes)} exceeds the knowledge "
            f"base's {total} facts (data.synthetic.num_subjects x num_relations)")
  for f in ("num_seeds", "steps", "eval_every"):
    _positive_int(e[f], f"edit.{f}")
  _deltas(e.linf_deltas, "edit.linf_deltas")
  _deltas(e.l2_deltas, "edit.l2_deltas")
  _deltas(e.parts_deltas, "edit.parts_deltas")
  lrs = e.learning_rates
  require(isinstance(lrs, (tuple, list)) and len(lrs) > 0
          and all(is_finite_number(x) and x > 0 for x in lrs), "edit.learning_rates",
          f"must be a non-empty tuple of learning rates > 0 (finite), got {lrs!r}")
  parts = tuple(e.parts)
  require(len(parts) > 0, "edit.parts", "must name at least one part")
  require(is_finite_number(e.replay_ratio) and e.replay_ratio > 0, "edit.replay_ratio",
          f"must be > 0 (replayed per modified sentence), got {e.replay_ratio!r}")
  _positive_int(config.eval.num_unmodified, "eval.num_unmodified")
  _positive_int(config.eval.batch_size, "eval.batch_size")
  k = config.eval.validation_templates
  _positive_int(k, "eval.validation_templates")
  if d.source == "synthetic":
    require(k < s.num_heldout_templates, "eval.validation_templates",
            f"must be < data.synthetic.num_heldout_templates={s.num_heldout_templates} "
            f"(the rest are the test split), got {k!r}")
  require(is_int(config.seed) and config.seed >= 0, "seed",
          f"must be an int >= 0, got {config.seed!r}")
