"""Study `modify_memories`: editing facts in a masked LM under a norm constraint.

Zhu, Rawat, Zaheer, Bhojanapalli, Li, Yu, Kumar, "Modifying Memories in Transformer
Models" (arXiv 2012.00363; docs/papers/google_papers.md §G; benchmark code
github.com/zhuchen03/modifying-memory). The paper's claims: plain fine-tuning on the modified facts
S forgets the unmodified facts F\\S; constraining ‖θ − θ₀‖ ≤ δ keeps them; tuning selected blocks
(the first and last) works best; the pre-training and fine-tuning phases matter for memorisation.

Pipeline (all training through the one loop, `xsens.train.loop.run`, resumable):
  1. knowledge: `xsens.data.knowledge` (synthetic from the seed, or LAMA / T-REx from
     `data.data_dir`) + a background corpus (the synthetic language, one masked word).
  2. pre-training: `xsens.models.mlm.RobertaMLM` with the `masked_lm` objective term
     (`xsens.train.objectives`) on mini-batches mixing fact sentences (training templates)
     and background sentences; batches are a pure function of the step. Recall = accuracy
     on the training-template sentences of every fact (target ≥ 95 %).
  3. optional second phase (`phases.finetune_steps` > 0): the pre-trained model trained
     on batches of background sentences with a share `phases.fact_fraction` of fact
     sentences (0: background only, a downstream phase); the edits also start from it.
  4. edits, per |S| in `edit.sizes` and edit seed: S = |S| known facts (every training
     sentence answered), new objects ∝ frequency among the relation's other objects
     (`knowledge.choose_modified`). Each method family is one loop run whose state holds a
     grid of variants, `jax.vmap`ped: "finetune" (all parameters, no constraint), "replay"
     (the same plus round(edit.replay_ratio × |S sentences|) unmodified training sentences
     drawn afresh every step), "linf" / "l2" (all parameters, projected after every step
     onto ‖θ − θ₀‖ ≤ δ for δ in edit.linf_deltas / edit.l2_deltas,
     `xsens.train.constraints.project`), "parts" (one part each, `edit.parts`, ℓ∞ δ in
     edit.parts_deltas; the other parameters get zero gradient: a 0/1 mask per leaf, which
     for Adam without weight decay equals optax.set_to_zero on the frozen leaves); every
     variant at each rate of edit.learning_rates (the optimizer's updates scaled by
     rate / optimizer.learning_rate, vmapped). Full batch on S's training sentences,
     `edit.steps` steps.
  5. metrics every `edit.eval_every` steps and at the end, on three disjoint sentence sets
     (`cloze_batches.edit_sets`): the test paraphrases (`A_M`, `A_FS`: the reported
     figures, the paper's held-out probe), the validation paraphrases (`A_M_val`,
     `A_FS_val`: model choice only) and the training sentences (`A_M_train`, `A_FS_train`,
     secondary: A_M_train is what the edit fits). A_M: accuracy on the modified facts with
     their new objects; A_{F\\S}: on `eval.num_unmodified` sentences of unmodified facts;
     Ā = (A_M + A_FS) / 2 per set; `background`: masked-word accuracy on held-out
     background sentences.
  6. model choice (`select_on_validation`): per (base, |S|, method; per part for "parts"),
     the (δ, lr) setting with the highest mean validation Ā over seeds; its test figures
     are the headline table, the whole sweep a supplementary one.
Reported: mean ± s.e. over edit seeds; trade-off plot A_M vs A_FS over δ per method (at
the chosen lr); parts bar plot (chosen settings); A_M / A_FS vs steps (chosen settings).
"""

from __future__ import annotations

import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mlcollections_configs import modify_memories as configs
from xsens import paths
from xsens.data import cloze_batches, knowledge
from xsens.errors import ConfigError, prefixed, require
from xsens.models import mlm
from xsens.report import plots, tables
from xsens.lab import cloze
from xsens.report import seed_stats
from xsens.train import constraints, full_batch, loop, optim
from xsens.train.workdir import Workdir

# Test paraphrases (reported), validation paraphrases (model choice), training sentences.
METRICS = ("A_M", "A_FS", "A_M_val", "A_FS_val", "A_M_train", "A_FS_train", "background")
SELECT_BY = "A_bar_val"   # The validation Ā, (A_M_val + A_FS_val) / 2.
EDIT_LOG_FIELDS = ("loss",) + METRICS
SUBRUNS = ("pretrain", "finetune_phase", "edits")   # Loop runs under the study's workdir.

# ------------------------------------------------------------------------------------------
# Validation.


def validate(config) -> None:
  """ConfigError naming `config.<field>` for any unusable value (nothing compiled): the
  field checks of the config file (`mlcollections_configs.modify_memories.validate`), then
  the optimizer blocks (`xsens.train.optim`) and the parts of the model `edit.parts` names
  (`xsens.models.mlm`)."""
  configs.validate(config)
  with prefixed("pretrain"):
    optim.validate_optimizer_config(config.pretrain.optimizer, int(config.pretrain.steps))
  e = config.edit
  for part in e.parts:
    mlm.check_part(part, int(config.model.depth), "edit.parts")
  with prefixed("edit"):
    optim.validate_optimizer_config(e.optimizer, int(e.steps))
  require(e.optimizer.weight_decay == 0, "edit.optimizer.weight_decay",
          "must be 0: decay would move the frozen parts and θ₀ is the reference")


# ------------------------------------------------------------------------------------------
# Data.


def load_knowledge(config) -> knowledge.ClozeData:
  """The cloze knowledge of `config.data` (synthetic from config.seed, or LAMA)."""
  d = config.data
  if d.source == "synthetic":
    s = d.synthetic
    return knowledge.synthetic_knowledge(
        int(config.seed), num_subjects=int(s.num_subjects), num_relations=int(s.num_relations),
        many_to_one_fraction=float(s.many_to_one_fraction),
        many_to_one_objects=int(s.many_to_one_objects),
        objects_per_relation=int(s.objects_per_relation),
        num_train_templates=int(s.num_train_templates),
        num_heldout_templates=int(s.num_heldout_templates))
  lama = d.lama
  data = knowledge.read_lama_trex(
      d.data_dir, relations=tuple(lama.relations) or None,
      max_facts_per_relation=lama.max_facts_per_relation or None)
  require(max(config.edit.sizes) <= len(data.facts), "edit.sizes",
          f"|S| = {max(config.edit.sizes)} exceeds the {len(data.facts)} facts read from "
          f"{d.data_dir!r}")
  return data


# ------------------------------------------------------------------------------------------
# Model, loss, evaluation.


def make_model(config, data: knowledge.ClozeData, length: int) -> mlm.RobertaMLM:
  m = config.model
  return mlm.RobertaMLM(vocab_size=data.vocab_size, max_length=length, width=int(m.width),
                        depth=int(m.depth), num_heads=int(m.num_heads),
                        mlp_dim=int(m.mlp_dim), dropout_rate=0.0)


# ------------------------------------------------------------------------------------------
# Pre-training (and the optional background-only phase) through the one loop.


def train_phase(path: str, config, model, corp: dict, objects: np.ndarray, *, steps: int,
                background_fraction: float, init_params=None, seed_offset: int = 0,
                log=print, desc: str = "pretrain") -> dict:
  """Trains (or resumes) one phase in `path` through the loop: config.pretrain.optimizer
  on the masked-LM term, batches from `cloze_batches.pretrain_batch`; returns {"params", "metrics"
  (`recall`), "wall_s"}."""
  p = config.pretrain
  batch = int(p.batch_size)
  num_bg = int(round(background_fraction * batch))
  tx = optim.make_optimizer(p.optimizer, steps)
  arrays = cloze_batches.pretrain_arrays(corp, objects)
  key = jax.random.fold_in(jax.random.key(int(config.seed)), 1 + seed_offset)
  ids0 = jnp.zeros((1, corp["length"]), jnp.int32)

  @jax.jit
  def init():
    params = (model.init(jax.random.fold_in(key, 7), ids0)["params"]
              if init_params is None else init_params)
    return {"params": params, "opt": tx.init(params), "step": jnp.zeros((), jnp.int32)}

  def one_step(state, t):
    ids, pos, tgt = cloze_batches.pretrain_batch(arrays, t, key, batch - num_bg, num_bg)
    params, opt, loss, acc = full_batch.optax_step(
        lambda q: cloze.mlm_loss(model, q, ids, pos, tgt), tx, state["params"], state["opt"],
        has_aux=True)
    return ({"params": params, "opt": opt, "step": state["step"] + 1},
            {"loss": loss, "accuracy": acc})

  advance = full_batch.scan_advance(one_step)

  size = int(p.chunk_steps)
  t0 = time.perf_counter()
  res = full_batch.run_one_device(path, init, advance, loop.Schedule(
      total_steps=steps, log_every=size, checkpoint_every=size, max_chunk=size), desc=desc)
  wall = time.perf_counter() - t0
  metrics = cloze.recall(model, res.state["params"], corp, objects,
                         int(config.eval.batch_size))
  for name in ("para_val", "para_test"):
    split = corp[name]
    metrics[f"recall_{name}"] = cloze.accuracy(
        model, res.state["params"], {"ids": split["ids"], "position": split["position"],
                                     "target": objects[split["fact"]]},
        int(config.eval.batch_size))
  log(f"[modify_memories] {desc}: {steps} steps ({wall:.0f} s with compilation and "
      f"checkpoints), " + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
  return {"params": res.state["params"], "metrics": metrics, "wall_s": wall}


# ------------------------------------------------------------------------------------------
# Edits.


def variants(config, methods) -> list[dict]:
  """Every edit variant of `methods` at every rate of edit.learning_rates: {"method",
  "label", "norm", "delta", "part", "lr"}; "finetune" and "replay" are ℓ∞ at δ = inf."""
  e = config.edit
  out = []
  for lr in e.learning_rates:
    for method in methods:
      if method in ("finetune", "replay"):
        settings = [("all", "linf", math.inf)]
      elif method in ("linf", "l2"):
        settings = [("all", method, float(d)) for d in e[f"{method}_deltas"]]
      else:
        settings = [(part, "linf", float(d)) for part in e.parts for d in e.parts_deltas]
      for part, norm, delta in settings:
        label = ("" if part == "all" else f"{part} ") + f"δ={delta:g} lr={float(lr):g}"
        out.append({"method": method, "label": label.replace("δ=inf", "δ=∞"), "norm": norm,
                    "delta": delta, "part": part, "lr": float(lr)})
  return out


def make_edit_fns(config, model, num_replay: int):
  """(init(anchor, G) -> state, chunk(state, arrays, grid, key, start, length) -> (state,
  per-step loss [G, length]), evaluate(params [G, ...], eval sets) -> {metric: [G]});
  `grid` = {"delta" [G], "l2" [G] bool, "lr_scale" [G] (updates x rate / optimizer rate),
  "mask" (0/1 per leaf, [G])}, vmapped."""
  base_tx = optim.make_optimizer(config.edit.optimizer, int(config.edit.steps))
  scaled = lambda scale: optax.chain(base_tx, optax.scale(scale))
  acc_fn = cloze.make_accuracy(model, int(config.eval.batch_size))

  def init(anchor, num_variants: int):
    grid = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_variants, *x.shape)), anchor)
    return {"anchor": anchor, "params": grid, "opt": jax.vmap(scaled(1.0).init)(grid),
            "step": jnp.zeros((), jnp.int32)}

  def one_step(params, opt, anchor, arrays, variant, key, t):
    ids, pos, tgt, _ = cloze_batches.edit_batch(arrays, t, key, num_replay)
    params, opt, loss, _ = full_batch.optax_step(
        lambda q: cloze.mlm_loss(model, q, ids, pos, tgt)[0], scaled(variant["lr_scale"]),
        params, opt,
        grad_map=lambda grads: jax.tree.map(lambda g, m: g * m, grads, variant["mask"]))
    linf = constraints.project(params, anchor, variant["delta"], "linf")
    l2 = constraints.project(params, anchor, variant["delta"], "l2")
    params = jax.tree.map(lambda a, b: jnp.where(variant["l2"], b, a), linf, l2)
    return params, opt, loss

  def chunk(state, arrays, grid, key, start, length):
    def body(carry, t):
      params, opt = carry
      params, opt, loss = jax.vmap(one_step, in_axes=(0, 0, None, None, 0, None, None))(
          params, opt, state["anchor"], arrays, grid, key, t)
      return (params, opt), loss
    (params, opt), losses = jax.lax.scan(body, (state["params"], state["opt"]),
                                         start + jnp.arange(length, dtype=jnp.int32))
    return ({"anchor": state["anchor"], "params": params, "opt": opt,
             "step": state["step"] + length}, losses.T)

  def evaluate(grid_params, eval_sets):
    return jax.lax.map(lambda p: {k: acc_fn(p, split) for k, split in eval_sets.items()},
                       grid_params)

  return (jax.jit(init, static_argnums=1), jax.jit(chunk, static_argnums=5),
          jax.jit(evaluate))


def run_edit(path: str, config, anchor, arrays: dict, specs: list, num_replay: int, key,
             fns: tuple, desc: str) -> dict:
  """The edit variants `specs` (vmapped) trained together through the loop in `path`.
  Returns {"final": {metric: [G], "distance": [G]}, "logs": {field: [G, steps]}}."""
  init, chunk, evaluate = fns
  n_var, steps = len(specs), int(config.edit.steps)
  depth = int(config.model.depth)
  grid = {"delta": jnp.asarray([v["delta"] for v in specs], jnp.float32),
          "l2": jnp.asarray([v["norm"] == "l2" for v in specs]),
          "lr_scale": jnp.asarray([v["lr"] / float(config.edit.optimizer.learning_rate)
                                   for v in specs], jnp.float32),
          "mask": jax.tree.map(lambda *m: jnp.asarray(np.stack(m)), *[
              mlm.part_mask(anchor, v["part"], depth) for v in specs])}
  eval_sets = arrays["eval"]
  train_arrays = {k: v for k, v in arrays.items() if k != "eval"}

  def advance(state, start, length):
    state, losses = chunk(state, train_arrays, grid, key, jnp.int32(start), length)
    metrics = jax.device_get(evaluate(state["params"], eval_sets))
    logs = {"loss": np.asarray(losses, np.float32)}
    for k in METRICS:   # Evaluated at the chunk's last step; NaN before it.
      col = np.full((n_var, length), np.nan, np.float32)
      col[:, -1] = metrics[k]
      logs[k] = col
    return state, {"loss": losses.mean(0).sum()}, logs

  every = int(config.edit.eval_every)
  res = full_batch.run_one_device(path, lambda: init(anchor, n_var), advance, loop.Schedule(
      total_steps=steps, checkpoint_every=every, max_chunk=every), desc=desc)
  logs = Workdir(path).read_step_log(res.step, EDIT_LOG_FIELDS, (n_var,))
  final = {k: logs[k][:, -1] for k in METRICS}
  final["distance"] = np.asarray([
      constraints.distance(jax.tree.map(lambda x, g=g: x[g], res.state["params"]), anchor,
                           v["norm"]) for g, v in enumerate(specs)])
  return {"final": final, "logs": logs}


# ------------------------------------------------------------------------------------------
# The study.


def base_models(config, workdir: str, model, corp, data, log) -> dict:
  """{"pretrained": phase-1 result, ["finetuned": phase-2 result]}."""
  objects = data.facts[:, 2]
  p = config.pretrain
  out = {"pretrained": train_phase(os.path.join(workdir, "pretrain"), config, model, corp,
                                   objects, steps=int(p.steps),
                                   background_fraction=float(p.background_fraction), log=log)}
  k = int(config.phases.finetune_steps)
  if k:
    out["finetuned"] = train_phase(
        os.path.join(workdir, "finetune_phase"), config, model, corp, objects, steps=k,
        background_fraction=1.0 - float(config.phases.fact_fraction),
        init_params=out["pretrained"]["params"],
        seed_offset=1, log=log, desc="finetune phase")
  return out


def edit_all(config, workdir: str, model, corp, data, bases: dict, log) -> list:
  """Every edit (base model x |S| x seed x method); one row per variant and seed."""
  e = config.edit
  fns, raw = {}, []
  grid_specs = variants(config, [m for m in e.methods if m != "replay"])
  replay_specs = variants(config, ["replay"]) if "replay" in e.methods else []
  for base, res in bases.items():
    anchor = res["params"]
    known = cloze.known_facts(model, anchor, corp, data.facts[:, 2], len(data.facts),
                              int(config.eval.batch_size))
    for size in e.sizes:
      for s in range(int(e.num_seeds)):
        seed = int(config.seed) + s
        try:
          chosen, new = knowledge.choose_modified(data, known, int(size), seed)
        except ValueError as err:
          raise ConfigError("edit.sizes", f"|S| = {size}: {err} (the {base} model knows "
                            f"{int(known.sum())} of {len(data.facts)} facts)") from None
        arrays = cloze_batches.edit_sets(corp, data, chosen, new,
                                         int(config.eval.num_unmodified), seed)
        key = jax.random.fold_in(jax.random.key(seed), 2)
        n_s = int(arrays["s_ids"].shape[0])
        for name, specs, n_replay in (
            ("grid", grid_specs, 0),
            ("replay", replay_specs, knowledge.replay_count(n_s, float(e.replay_ratio)))):
          if not specs:
            continue
          if n_replay not in fns:
            fns[n_replay] = make_edit_fns(config, model, n_replay)
          out = run_edit(os.path.join(workdir, "edits", base, f"S{size}", f"seed{seed}", name),
                         config, anchor, arrays, specs, n_replay, key, fns[n_replay],
                         f"edit {name}")
          for g, v in enumerate(specs):
            raw.append({"base": base, "size": int(size), "seed": seed, "method": v["method"],
                        "variant": v["label"], "part": v["part"], "delta": v["delta"],
                        "lr": v["lr"],
                        **{k: float(x[g]) for k, x in out["final"].items()},
                        "curve": {k: out["logs"][k][g].tolist() for k in ("A_M", "A_FS")}})
          log(f"[modify_memories] {base} |S|={size} seed {seed} {name}: " + "; ".join(
              f"{v['method']} {v['label']} A_M {out['final']['A_M'][g]:.2f} A_FS "
              f"{out['final']['A_FS'][g]:.2f} (test paraphrases)"
              for g, v in enumerate(specs)))
  return raw


def run(config, workdir: str, *, overwrite: bool = False, log=print) -> dict:
  """Pre-trains, edits with every method, writes results.md/json and the plots."""
  validate(config)
  runs = [os.path.join(workdir, name) for name in SUBRUNS]
  # The guard: a workdir holding runs of another config is refused (one line naming the
  # differing fields); --overwrite removes them.
  Workdir.open(workdir, config, overwrite=overwrite, keep_checkpoints=1,
               has_state=any(paths.isdir(r) for r in runs)).release_lock()
  if overwrite:
    for r in runs:
      if paths.isdir(r):
        paths.rmtree(r)
  t0 = time.perf_counter()
  data = load_knowledge(config)
  b = config.data.background
  try:
    corp = cloze_batches.corpus(data, num_train=int(b.num_train), num_test=int(b.num_test),
                                max_clauses=int(b.max_clauses), seed=int(config.seed),
                                validation_templates=int(config.eval.validation_templates))
  except ValueError as err:
    raise ConfigError("eval.validation_templates", str(err)) from None
  model = make_model(config, data, corp["length"])
  bases = base_models(config, workdir, model, corp, data, log)
  raw = edit_all(config, workdir, model, corp, data, bases, log)
  rows = summary_rows(raw)
  chosen = select_on_validation(rows)
  plot_files = figures(workdir, config, rows, chosen, raw)
  wall = time.perf_counter() - t0
  notes = report_notes(config, data, bases, wall)
  notes += ("\n\n## Full sweep (supplementary; every setting, test and validation "
            "columns)\n\n" + tables.markdown_table(rows, SWEEP_COLUMNS))
  md = tables.write_results(
      workdir, "Modifying memories: constrained fine-tuning of a masked LM (settings "
      "chosen on the validation paraphrases)", chosen, columns=HEADLINE_COLUMNS,
      notes=notes, plots=plot_files,
      extra={"sweep": rows,
             "runs": [{k: v for k, v in r.items() if k != "curve"} for r in raw],
             "bases": {b: r["metrics"] for b, r in bases.items()},
             "num_facts": int(len(data.facts)), "vocab_size": data.vocab_size,
             "wall_s": wall, "config": json.loads(config.to_json_best_effort())})
  return {"rows": rows, "chosen": chosen, "raw": raw, "markdown": md, "bases":
          {b: r["metrics"] for b, r in bases.items()}, "wall_s": wall}


HEADLINE_COLUMNS = (
    "base", "|S|", "method", "variant", "seeds", "A_M", "A_M_se", "A_FS", "A_FS_se",
    "A_bar", "A_bar_se", "A_bar_val", "A_M_train", "A_FS_train", "A_bar_train",
    "background", "‖θ−θ₀‖")
SWEEP_COLUMNS = (
    "base", "|S|", "method", "variant", "A_M", "A_FS", "A_bar", "A_bar_se", "A_M_val",
    "A_FS_val", "A_bar_val", "A_M_train", "A_FS_train", "background", "‖θ−θ₀‖")


def summary_rows(raw: list) -> list:
  """Mean ± s.e. over edit seeds per (base, |S|, method, variant); Ā = (A_M + A_FS) / 2 on
  each sentence set: `A_bar` (test paraphrases), `A_bar_val`, `A_bar_train`."""
  groups = {}
  for r in raw:
    groups.setdefault((r["base"], r["size"], r["method"], r["variant"]), []).append(r)
  rows = []
  for (base, size, method, variant), rs in groups.items():
    row = {"base": base, "|S|": size, "method": method, "variant": variant,
           "part": rs[0]["part"], "delta": rs[0]["delta"], "lr": rs[0]["lr"],
           "seeds": len(rs)}
    for k in METRICS:
      row[k], row[f"{k}_se"] = seed_stats.mean_and_stderr([r[k] for r in rs])
    for suffix in ("", "_val", "_train"):
      row[f"A_bar{suffix}"], row[f"A_bar{suffix}_se"] = seed_stats.mean_and_stderr(
          [(r[f"A_M{suffix}"] + r[f"A_FS{suffix}"]) / 2 for r in rs])
    row["‖θ−θ₀‖"] = float(np.mean([r["distance"] for r in rs]))
    rows.append(row)
  return rows


def selection_group(row: dict) -> tuple:
  """The rows one choice is made among: (base, |S|, method), and the part for "parts"."""
  group = (row["base"], row["|S|"], row["method"])
  return group + (row["part"],) if row["method"] == "parts" else group


def select_on_validation(rows: list, score: str = SELECT_BY) -> list:
  """Per `selection_group`, the row with the highest `score` (the validation Ā; the first
  such row on ties), in the groups' order of first appearance; each copied with
  "chosen_by" = score."""
  best = {}
  for row in rows:
    g = selection_group(row)
    if g not in best or row[score] > best[g][score]:
      best[g] = row
  return [{**row, "chosen_by": score} for row in best.values()]


def figures(workdir: str, config, rows: list, chosen: list, raw: list) -> list:
  """trade_off.png (test A_M vs A_FS per method over δ at its chosen lr, first base and
  |S|), parts.png and steps.png (chosen settings); returns the file names."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  base, size = rows[0]["base"], rows[0]["|S|"]
  sel = [r for r in rows if r["base"] == base and r["|S|"] == size]
  picked = [r for r in chosen if r["base"] == base and r["|S|"] == size]
  lr_of = {r["method"]: r["lr"] for r in picked if r["method"] != "parts"}
  files = []
  fig, ax = plt.subplots(figsize=(5.6, 3.6))
  styles = plots.line_styles(len(configs.METHODS))
  for method, style in zip(configs.METHODS, styles):
    pts = ([r for r in picked if r["method"] == method] if method == "parts" else
           [r for r in sel if r["method"] == method and r["lr"] == lr_of.get(method)])
    if not pts:
      continue
    ax.errorbar([r["A_FS"] for r in pts], [r["A_M"] for r in pts],
                xerr=[r["A_FS_se"] for r in pts], yerr=[r["A_M_se"] for r in pts],
                label=method, color=style["color"], marker=style.get("marker", "o"),
                linestyle=style.get("linestyle", "-") if method in ("linf", "l2") else "none",
                capsize=2)
    if method in ("linf", "l2", "parts"):
      for r in pts:
        ax.annotate(r["variant"].replace("δ=", ""), (r["A_FS"], r["A_M"]), fontsize=6)
  plots.styled_axes(ax, f"A_M vs A_F\\S over δ ({base}, |S|={size}, test paraphrases)",
                    "A_F\\S (unmodified facts, accuracy)", "A_M (modified facts, accuracy)")
  plots.legend_outside(ax)
  files.append(plots.save_figure(fig, os.path.join(workdir, "trade_off.png"), tight=True))
  parts = [r for r in picked if r["method"] == "parts"]
  if parts:
    files.append(plots.grouped_bar_plot(
        os.path.join(workdir, "parts.png"), [r["variant"] for r in parts],
        {"A_M": [r["A_M"] for r in parts], "A_F\\S": [r["A_FS"] for r in parts],
         "A_M train": [r["A_M_train"] for r in parts]},
        ylabel="accuracy (test paraphrases)", xlabel="part tuned (δ, lr chosen on validation)",
        title=f"Parts, ℓ∞ ({base}, |S|={size})"))
  series, steps = {}, None
  for method in ("finetune", "replay", "linf"):
    variant = next((r["variant"] for r in picked if r["method"] == method), None)
    rs = [r for r in raw if r["base"] == base and r["size"] == size
          and r["method"] == method and r["variant"] == variant]
    if not rs:
      continue
    curves = {k: np.asarray([r["curve"][k] for r in rs], np.float64) for k in ("A_M", "A_FS")}
    idx = np.flatnonzero(np.all(~np.isnan(curves["A_M"]), axis=0))   # Evaluated steps.
    if steps is not None and not np.array_equal(steps, idx + 1):
      continue
    steps = idx + 1
    for k, curve in curves.items():
      series[f"{method} {variant} {k}"] = (curve[:, idx].mean(0), curve[:, idx].std(0))
  if series:
    files.append(plots.dynamics_plot(os.path.join(workdir, "steps.png"), steps, series,
                                     xlabel="edit step", ylabel="accuracy",
                                     title=f"A_M and A_F\\S vs steps ({base}, |S|={size})",
                                     error_every=1))
  return [os.path.basename(f) for f in files]


def report_notes(config, data, bases: dict, wall: float) -> str:
  e, m, p = config.edit, config.model, config.pretrain
  lines = [
      f"Knowledge: {config.data.source}, {len(data.facts)} facts, {len(data.relation_names)} "
      f"relations, vocabulary {data.vocab_size}; background: synthetic language, "
      f"{config.data.background.num_train} training sentences, one masked word each.",
      f"Model: RoBERTa MLM width {m.width}, depth {m.depth}, {m.num_heads} heads, MLP "
      f"{m.mlp_dim}, tied embeddings; pre-trained {p.steps} steps, batch {p.batch_size} "
      f"({p.background_fraction:.0%} background), {p.optimizer.name} lr "
      f"{p.optimizer.learning_rate}.",
  ]
  for base, res in bases.items():
    reached = res["metrics"]["recall"] >= float(p.target_recall)
    lines.append(f"Base model `{base}`: " + ", ".join(
        f"{k} {v:.3f}" for k, v in res["metrics"].items()) + f" (recall target "
        f"{p.target_recall:g} {'reached' if reached else 'NOT reached'}).")
  lines += [
      f"Edits: |S| ∈ {list(e.sizes)}, {e.num_seeds} seeds (S and new objects), {e.steps} "
      f"full-batch steps of {e.optimizer.name} at lr ∈ {list(e.learning_rates)}; replay "
      f"ratio {e.replay_ratio}; ℓ∞ δ {list(e.linf_deltas)}, ℓ2 δ {list(e.l2_deltas)}; parts "
      f"at ℓ∞ δ ∈ {list(e.parts_deltas)}. The table: per method (per part for parts) the "
      f"setting with the highest validation Ā (`A_bar_val`, the first "
      f"{config.eval.validation_templates} held-out paraphrase template(s) of each "
      "relation); A_M, A_FS, A_bar on the other (test) paraphrase templates, never used "
      "for a choice; `_train` on the training sentences (secondary). Mean over seeds, "
      "`_se` its standard error; Ā = (A_M + A_FS) / 2; ‖θ−θ₀‖ in the method's norm.",
      f"Wall time {wall:.0f} s.",
  ]
  return "\n\n".join(lines)
