"""Study `grokking`: sensitivity as a progress measure for grokking modular addition.

Vasudeva et al., "Transformers Learn Low Sensitivity Functions", ICLR 2025 (arXiv
2403.06925); official code estija/sensitivity language/sens_addition.py and
language/sens_modular_addition.ipynb (docs/papers/sensitivity.md §5). The paper's claim (secondary
source): sensitivity falls during the loss plateau, before test accuracy jumps; the authors call
sensitivity "a progress measure for grokking" (rebuttal).

Setup (as the official code):
  * task (a + b) mod p on the inputs "a b =" (ids a, b, p; vocabulary p + 1); all p^2
    pairs, the first int(train_fraction * p^2) of a permutation are the training set, the
    rest the test set. The permutation is `np.random.RandomState(seed).shuffle`, the same
    stream as the notebook's `np.random.seed(seed); np.random.shuffle(indices)`, so seed 42
    gives the official split.
  * `xsens.models.grokking_transformer.GrokkingTransformer` (no residuals, no LayerNorm).
  * AdamW with PyTorch's defaults (betas 0.9, 0.999, eps 1e-8, decoupled weight decay on
    every parameter, as `optim.AdamW(model.parameters(), lr, weight_decay)`), full batch,
    cross-entropy.
  * sensitivity: N(0, sigma^2) added to the embeddings (token + position) of positions 0
    and 1 together, "=" untouched, one draw per training example; the flip fraction of the
    argmax against the clean argmax, on the whole training set
    (`xsens.measures.sensitivity.global_sensitivity` with a token mask).

Logging (row t = the parameters after t updates, t = 0..epochs-1; the final parameters
are evaluated once more at the end): train loss and accuracy (from the forward pass of
the update itself), sensitivity, the L2 norm of all parameters, and test loss/accuracy
when t % test_every == 0 (NaN otherwise). The notebook logs the train metrics of epoch e
at the same parameters (before update e) and the sensitivity/norm one update later: a
one-epoch offset. Epochs run through the one loop (`xsens.train.loop`) as jitted
`lax.scan` chunks, seeds `vmap`ped; after each chunk the workdir saves the logs
(`logs/epochs_<a>_<b>.npz`) and the full state (orbax: params, AdamW state, step), so an
interrupted run resumes exactly where it stopped (the noise of epoch t uses
fold_in(key, t), a pure function of the step).

Events (per seed, on the logs; all reported in results.md):
  * memorised: the first epoch with train accuracy >= 0.99.
  * grokked: the first test evaluation (every `test_every` epochs) with test accuracy >=
    t, for each t in `report.grok_thresholds` (0.5, 0.95): keys `grok_epoch_<t>` and
    `lead_epochs_<t>`; the first threshold (0.5) also gives the unsuffixed `grok_epoch`,
    `lead_epochs`, `sens_at_grok` and `grokked` (it grokked within the run's epochs), the
    keys of a single-threshold report.
  * sensitivity peak: the epoch of the maximum of the trailing rolling mean (window
    `report.window` = 50, as the notebook's plots) of the sensitivity on the plateau: from
    `window` epochs after memorisation (this skips the transient while the training set
    is still being fitted) up to the grokking epoch of the first threshold (to the end
    if it did not grok). The paper's claim is about the plateau; after grokking, AdamW
    with weight decay 1.0 has late loss spikes (the "slingshot" of Thilak et al., 2022)
    during which the sensitivity rises again at 100 % test accuracy: at p = 113 from the
    official initial weights, 4 of 5 seeds rose from < 1 % to 13-40 % after epoch 17,000.
    That maximum is reported apart (`sens_post_grok_max`).
  * sensitivity falls: the first epoch after the peak at which the rolling mean is <=
    `report.fall_fraction` (0.5) x the peak; `sens_drop10_epoch` uses 0.9 (the start of
    the fall).
  * test accuracy starts rising (`test_rise_epoch`): the first test evaluation after
    memorisation at least 0.05 above the first one after memorisation.
  * lead = grokked − sensitivity falls (> 0: sensitivity falls before test accuracy jumps).

Across seeds (`summary`, one row per threshold): the fraction that grokked within the
run's epochs, and mean ± standard error (sample std / sqrt n) of the grokking epoch and of
the lead over the n seeds where each is defined (n stated; no s.e. for n = 1).

Initial weights (`model.init_npz`, None by default: the seeds' own draws): an `.npz` of the
official model's state_dict (keys and shapes in `xsens.models.grokking_transformer`,
converted by its `from_official`), cast to float32, replaces the initial parameters; the
AdamW state starts at zero as PyTorch's. Each array either has the official shape (every
seed starts from it) or a leading seed axis of length `train.num_seeds` (index i for seed
`seed + i`; the split of seed i is still RandomState(seed + i)'s, as the official code's).
The workdir's guard sees the path, not the file's contents; results.json records the
file's sha256. Training from these weights follows the official code's steps; its
sensitivity noise is a different random stream (it does not affect training).
"""

from __future__ import annotations

import functools
import json
import math
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mlcollections_configs import grokking as configs
from xsens.errors import require
from xsens.models import grokking_transformer as gt
from xsens.report import plots, tables
from xsens.data import modular_addition
from xsens.lab import modular_addition as addition_model
from xsens.train import full_batch, loop, optim
from xsens.train.workdir import Workdir

STEP_FIELDS = ("train_loss", "train_accuracy", "sensitivity", "weight_norm", "test_loss",
               "test_accuracy")

# ------------------------------------------------------------------------------------------
# Validation.


def validate(config) -> None:
  """ConfigError naming `config.<field>` for any unusable value (nothing compiled): the
  field checks of the config file (`mlcollections_configs.grokking.validate`), then the
  initial weights of `model.init_npz` (a file) against the model."""
  configs.validate(config)
  if config.model.init_npz is not None:
    addition_model.load_init_npz(config)  # Refuses a missing file, wrong keys, shapes, values.


# ------------------------------------------------------------------------------------------
# Model, optimiser and the jitted chunk of epochs.


def make_model(config) -> gt.GrokkingTransformer:
  p = int(config.data.modulus)
  m = config.model
  return gt.GrokkingTransformer(vocab_size=p + 1, num_classes=p + 1, width=int(m.width),
                                num_heads=int(m.num_heads), mlp_dim=int(m.mlp_dim))


def make_optimizer(config) -> optax.GradientTransformation:
  """AdamW with PyTorch's semantics: p <- p - lr (adam(g) + wd p), all params."""
  o = config.optimizer
  return optim.optimizer_by_name("adamw", float(o.learning_rate), b1=float(o.b1),
                                 b2=float(o.b2), eps=float(o.eps),
                                 weight_decay=float(o.weight_decay))


def _cross_entropy(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def state_from_params(tx: optax.GradientTransformation, params) -> dict:
  """The training state at step 0 from parameters: {"params", "opt" (fresh), "step"}."""
  return {"params": params, "opt": tx.init(params), "step": jnp.zeros((), jnp.int32)}


def make_fns(config):
  """(model, init_state(key) -> state, chunk(state, data, key, start, length) -> (state,
  logs [length]), evaluate(params, data, key, step) -> metrics); pure, for one seed (vmap
  them over seeds, `start` unbatched). `init_state` draws the parameters (PyTorch's
  initialisation); `initial_state` applies `model.init_npz`."""
  model = make_model(config)
  tx = make_optimizer(config)
  sigma = float(config.sensitivity.sigma)
  mask = np.zeros(gt.SEQ_LEN, bool)
  mask[list(config.sensitivity.positions)] = True
  token_mask = jnp.asarray(mask)
  test_every = int(config.train.test_every)

  def init_state(key):
    params = model.init(key, jnp.zeros((1, gt.SEQ_LEN), jnp.int32))["params"]
    return state_from_params(tx, params)

  def sensitivity(params, ids, clean, key):
    variables = {"params": params}
    tokens = model.apply(variables, ids, method=model.embed)
    apply_fn = functools.partial(model.apply, method=model.from_embeddings)
    return addition_model.embedding_sensitivity(apply_fn, variables, tokens, labels=clean,
                                                key=key, sigma=sigma, token_mask=token_mask)

  def test_metrics(params, data):
    logits = model.apply({"params": params}, data["test_ids"])
    return (_cross_entropy(logits, data["test_labels"]),
            jnp.mean(jnp.argmax(logits, -1) == data["test_labels"]))

  def loss_fn(params, data):
    logits = model.apply({"params": params}, data["train_ids"])
    return _cross_entropy(logits, data["train_labels"]), logits

  def epoch(state, data, key, step):
    params = state["params"]
    new_params, opt, loss, logits = full_batch.optax_step(loss_fn, tx, params, state["opt"],
                                                          data, has_aux=True)
    clean = jnp.argmax(logits, -1)
    log = {"train_loss": loss,
           "train_accuracy": jnp.mean(clean == data["train_labels"]),
           "sensitivity": sensitivity(params, data["train_ids"], clean,
                                      jax.random.fold_in(key, step)),
           "weight_norm": addition_model.weight_norm(params)}
    nan = jnp.full((), jnp.nan, jnp.float32)
    log["test_loss"], log["test_accuracy"] = jax.lax.cond(
        step % test_every == 0, lambda: test_metrics(params, data), lambda: (nan, nan))
    return {"params": new_params, "opt": opt, "step": state["step"] + 1}, log

  def chunk(state, data, key, start, length: int):
    # The epoch index comes from xs, not from the (per-seed, vmapped) state, so the
    # test-every-k `lax.cond` keeps an unbatched predicate and stays a real branch.
    steps = start + jnp.arange(length, dtype=jnp.int32)
    return jax.lax.scan(lambda s, t: epoch(s, data, key, t), state, steps)

  def evaluate(params, data, key, step):
    loss, logits = loss_fn(params, data)
    clean = jnp.argmax(logits, -1)
    test_loss, test_acc = test_metrics(params, data)
    return {"train_loss": loss, "train_accuracy": jnp.mean(clean == data["train_labels"]),
            "sensitivity": sensitivity(params, data["train_ids"], clean,
                                       jax.random.fold_in(key, step)),
            "weight_norm": addition_model.weight_norm(params), "test_loss": test_loss,
            "test_accuracy": test_acc}

  return model, init_state, chunk, evaluate


def seeds_of(config) -> list[int]:
  return [int(config.seed) + i for i in range(int(config.train.num_seeds))]


def stacked_data(config) -> dict:
  """Per-seed splits stacked on a leading seed axis (same sizes for every seed)."""
  splits = [modular_addition.split(int(config.data.modulus),
                                   float(config.data.train_fraction), s)
            for s in seeds_of(config)]
  keys = ("train_ids", "train_labels", "test_ids", "test_labels")
  return {k: jnp.asarray(np.stack([s[k] for s in splits])) for k in keys}


def initial_state(config, init_keys):
  """The seeds' step-0 state [S, ...]: drawn from `init_keys`, or `model.init_npz`'s weights."""
  _, init_state, _, _ = make_fns(config)
  if config.model.init_npz is None:
    return jax.jit(jax.vmap(init_state))(init_keys)
  tx = make_optimizer(config)
  params = jax.tree.map(jnp.asarray, addition_model.load_init_npz(config))
  return jax.jit(jax.vmap(functools.partial(state_from_params, tx)))(params)


def seed_keys(config):
  """(init keys, noise keys) [S]: key(seed) folded with 0 / 1."""
  base = [jax.random.key(s) for s in seeds_of(config)]
  return (jnp.stack([jax.random.fold_in(k, 0) for k in base]),
          jnp.stack([jax.random.fold_in(k, 1) for k in base]))


# ------------------------------------------------------------------------------------------
# Training: the one loop, one chunk of epochs per call.


def load_logs(workdir: str, upto: int, num_seeds: int) -> dict:
  """{field: [S, upto]} from the array logs of epochs [0, upto) (NaN where missing)."""
  return Workdir(workdir).read_step_log(upto, STEP_FIELDS, (num_seeds,))


def train(config, workdir: str, *, max_chunks: int | None = None, log=print) -> dict:
  """Trains (or resumes) every seed through the one loop (`xsens.train.loop`).

  One call of the loop's `advance` runs a chunk of epochs as a jitted, seed-vmapped
  `lax.scan` (compiled ahead of time once per chunk length, outside the timing); chunks
  end at multiples of `train.chunk_epochs`, and after each the per-epoch logs
  (`logs/epochs_<a>_<b>.npz`, {field: [S, b - a]} float32) and the full state (params,
  AdamW state, step) are saved. `max_chunks` stops after that many new chunks (at least
  one). A new run starts from `initial_state` (`model.init_npz`'s weights when set); a
  resumed one from its checkpoint. Returns {"logs" {field: [S, E]}, "final" ({field: [S]}
  after the last epoch, None if interrupted), "wall_s", "compile_s", "epochs_done",
  "resumed_from", "chunks_computed", "num_params"}.
  """
  epochs, size = int(config.train.epochs), int(config.train.chunk_epochs)
  wd = Workdir(workdir, keep_checkpoints=int(config.train.keep_checkpoints))
  held = wd.latest_step()
  require(held is None or held <= epochs, "train.epochs",
          f"{epochs}, but {workdir!r} already holds {held} trained epochs; use epochs >= "
          f"{held} (to extend the run) or --overwrite")
  if held is not None:
    log(f"[grokking] resumed at epoch {held}")
  model, init_state, chunk, evaluate = make_fns(config)
  data = stacked_data(config)
  init_keys, noise_keys = seed_keys(config)
  abstract = jax.eval_shape(jax.jit(jax.vmap(init_state)), init_keys)
  compiled, stats = {}, {"wall_s": 0.0, "compile_s": 0.0, "chunk_s": 0.0, "chunks": 0}

  def advance(state, start, length):
    if length not in compiled:
      fn = jax.jit(jax.vmap(functools.partial(chunk, length=length), in_axes=(0, 0, 0, None)))
      t0 = time.perf_counter()
      compiled[length] = fn.lower(state, data, noise_keys, jnp.int32(start)).compile()
      stats["compile_s"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    state, logs = compiled[length](state, data, noise_keys, jnp.int32(start))
    logs = {k: np.asarray(v, np.float32) for k, v in jax.device_get(logs).items()}
    stats["chunk_s"] = time.perf_counter() - t0
    stats["wall_s"] += stats["chunk_s"]
    stats["chunks"] += 1
    return state, None, logs

  def on_chunk(start, end, logs, _):
    dt, acc = stats["chunk_s"], logs["test_accuracy"]
    tested = ~np.isnan(acc[0])
    last_test = acc[:, tested][:, -1] if np.any(tested) else acc[:, -1]
    log(f"[grokking] epoch {end}/{epochs} ({dt:.1f}s, {1e3 * dt / (end - start):.1f} "
        f"ms/epoch): train acc {np.round(logs['train_accuracy'][:, -1], 3)}, test acc "
        f"{np.round(last_test, 3)}, sensitivity {np.round(logs['sensitivity'][:, -1], 3)}")

  res = full_batch.run_one_device(
      wd, lambda: initial_state(config, init_keys), advance,
      loop.Schedule(total_steps=epochs, checkpoint_every=size, max_chunk=size),
      abstract=abstract, on_chunk=on_chunk, desc="grokking", max_chunks=max_chunks)
  final = None
  if res.step >= epochs:
    final = jax.device_get(jax.jit(jax.vmap(evaluate, in_axes=(0, 0, 0, None)))(
        res.state["params"], data, noise_keys, jnp.int32(res.step)))
    rms = jax.jit(jax.vmap(functools.partial(
        addition_model.embedding_rms, model, positions=tuple(config.sensitivity.positions))))
    final["embedding_rms"] = np.asarray(rms(res.state["params"], data["train_ids"]))
    final["initial_embedding_rms"] = np.asarray(rms(
        initial_state(config, init_keys)["params"], data["train_ids"]))
  return {"logs": load_logs(workdir, res.step, len(seeds_of(config))), "final": final,
          "wall_s": stats["wall_s"], "compile_s": stats["compile_s"],
          "epochs_done": res.step, "resumed_from": held or 0,
          "chunks_computed": stats["chunks"],
          "num_params": gt.num_params(model.vocab_size, model.num_classes, model.width,
                                      model.mlp_dim)}


# ------------------------------------------------------------------------------------------
# Events and report.


def rolling_mean(x: np.ndarray, window: int) -> np.ndarray:
  """Trailing mean over the last `window` values (pandas rolling(min_periods=1).mean())."""
  x = np.asarray(x, np.float64)
  c = np.concatenate([[0.0], np.cumsum(x)])
  idx = np.arange(1, len(x) + 1)
  lo = np.maximum(idx - window, 0)
  return (c[idx] - c[lo]) / (idx - lo)


def _first(mask: np.ndarray, offset: int = 0):
  hits = np.nonzero(mask)[0]
  return int(hits[0]) + offset if len(hits) else None


def threshold_key(name: str, threshold: float) -> str:
  """`name` for one grokking threshold, e.g. ("grok_epoch", 0.95) -> "grok_epoch_0.95"."""
  return f"{name}_{threshold:g}"


def events(logs: dict, *, window: int, grok_thresholds: Sequence[float],
           fall_fraction: float, rise: float = 0.05) -> dict:
  """The epochs defined in the module docstring for ONE seed (logs: {field: [E]}).

  Per threshold t: `grok_epoch_<t>`, `lead_epochs_<t>`; the first threshold also gives
  `grok_epoch`, `lead_epochs`, `sens_at_grok` and `grokked` (grok_epoch is not None).
  """
  sens = rolling_mean(logs["sensitivity"], window)
  test = np.asarray(logs["test_accuracy"])
  tested = ~np.isnan(test)
  memorised = _first(np.asarray(logs["train_accuracy"]) >= 0.99)
  # The peak after memorisation: skip the transient of the first `window` epochs after it
  # (while the model is still fitting, its predictions are unstable anyway).
  start = min((memorised or 0) + window, len(sens) - 1)
  grok_first = _first(tested & (np.nan_to_num(test) >= grok_thresholds[0]))
  stop = len(sens) if grok_first is None else max(grok_first + 1, start + 1)
  peak = start + int(np.argmax(sens[start:stop]))
  after = sens[peak:]
  out = {"memorised_epoch": memorised,
         "sens_peak_epoch": peak, "sens_peak": float(sens[peak]),
         "sens_drop10_epoch": _first(after <= 0.9 * sens[peak], peak),
         "sens_fall_epoch": _first(after <= fall_fraction * sens[peak], peak),
         "sens_post_grok_max": (float(sens[grok_first:].max())
                                if grok_first is not None else None)}
  # Test accuracy starts rising: `rise` above its first value after memorisation.
  evals = np.nonzero(tested & (np.arange(len(test)) >= (memorised or 0)))[0]
  out["test_rise_epoch"] = (_first(test[evals] >= test[evals[0]] + rise)
                            if len(evals) else None)
  if out["test_rise_epoch"] is not None:
    out["test_rise_epoch"] = int(evals[out["test_rise_epoch"]])
  f = out["sens_fall_epoch"]
  for t in grok_thresholds:
    g = _first(tested & (np.nan_to_num(test) >= t))
    out[threshold_key("grok_epoch", t)] = g
    out[threshold_key("lead_epochs", t)] = (g - f) if g is not None and f is not None else None
  first = grok_thresholds[0]
  out["grok_epoch"] = g = out[threshold_key("grok_epoch", first)]
  out["lead_epochs"] = out[threshold_key("lead_epochs", first)]
  out["grokked"] = g is not None
  out["sens_at_grok"] = float(sens[g]) if g is not None else None
  return out


def mean_se(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
  """(mean, standard error = sample std / sqrt(n), n) over the values that are not None;
  (None, None, 0) for none, s.e. None for one."""
  x = np.asarray([v for v in values if v is not None], np.float64)
  if not len(x):
    return None, None, 0
  se = float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else None
  return float(x.mean()), se, len(x)


def summary(ev: Sequence[dict], grok_thresholds: Sequence[float]) -> list[dict]:
  """One row per threshold across the seeds' `events`: how many grokked within the run
  (fraction), and mean ± s.e. (n) of the grokking epoch and of the lead."""
  rows = []
  for t in grok_thresholds:
    grok = [e[threshold_key("grok_epoch", t)] for e in ev]
    lead = [e[threshold_key("lead_epochs", t)] for e in ev]
    g_mean, g_se, g_n = mean_se(grok)
    l_mean, l_se, l_n = mean_se(lead)
    rows.append({"test_acc_threshold": float(t), "seeds": len(ev), "grokked": g_n,
                 "fraction_grokked": g_n / len(ev) if ev else None,
                 "grok_epoch_mean": g_mean, "grok_epoch_se": g_se, "grok_epoch_n": g_n,
                 "lead_epochs_mean": l_mean, "lead_epochs_se": l_se, "lead_epochs_n": l_n})
  return rows


def _mean_se_text(mean, se, n) -> str:
  if n == 0:
    return "— (n = 0)"
  return f"{mean:,.0f}" + (f" ± {se:,.0f}" if se is not None else "") + f" (n = {n})"


def summary_markdown(rows: Sequence[dict]) -> str:
  """The `summary` rows as a markdown table (mean ± s.e. (n))."""
  return tables.markdown_table([
      {"test acc ≥": f"{r['test_acc_threshold']:g}",
       "grokked": f"{r['grokked']} of {r['seeds']} ({r['fraction_grokked']:.2f})",
       "grokking epoch": _mean_se_text(r["grok_epoch_mean"], r["grok_epoch_se"],
                                       r["grok_epoch_n"]),
       "lead (grokked − sensitivity falls)": _mean_se_text(
           r["lead_epochs_mean"], r["lead_epochs_se"], r["lead_epochs_n"])} for r in rows])


def _figure(path: str, logs: dict, ev: list[dict], config) -> str:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  w = int(config.report.window)
  num_seeds, e = logs["train_loss"].shape
  epochs = np.arange(e)
  fig, axes = plt.subplots(2, 2, figsize=(13, 6.8))
  panels = [("loss", "cross-entropy (nats, log scale)", ["train_loss", "test_loss"], True),
            ("accuracy", "accuracy (fraction correct)", ["train_accuracy", "test_accuracy"],
             False),
            ("sensitivity", "sensitivity (% of flipped predictions)", ["sensitivity"], False),
            ("weight L2 norm", "‖θ‖₂", ["weight_norm"], False)]
  seeds = seeds_of(config)
  for ax, (title, ylabel, keys, logy) in zip(axes.ravel(), panels):
    styles = iter(plots.line_styles(num_seeds * len(keys)))
    for s in range(num_seeds):
      for k in keys:
        y = np.asarray(logs[k][s], np.float64)
        if k.startswith("test"):
          ok = ~np.isnan(y)
          x, y = epochs[ok], y[ok]
        else:
          x, y = epochs, rolling_mean(y, w)
        if k == "sensitivity":
          y = 100 * y
        ax.plot(x, y, label=f"{k} (seed {seeds[s]})" if num_seeds > 1 else k,
                markevery=max(1, len(x) // 12), **{**next(styles), "linewidth": 1.1})
    for i, evs in enumerate(ev):
      if evs["grok_epoch"] is not None:
        ax.axvline(evs["grok_epoch"], color="tab:green", ls="--", lw=0.8,
                   label="test acc ≥ {:g}".format(config.report.grok_thresholds[0])
                   if i == 0 else None)
      if evs["sens_fall_epoch"] is not None:
        ax.axvline(evs["sens_fall_epoch"], color="tab:red", ls=":", lw=0.9,
                   label="sensitivity ≤ {:g}×peak".format(config.report.fall_fraction)
                   if i == 0 else None)
    for m in config.report.markers:
      ax.axvline(m, color="gray", ls="-.", lw=0.6)
    if logy:
      ax.set_yscale("log")
    if title == "accuracy":
      plots.chance_line(ax, int(config.data.modulus))
    plots.styled_axes(ax, title, "epoch", ylabel, integer_x=True)
    plots.legend_outside(ax, fontsize=6, in_layout=True)  # Axes to the right.
  fig.suptitle(f"Grokking (a+b) mod {config.data.modulus}: rolling mean (window {w}) of the "
               "per-epoch train metrics; test every {} epochs".format(config.train.test_every),
               fontsize=10)
  return plots._save(fig, path)  # pylint: disable=protected-access


def run(config, workdir: str, *, overwrite: bool = False, log=print) -> dict:
  """Trains, logs every epoch, finds the events, writes results.md/json and the figure."""
  validate(config)
  # The guard: `report`, `train.epochs`, `train.chunk_epochs` and `train.keep_checkpoints`
  # may change on a resume (Workdir's MAY_CHANGE_ON_RESUME); --overwrite clears the logs.
  wd = Workdir.open(workdir, config, overwrite=overwrite,
                    keep_checkpoints=int(config.train.keep_checkpoints))
  t0 = time.perf_counter()
  out = train(config, workdir, log=log)
  total = time.perf_counter() - t0
  logs, final = out["logs"], out["final"]
  rcfg = config.report
  thresholds = [float(t) for t in rcfg.grok_thresholds]
  ev = [events({k: v[s] for k, v in logs.items()}, window=int(rcfg.window),
                grok_thresholds=thresholds, fall_fraction=float(rcfg.fall_fraction))
        for s in range(logs["train_loss"].shape[0])]
  more = [threshold_key(n, t) for t in thresholds[1:] for n in ("grok_epoch", "lead_epochs")]
  rows = []
  for s, (seed, evs) in enumerate(zip(seeds_of(config), ev)):
    row = {"seed": seed}
    row.update({k: evs[k] for k in ("memorised_epoch", "sens_peak_epoch", "sens_drop10_epoch",
                                    "sens_fall_epoch", "test_rise_epoch", "grok_epoch",
                                    "lead_epochs", *more, "grokked")})
    row["sens_peak_%"] = 100 * evs["sens_peak"]
    row["sens_post_grok_max_%"] = (100 * evs["sens_post_grok_max"]
                                   if evs["sens_post_grok_max"] is not None else None)
    if final is not None:
      row["final_train_acc"] = float(final["train_accuracy"][s])
      row["final_test_acc"] = float(final["test_accuracy"][s])
      row["final_sens_%"] = 100 * float(final["sensitivity"][s])
      row["final_weight_norm"] = float(final["weight_norm"][s])
      # σ relative to the noised embeddings' RMS coordinate, at the start and at the end.
      sigma = float(config.sensitivity.sigma)
      row["noise_to_signal_initial"] = sigma / float(final["initial_embedding_rms"][s])
      row["noise_to_signal_final"] = sigma / float(final["embedding_rms"][s])
    rows.append(row)
  wd.write_npz("logs.npz", logs)
  fig = _figure(wd.file("grokking.png"), logs, ev, config)
  leads = [r["lead_epochs"] for r in rows]
  before = sum(1 for x in leads if x is not None and x > 0)
  notes = [
      f"Task (a+b) mod {config.data.modulus}, {int(config.data.train_fraction * 100)} % of "
      f"the {config.data.modulus ** 2} pairs for training; model width {config.model.width}, "
      f"{config.model.num_heads} heads, MLP {config.model.mlp_dim} ({out['num_params']:,} "
      f"params), no residuals/LayerNorm; AdamW lr {config.optimizer.learning_rate}, weight "
      f"decay {config.optimizer.weight_decay}, full batch, {config.train.epochs} epochs.",
      f"Sensitivity: N(0, {config.sensitivity.sigma}²) on the embeddings of positions "
      f"{list(config.sensitivity.positions)}, one draw, flip fraction on the training set; "
      f"noise_to_signal_initial/final = σ / RMS coordinate of those embeddings at epoch 0 "
      f"and at the end (weight decay shrinks the embeddings, so one σ is a relatively "
      f"stronger noise late in training).",
      f"Events: grok_epoch = first test evaluation with accuracy ≥ {thresholds[0]:g}"
      + "".join(f" ({threshold_key('grok_epoch', t)}: ≥ {t:g})" for t in thresholds[1:])
      + f"; grokked = grok_epoch within the {out['epochs_done']} epochs; sensitivity falls "
      f"= first epoch after the peak of its rolling mean (window {rcfg.window}; the peak "
      f"searched between memorisation and grok_epoch) at ≤ {rcfg.fall_fraction} × peak; "
      f"lead = grokked − falls; sens_post_grok_max_% = the rolling mean's maximum from "
      f"grok_epoch on (late AdamW loss spikes raise it at 100 % test accuracy).",
      f"Sensitivity fell before test accuracy jumped in {before} of {len(rows)} seed(s).",
      f"Training wall time {out['wall_s']:.1f} s for {out['epochs_done'] - out['resumed_from']} "
      f"new epochs × {len(rows)} seed(s) (+{out['compile_s']:.1f} s compile); "
      f"resumed from epoch {out['resumed_from']}."]
  sha = (addition_model.file_sha256(config.model.init_npz)
         if config.model.init_npz is not None else None)
  if sha is not None:
    notes.append(f"Initial weights: {config.model.init_npz} (official layout, sha256 "
                 f"{sha[:16]}…).")
  across = summary(ev, thresholds)
  notes.append(f"\nAcross the {len(rows)} seed(s) (mean ± s.e. over the n seeds where "
               "defined):\n\n" + summary_markdown(across))
  extra = {"events": ev, "summary": across, "config": json.loads(config.to_json_best_effort()),
           "wall_s": out["wall_s"], "compile_s": out["compile_s"],
           "ms_per_epoch": 1e3 * out["wall_s"] / max(out["epochs_done"] - out["resumed_from"], 1),
           "num_params": out["num_params"],
           "init_npz_sha256": sha}
  md = tables.write_results(workdir, f"Grokking and sensitivity, (a+b) mod "
                            f"{config.data.modulus}", rows, notes="\n".join(notes),
                            extra=extra, plots=[fig])
  return {"rows": rows, "summary": across, "markdown": md, "logs": logs, "events": ev,
          "final": final,
          "wall_s": total, **{k: out[k] for k in ("resumed_from", "epochs_done",
                                                  "num_params")}}
