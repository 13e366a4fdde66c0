"""Study `position_encoding`: DIET (Chen et al., EMNLP 2021, arXiv 2104.08698).

Trains the text encoder once per (task, position mode[, DIET-ABS d_p]) and training seed
(`multirun.train_runs`, `config.num_seeds`), then reports:
- test accuracy mean ± s.e. over the seeds per run, every seed's value, and the fraction
  of seeds that learn (test accuracy >= `position_encoding.learn_threshold`: the seeds are
  bimodal, near chance or near 1, so the mean alone says little);
- per mode, measured identically: parameters, forward FLOPs (XLA cost analysis,
  `xsens.lab.model_cost`) and best-of-n train-step time (loss + grads,
  `model_cost.train_step_cost`) on one batch, with ratios to `baseline_mode` (input PE);
- Theorem 1 as a measurement: the numerical rank of every head's attention logits
  (`xsens.measures.logit_rank`) on test examples, per mode (first seed of each run), beside
  the theorem's bound (`rank_bound`);
- heat maps of the learned position-to-position maps per head: DIET-ABS P_Q P_Kᵀ and
  DIET-REL's Toeplitz R_{i−j} (layer 0), shown minus their minimum (softmax ignores a
  constant added to every logit).
Pre-train then fine-tune (`config.pretrain.steps` > 0): before training, every run id
(mode and seed) gets a `xsens.models.mlm.RobertaMLM` of its own architecture and position
encoding pre-trained with the `masked_lm` objective term through the loop
(`full_batch.run_one_device`, in `workdir/pretrain/<run id>`; run ids with the same model,
seed and corpus, e.g. two pair tasks of one mode, share one pre-training), saved as
`encoder.npz` (`mlm.XSENS_MLM`), and the run fine-tunes from it (`train.pretrained.path`:
the encoder's weights restored, the classifier head new) through the one training loop.
Writes results.md/json, accuracy.png, diet_abs_maps.png, diet_rel_maps.png.
"""

from __future__ import annotations

import hashlib
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from mlcollections_configs import position_encoding as configs
from xsens.config_utils import run_config
from xsens.data import pair_tasks
from xsens.errors import ConfigError, prefixed
from xsens.lab import model_cost, multirun
from xsens.measures import logit_rank as logit_rank_lib
from xsens.models import mlm, position
from xsens.models.text import RoBERTa, padding_mask
from xsens.report import plots, seed_stats, tables
from xsens.train import full_batch, loop, objectives, optim, trainer

CHECKPOINT = "encoder.npz"     # The pre-trained RobertaMLM in `workdir/pretrain/<run id>`.
MLM_EVAL_ROWS = 512            # Corpus rows (freshly masked) of the pre-training accuracy.


def run_mode(config, run_name: str) -> str:
  """The position mode of run `run_name` (its model's `position`)."""
  return run_config(config, run_name).model.position


def run_label(config, run_name: str) -> str:
  """The mode of run `run_name`, with DIET-ABS's d_p where the run sets it."""
  model = run_config(config, run_name).model
  if model.position == "diet_abs" and model.diet_dim is not None:
    return f"diet_abs d_p={model.diet_dim}"
  return model.position


def baseline_label(config) -> str:
  """The `run_label` of the first run of mode `position_encoding.baseline_mode` (the cost
  ratios' denominator)."""
  mode = config.position_encoding.baseline_mode
  return next(run_label(config, n) for n in config.runs if run_mode(config, n) == mode)


def run_task(config, run_name: str) -> str:
  """The dataset of run `run_name` (its `data.name`, else the shared one)."""
  return run_config(config, run_name).data.name


def validate(config, experiments) -> None:
  """ConfigError naming `position_encoding.<field>` (the config file's `validate`) or the
  run that is not a RoBERTa on the einsum path."""
  configs.validate(config)
  if config.pretrain.steps:
    with prefixed("pretrain"):
      optim.validate_optimizer_config(config.pretrain.optimizer, int(config.pretrain.steps))
  for run_id, exp in experiments.items():
    if not isinstance(exp.model, RoBERTa):
      raise ConfigError(multirun.run_field(config, run_id, "model.name"), "the position "
                        "study needs the text encoder 'roberta'")
    if exp.model.attention_impl != "einsum":
      raise ConfigError(multirun.run_field(config, run_id, "model.attention_impl"),
                        "the logit-rank check reads the logits of the 'einsum' path; "
                        "use 'einsum'")


def mode_costs(results, config) -> dict[str, dict]:
  """{label: params, forward FLOPs, step ms} on the first run of each label (`run_label`:
  the mode, with d_p), one batch of `timing_batch` training examples, measured identically."""
  pc, out = config.position_encoding, {}
  for run_id, res in results.items():
    mode = run_label(config, multirun.run_ids(config)[run_id][0])
    if mode in out:
      continue
    ids = jnp.asarray(res.train.inputs[:pc.timing_batch])
    labels = jnp.asarray(res.train.labels[:pc.timing_batch])
    cost = model_cost.train_step_cost(res.model, res.variables, ids, labels,
                                 repeats=pc.timing_repeats)
    out[mode] = {"params": res.summary["num_params"],
                 "flops": model_cost.forward_flops(res.model, res.variables, ids),
                 "step_ms": cost["step_ms"]}
  return out


def rank_of_run(res, pc) -> dict:
  """Logit ranks of one run on its first `rank_examples` test examples."""
  ids = jnp.asarray(res.test.inputs[:pc.rank_examples])
  out = logit_rank_lib.attention_logit_rank(res.apply_fn, res.variables, ids,
                                  token_mask=padding_mask(ids), rtol=pc.rank_rtol)
  return {"mean_rank": float(out["mean_rank"].mean()),
          "max_rank": int(out["max_rank"].max())}


def position_maps(res, mode: str) -> dict[str, np.ndarray]:
  """{panel: [L, L]} learned position-to-position logit maps per head (minus the min),
  over the run's sequence length L."""
  p = res.variables["params"]
  length = res.train.inputs.shape[1]
  if mode == "diet_abs":
    b = p["position_bias"]
    maps = np.einsum("hid,hjd->hij", np.asarray(b["p_query"])[:, :length],
                     np.asarray(b["p_key"])[:, :length])
  elif mode == "diet_rel":
    maps = np.asarray(position.toeplitz_bias(p["layers_0"]["position_bias"]["relative"],
                                             length))
  else:
    return {}
  return {f"head {h}": m - m.min() for h, m in enumerate(maps)}


def rank_bound(model: RoBERTa, length: int) -> int:
  """Theorem 1's cap on a head's logit rank on L = `length` tokens: d_h with position at
  the input (or none), d_h + d_p + 2 for DIET-ABS (E_S, one scalar per segment pair, adds
  a rank <= 2 block matrix), else L (relative terms are not rank-limited); never above L."""
  d_h = model.width // model.num_heads
  if model.position in ("none", *position.INPUT_POSITIONS):
    return min(d_h, length)
  if model.position == "diet_abs":
    return min(d_h + (model.diet_dim or d_h) + position.NUM_SEGMENTS, length)
  return length


def learned(accuracies, threshold: float) -> np.ndarray:
  """[n] bool: which seeds' test accuracies reach `threshold` (they "learn")."""
  return np.asarray(accuracies, np.float64) >= threshold


def learn_fraction(accuracies, threshold: float) -> float:
  """The fraction of seeds whose test accuracy reaches `threshold` (NaN for none)."""
  hits = learned(accuracies, threshold)
  return float(hits.mean()) if hits.size else float("nan")


def seed_values(per_seed: list[dict], ids, column: str) -> dict[str, list[float]]:
  """{run name: [`column` of seed 0, 1, ...]} from one row per run id."""
  out: dict[str, dict[int, float]] = {}
  for row in per_seed:
    name, i = ids[row["run"]]
    out.setdefault(name, {})[i] = row[column]
  return {name: [v[i] for i in sorted(v)] for name, v in out.items()}


# ------------------------------------------------------------------------------------------
# Pre-training with the masked LM (config.pretrain), through the loop.


def mlm_batch(corpus, step, key, batch_size: int, mask_rate: float):
  """(ids [B, L] with the hidden words replaced by <unk>, labels [B, L]: the hidden word,
  −1 elsewhere) of step `step`: B rows of `corpus` [N, L] drawn uniformly, each word token
  (id >= `pair_tasks.NUM_SPECIAL`) hidden with probability `mask_rate`."""
  k_rows, k_mask = jax.random.split(jax.random.fold_in(key, step))
  ids = corpus[jax.random.randint(k_rows, (batch_size,), 0, corpus.shape[0])]
  hide = (jax.random.uniform(k_mask, ids.shape) < mask_rate) & (ids >= pair_tasks.NUM_SPECIAL)
  return jnp.where(hide, pair_tasks.MASK_ID, ids), jnp.where(hide, ids, -1)


def pretrain_corpus(config, exp) -> np.ndarray:
  """ids [N, L] of `config.pretrain.corpus` for run `exp` (at its max_length)."""
  p = config.pretrain
  if p.corpus == "train_inputs":
    return np.asarray(exp.train.inputs)
  return pair_tasks.unlabeled_corpus(int(p.num_examples), int(exp.config.seed),
                                     max_length=int(exp.train.inputs.shape[1]))


def pretrain_run(path: str, model: mlm.RobertaMLM, corpus: np.ndarray, p, seed: int,
                 desc: str) -> dict:
  """Trains (or resumes) `model` on the `masked_lm` term over `corpus` for `p.steps`
  steps in `path` through the loop; writes `path/encoder.npz`. Returns {"checkpoint",
  "mlm_accuracy" (on MLM_EVAL_ROWS freshly masked corpus rows), "wall_s"}."""
  steps, batch, rate = int(p.steps), int(p.batch_size), float(p.mask_rate)
  tx = optim.make_optimizer(p.optimizer, steps)
  term = objectives.make_term("masked_lm", "masked_lm", 1.0, {})
  key = jax.random.key(seed)
  data = jnp.asarray(corpus, jnp.int32)

  def loss_fn(params, ids, labels):
    logits = model.apply({"params": params}, ids)
    return term.fn(None, params, {"logits": logits, "label": labels}, None, None)

  @jax.jit
  def init():
    params = model.init(jax.random.fold_in(key, 1), data[:1])["params"]
    return {"params": params, "opt": tx.init(params), "step": jnp.zeros((), jnp.int32)}

  def one_step(state, t):
    ids, labels = mlm_batch(data, t, jax.random.fold_in(key, 2), batch, rate)
    params, opt, loss, aux = full_batch.optax_step(loss_fn, tx, state["params"],
                                                   state["opt"], ids, labels, has_aux=True)
    return ({"params": params, "opt": opt, "step": state["step"] + 1},
            {"loss": loss, "accuracy": aux["accuracy"]})

  advance = full_batch.scan_advance(one_step)

  size = max(1, min(steps, 500))
  t0 = time.perf_counter()
  res = full_batch.run_one_device(path, init, advance, loop.Schedule(
      total_steps=steps, log_every=size, checkpoint_every=size, max_chunk=size), desc=desc)
  wall = time.perf_counter() - t0
  ids, labels = mlm_eval_rows(corpus, p, seed)
  _, aux = jax.jit(loss_fn)(res.state["params"], ids, labels)
  checkpoint = os.path.join(path, CHECKPOINT)
  mlm.save_checkpoint(checkpoint, res.state["params"])
  out = {"checkpoint": checkpoint, "mlm_accuracy": float(aux["accuracy"]), "wall_s": wall}
  if p.corpus != "train_inputs":  # Pair rows: the order-free yardstick applies.
    out["mlm_order_free"] = pair_tasks.order_free_mlm_accuracy(np.asarray(ids),
                                                               np.asarray(labels))
  return out


def mlm_eval_rows(corpus: np.ndarray, p, seed: int):
  """(ids, labels) [min(MLM_EVAL_ROWS, N), L] of `mlm_batch`: the freshly masked corpus
  rows on which `pretrain_run` measures a pre-trained model of `seed` (block `p`)."""
  return mlm_batch(jnp.asarray(corpus, jnp.int32), int(p.steps),
                   jax.random.fold_in(jax.random.key(seed), 3),
                   min(MLM_EVAL_ROWS, len(corpus)), float(p.mask_rate))


def pretrain_key(model: mlm.RobertaMLM, corpus: np.ndarray, seed: int) -> tuple:
  """What fixes a pre-training (the MLM's fields, its seed, the corpus bytes): run ids with
  equal keys (e.g. two pair tasks of one mode and seed) share one pre-trained encoder."""
  corpus = np.ascontiguousarray(corpus)
  return (repr(model), seed, corpus.shape, str(corpus.dtype),
          hashlib.sha256(corpus.tobytes()).hexdigest())


def pretrain_all(config, workdir: str, experiments) -> tuple[dict, dict]:
  """Pre-trains every distinct (model, seed, corpus) once, in `workdir/pretrain/<the first
  run id with it>`, then rebuilds each run's experiment to fine-tune from that checkpoint.
  Returns (experiments, {run id: result}); a result shared by run ids is one dict."""
  ids, out, rebuilt, done = multirun.run_ids(config), {}, {}, {}
  for run_id, exp in experiments.items():
    cfg = exp.config
    seed = int(cfg.seed if cfg.init_seed is None else cfg.init_seed)
    model, corpus = mlm.for_classifier(exp.model), pretrain_corpus(config, exp)
    key = pretrain_key(model, corpus, seed)
    if key not in done:
      done[key] = pretrain_run(os.path.join(workdir, "pretrain", run_id), model, corpus,
                               config.pretrain, seed, desc=f"pretrain {run_id}")
    out[run_id] = done[key]
    cfg = multirun.seeded_run_config(config, run_id, ids)
    cfg.pretrained.path = out[run_id]["checkpoint"]
    cfg.pretrained.reinit_head = True
    with multirun.run_errors(config, ids[run_id][0]):
      rebuilt[run_id] = trainer.build_experiment(cfg)
  return rebuilt, out


def _ratio(value, base) -> float:
  return float(value) / float(base) if base else float("nan")


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every (task, mode) run over the seeds, measures them, writes the report."""
  experiments = multirun.validate_runs(config)
  validate(config, experiments)
  pretrained = {}
  if config.pretrain.steps:
    experiments, pretrained = pretrain_all(config, workdir, experiments)
  results = multirun.train_runs(config, workdir, overwrite=overwrite, experiments=experiments)
  pc, ids = config.position_encoding, multirun.run_ids(config)
  per_seed = [{"run": rid, "test_accuracy": r.summary["test_accuracy"],
               "train_accuracy": r.summary["train_accuracy"]} for rid, r in results.items()]
  acc = {row["run"]: row for row in seed_stats.seed_rows(per_seed, ids,
                                                      ("test_accuracy", "train_accuracy"))}
  tests = seed_values(per_seed, ids, "test_accuracy")
  costs = mode_costs(results, config)
  base = costs[baseline_label(config)]
  ranks = {name: rank_of_run(results[name], pc) for name in config.runs}
  rows = []
  for name in config.runs:
    label, a = run_label(config, name), acc[name]
    rows.append({"run": name, "task": run_task(config, name), "mode": label,
                 "seeds": a["seeds"], "test_accuracy": a["test_accuracy"],
                 "test_accuracy s.e.": a["test_accuracy s.e."],
                 "per_seed": ", ".join(f"{v:.2f}" for v in tests[name]),
                 "learn_fraction": learn_fraction(tests[name], pc.learn_threshold),
                 "train_accuracy": a["train_accuracy"],
                 "logit_rank_mean": ranks[name]["mean_rank"],
                 "logit_rank_max": ranks[name]["max_rank"],
                 "rank_bound": rank_bound(experiments[name].model,
                                          results[name].test.inputs.shape[1]),
                 "params": results[name].summary["num_params"]})
    if pretrained:
      for field in ("mlm_accuracy", "mlm_order_free"):
        values = [pretrained[i][field] for i, (n, _) in ids.items()
                  if n == name and field in pretrained[i]]
        if values:
          rows[-1][field] = float(np.mean(values))
  cost_rows = [{"mode": m, "params": c["params"], "params_ratio": _ratio(c["params"],
                                                                       base["params"]),
                "forward_flops": c["flops"], "flops_ratio": _ratio(c["flops"], base["flops"]),
                "step_ms": c["step_ms"], "step_time_ratio": _ratio(c["step_ms"],
                                                                   base["step_ms"])}
               for m, c in costs.items()]
  tasks = list(dict.fromkeys(r["task"] for r in rows))
  modes = list(dict.fromkeys(r["mode"] for r in rows))   # Labels (d_p included).
  by = {(r["task"], r["mode"]): r["test_accuracy"] for r in rows}
  plot_files = [plots.grouped_bar_plot(
      os.path.join(workdir, "accuracy.png"), tasks,
      {m: [by.get((t, m), np.nan) for t in tasks] for m in modes},
      ylabel=plots.ACCURACY, xlabel="task", title="Test accuracy per position mode",
      num_classes=2)]
  for mode in ("diet_abs", "diet_rel"):
    name = next((n for n in config.runs if run_mode(config, n) == mode), None)
    if name is not None:
      plot_files.append(plots.heatmap_grid(
          os.path.join(workdir, f"{mode}_maps.png"), position_maps(results[name], mode),
          title=f"{mode}: learned position-to-position logits ({name})",
          cbar_label="logit bias − min", xlabel="key position j",
          ylabel="query position i"))
  d_h = {m: experiments[n].model.width // experiments[n].model.num_heads
         for n, m in ((n, run_mode(config, n)) for n in config.runs)}
  notes = (f"Accuracy: mean ± s.e. over {multirun.num_seeds(config)} training seeds, every "
           f"seed's value (`per_seed`) and `learn_fraction`, the share of seeds with test "
           f"accuracy >= {pc.learn_threshold:g}. "
           + (f"Pre-trained first: {config.pretrain.steps} masked-LM steps on "
              f"`{config.pretrain.corpus}`, once per model, seed and corpus (`mlm_accuracy`: "
              f"masked words right, mean over seeds; `mlm_order_free`: the best order-blind "
              f"guesser on the same rows, `pair_tasks.order_free_mlm_accuracy`), then "
              f"fine-tuned from that encoder (head new). "
              if pretrained else "") + "Costs: "
           f"batch {pc.timing_batch}, best of {pc.timing_repeats} train steps, ratios to "
           f"`{pc.baseline_mode}`. Logit rank: singular values > {pc.rank_rtol:g} · the "
           f"largest, on {pc.rank_examples} test examples, mean over layers, heads and "
           f"examples (first seed); Theorem 1 bounds input-PE modes by d_h = "
           f"{sorted(set(d_h.values()))}; `rank_bound` is the theorem's cap per run "
           f"(d_h; DIET-ABS d_h + d_p + 2; L for relative terms).")
  notes += "\n\n## Cost per position mode\n\n" + tables.markdown_table(cost_rows)
  md = tables.write_results(workdir, "DIET position encodings", rows, notes=notes,
                            plots=plot_files, extra={"costs": cost_rows, "ranks": ranks,
                                                     "per_seed": tests,
                                                     "pretrain": pretrained})
  return {"rows": rows, "costs": cost_rows, "ranks": ranks, "per_seed": tests,
          "pretrain": pretrained, "markdown": md}
