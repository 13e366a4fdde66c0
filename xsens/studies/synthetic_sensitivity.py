"""Study `synthetic_sensitivity`: one attention layer vs MLPs on synthetic token tasks, the
generating rule's own sensitivity as the yardstick, an ablation of the layer's parts, and
the Boolean spectral bias.

Vasudeva et al., "Transformers Learn Low Sensitivity Functions", ICLR 2025 (arXiv
2403.06925) §2–§3.1 (OpenReview numbering; spec §6 and its last section, "Facts from the
full paper text", item 1). What is known of the paper's synthetic experiment: a single
attention layer (W_Q, W_K, W_V) followed by a linear decoder U, on a synthetic vocabulary
with frequent and sparse tokens; in one reviewer's paraphrase, the sparse tokens are made
uninformative so that the model must use the frequent ones. An MLP comparison there is
not confirmed. Vocabulary size, sequence length, label rule, dimensions, σ and training
are not known: every choice below is ours.

Tasks (each trained for every model and seed; data `xsens.data.sparse_tokens`):

  * "sparse" (OURS, `config.sparse`): n tokens [c_i ; p e_i]; the label is the majority (or
    parity) of one sign of k fixed tokens ("relevant" tokens vs the "other" ones).
  * "vocab_uninformative" (THE PAPER'S SET-UP AS KNOWN, a reviewer's paraphrase; details
    ours, `config.vocab`): a vocabulary of F frequent and S sparse tokens with unit-norm
    Gaussian embeddings; each sequence holds `sparse_per_sequence` sparse tokens at random
    positions and frequent tokens elsewhere; label = 1[sum of the frequent tokens' scores
    w_v > 0]; sparse ids drawn independently of the label (uninformative).
  * "vocab_informative" (OUR CONTROL): the same, but the sparse ids are drawn from the
    label's half of the sparse vocabulary, so the sparse tokens also carry the label; also
    reported: the accuracy on the same test sequences with uninformative sparse ids (how
    much the model relied on the sparse cue).

Models (`config.models`): "attention" f(X) = U·mean_rows(softmax(X W_Q (X W_K)ᵀ/√d_k)
X W_V) (`xsens.models.one_layer_attention`); "mlp" (the big ReLU MLP on the flattened
tokens, `config.mlp`); "mlp_matched" (one hidden layer whose width makes its parameter
count closest to the attention layer's on the same tokens); and the ablation
"attention_freeze_qk" / "attention_freeze_v" / "attention_freeze_u": the attention layer
from the same initial weights with W_Q and W_K (hence W_Q W_Kᵀ), W_V, or U frozen at their
initial values (their updates are zeroed after Adam). The trained "attention" model is also
measured with its attention map replaced by the uniform one (row "attention_uniform", an
ablation after training, nothing retrained).

Each model is trained by full-batch Adam on the cross-entropy until its train accuracy
reaches `target_train_accuracy` (and, with `target_train_loss`, its loss is below it;
checked every `eval_every` steps) or `max_steps`. Then, on the training set, token-wise
Gaussian sensitivity (`xsens.measures.token_sensitivity`: noise N(0, σ² I_d) on one token
at a time, R draws) at every σ of `sigmas`, overall and per token group (relevant / other
tokens; sparse / frequent tokens). The yardstick, at every σ and with the same noise draws
(common random numbers): the same measure applied to the generating rule itself as a
classifier of the noised tokens (`xsens.data.sparse_tokens.sparse_rule`, `vocab_rule`), i.e.
the flip rate of the true rule when the input tokens are noised; the σ grid should stay
where that rate is small (the report flags a rate above `RULE_STABLE_FLIP_RATE`).

Seeds: `num_seeds` seeds from `seed`; a seed draws the task (relevant positions or the
vocabulary, the train and test sets), the initial weights and the noise. The report gives
mean ± s.e. over seeds (s.e. = sample std / √seeds).

Part 2, Boolean spectrum (`config.boolean`): f* = sum_c coef_c chi_{S_c} on {±1}^n
(default x_0 + x_1 x_2 + x_3 x_4 x_5: degrees 1, 2, 3), fed as n tokens [x_i ; p e_i];
MSE regression by full-batch Adam on a `train_fraction` of the 2^n inputs, for each model
of `boolean.models` and each seed (only the initial weights depend on it). Every
`log_every` steps, the learned function on all 2^n inputs -> exact Fourier–Walsh
coefficients (`xsens.measures.boolean`): the coefficient of each target monomial, the
degree spectrum W^k and the total influence sum_S |S| fhat(S)^2. A component is
"learned" at the first logged step at which its coefficient reaches `learned_fraction`
(0.9; also reported: 0.5) of its target; the weak spectral bias predicts lower degrees
first.

Each trained model goes through the one loop (`xsens.train.loop`) in its own workdir,
`workdir/runs/<task>_<model>_s<seed>/` (orbax checkpoints, metrics, the Boolean
coefficients as array logs), so an interrupted study resumes where it stopped and a rerun
trains nothing new; a run's workdir is keyed by what the model's training depends on
(changing σ, the draws or `learned_fraction` reuses it).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from xsens import paths
from xsens.data import sparse_tokens as st
from xsens.errors import is_finite_number, is_int, require
from xsens.measures import boolean
from xsens.measures import sensitivity as sens_lib
from xsens.models import one_layer_attention as ola
from xsens.report import plots, tables
from xsens.train.progress import progress
from xsens.train import loop
from xsens.train.metrics import read_metrics
from xsens.train.workdir import Workdir

# Models that config.models may name; the frozen parts of the ablation variants.
FROZEN = {"attention_freeze_qk": ("w_q", "w_k"), "attention_freeze_v": ("w_v",),
          "attention_freeze_u": ("u",)}
MODELS = ("attention", "mlp", "mlp_matched") + tuple(FROZEN)
BOOLEAN_MODELS = ("attention", "mlp", "mlp_matched")
# Initial-weight stream of each model (fold_in(key(seed), i)): the ablation variants start
# from the attention model's weights; "attention" 0 and "mlp" 1 as in earlier versions.
INIT_INDEX = {"attention": 0, "mlp": 1, "mlp_matched": 2, **{m: 0 for m in FROZEN}}
UNIFORM, RULE = "attention_uniform", "rule"
TASKS = ("sparse", "vocab_uninformative", "vocab_informative")
TASK_LABELS = {
    "sparse": "ours: label = majority of one sign of k fixed tokens",
    "vocab_uninformative": "paper's set-up as known (reviewer's paraphrase; details ours): "
                           "frequent + sparse tokens, sparse tokens uninformative",
    "vocab_informative": "our control: the same vocabulary, sparse tokens informative"}
GROUPS = {"sparse": ("relevant", "other"), "vocab": ("sparse", "frequent")}
RULE_STABLE_FLIP_RATE = 0.05      # Above this, the report flags σ as beyond the stable regime.
RUNS_DIR = "runs"                 # workdir/runs/<task>_<model>_s<seed>/: one trained model.
SUMMARY_FILE = "train_summary.json"
CHECKPOINT_CHUNKS = 20            # Sparse runs: a checkpoint every 20 chunks (and at the stop).
LOGS_PER_CHUNK = 20               # Boolean runs: one jitted chunk (and checkpoint) per 20 logs.
_LOSS, _ACC = "eval/train_loss", "eval/train_accuracy"

# ------------------------------------------------------------------------------------------
# Validation.


def _pos_int(v) -> bool:
  return is_int(v) and v >= 1


def _check_names(values, allowed, field: str) -> None:
  values = list(values or [])
  require(values and all(m in allowed for m in values) and len(set(values)) == len(values),
          field, f"must be a non-empty list of distinct names from {allowed}, got {values!r}")


def _check_training(sec, path: str) -> None:
  for f in ("num_train", "num_test", "max_steps", "eval_every", "num_draws"):
    require(_pos_int(sec[f]), f"{path}.{f}", f"must be a positive int, got {sec[f]!r}")
  require(is_finite_number(sec.target_train_accuracy) and 0 < sec.target_train_accuracy <= 1,
          f"{path}.target_train_accuracy",
          f"must be in (0, 1], got {sec.target_train_accuracy!r}")
  require(sec.target_train_loss is None or (is_finite_number(sec.target_train_loss)
                                            and sec.target_train_loss > 0),
          f"{path}.target_train_loss", f"must be None or > 0, got {sec.target_train_loss!r}")
  sig = list(sec.sigmas)
  require(sig and all(is_finite_number(x) and x >= 0 for x in sig), f"{path}.sigmas",
          f"must be a non-empty list of standard deviations >= 0, got {sig!r}")


def validate(config) -> None:
  """Raises ConfigError naming `config.<field>` for any unusable value (nothing compiled)."""
  _check_names(config.get("models"), MODELS, "models")
  require(is_int(config.seed) and config.seed >= 0, "seed", f"must be an int >= 0, got "
          f"{config.seed!r}")
  require(_pos_int(config.num_seeds), "num_seeds",
          f"must be a positive int, got {config.num_seeds!r}")
  a = config.attention
  for f in ("qk_dim", "v_dim"):
    require(a[f] is None or _pos_int(a[f]), f"attention.{f}",
            f"must be None (= d) or a positive int, got {a[f]!r}")
  hd = list(config.mlp.hidden_dims)
  require(all(_pos_int(h) for h in hd), "mlp.hidden_dims",
          f"must be a list of positive ints, got {hd!r}")
  for m in ("attention", "mlp", "mlp_matched"):
    lr = config[m].learning_rate
    require(is_finite_number(lr) and lr > 0, f"{m}.learning_rate", f"must be > 0, got {lr!r}")
  require(config.sparse.enabled or config.vocab.enabled or config.boolean.enabled,
          "sparse.enabled", "at least one of sparse.enabled, vocab.enabled and "
          "boolean.enabled must be True")
  s = config.sparse
  if s.enabled:
    for f in ("n", "m", "k"):
      require(_pos_int(s[f]), f"sparse.{f}", f"must be a positive int, got {s[f]!r}")
    _check_training(s, "sparse")
    require(s.k <= s.n, "sparse.k", f"must be <= sparse.n={s.n}, got {s.k}")
    require(s.rule in st.RULES, "sparse.rule", f"got {s.rule!r}; allowed: {', '.join(st.RULES)}")
    require(s.rule != "majority" or s.k % 2 == 1, "sparse.k",
            f"must be odd for rule='majority' (no ties), got {s.k}")
    require(is_finite_number(s.position_scale) and s.position_scale >= 0, "sparse.position_scale",
            f"must be >= 0, got {s.position_scale!r}")
  v = config.vocab
  if v.enabled:
    for f in ("n", "dim", "num_frequent", "num_sparse", "sparse_per_sequence"):
      require(_pos_int(v[f]), f"vocab.{f}", f"must be a positive int, got {v[f]!r}")
    _check_training(v, "vocab")
    require(v.num_frequent >= 2, "vocab.num_frequent",
            f"must be >= 2 (the scores are centred), got {v.num_frequent}")
    require(v.sparse_per_sequence < v.n, "vocab.sparse_per_sequence",
            f"must be < vocab.n={v.n} (at least one frequent token), got "
            f"{v.sparse_per_sequence}")
    _check_names(v.cues, st.SPARSE_CUES, "vocab.cues")
    require("informative" not in v.cues or v.num_sparse % 2 == 0, "vocab.num_sparse",
            f"must be even for the informative cue (two halves), got {v.num_sparse}")
  b = config.boolean
  if b.enabled:
    _check_names(b.models, BOOLEAN_MODELS, "boolean.models")
    require(is_int(b.n) and 1 <= b.n <= 16, "boolean.n",
            f"must be an int in [1, 16] (exact 2^n enumeration), got {b.n!r}")
    for f in ("steps", "log_every"):
      require(_pos_int(b[f]), f"boolean.{f}", f"must be a positive int, got {b[f]!r}")
    require(b.steps % b.log_every == 0, "boolean.steps",
            f"must be a multiple of boolean.log_every={b.log_every}, got {b.steps}")
    comps = list(b.components)
    ok = bool(comps) and is_int(b.n)
    for c in comps:
      ok = ok and len(c) == 2 and is_finite_number(c[1]) and len(c[0]) == len(set(c[0])) and all(
          is_int(i) and 0 <= i < b.n for i in c[0])
    require(ok, "boolean.components", f"must be a non-empty list of [coords, coef] with "
            f"distinct coords in [0, n={b.n}), got {comps!r}")
    require(is_finite_number(b.train_fraction) and 0 < b.train_fraction <= 1,
            "boolean.train_fraction",
            f"must be in (0, 1], got {b.train_fraction!r}")
    require(is_finite_number(b.learned_fraction) and 0 < b.learned_fraction <= 1,
            "boolean.learned_fraction", f"must be in (0, 1], got {b.learned_fraction!r}")
    require(is_finite_number(b.position_scale) and b.position_scale >= 0, "boolean.position_scale",
            f"must be >= 0, got {b.position_scale!r}")


# ------------------------------------------------------------------------------------------
# Models, optimisers and training.


def seeds(config) -> list[int]:
  return [int(config.seed) + i for i in range(int(config.num_seeds))]


def section_name(name: str) -> str:
  """The config section of a model's settings (the ablation variants share "attention")."""
  return "attention" if name in FROZEN else name


def attention_num_params(d: int, num_outputs: int, qk_dim=None, v_dim=None) -> int:
  """Parameters of `OneLayerAttention` on tokens of dimension d (no biases)."""
  qk, v = qk_dim or d, v_dim or d
  return 2 * d * qk + d * v + v * num_outputs


def matched_width(config, token_shape, num_outputs: int) -> int:
  """The hidden width of "mlp_matched" on tokens of shape (n, d): parameter count closest
  to the attention layer's on the same tokens."""
  n, d = token_shape
  a = config.attention
  return ola.matched_mlp_width(n * d, num_outputs,
                               attention_num_params(d, num_outputs, a.qk_dim, a.v_dim))


def make_model(config, name: str, num_outputs: int, token_shape=None, *,
               uniform_attention: bool = False):
  """The flax model `name`; "mlp_matched" needs the per-example token shape (n, d);
  `uniform_attention`: the attention layer with a uniform map (`ola.UniformAttention`)."""
  if section_name(name) == "attention":
    a = config.attention
    cls = ola.UniformAttention if uniform_attention else ola.OneLayerAttention
    return cls(num_outputs=num_outputs, qk_dim=a.qk_dim, v_dim=a.v_dim)
  if name == "mlp_matched":
    return ola.TokenMLP(num_outputs=num_outputs,
                        hidden_dims=(matched_width(config, token_shape, num_outputs),))
  return ola.TokenMLP(num_outputs=num_outputs, hidden_dims=tuple(config.mlp.hidden_dims))


def freeze(names) -> optax.GradientTransformation:
  """Zeroes the updates of the top-level params `names` (stateless): chained after the
  optimiser, those params stay exactly at their initial values."""
  names = tuple(names)

  def update_fn(updates, state, params=None):
    del params
    return {k: (jax.tree.map(jnp.zeros_like, v) if k in names else v)
            for k, v in updates.items()}, state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


@functools.lru_cache(maxsize=None)
def _optimizer(name: str, learning_rate: float) -> optax.GradientTransformation:
  """Adam (with the frozen parts' updates zeroed for an ablation variant); one object per
  (model, learning rate), so the compiled training steps are shared across seeds."""
  tx = optax.adam(learning_rate)
  return optax.chain(tx, freeze(FROZEN[name])) if name in FROZEN else tx


def make_optimizer(config, name: str) -> optax.GradientTransformation:
  return _optimizer(name, float(config[section_name(name)].learning_rate))


def _num_params(params) -> int:
  return int(sum(x.size for x in jax.tree.leaves(params)))


def _tasks(config) -> list[str]:
  out = ["sparse"] if config.sparse.enabled else []
  if config.vocab.enabled:
    out += [f"vocab_{cue}" for cue in config.vocab.cues]
  return out


def _section(config, task: str):
  return config.sparse if task == "sparse" else config.vocab


def run_config(config, part: str, name: str, seed: int) -> dict:
  """What the training of model `name` in `part` (a task of TASKS, or "boolean") for `seed`
  depends on: its run workdir's fingerprint."""
  sec = "boolean" if part == "boolean" else ("sparse" if part == "sparse" else "vocab")
  section = config[sec].to_dict()
  for field in ("enabled", "sigmas", "num_draws", "learned_fraction", "cues", "models"):
    section.pop(field, None)  # Measurement only, or which runs exist.
  out = {"part": part, "model": name, "init": INIT_INDEX[name], "seed": seed,
         section_name(name): config[section_name(name)].to_dict(), sec: section}
  if name == "mlp_matched":
    out["attention"] = config.attention.to_dict()   # The matched width depends on it.
  return out


def run_workdirs(config, workdir: str) -> dict[tuple[str, str, int], tuple[str, dict]]:
  """{(part, model, seed): (run workdir, its fingerprint)} of every enabled part."""
  out = {}
  for part in _tasks(config) + (["boolean"] if config.boolean.enabled else []):
    models = config.boolean.models if part == "boolean" else config.models
    for seed in seeds(config):
      for name in models:
        out[(part, name, seed)] = (os.path.join(workdir, RUNS_DIR, f"{part}_{name}_s{seed}"),
                                   run_config(config, part, name, seed))
  return out


def _open_run(config, workdir: str, part: str, name: str, seed: int,
              overwrite: bool) -> Workdir:
  path, fingerprint = run_workdirs(config, workdir)[(part, name, seed)]
  return Workdir.open(path, fingerprint, overwrite=overwrite)


def _abstract(state):
  """The ShapeDtypeStructs of a state on the default device (what a checkpoint restores)."""
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), state)


def _train_s(wd: Workdir, out: loop.LoopResult) -> float:
  """Seconds spent training the run so far (a resumed run adds the interrupted part's)."""
  before = wd.read_json(SUMMARY_FILE) or {}
  prev = before.get("train_s", 0.0) if before.get("steps") == out.restored_step else 0.0
  train_s = prev + out.wall_s
  wd.write_json(SUMMARY_FILE, {"steps": out.step, "stop_reason": out.stop_reason,
                               "train_s": train_s})
  return train_s


@functools.lru_cache(maxsize=None)
def _ce_chunk(model, tx):
  """jit (state, x, y, length) -> the state after `length` full-batch steps, with the loss
  and accuracy at its end; one compiled function per (model, optimiser) and shape (the
  optimisers come from `_optimizer`, one object per setting, so seeds share it)."""
  def loss_fn(p, x, y):
    logits = model.apply({"params": p}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @functools.partial(jax.jit, static_argnums=3)
  def chunk(state, x, y, length):
    def body(carry, _):
      p, opt = carry
      loss, g = jax.value_and_grad(loss_fn)(p, x, y)
      upd, opt = tx.update(g, opt, p)
      return (optax.apply_updates(p, upd), opt), loss
    (p, opt), _ = jax.lax.scan(body, (state["params"], state["opt"]), None, length=length)
    logits = model.apply({"params": p}, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return {"params": p, "opt": opt, "loss": loss,
            "accuracy": jnp.mean(jnp.argmax(logits, -1) == y)}
  return chunk


def train_to_accuracy(wd: Workdir, model, params, tx, x, y, *, target: float,
                      eval_every: int, max_steps: int, target_loss=None,
                      max_chunks: int | None = None):
  """Full-batch steps on the cross-entropy through the one loop, resumed from `wd`.

  Chunks of `eval_every` steps (a `lax.scan`); after each, the train loss and accuracy;
  stops when the accuracy is >= target (and, when `target_loss` is set, the loss is <=
  target_loss) or after `max_steps` (rounded up to whole chunks). Checkpoints every
  `CHECKPOINT_CHUNKS` chunks and at the stop. `max_chunks`: stop after that many chunks
  (an interruption, for tests). Returns (params, steps, train accuracy, curve
  [(step, loss, accuracy)] of every chunk, train_s).
  """
  chunk = _ce_chunk(model, tx)

  def init():
    return {"params": params, "opt": tx.init(params), "loss": jnp.float32(jnp.nan),
            "accuracy": jnp.float32(0.0)}

  def reached(scalars):
    return scalars[_ACC] >= target and (target_loss is None or scalars[_LOSS] <= target_loss)

  program = loop.Program(
      init=init, abstract_state=_abstract(jax.eval_shape(init)),
      advance=lambda state, step, length: (chunk(state, x, y, length), None, None),
      evaluate=lambda state, step: {_LOSS: float(state["loss"]),
                                    _ACC: float(state["accuracy"])},
      should_stop=lambda step, scalars: "target_train_accuracy" if reached(scalars) else None)
  total = -(-max_steps // eval_every) * eval_every  # Whole chunks, as many as reach max_steps.
  schedule = loop.Schedule(total, eval_every=eval_every, max_chunk=eval_every,
                           checkpoint_every=eval_every * CHECKPOINT_CHUNKS)
  def finished(restored):
    done = [r for r in read_metrics(wd.path) if _ACC in r and r["step"] <= restored]
    return ("target_train_accuracy" if done and done[-1]["step"] == restored
            and reached(done[-1]) else None)

  out = loop.run(wd, program, schedule, finished_reason=finished, max_chunks=max_chunks)
  curve = [(r["step"], r[_LOSS], r[_ACC]) for r in read_metrics(wd.path) if _ACC in r]
  return out.state["params"], out.step, curve[-1][2], curve, _train_s(wd, out)


def _apply_of(owner):
  """A flax model's apply, or a rule's apply_fn itself."""
  return owner.apply if isinstance(owner, nn.Module) else owner


@functools.lru_cache(maxsize=None)
def _init_fn(model):
  """jit (key, x) -> the model's params; one compilation per (equal) model and shape."""
  return jax.jit(lambda key, x: model.init(key, x)["params"])


@functools.lru_cache(maxsize=None)
def _sensitivity_fn(owner, *, num_draws: int, chunk_size: int):
  """jit (variables, tokens [B, n, d], key, sigma) -> token_sensitivity's dict for `owner`
  (a flax model, cached by value, or a rule's apply_fn; the weights are an argument, not a
  constant of the compiled function, so one compilation serves every seed)."""
  apply_fn = _apply_of(owner)

  @jax.jit
  def measure(variables, tokens, key, sigma):
    return sens_lib.token_sensitivity(apply_fn, variables, tokens, key=key, sigma=sigma,
                                      num_draws=num_draws, chunk_size=chunk_size,
                                      example_chunk_size=None)
  return measure


@functools.lru_cache(maxsize=None)
def _accuracy_fn(owner):
  apply_fn = _apply_of(owner)
  return jax.jit(lambda variables, x, y: jnp.mean(jnp.argmax(apply_fn(variables, x), -1) == y))


def task_data(config, task: str, seed: int) -> dict:
  """The train / test sets of `task` for `seed`, the token groups of the training set
  ([N, n] bool: relevant or sparse tokens), and the generating rule (apply_fn, variables).

  "vocab_informative" also holds `shifted`: the test sequences with their sparse ids
  redrawn independently of the label (the same frequent tokens, positions and labels)."""
  if task == "sparse":
    s = config.sparse
    positions = st.relevant_positions(int(s.n), int(s.k), seed)
    kw = dict(n=int(s.n), m=int(s.m), k=int(s.k), rule=s.rule,
              position_scale=float(s.position_scale), positions=positions)
    train = st.sparse_token_task(int(s.num_train), seed=seed * 2 + 1, **kw)
    test = st.sparse_token_task(int(s.num_test), seed=seed * 2 + 2, **kw)
    group = np.zeros(train["tokens"].shape[:2], bool)
    group[:, positions] = True
    fn, make_vars = st.sparse_rule(s.rule)
    return {"train": train, "test": test, "shifted": None, "group": group,
            "groups": GROUPS["sparse"], "rule": (fn, make_vars(positions)),
            "positions": positions.tolist()}
  v = config.vocab
  cue = task[len("vocab_"):]
  vocab = st.vocabulary(num_frequent=int(v.num_frequent), num_sparse=int(v.num_sparse),
                        dim=int(v.dim), seed=seed * 3)
  kw = dict(vocab=vocab, n=int(v.n), sparse_per_sequence=int(v.sparse_per_sequence))
  train = st.frequent_sparse_task(int(v.num_train), sparse_cue=cue, seed=seed * 3 + 1, **kw)
  test = st.frequent_sparse_task(int(v.num_test), sparse_cue=cue, seed=seed * 3 + 2, **kw)
  shifted = None
  if cue == "informative":
    shifted = st.frequent_sparse_task(int(v.num_test), sparse_cue="uninformative",
                                      seed=seed * 3 + 2, **kw)
  return {"train": train, "test": test, "shifted": shifted, "group": train["is_sparse"],
          "groups": GROUPS["vocab"], "rule": (st.vocab_rule, st.vocab_rule_variables(vocab)),
          "positions": None}


def _measure_rows(owner, variables, data, sec, seed: int, base: dict) -> tuple[list, dict]:
  """One row per σ (base + sensitivity, its s.e., per-group flip rates) and the per-position
  profile {σ: [n]} of `owner` (a flax model or a rule's apply_fn) on the training set."""
  x = jnp.asarray(data["train"]["tokens"])
  n, d = x.shape[1:]
  group = data["group"]
  g_in, g_out = data["groups"]
  token_norm = float(np.linalg.norm(data["train"]["tokens"], axis=-1).mean())
  measure = _sensitivity_fn(owner, num_draws=int(sec.num_draws), chunk_size=int(n))
  rows, profile = [], {}
  for j, sigma in enumerate(progress(sec.sigmas, desc="σ sweep", unit="σ")):
    # Common random numbers: the same noise for every model and the rule at each sigma.
    out = measure(variables, x, jax.random.fold_in(jax.random.key(seed + 1000), j),
                  float(sigma))
    per_token = np.asarray(out["per_token"])
    profile[float(sigma)] = per_token.mean(0).tolist()
    rows.append({**base, "sigma": float(sigma),
                 "noise_to_token_norm": float(sigma) * math.sqrt(d) / token_norm,
                 "sensitivity": float(out["mean"]), "stderr": float(out["stderr"]),
                 f"{g_in}_tokens": float(per_token[group].mean()),
                 f"{g_out}_tokens": float(per_token[~group].mean())
                 if (~group).any() else float("nan")})
  return rows, profile


def run_task(config, workdir: str, task: str, seed: int, *, overwrite: bool = False,
             log=print, max_chunks: int | None = None) -> dict:
  """One task for one seed: every model of `config.models` trained (or resumed) in its run
  workdir, then measured with the rule (and "attention_uniform" when "attention" is
  trained); `max_chunks` interrupts each training, for tests. Returns {"rows", "profiles"
  {model: {sigma: [n]}}, "positions", "curves"}."""
  sec = _section(config, task)
  data = task_data(config, task, seed)
  x, y = jnp.asarray(data["train"]["tokens"]), jnp.asarray(data["train"]["labels"])
  xt, yt = jnp.asarray(data["test"]["tokens"]), jnp.asarray(data["test"]["labels"])
  shifted = data["shifted"]

  def accuracies(owner, variables):
    acc = _accuracy_fn(owner)
    out = {"train_acc": float(acc(variables, x, y)), "test_acc": float(acc(variables, xt, yt))}
    if shifted is not None:
      out["shifted_test_acc"] = float(acc(variables, jnp.asarray(shifted["tokens"]),
                                          jnp.asarray(shifted["labels"])))
    return out

  common = {"task": task, "seed": seed}
  rule_fn, rule_vars = data["rule"]
  rows, profiles = _measure_rows(rule_fn, rule_vars, data, sec, seed, {
      **common, "model": RULE, "params": 0, "steps": 0, "train_loss": float("nan"),
      **accuracies(rule_fn, rule_vars), "train_s": 0.0})
  profiles = {RULE: profiles}
  curves = {}
  tl = None if sec.target_train_loss is None else float(sec.target_train_loss)
  for name in config.models:
    model = make_model(config, name, 2, tuple(x.shape[1:]))
    params = _init_fn(model)(jax.random.fold_in(jax.random.key(seed), INIT_INDEX[name]),
                             x[:1])
    params, steps, _, curve, wall = train_to_accuracy(
        _open_run(config, workdir, task, name, seed, overwrite), model, params,
        make_optimizer(config, name), x, y, target=float(sec.target_train_accuracy),
        eval_every=int(sec.eval_every), max_steps=int(sec.max_steps), target_loss=tl,
        max_chunks=max_chunks)
    curves[name] = curve
    variants = [(name, model)]
    if name == "attention":
      variants.append((UNIFORM, make_model(config, name, 2, uniform_attention=True)))
    for label, m in variants:
      variables = {"params": params}
      base = {**common, "model": label, "params": _num_params(params), "steps": steps,
              "train_loss": curve[-1][1] if label == name else float("nan"),
              **accuracies(m, variables), "train_s": round(wall, 2)}
      r, profiles[label] = _measure_rows(m, variables, data, sec, seed, base)
      rows += r
    mine = [r for r in rows if r["model"] == name][-1]
    log(f"[synthetic] {task} seed {seed} {name}: {steps} steps, train acc "
        f"{mine['train_acc']:.3f}, test acc {mine['test_acc']:.3f}")
  return {"rows": rows, "profiles": profiles, "positions": data["positions"],
          "curves": curves}


def run_sparse(config, workdir: str, *, overwrite: bool = False, log=print,
               max_chunks: int | None = None) -> dict:
  """Every enabled token task for every seed (`run_task`): {"rows" (per seed), "profiles"
  {task: {seed: {model: {sigma: [n]}}}}, "positions" {seed: relevant positions of the
  "sparse" task}, "curves" {task: {seed: {model: curve}}}}."""
  out = {"rows": [], "profiles": {}, "positions": {}, "curves": {}}
  for task in _tasks(config):
    for seed in seeds(config):
      r = run_task(config, workdir, task, seed, overwrite=overwrite, log=log,
                   max_chunks=max_chunks)
      out["rows"] += r["rows"]
      out["profiles"].setdefault(task, {})[seed] = r["profiles"]
      out["curves"].setdefault(task, {})[seed] = r["curves"]
      if task == "sparse":
        out["positions"][seed] = r["positions"]
  return out


def boolean_trajectory(wd: Workdir, model, params, tx, tokens, target, train_mask, *,
                       steps: int, log_every: int, max_chunks: int | None = None):
  """MSE full-batch training on the masked inputs through the one loop, resumed from `wd`;
  every `log_every` steps (and at step 0) the Fourier coefficients [L + 1, 2^n] of the
  learned function on all 2^n inputs.

  Chunks (`lax.scan`s) of `log_every * LOGS_PER_CHUNK` steps, each checkpointed; the
  coefficients and losses are the workdir's array logs (per chunk, the logged points of
  its steps on the last axis). `max_chunks`: stop after that many chunks (an interruption,
  for tests). Returns (params, coefficients, train losses [L + 1], train_s).
  """
  w = train_mask / jnp.sum(train_mask)

  def predict(p):
    return model.apply({"params": p}, tokens)[:, 0]

  def loss_fn(p):
    return jnp.sum(w * jnp.square(predict(p) - target))

  def outer(carry, _):
    def inner(c, _):
      p, opt = c
      g = jax.grad(loss_fn)(p)
      upd, opt = tx.update(g, opt, p)
      return (optax.apply_updates(p, upd), opt), None
    carry, _ = jax.lax.scan(inner, carry, None, length=log_every)
    f = predict(carry[0])
    return carry, (boolean.fourier_coefficients(f), jnp.sum(w * jnp.square(f - target)))

  @functools.partial(jax.jit, static_argnums=1)
  def chunk(state, num_logs):
    """`num_logs` × `log_every` steps: the state, coefficients and losses at the chunk's
    start and after each `log_every` steps ([num_logs + 1, ...])."""
    p = state["params"]
    f0 = predict(p)
    first = (boolean.fourier_coefficients(f0), jnp.sum(w * jnp.square(f0 - target)))
    (p, opt), (coeffs, losses) = jax.lax.scan(outer, (p, state["opt"]), None,
                                              length=num_logs)
    return ({"params": p, "opt": opt}, jnp.concatenate([first[0][None], coeffs]),
            jnp.concatenate([first[1][None], losses]))

  def advance(state, step, length):
    state, coeffs, losses = chunk(state, length // log_every)
    coeffs, losses = jax.device_get((coeffs, losses))
    keep = slice(0 if step == 0 else 1, None)  # The start is the previous chunk's end.
    return state, None, {"coef": np.asarray(coeffs)[keep].T, "loss": np.asarray(losses)[keep]}

  init = lambda: {"params": params, "opt": tx.init(params)}
  program = loop.Program(init=init, abstract_state=_abstract(jax.eval_shape(init)),
                         advance=advance)
  every = log_every * LOGS_PER_CHUNK
  out = loop.run(wd, program, loop.Schedule(steps, checkpoint_every=every, max_chunk=every),
                 max_chunks=max_chunks)
  parts = []
  for _, end, path in wd.step_log_files():
    if end <= out.step:
      z = paths.load_npz(path)
      parts.append({k: z[k] for k in ("coef", "loss")})
  coeffs = np.concatenate([z["coef"] for z in parts], axis=-1).T
  losses = np.concatenate([z["loss"] for z in parts], axis=-1)
  return out.state["params"], coeffs, losses, _train_s(wd, out)


def learned_step(coef_curve: np.ndarray, target: float, fraction: float, logged_steps):
  """The first logged step at which coef / target >= fraction (None if never)."""
  hits = np.nonzero(np.asarray(coef_curve) / target >= fraction)[0]
  return int(logged_steps[hits[0]]) if len(hits) else None


def run_boolean(config, workdir: str, *, overwrite: bool = False, log=print,
                max_chunks: int | None = None) -> dict:
  """Part 2 (each model of `boolean.models` and seed trained, or resumed, in
  `workdir/runs/boolean_<model>_s<seed>`; `max_chunks` interrupts each, for tests): returns
  {"rows" (per seed), "components", "steps", "coef" {model: [L+1, C]}, "spectrum" {model:
  [L+1, n+1]}, "influence" {model: [L+1]} (of the first seed), "target_spectrum"}."""
  b = config.boolean
  n = int(b.n)
  target, comps = st.boolean_target(n, [(tuple(c[0]), c[1]) for c in b.components])
  tokens = jnp.asarray(st.boolean_tokens(n, float(b.position_scale)))
  idx = [c["index"] for c in comps]
  logged = np.arange(0, int(b.steps) + 1, int(b.log_every))
  target_coeffs = boolean.fourier_coefficients(jnp.asarray(target))
  out = {"components": comps, "steps": logged.tolist(), "coef": {}, "spectrum": {},
         "influence": {}, "rows": [],
         "target_spectrum": np.asarray(boolean.degree_spectrum(target_coeffs)).tolist(),
         "target_influence": float(boolean.fourier_average_sensitivity(target_coeffs))}
  for seed in seeds(config):
    mask = np.ones(2**n, np.float32)
    if b.train_fraction < 1:
      keep = max(1, int(round(b.train_fraction * 2**n)))
      mask[:] = 0
      mask[np.random.default_rng(seed).choice(2**n, keep, replace=False)] = 1
    for name in b.models:
      model = make_model(config, name, 1, tuple(tokens.shape[1:]))
      params = _init_fn(model)(jax.random.fold_in(jax.random.key(seed + 7), INIT_INDEX[name]),
                               tokens[:1])
      params, coeffs, losses, wall = boolean_trajectory(
          _open_run(config, workdir, "boolean", name, seed, overwrite), model, params,
          make_optimizer(config, name), tokens, jnp.asarray(target), jnp.asarray(mask),
          steps=int(b.steps), log_every=int(b.log_every), max_chunks=max_chunks)
      coef = np.asarray(coeffs)[:, idx]                               # [L+1, C]
      spec = np.asarray(boolean.degree_spectrum(coeffs))              # [L+1, n+1]
      infl = np.asarray(boolean.fourier_average_sensitivity(coeffs))  # [L+1]
      if seed == seeds(config)[0]:
        out["coef"][name], out["spectrum"][name], out["influence"][name] = coef, spec, infl
      for c, comp in enumerate(comps):
        out["rows"].append({
            "model": name, "seed": seed,
            "component": "x" + "·x".join(str(j) for j in comp["coords"]),
            "degree": comp["degree"], "target_coef": comp["coef"],
            "step_50%": learned_step(coef[:, c], comp["coef"], 0.5, logged),
            f"step_{int(100 * b.learned_fraction)}%": learned_step(
                coef[:, c], comp["coef"], float(b.learned_fraction), logged),
            "final_coef": float(coef[-1, c]), "final_train_mse": float(losses[-1]),
            "final_influence": float(infl[-1]), "train_s": round(wall, 2)})
      log(f"[synthetic] boolean seed {seed} {name}: final coefficients "
          f"{np.round(coef[-1], 3)}, train MSE {float(losses[-1]):.4f}")
  return out


# ------------------------------------------------------------------------------------------
# Report.


def mean_se(values) -> tuple[float, float, int]:
  """(mean, standard error = sample std / sqrt(count), count) of the finite values (None
  and NaN left out); s.e. NaN for fewer than two."""
  v = np.asarray([float(x) for x in values if x is not None and math.isfinite(float(x))])
  if not len(v):
    return float("nan"), float("nan"), 0
  se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
  return float(v.mean()), se, len(v)


def _fmt(values, digits: int = 3, *, integer: bool = False) -> str:
  """"mean ± s.e." over seeds ("(k/S)" when only k of the S values exist)."""
  m, se, count = mean_se(values)
  if count == 0:
    return "–"
  if integer:
    text = f"{m:,.0f}" if math.isnan(se) else f"{m:,.0f} ± {se:,.0f}"
  else:
    text = f"{m:.{digits}g}" if math.isnan(se) else f"{m:.{digits}g} ± {se:.2g}"
  return text if count == len(values) else f"{text} ({count}/{len(values)})"


def model_label(config, name: str, token_shape=None) -> str:
  if name == "mlp_matched" and token_shape is not None:
    return f"MLP matched params (hidden {matched_width(config, token_shape, 2)})"
  return {RULE: "generating rule (yardstick)", "attention": "attention",
          UNIFORM: "attention, uniform map after training",
          "attention_freeze_qk": "attention, W_Q W_Kᵀ frozen at init",
          "attention_freeze_v": "attention, W_V frozen at init",
          "attention_freeze_u": "attention, U frozen at init",
          "mlp": "MLP " + "-".join(map(str, config.mlp.hidden_dims)),
          "mlp_matched": "MLP matched params"}[name]


def summarize_task(config, rows, task: str) -> list[dict]:
  """Per model (rule first, then config.models with "attention_uniform" after
  "attention"), mean ± s.e. over seeds of every column; σ columns S(σ=…) and, at the
  largest σ, the two token groups. Values are strings ("mean ± s.e.")."""
  sec = _section(config, task)
  g_in, g_out = GROUPS["sparse" if task == "sparse" else "vocab"]
  token_shape = ((sec.n, sec.m + sec.n) if task == "sparse" else (sec.n, sec.dim))
  names = [RULE]
  for m in config.models:
    names += [m, UNIFORM] if m == "attention" else [m]
  sig_last = float(sec.sigmas[-1])
  out = []
  for name in names:
    mine = [r for r in rows if r["task"] == task and r["model"] == name]
    if not mine:
      continue
    first = [r for r in mine if r["sigma"] == float(sec.sigmas[0])]   # One per seed.
    row = {"model": model_label(config, name, token_shape),
           "params": f"{int(first[0]['params']):,}" if first[0]["params"] else "–",
           "steps": _fmt([r["steps"] for r in first], integer=True) if name != RULE else "–",
           "train acc": _fmt([r["train_acc"] for r in first]),
           "train loss": _fmt([r["train_loss"] for r in first], 2),
           "test acc": _fmt([r["test_acc"] for r in first])}
    if task == "vocab_informative":
      row["test acc, sparse cue removed"] = _fmt([r["shifted_test_acc"] for r in first])
    for sigma in sec.sigmas:
      row[f"S(σ={float(sigma):g})"] = _fmt([r["sensitivity"] for r in mine
                                             if r["sigma"] == float(sigma)], 2)
    for g in (g_in, g_out):
      row[f"σ={sig_last:g}: {g} tokens"] = _fmt(
          [r[f"{g}_tokens"] for r in mine if r["sigma"] == sig_last], 2)
    out.append(row)
  return out


def summarize_boolean(config, rows) -> list[dict]:
  b = config.boolean
  key90 = f"step_{int(100 * b.learned_fraction)}%"
  out = []
  for name in b.models:
    for comp in dict.fromkeys(r["component"] for r in rows):
      mine = [r for r in rows if r["model"] == name and r["component"] == comp]
      out.append({"model": name, "component": comp, "degree": mine[0]["degree"],
                  "step 50%": _fmt([r["step_50%"] for r in mine], integer=True),
                  f"step {key90[5:]}": _fmt([r[key90] for r in mine], integer=True),
                  "final coef": _fmt([r["final_coef"] for r in mine]),
                  "final train MSE": _fmt([r["final_train_mse"] for r in mine], 2),
                  "final influence": _fmt([r["final_influence"] for r in mine])})
  return out


def _boolean_figure(path: str, res: dict) -> str:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  models = list(res["coef"])
  steps = np.asarray(res["steps"])
  fig, axes = plt.subplots(2, len(models), figsize=(6.2 * len(models), 6.6), squeeze=False)
  every = max(1, len(steps) // 10)
  comps = res["components"]
  for j, name in enumerate(models):
    ax = axes[0, j]
    for comp, c, style in zip(comps, range(len(comps)), plots.line_styles(len(comps))):
      ax.plot(steps, res["coef"][name][:, c] / comp["coef"], markevery=every,
              label=f"deg {comp['degree']}: " + "x" + "·x".join(map(str, comp["coords"])),
              **style)
    ax.axhline(1.0, color="gray", lw=0.6, ls="--")
    plots.styled_axes(ax, f"{name}: learned / target coefficient", "training step",
                      "learned / target coefficient", integer_x=True, title_size=9)
    plots.legend_outside(ax, in_layout=True)  # Other models' panels to the right.
    ax = axes[1, j]
    spec = res["spectrum"][name]
    ks = [k for k in range(spec.shape[1]) if k <= 4 or spec[:, k].max() > 0.05]
    for k, style in zip(ks, plots.line_styles(len(ks))):
      ax.plot(steps, spec[:, k], label=f"W^{k}", markevery=every, **style)
    plots.styled_axes(ax, f"{name}: degree spectrum W^k of the learned f", "training step",
                      "W^k (share of ‖f‖²)", integer_x=True, title_size=9)
    plots.legend_outside(ax, in_layout=True)  # Other models' panels to the right.
  fig.suptitle("Boolean task: coefficients and degree spectrum over training")
  return plots._save(fig, path)  # pylint: disable=protected-access


def _task_note(config, task: str, sp: dict) -> str:
  sec = _section(config, task)
  rows = [r for r in sp["rows"] if r["task"] == task]
  stop = (f"Adam full batch until train accuracy ≥ {sec.target_train_accuracy}"
          + (f" and train loss ≤ {sec.target_train_loss}" if sec.target_train_loss else "")
          + f" (checked every {sec.eval_every} steps, ≤ {sec.max_steps})")
  if task == "sparse":
    what = (f"n={sec.n} tokens of d={sec.m}+{sec.n} (content signs/√{sec.m}, position "
            f"one-hot ×{sec.position_scale}); label = {sec.rule} of one sign of the k={sec.k} "
            f"tokens at positions drawn per seed ({sp['positions']})")
  else:
    what = (f"vocabulary of {sec.num_frequent} frequent + {sec.num_sparse} sparse tokens, "
            f"unit-norm Gaussian embeddings in d={sec.dim}; n={sec.n} positions, "
            f"{sec.sparse_per_sequence} of them sparse; label = 1[Σ frequent scores > 0]; "
            + ("sparse ids independent of the label"
               if task == "vocab_uninformative" else "sparse ids from the label's half"))
  def rule_mean(field, sigma):
    return mean_se([r[field] for r in rows if r["model"] == RULE
                    and r["sigma"] == float(sigma)])[0]
  n2s = ", ".join(f"σ={float(s):g}: {rule_mean('noise_to_token_norm', s):.2f}"
                  for s in sec.sigmas)
  worst = max(rule_mean("sensitivity", s) for s in sec.sigmas)
  flag = ("" if worst <= RULE_STABLE_FLIP_RATE else
          f" WARNING: the rule's own flip rate reaches {worst:.3f} > "
          f"{RULE_STABLE_FLIP_RATE}: σ is beyond the regime where the rule is stable.")
  return (f"**{task}** ({TASK_LABELS[task]}): {what}; {sec.num_train} train / "
          f"{sec.num_test} test; {stop}; token-wise sensitivity on the training set, "
          f"{sec.num_draws} draws per token; mean ± s.e. over {config.num_seeds} seed(s). "
          f"Noise norm / mean token norm (σ√d/‖x‖): {n2s}. Largest flip rate of the "
          f"generating rule: {worst:.4f}.{flag}\n\n"
          + tables.markdown_table(summarize_task(config, sp["rows"], task)))


def run(config, workdir: str, *, overwrite: bool = False, log=print) -> dict:
  """Runs the enabled parts and writes results.md/json and the plots.

  Every trained model resumes from its run workdir (`run_workdirs`); each is checked
  against the config before anything trains (ConfigError on `workdir`, nothing written);
  `overwrite` trains them all again.
  """
  validate(config)
  for path, fingerprint in run_workdirs(config, workdir).values():
    Workdir(path).check(fingerprint, overwrite=overwrite)
  paths.makedirs(workdir)
  t0 = time.perf_counter()
  summary, figs, notes = [], [], []
  extra = {"config": json.loads(config.to_json_best_effort())}
  result = {"rows": []}
  if _tasks(config):
    sp = run_sparse(config, workdir, overwrite=overwrite, log=log)
    result["sparse"] = sp
    result["rows"] += sp["rows"]
    first = seeds(config)[0]
    for task in _tasks(config):
      sec = _section(config, task)
      names = [m for m in sp["profiles"][task][first]]
      if task == "sparse":
        sigma = float(sec.sigmas[-1])
        figs.append(plots.line_plot(
            os.path.join(workdir, "sparse_per_position.png"), list(range(sec.n)),
            {m: sp["profiles"][task][first][m][sigma] for m in names},
            xlabel="token position (0 = first)", ylabel=f"flip probability (σ={sigma:g})",
            title=f"Per-position sensitivity, seed {first}; relevant: "
                  f"{sp['positions'][first]}"))
      curves = {m: [mean_se([r["sensitivity"] for r in sp["rows"] if r["task"] == task
                             and r["model"] == m and r["sigma"] == float(s)])
                    for s in sec.sigmas] for m in names}
      figs.append(plots.line_plot(
          os.path.join(workdir, f"{task}_sensitivity_vs_sigma.png"),
          [float(s) for s in sec.sigmas], {m: [c[0] for c in v] for m, v in curves.items()},
          errors={m: [0.0 if math.isnan(c[1]) else c[1] for c in v]
                  for m, v in curves.items()},
          xlabel="σ (noise scale, input units)",
          ylabel="token-wise sensitivity (flip probability)",
          title=f"{task}: mean over tokens, training set"))
      rows = summarize_task(config, sp["rows"], task)
      summary += [{"task": task, **r} for r in rows]
      notes.append(_task_note(config, task, sp))
    extra["sparse"] = {
        "profiles": {t: {str(s): {m: {str(k): v for k, v in p.items()} for m, p in ps.items()}
                         for s, ps in by_seed.items()}
                     for t, by_seed in sp["profiles"].items()},
        "positions": {str(k): v for k, v in sp["positions"].items()},
        "curves": {t: {str(s): c for s, c in by_seed.items()}
                   for t, by_seed in sp["curves"].items()}}
  if config.boolean.enabled:
    bo = run_boolean(config, workdir, overwrite=overwrite, log=log)
    result["boolean"] = bo
    result["rows"] += bo["rows"]
    figs.append(_boolean_figure(os.path.join(workdir, "boolean_spectrum.png"), bo))
    b = config.boolean
    key = f"step_{int(100 * b.learned_fraction)}%"
    order = {}
    for m in b.models:
      got = [(mean_se([r[key] for r in bo["rows"] if r["model"] == m and r["degree"] == c["degree"]
                       and r["component"] == "x" + "·x".join(map(str, c["coords"]))]), c["degree"])
             for c in bo["components"]]
      # Components that every seed learned, by their mean step.
      done = [(mu, d) for (mu, _, cnt), d in got if cnt == config.num_seeds]
      order[m] = [d for _, d in sorted(done)]
    brows = summarize_boolean(config, bo["rows"])
    notes.append(
        "**Boolean**: f* = " + " + ".join(f"{c['coef']:g}·x" + "·x".join(map(str, c["coords"]))
                                          for c in bo["components"])
        + f" on n={b.n} bits ({2 ** b.n} inputs, {b.train_fraction:.0%} for training); "
        f"MSE, Adam full batch, {b.steps} steps; exact Fourier–Walsh spectrum of the "
        f"learned function every {b.log_every} steps; mean ± s.e. over {config.num_seeds} "
        f"seed(s) ((k/S): only k of S seeds reached it). Order in which components reach "
        f"{b.learned_fraction:.0%} of their coefficient (degrees, by mean step): "
        + "; ".join(f"{m}: {o}" for m, o in order.items()) + ".\n\n"
        + tables.markdown_table(brows))
    if not summary:
      summary = brows
    extra["boolean"] = {"steps": bo["steps"], "components": bo["components"],
                        "coef": {m: v.tolist() for m, v in bo["coef"].items()},
                        "spectrum": {m: v.tolist() for m, v in bo["spectrum"].items()},
                        "influence": {m: v.tolist() for m, v in bo["influence"].items()},
                        "target_spectrum": bo["target_spectrum"],
                        "target_influence": bo["target_influence"], "order": order,
                        "summary": brows}
  extra["seed_rows"] = result["rows"]
  extra["wall_s"] = time.perf_counter() - t0
  columns = list(dict.fromkeys(k for r in summary for k in r))  # Every task's columns.
  md = tables.write_results(workdir, "Synthetic sensitivity: one attention layer vs MLPs",
                            summary, columns=columns, notes="\n\n".join(notes),
                            extra=extra, plots=figs)
  return {**result, "summary": summary, "markdown": md}
