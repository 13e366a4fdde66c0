"""Study `synthetic_sensitivity`: one attention layer vs MLPs on synthetic token tasks, the
generating rule's own sensitivity as the yardstick, an ablation of the layer's parts, and
the Boolean spectral bias.

Vasudeva et al., "Transformers Learn Low Sensitivity Functions", ICLR 2025 (arXiv
2403.06925) §2–§3.1 (OpenReview numbering; docs/papers/sensitivity.md §6 and its last section,
"Facts from the full paper text", item 1). What is known of the paper's synthetic experiment: a
single attention layer (W_Q, W_K, W_V) followed by a linear decoder U, on a synthetic vocabulary
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

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mlcollections_configs import synthetic_sensitivity as configs
from xsens import paths
from xsens.data import sparse_tokens as st
from xsens.lab import boolean_spectrum, token_tasks
from xsens.models import one_layer_attention as ola
from xsens.report import plots, tables
from xsens.train import full_batch, optim
from xsens.train.workdir import Workdir

# The frozen parts of the ablation variants (`config.models` names them:
# mlcollections_configs.synthetic_sensitivity.MODELS).
FROZEN = {"attention_freeze_qk": ("w_q", "w_k"), "attention_freeze_v": ("w_v",),
          "attention_freeze_u": ("u",)}
# Initial-weight stream of each model (fold_in(key(seed), i)): the ablation variants start
# from the attention model's weights.
INIT_INDEX = {"attention": 0, "mlp": 1, "mlp_matched": 2, **{m: 0 for m in FROZEN}}
UNIFORM, RULE = "attention_uniform", "rule"
TASKS = ("sparse", "vocab_uninformative", "vocab_informative")
TASK_LABELS = {
    "sparse": "ours: label = majority of one sign of k fixed tokens",
    "vocab_uninformative": "paper's set-up as known (reviewer's paraphrase; details ours): "
                           "frequent + sparse tokens, sparse tokens uninformative",
    "vocab_informative": "our control: the same vocabulary, sparse tokens informative"}
RULE_STABLE_FLIP_RATE = 0.05      # Above this, the report flags σ as beyond the stable regime.
RUNS_DIR = "runs"                 # workdir/runs/<task>_<model>_s<seed>/: one trained model.

# ------------------------------------------------------------------------------------------
# Validation.


def validate(config) -> None:
  """ConfigError naming `config.<field>` for any unusable value (nothing compiled): every
  check is a field check of the config file
  (`mlcollections_configs.synthetic_sensitivity.validate`)."""
  configs.validate(config)


# ------------------------------------------------------------------------------------------
# Models, optimisers and training.


def seeds(config) -> list[int]:
  return [int(config.seed) + i for i in range(int(config.num_seeds))]


def section_name(name: str) -> str:
  """The config section of a model's settings (the ablation variants share "attention")."""
  return "attention" if name in FROZEN else name


def make_model(config, name: str, num_outputs: int, token_shape=None, *,
               uniform_attention: bool = False):
  """The flax model `name`; "mlp_matched" needs the per-example token shape (n, d);
  `uniform_attention`: the attention layer with a uniform map (`ola.UniformAttention`)."""
  if section_name(name) == "attention":
    a = config.attention
    cls = ola.UniformAttention if uniform_attention else ola.OneLayerAttention
    return cls(num_outputs=num_outputs, qk_dim=a.qk_dim, v_dim=a.v_dim)
  if name == "mlp_matched":
    width = token_tasks.matched_width(config.attention, token_shape, num_outputs)
    return ola.TokenMLP(num_outputs=num_outputs, hidden_dims=(width,))
  return ola.TokenMLP(num_outputs=num_outputs, hidden_dims=tuple(config.mlp.hidden_dims))


@functools.lru_cache(maxsize=None)
def _optimizer(name: str, learning_rate: float) -> optax.GradientTransformation:
  """Adam (with the frozen parts' updates zeroed for an ablation variant); one object per
  (model, learning rate), so the compiled training steps are shared across seeds."""
  tx = optim.optimizer_by_name("adam", learning_rate)
  return optax.chain(tx, optim.freeze(FROZEN[name])) if name in FROZEN else tx


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


def run_task(config, workdir: str, task: str, seed: int, *, overwrite: bool = False,
             log=print, max_chunks: int | None = None) -> dict:
  """One task for one seed: every model of `config.models` trained (or resumed) in its run
  workdir, then measured with the rule (and "attention_uniform" when "attention" is
  trained); `max_chunks` interrupts each training, for tests. Returns {"rows", "profiles"
  {model: {sigma: [n]}}, "positions", "curves"}."""
  sec = _section(config, task)
  data = token_tasks.task_data(_section(config, task), task, seed)
  x, y = jnp.asarray(data["train"]["tokens"]), jnp.asarray(data["train"]["labels"])
  xt, yt = jnp.asarray(data["test"]["tokens"]), jnp.asarray(data["test"]["labels"])
  shifted = data["shifted"]

  def accuracies(owner, variables):
    acc = token_tasks.accuracy_fn(owner)
    out = {"train_acc": float(acc(variables, x, y)), "test_acc": float(acc(variables, xt, yt))}
    if shifted is not None:
      out["shifted_test_acc"] = float(acc(variables, jnp.asarray(shifted["tokens"]),
                                          jnp.asarray(shifted["labels"])))
    return out

  common = {"task": task, "seed": seed}
  rule_fn, rule_vars = data["rule"]
  rows, profiles = token_tasks.measure_rows(rule_fn, rule_vars, data, sec, seed, {
      **common, "model": RULE, "params": 0, "steps": 0, "train_loss": float("nan"),
      **accuracies(rule_fn, rule_vars), "train_s": 0.0})
  profiles = {RULE: profiles}
  curves = {}
  tl = None if sec.target_train_loss is None else float(sec.target_train_loss)
  for name in config.models:
    model = make_model(config, name, 2, tuple(x.shape[1:]))
    params = token_tasks.init_fn(model)(
        jax.random.fold_in(jax.random.key(seed), INIT_INDEX[name]), x[:1])
    params, steps, _, curve, wall = full_batch.train_to_accuracy(
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
      r, profiles[label] = token_tasks.measure_rows(m, variables, data, sec, seed, base)
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
  logged = np.arange(0, int(b.steps) + 1, int(b.log_every))
  out = {"components": comps, "steps": logged.tolist(), "coef": {}, "spectrum": {},
         "influence": {}, "rows": [], **boolean_spectrum.target_spectrum(target)}
  for seed in seeds(config):
    mask = boolean_spectrum.train_mask(n, float(b.train_fraction), seed)
    for name in b.models:
      model = make_model(config, name, 1, tuple(tokens.shape[1:]))
      params = token_tasks.init_fn(model)(
          jax.random.fold_in(jax.random.key(seed + 7), INIT_INDEX[name]), tokens[:1])
      params, coeffs, losses, wall = boolean_spectrum.boolean_trajectory(
          _open_run(config, workdir, "boolean", name, seed, overwrite), model, params,
          make_optimizer(config, name), tokens, jnp.asarray(target), jnp.asarray(mask),
          steps=int(b.steps), log_every=int(b.log_every), max_chunks=max_chunks)
      coef, spec, infl, rows = boolean_spectrum.component_rows(
          coeffs, losses, comps, logged, float(b.learned_fraction),
          {"model": name, "seed": seed}, {"train_s": round(wall, 2)})
      if seed == seeds(config)[0]:
        out["coef"][name], out["spectrum"][name], out["influence"][name] = coef, spec, infl
      out["rows"] += rows
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
    width = token_tasks.matched_width(config.attention, token_shape, 2)
    return f"MLP matched params (hidden {width})"
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
  g_in, g_out = token_tasks.GROUPS["sparse" if task == "sparse" else "vocab"]
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
    figs.append(plots.boolean_spectrum_figure(os.path.join(workdir, "boolean_spectrum.png"), bo))
    b = config.boolean
    order = boolean_spectrum.learning_order(bo["rows"], bo["components"], b.models,
                                            float(b.learned_fraction), config.num_seeds)
    brows = boolean_spectrum.summary_rows(bo["rows"], b.models, float(b.learned_fraction),
                                          _fmt)
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
