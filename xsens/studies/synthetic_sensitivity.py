"""Study `synthetic_sensitivity`: one attention layer vs an MLP on sparse-token and Boolean tasks.

Vasudeva et al., "Transformers Learn Low Sensitivity Functions", ICLR 2025 (arXiv
2403.06925) §2–§3.1 (OpenReview numbering; spec §6). What the paper states: a single
attention layer (W_Q, W_K, W_V, linear decoder U) learns lower-sensitivity functions
than an MLP on synthetic data where labels depend on a few tokens; and Prop. 2.1
(transformer in the NTK regime): "Larger eigenvalues for lower-order monomials indicate
that simpler features are learned faster … a weak form of low sensitivity bias". The
data model, sizes, label rule and training settings are not known: everything below
the model formula is our design.

Part 1, sparse tokens (`config.sparse`; data `xsens.data.sparse_tokens`): n tokens, the
label is the majority (or parity) of one sign of k fixed tokens. Each model is trained
by full-batch Adam on the cross-entropy until its train accuracy reaches
`target_train_accuracy` (checked every `eval_every` steps; matched accuracy) or
`max_steps`. Then, on the training set, token-wise Gaussian sensitivity
(`xsens.measures.sensitivity.token_sensitivity`, noise N(0, sigma^2 I_d) on one token at
a time, R draws) for every sigma of `sigmas`: the mean over tokens, the mean over the k
relevant tokens and over the n − k others, and the per-position profile.

Part 2, Boolean spectrum (`config.boolean`): f* = sum_c coef_c chi_{S_c} on {±1}^n
(default x_0 + x_1 x_2 + x_3 x_4 x_5: degrees 1, 2, 3), fed as n tokens [x_i ; p e_i];
MSE regression by full-batch Adam on a `train_fraction` of the 2^n inputs. Every
`log_every` steps, the learned function on all 2^n inputs -> exact Fourier–Walsh
coefficients (`xsens.measures.boolean`): the coefficient of each target monomial, the
degree spectrum W^k and the total influence sum_S |S| fhat(S)^2. A component is
"learned" at the first logged step at which its coefficient reaches `learned_fraction`
(0.9; also reported: 0.5) of its target; the weak spectral bias predicts lower degrees
first.

Each trained model goes through the one loop (`xsens.train.loop`) in its own workdir,
`workdir/runs/<part>_<model>/` (orbax checkpoints, metrics, the Boolean coefficients as
array logs), so an interrupted study resumes where it stopped and a rerun trains nothing
new; a run's workdir is keyed by what the model's training depends on (changing σ, the
draws or `learned_fraction` reuses it).
"""

from __future__ import annotations

import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from xsens.data import sparse_tokens as st
from xsens.errors import is_finite_number, is_int, require
from xsens.measures import boolean
from xsens.measures import sensitivity as sens_lib
from xsens.models import one_layer_attention as ola
from xsens.report import plots, tables
from xsens.train import loop
from xsens.train.metrics import read_metrics
from xsens.train.workdir import Workdir

MODELS = ("attention", "mlp")
RUNS_DIR = "runs"                 # workdir/runs/<part>_<model>/: one trained model each.
SUMMARY_FILE = "train_summary.json"
CHECKPOINT_CHUNKS = 20            # Sparse runs: a checkpoint every 20 chunks (and at the stop).
LOGS_PER_CHUNK = 20               # Boolean runs: one jitted chunk (and checkpoint) per 20 logs.
_LOSS, _ACC = "eval/train_loss", "eval/train_accuracy"

# ------------------------------------------------------------------------------------------
# Validation.


def _pos_int(v) -> bool:
  return is_int(v) and v >= 1


def validate(config) -> None:
  """Raises ConfigError naming `config.<field>` for any unusable value (nothing compiled)."""
  models = list(config.get("models") or [])
  require(models and all(m in MODELS for m in models) and len(set(models)) == len(models),
        "models", f"must be a non-empty list of distinct names from {MODELS}, got {models!r}")
  require(is_int(config.seed) and config.seed >= 0, "seed", f"must be an int >= 0, got "
        f"{config.seed!r}")
  a = config.attention
  for f in ("qk_dim", "v_dim"):
    require(a[f] is None or _pos_int(a[f]), f"attention.{f}",
          f"must be None (= d) or a positive int, got {a[f]!r}")
  hd = list(config.mlp.hidden_dims)
  require(all(_pos_int(h) for h in hd), "mlp.hidden_dims",
        f"must be a list of positive ints, got {hd!r}")
  for m in MODELS:
    lr = config[m].learning_rate
    require(is_finite_number(lr) and lr > 0, f"{m}.learning_rate", f"must be > 0, got {lr!r}")
  require(config.sparse.enabled or config.boolean.enabled, "sparse.enabled",
        "at least one of sparse.enabled and boolean.enabled must be True")
  s = config.sparse
  if s.enabled:
    for f in ("n", "m", "k", "num_train", "num_test", "max_steps", "eval_every", "num_draws"):
      require(_pos_int(s[f]), f"sparse.{f}", f"must be a positive int, got {s[f]!r}")
    require(s.k <= s.n, "sparse.k", f"must be <= sparse.n={s.n}, got {s.k}")
    require(s.rule in st.RULES, "sparse.rule", f"got {s.rule!r}; allowed: {', '.join(st.RULES)}")
    require(s.rule != "majority" or s.k % 2 == 1, "sparse.k",
          f"must be odd for rule='majority' (no ties), got {s.k}")
    require(is_finite_number(s.position_scale) and s.position_scale >= 0, "sparse.position_scale",
          f"must be >= 0, got {s.position_scale!r}")
    require(is_finite_number(s.target_train_accuracy) and 0 < s.target_train_accuracy <= 1,
          "sparse.target_train_accuracy", f"must be in (0, 1], got {s.target_train_accuracy!r}")
    require(s.target_train_loss is None or (is_finite_number(s.target_train_loss)
                                          and s.target_train_loss > 0),
          "sparse.target_train_loss", f"must be None or > 0, got {s.target_train_loss!r}")
    sig = list(s.sigmas)
    require(sig and all(is_finite_number(x) and x >= 0 for x in sig), "sparse.sigmas",
          f"must be a non-empty list of standard deviations >= 0, got {sig!r}")
  b = config.boolean
  if b.enabled:
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
    require(is_finite_number(b.train_fraction) and 0 < b.train_fraction <= 1, "boolean.train_fraction",
          f"must be in (0, 1], got {b.train_fraction!r}")
    require(is_finite_number(b.learned_fraction) and 0 < b.learned_fraction <= 1,
          "boolean.learned_fraction", f"must be in (0, 1], got {b.learned_fraction!r}")
    require(is_finite_number(b.position_scale) and b.position_scale >= 0, "boolean.position_scale",
          f"must be >= 0, got {b.position_scale!r}")


# ------------------------------------------------------------------------------------------
# Models and training.


def make_model(config, name: str, num_outputs: int):
  if name == "attention":
    a = config.attention
    return ola.OneLayerAttention(num_outputs=num_outputs, qk_dim=a.qk_dim, v_dim=a.v_dim)
  return ola.TokenMLP(num_outputs=num_outputs, hidden_dims=tuple(config.mlp.hidden_dims))


def _num_params(params) -> int:
  return int(sum(x.size for x in jax.tree.leaves(params)))


def run_config(config, part: str, index: int, name: str) -> dict:
  """What the training of model `name` (position `index` in `config.models`) in `part`
  ("sparse" or "boolean") depends on: its run workdir's fingerprint."""
  section = config[part].to_dict()
  for field in ("enabled", "sigmas", "num_draws", "learned_fraction"):  # Measurement only.
    section.pop(field, None)
  return {"part": part, "model": name, "index": index, "seed": config.seed,
          name: config[name].to_dict(), part: section}


def run_workdirs(config, workdir: str) -> dict[tuple[str, str], tuple[str, dict]]:
  """{(part, model): (run workdir, its fingerprint)} of every enabled part."""
  return {(part, name): (os.path.join(workdir, RUNS_DIR, f"{part}_{name}"),
                         run_config(config, part, i, name))
          for part in ("sparse", "boolean") if config[part].enabled
          for i, name in enumerate(config.models)}


def _open_run(config, workdir: str, part: str, name: str, overwrite: bool) -> Workdir:
  path, fingerprint = run_workdirs(config, workdir)[(part, name)]
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

  def loss_fn(p):
    logits = model.apply({"params": p}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @functools.partial(jax.jit, static_argnums=1)
  def chunk(state, length):
    def body(carry, _):
      p, opt = carry
      loss, g = jax.value_and_grad(loss_fn)(p)
      upd, opt = tx.update(g, opt, p)
      return (optax.apply_updates(p, upd), opt), loss
    (p, opt), _ = jax.lax.scan(body, (state["params"], state["opt"]), None, length=length)
    logits = model.apply({"params": p}, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return {"params": p, "opt": opt, "loss": loss,
            "accuracy": jnp.mean(jnp.argmax(logits, -1) == y)}

  def init():
    return {"params": params, "opt": tx.init(params), "loss": jnp.float32(jnp.nan),
            "accuracy": jnp.float32(0.0)}

  def reached(scalars):
    return scalars[_ACC] >= target and (target_loss is None or scalars[_LOSS] <= target_loss)

  program = loop.Program(
      init=init, abstract_state=_abstract(jax.eval_shape(init)),
      advance=lambda state, step, length: (chunk(state, length), None, None),
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


def _sensitivity_fn(model, *, num_draws: int, chunk_size: int):
  """jit (variables, tokens [B, n, d], key, sigma) -> token_sensitivity's dict for `model`
  (the weights are an argument, not a constant of the compiled function)."""

  @jax.jit
  def measure(variables, tokens, key, sigma):
    return sens_lib.token_sensitivity(model.apply, variables, tokens, key=key, sigma=sigma,
                                      num_draws=num_draws, chunk_size=chunk_size,
                                      example_chunk_size=None)
  return measure


def run_sparse(config, workdir: str, *, overwrite: bool = False, log=print,
               max_chunks: int | None = None) -> dict:
  """Part 1 (each model trained, or resumed, in `workdir/runs/sparse_<model>`; `max_chunks`
  interrupts each, for tests): returns {"rows", "profiles" {model: {sigma: [n]}},
  "positions", "curves"}."""
  s = config.sparse
  seed = int(config.seed)
  positions = st.relevant_positions(int(s.n), int(s.k), seed)
  kw = dict(n=int(s.n), m=int(s.m), k=int(s.k), rule=s.rule,
            position_scale=float(s.position_scale), positions=positions)
  train = st.sparse_token_task(int(s.num_train), seed=seed * 2 + 1, **kw)
  test = st.sparse_token_task(int(s.num_test), seed=seed * 2 + 2, **kw)
  x, y = jnp.asarray(train["tokens"]), jnp.asarray(train["labels"])
  xt, yt = jnp.asarray(test["tokens"]), jnp.asarray(test["labels"])
  relevant = np.zeros(int(s.n), bool)
  relevant[positions] = True
  rows, profiles, curves = [], {}, {}
  for i, name in enumerate(config.models):
    model = make_model(config, name, 2)
    params = model.init(jax.random.fold_in(jax.random.key(seed), i), x[:1])["params"]
    tx = optax.adam(float(config[name].learning_rate))
    params, steps, acc, curve, wall = train_to_accuracy(
        _open_run(config, workdir, "sparse", name, overwrite), model, params, tx, x, y,
        target=float(s.target_train_accuracy), eval_every=int(s.eval_every),
        max_steps=int(s.max_steps),
        target_loss=None if s.target_train_loss is None else float(s.target_train_loss),
        max_chunks=max_chunks)
    curves[name] = curve
    test_acc = float(jnp.mean(jnp.argmax(model.apply({"params": params}, xt), -1) == yt))
    measure = _sensitivity_fn(model, num_draws=int(s.num_draws), chunk_size=int(s.n))
    profiles[name] = {}
    for j, sigma in enumerate(s.sigmas):
      # Common random numbers: the same noise for both models at each sigma.
      out = measure({"params": params}, x, jax.random.fold_in(jax.random.key(seed + 1000), j),
                    float(sigma))
      per_pos = np.asarray(out["per_token"]).mean(0)
      profiles[name][float(sigma)] = per_pos.tolist()
      rows.append({"model": name, "params": _num_params(params), "steps": steps,
                   "train_acc": acc, "train_loss": curve[-1][1], "test_acc": test_acc,
                   "sigma": float(sigma),
                   "sensitivity": float(out["mean"]), "stderr": float(out["stderr"]),
                   "relevant_tokens": float(per_pos[relevant].mean()),
                   "other_tokens": float(per_pos[~relevant].mean())
                   if (~relevant).any() else float("nan"),
                   "train_s": round(wall, 2)})
    log(f"[synthetic] {name}: {steps} steps, train acc {acc:.3f}, test acc {test_acc:.3f}")
  return {"rows": rows, "profiles": profiles, "positions": positions.tolist(),
          "curves": curves}


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
      with np.load(path) as z:
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
  """Part 2 (each model trained, or resumed, in `workdir/runs/boolean_<model>`;
  `max_chunks` interrupts each, for tests): returns {"rows", "components", "steps",
  "coef" {model: [L+1, C]}, "spectrum" {model: [L+1, n+1]}, "influence" {model: [L+1]},
  "target_spectrum"}."""
  b = config.boolean
  n, seed = int(b.n), int(config.seed)
  target, comps = st.boolean_target(n, [(tuple(c[0]), c[1]) for c in b.components])
  tokens = jnp.asarray(st.boolean_tokens(n, float(b.position_scale)))
  mask = np.ones(2**n, np.float32)
  if b.train_fraction < 1:
    keep = max(1, int(round(b.train_fraction * 2**n)))
    mask[:] = 0
    mask[np.random.default_rng(seed).choice(2**n, keep, replace=False)] = 1
  idx = [c["index"] for c in comps]
  logged = np.arange(0, int(b.steps) + 1, int(b.log_every))
  target_coeffs = boolean.fourier_coefficients(jnp.asarray(target))
  out = {"components": comps, "steps": logged.tolist(), "coef": {}, "spectrum": {},
         "influence": {}, "rows": [],
         "target_spectrum": np.asarray(boolean.degree_spectrum(target_coeffs)).tolist(),
         "target_influence": float(boolean.fourier_average_sensitivity(target_coeffs))}
  for i, name in enumerate(config.models):
    model = make_model(config, name, 1)
    params = model.init(jax.random.fold_in(jax.random.key(seed + 7), i), tokens[:1])["params"]
    tx = optax.adam(float(config[name].learning_rate))
    params, coeffs, losses, wall = boolean_trajectory(
        _open_run(config, workdir, "boolean", name, overwrite), model, params, tx, tokens,
        jnp.asarray(target), jnp.asarray(mask), steps=int(b.steps),
        log_every=int(b.log_every), max_chunks=max_chunks)
    coef = np.asarray(coeffs)[:, idx]                               # [L+1, C]
    spec = np.asarray(boolean.degree_spectrum(coeffs))              # [L+1, n+1]
    infl = np.asarray(boolean.fourier_average_sensitivity(coeffs))  # [L+1]
    out["coef"][name], out["spectrum"][name], out["influence"][name] = coef, spec, infl
    for c, comp in enumerate(comps):
      out["rows"].append({
          "model": name, "component": "x" + "·x".join(str(j) for j in comp["coords"]),
          "degree": comp["degree"], "target_coef": comp["coef"],
          "step_50%": learned_step(coef[:, c], comp["coef"], 0.5, logged),
          f"step_{int(100 * b.learned_fraction)}%": learned_step(
              coef[:, c], comp["coef"], float(b.learned_fraction), logged),
          "final_coef": float(coef[-1, c]), "final_train_mse": float(losses[-1]),
          "final_influence": float(infl[-1]), "train_s": round(wall, 2)})
    log(f"[synthetic] boolean {name}: final coefficients {np.round(coef[-1], 3)}, "
        f"train MSE {float(losses[-1]):.4f}")
  return out


# ------------------------------------------------------------------------------------------
# Report.


def _boolean_figure(path: str, res: dict) -> str:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  models = list(res["coef"])
  steps = np.asarray(res["steps"])
  fig, axes = plt.subplots(2, len(models), figsize=(4.6 * len(models), 6.4), squeeze=False)
  for j, name in enumerate(models):
    ax = axes[0, j]
    for c, comp in enumerate(res["components"]):
      ax.plot(steps, res["coef"][name][:, c] / comp["coef"],
              label=f"deg {comp['degree']}: " + "x" + "·x".join(map(str, comp["coords"])))
    ax.axhline(1.0, color="gray", lw=0.6, ls="--")
    ax.set_title(f"{name}: learned / target coefficient", fontsize=9)
    ax.set_xlabel("step")
    ax.legend(fontsize=7)
    ax = axes[1, j]
    spec = res["spectrum"][name]
    for k in range(spec.shape[1]):
      if k <= 4 or spec[:, k].max() > 0.05:
        ax.plot(steps, spec[:, k], label=f"W^{k}")
    ax.set_title(f"{name}: degree spectrum W^k of the learned f", fontsize=9)
    ax.set_xlabel("step")
    ax.legend(fontsize=7)
  return plots._save(fig, path)  # pylint: disable=protected-access


def run(config, workdir: str, *, overwrite: bool = False, log=print) -> dict:
  """Runs the enabled parts and writes results.md/json and the plots.

  Every trained model resumes from its run workdir (`run_workdirs`); each is checked
  against the config before anything trains (ConfigError on `workdir`, nothing written);
  `overwrite` trains them all again.
  """
  validate(config)
  for path, fingerprint in run_workdirs(config, workdir).values():
    Workdir(path).check(fingerprint, overwrite=overwrite)
  os.makedirs(workdir, exist_ok=True)
  t0 = time.perf_counter()
  rows, figs, notes, extra = [], [], [], {"config": json.loads(config.to_json_best_effort())}
  result = {}
  if config.sparse.enabled:
    sp = run_sparse(config, workdir, overwrite=overwrite, log=log)
    result["sparse"] = sp
    rows += sp["rows"]
    sigma = float(config.sparse.sigmas[-1])
    figs.append(plots.line_plot(
        os.path.join(workdir, "sparse_per_position.png"), list(range(config.sparse.n)),
        {m: sp["profiles"][m][sigma] for m in sp["profiles"]}, xlabel="token position",
        ylabel=f"flip probability (σ={sigma:g})",
        title=f"Per-position sensitivity; relevant: {sp['positions']}"))
    figs.append(plots.line_plot(
        os.path.join(workdir, "sparse_sensitivity_vs_sigma.png"),
        [float(x) for x in config.sparse.sigmas],
        {r_m: [r["sensitivity"] for r in sp["rows"] if r["model"] == r_m]
         for r_m in sp["profiles"]}, xlabel="σ", ylabel="token-wise sensitivity",
        title="Mean over tokens, training set"))
    s = config.sparse
    notes.append(
        f"Sparse tokens: n={s.n} tokens of d={s.m}+{s.n} (content signs/√{s.m}, position "
        f"one-hot ×{s.position_scale}); label = {s.rule} of one sign of the k={s.k} tokens "
        f"at positions {sp['positions']}; {s.num_train} train / {s.num_test} test; Adam "
        f"full batch until train accuracy ≥ {s.target_train_accuracy}"
        + (f" and train loss ≤ {s.target_train_loss}" if s.target_train_loss else "")
        + f" (checked every "
        f"{s.eval_every} steps, ≤ {s.max_steps}); token-wise sensitivity on the training "
        f"set, {s.num_draws} draws per token.")
    extra["sparse"] = {"profiles": {m: {str(k): v for k, v in p.items()}
                                    for m, p in sp["profiles"].items()},
                       "positions": sp["positions"], "curves": sp["curves"]}
  if config.boolean.enabled:
    bo = run_boolean(config, workdir, overwrite=overwrite, log=log)
    result["boolean"] = bo
    figs.append(_boolean_figure(os.path.join(workdir, "boolean_spectrum.png"), bo))
    b = config.boolean
    order = {}
    for m in bo["coef"]:
      key = f"step_{int(100 * b.learned_fraction)}%"
      got = [(r[key], r["degree"]) for r in bo["rows"] if r["model"] == m]
      order[m] = [d for s_, d in sorted(got, key=lambda t: (t[0] is None, t[0] or 0))
                  if s_ is not None]
    notes.append(
        "Boolean: f* = " + " + ".join(f"{c['coef']:g}·x" + "·x".join(map(str, c["coords"]))
                                       for c in bo["components"])
        + f" on n={b.n} bits ({2 ** b.n} inputs, {b.train_fraction:.0%} for training); "
        f"MSE, Adam full batch, {b.steps} steps; exact Fourier–Walsh spectrum of the "
        f"learned function every {b.log_every} steps. Order in which components reach "
        f"{b.learned_fraction:.0%} of their coefficient (degrees): "
        + "; ".join(f"{m}: {o}" for m, o in order.items()) + ".")
    if rows:
      notes.append("Boolean spectrum rows:\n\n" + tables.markdown_table(bo["rows"]))
    else:
      rows = bo["rows"]
    extra["boolean"] = {"steps": bo["steps"], "components": bo["components"],
                        "coef": {m: v.tolist() for m, v in bo["coef"].items()},
                        "spectrum": {m: v.tolist() for m, v in bo["spectrum"].items()},
                        "influence": {m: v.tolist() for m, v in bo["influence"].items()},
                        "target_spectrum": bo["target_spectrum"],
                        "target_influence": bo["target_influence"], "order": order}
  extra["wall_s"] = time.perf_counter() - t0
  md = tables.write_results(workdir, "Synthetic sensitivity: one attention layer vs MLP",
                            rows, notes="\n\n".join(notes),
                            extra=extra, plots=figs)
  return {"rows": rows, "markdown": md, **result}

