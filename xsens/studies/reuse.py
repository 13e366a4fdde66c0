"""Study `reuse`: does reusing attention keep accuracy at lower compute and memory?

Bhojanapalli et al. 2021, "Leveraging redundancy in attention with Reuse
Transformers", arXiv 2110.06821 (docs/papers/google_papers.md §A). Trains a baseline ViT and
ReuseViT variants (P reused heads in layers 1..K) with the one trainer
(`multirun.train_runs`) and reports per run:

- params, train/test accuracy;
- forward FLOPs of one eval batch and the attention share of it, both from XLA's
  cost analysis (attention FLOPs = FLOPs of the model minus FLOPs of the same
  model with every attention sub-layer skipped; includes its pre-LayerNorm);
- peak temporary memory of one training step (loss + gradients) from XLA's
  memory analysis, and its wall time (best of a few timed calls);
- the attention similarity (§A.1, `xsens.measures.attention_similarity`, pooled over
  the test examples by `xsens.lab.head_similarity`) of the trained baseline vs two
  controls: the same architecture at random init, and the same architecture trained on
  randomly labelled data (`reuse.random_labels_run`, a run with `data.random_labels`;
  docs/papers/google_papers.md §A.1's "trained on random data" control, which tells redundancy
  learnt from the data's structure from redundancy of any trained network): the layer x layer heat
  map and each head's k-th best match in the previous layer.

Writes results.md/json, accuracy_vs_flops.png, similarity_layers.png and
similarity_kth_best.png.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mlcollections_configs import reuse as configs
from xsens.errors import ConfigError
from xsens.lab import head_similarity, model_cost, multirun, selection
from xsens.measures import attention_similarity as asim
from xsens.report import plots, seed_stats, tables, training
from xsens.train import distill as distill_lib


def _model_fields(model) -> tuple[int, int]:
  """(P resolved, K) of a run's model; (0, 0) for a model without reuse."""
  p = getattr(model, "reuse_heads", 0)
  p = model.num_heads if p == -1 else p
  return p, getattr(model, "reuse_layers", 0)


def _scatter(path, rows, x_key, y_key, *, xlabel, ylabel, title, num_classes=None) -> str:
  """One marker per run (legend outside); a chance line when `num_classes` is given."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6.0, 3.4))
  for r, style in zip(rows, plots.line_styles(len(rows))):
    ax.plot([r[x_key]], [r[y_key]], linestyle="none", marker=style["marker"],
            color=style["color"], markerfacecolor="none", markersize=7, label=r["run"])
  plots.chance_line(ax, num_classes)
  plots.styled_axes(ax, title, xlabel, ylabel)
  plots.legend_outside(ax)
  fig.tight_layout()
  return plots.save_figure(fig, path)


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every run of `config.runs`, measures cost and similarity, writes the report."""
  configs.validate(config)
  rc = config.reuse
  probe = multirun.validate_runs(config)
  if rc.baseline not in probe:
    raise ConfigError("reuse.baseline", f"{rc.baseline!r} is not a run; runs: "
                      f"{', '.join(probe)}")
  control = rc.random_labels_run
  if control is not None:
    if control not in probe:
      raise ConfigError("reuse.random_labels_run", f"{control!r} is not a run; runs: "
                        f"{', '.join(probe)} (or None: no random-label control)")
    if not probe[control].config.data.random_labels:
      raise ConfigError("reuse.random_labels_run", f"run {control!r} trains on true labels; "
                        f"set runs.{control}.data.random_labels=1.0")
  if multirun.num_seeds(config) != 1:
    raise ConfigError("num_seeds", f"must be 1 here, got {config.num_seeds}; the seeds of "
                      "the baseline, its control and the chosen reuse run are reuse.num_seeds")
  candidates = reuse_candidates(config)
  if not candidates:
    raise ConfigError("runs", f"no reuse run to choose besides {rc.baseline!r} and its "
                      "control")
  results = multirun.train_runs(config, workdir, overwrite=overwrite, experiments=probe)
  rows = multirun.summary_rows(results)
  first = next(iter(results.values()))
  val, ev = selection.split_val_eval(len(first.test), rc.val_fraction, rc.split_seed)
  labels = first.test.labels
  correct = {name: _correct(res, labels) for name, res in results.items()}
  for r in rows:
    r["val_accuracy"] = float(correct[r["run"]][val].mean())
    r["eval_accuracy"] = float(correct[r["run"]][ev].mean())
  chosen = selection.pick_on_val([r for r in rows if r["run"] in candidates],
                                 "val_accuracy")["run"]
  seeded = _train_seeds(config, workdir, overwrite, [rc.baseline, control, chosen], results)
  by_name = {r["run"]: r for r in rows}
  for name, res in results.items():
    x = jnp.asarray(res.test.images[:rc.cost_batch_size])
    y = jnp.asarray(res.test.labels[:rc.cost_batch_size])
    p, k = _model_fields(res.model)
    total = model_cost.forward_flops(res.model, res.variables, x)
    attn = model_cost.attention_flops(res.model, res.variables, x)
    cost = model_cost.train_step_cost(res.model, res.variables, x, y,
                                      repeats=rc.timing_repeats)
    by_name[name].update({
        "reuse_heads": p, "reuse_layers": k, "fwd_gflops": total / 1e9,
        "attn_gflops": attn / 1e9, "attn_share": attn / total, **cost})
  base = by_name[rc.baseline]
  for r in rows:
    r["flops_vs_base"] = r["fwd_gflops"] / base["fwd_gflops"]
    r["attn_flops_vs_base"] = (r["attn_gflops"] / base["attn_gflops"]
                               if base["attn_gflops"] else float("nan"))
    r["mem_vs_base"] = r["peak_temp_mb"] / base["peak_temp_mb"]

  # Attention similarity (seed 0): trained baseline vs the same architecture at random init
  # and (`reuse.random_labels_run`) trained on randomly labelled data.
  res = results[rc.baseline]
  images = res.test.images[:rc.num_examples]
  random_vars = res.model.init(jax.random.key(rc.seed), jnp.asarray(images[:1]),
                               train=False)
  collect = functools.partial(head_similarity.collect_head_similarity, inputs=images,
                              batch_size=rc.batch_size)
  head_sim = {"trained": collect(res.apply_fn, res.variables),
              "random init": collect(res.apply_fn, random_vars)}
  if control is not None:
    r = results[control]
    head_sim["random labels"] = collect(r.apply_fn, r.variables)
  for name in rc.similarity_runs:
    if name not in (rc.baseline, control) and name in results:
      r = results[name]
      head_sim[f"{name} (trained)"] = collect(r.apply_fn, r.variables)
  layer_sim = {n: asim.layer_similarity(s) for n, s in head_sim.items()}
  kth = {n: asim.adjacent_kth_best(s) for n, s in head_sim.items()}
  seed_table, seed_sim = _seed_report(config, seeded, chosen, val, ev, labels, correct,
                                      layer_sim)

  plot_files = [
      _scatter(os.path.join(workdir, "accuracy_vs_flops.png"), rows, "fwd_gflops",
               "eval_accuracy", xlabel=f"forward GFLOPs (batch {rc.cost_batch_size})",
               ylabel="eval accuracy (fraction correct)", title="Accuracy vs compute",
               num_classes=res.train.num_classes),
      plots.heatmap_grid(os.path.join(workdir, "similarity_layers.png"),
                         {n: m for n, m in layer_sim.items()},
                         title="Layer x layer attention similarity (row ℓ vs column ℓ')",
                         cbar_label="mean best-head similarity",
                         xlabel="layer ℓ' (0 = first)", ylabel="layer ℓ (0 = first)"),
  ]
  num_heads = next(iter(kth.values())).shape[-1]
  if next(iter(kth.values())).shape[0]:
    plot_files.append(plots.line_plot(
        os.path.join(workdir, "similarity_kth_best.png"), list(range(1, num_heads + 1)),
        {n: kth[n].mean(axis=(0, 1)) for n in kth},
        xlabel="k (k-th best head in the previous layer)",
        ylabel="similarity (mean over heads and layers)",
        title="Adjacent-layer head similarity"))
  adjacent = {n: _adjacent(m) for n, m in layer_sim.items()}
  columns = ["run", "reuse_heads", "reuse_layers", "params", "steps", "train_accuracy",
             "val_accuracy", "eval_accuracy", "fwd_gflops", "attn_gflops",
             "attn_share", "flops_vs_base", "attn_flops_vs_base", "peak_temp_mb",
             "mem_vs_base", "step_ms", "wall_s"]
  notes = _notes(config, rows, adjacent, len(images), chosen, len(val), len(ev), seed_table,
                 seed_sim)
  md = tables.write_results(
      workdir, f"Reuse attention on {config.train.data.name}", rows, columns=columns,
      notes=notes, plots=plot_files,
      extra={"layer_similarity": {n: m.tolist() for n, m in layer_sim.items()},
             "adjacent_kth_best": {n: m.tolist() for n, m in kth.items()},
             "adjacent_layer_similarity": adjacent,
             "chosen": chosen, "seeds": seed_table, "similarity_seeds": seed_sim,
             "val_indices": val.tolist(), "eval_indices": ev.tolist(),
             "device": jax.devices()[0].device_kind})
  return {"rows": rows, "markdown": md, "layer_similarity": layer_sim,
          "adjacent_kth_best": kth, "chosen": chosen, "seeds": seed_table,
          "similarity_seeds": seed_sim, "val": val, "eval": ev}


def reuse_candidates(config) -> list[str]:
  """The runs a reuse configuration is chosen from: every run but the baseline and its
  random-label control."""
  rc = config.reuse
  return [n for n in config.runs if n not in (rc.baseline, rc.random_labels_run)]


def _correct(res, labels: np.ndarray) -> np.ndarray:
  """[N] bool: the run's argmax on its test split equals `labels`."""
  logits = distill_lib.predict_logits(res.model, res.variables, res.test.images)
  return np.argmax(logits, -1) == labels


def _train_seeds(config, workdir: str, overwrite: bool, names: list, trained: dict) -> dict:
  """{run id: TrainResult} of `names` (None skipped) at `reuse.num_seeds` training seeds
  (`multirun.run_ids`): seed 0 is the run in `trained` (already trained by this study),
  `<name>_seed<i>` the others, trained here."""
  cfg = config.copy_and_resolve_references()
  keep = [n for n in dict.fromkeys(names) if n is not None]
  with cfg.unlocked():
    cfg.runs = ml_collections.ConfigDict({n: config.runs[n].to_dict() for n in keep})
    cfg.num_seeds = config.reuse.num_seeds
  ids = multirun.run_ids(cfg)
  others = {rid: exp for rid, exp in multirun.validate_runs(cfg).items() if ids[rid][1] > 0}
  seeded = multirun.train_runs(cfg, workdir, overwrite=overwrite, experiments=others)
  return {rid: trained[rid] if seed == 0 else seeded[rid] for rid, (_, seed) in ids.items()}


def _adjacent(layer_sim: np.ndarray) -> float:
  """Mean over ℓ ≥ 1 of layer_sim[ℓ, ℓ−1] ([L, L] -> scalar; NaN for one layer)."""
  m = np.asarray(layer_sim)
  return float(np.mean([m[l, l - 1] for l in range(1, len(m))])) if len(m) > 1 else float("nan")


def _seed_id(name: str, i: int) -> str:
  return name if i == 0 else f"{name}_seed{i}"


def _seed_report(config, seeded: dict, chosen: str, val, ev, labels, correct: dict,
                 layer_sim: dict) -> tuple[dict, dict]:
  """Eval accuracy per seed of the baseline, the control and the chosen run (mean ± s.e.;
  the paired difference chosen − baseline), and the adjacent-layer similarity per seed of
  the trained baseline, the same ViT at random init (key `reuse.seed` + i) and the
  random-label control (mean ± s.e.; trained − random labels, paired by seed). Seed 0 is
  read from `correct` ({run: [N] bool}) and `layer_sim` ({"trained", "random init",
  "random labels"?: layer x layer map}), which the study already computed."""
  rc = config.reuse
  n = rc.num_seeds
  control = rc.random_labels_run
  names = [x for x in dict.fromkeys([rc.baseline, chosen, control]) if x is not None]
  right = {x: [correct[x]] + [_correct(seeded[_seed_id(x, i)], labels) for i in range(1, n)]
           for x in names}
  acc = {x: [float(c[ev].mean()) for c in right[x]] for x in names}
  table = {x: {"eval_accuracy": acc[x], "val_accuracy": [float(c[val].mean())
                                                         for c in right[x]],
               "mean_se": seed_stats.mean_and_stderr(acc[x])} for x in names}
  table["chosen_minus_baseline"] = {"per_seed": np.subtract(acc[chosen], acc[rc.baseline])
                                    .tolist(),
                                    "mean_se": seed_stats.mean_and_stderr(
                                        np.subtract(acc[chosen], acc[rc.baseline]))}
  keys = ["trained", "random init"] + (["random labels"] if control is not None else [])
  sim = {k: [_adjacent(layer_sim[k])] for k in keys}
  for i in range(1, n):
    res = seeded[_seed_id(rc.baseline, i)]
    images = res.test.images[:rc.num_examples]
    collect = functools.partial(head_similarity.collect_head_similarity, inputs=images,
                                batch_size=rc.batch_size)
    random_vars = res.model.init(jax.random.key(rc.seed + i), jnp.asarray(images[:1]),
                                 train=False)
    sim["trained"].append(_adjacent(asim.layer_similarity(collect(res.apply_fn,
                                                                  res.variables))))
    sim["random init"].append(_adjacent(asim.layer_similarity(collect(res.apply_fn,
                                                                      random_vars))))
    if control is not None:
      r = seeded[_seed_id(control, i)]
      sim["random labels"].append(_adjacent(asim.layer_similarity(collect(r.apply_fn,
                                                                          r.variables))))
  out = {k: {"per_seed": v, "mean_se": seed_stats.mean_and_stderr(v)} for k, v in sim.items()}
  if control is not None:
    diff = np.subtract(sim["trained"], sim["random labels"])
    out["trained_minus_random_labels"] = {"per_seed": diff.tolist(),
                                          "mean_se": seed_stats.mean_and_stderr(diff)}
  return table, out


def _notes(config, rows, adjacent, n, chosen, n_val, n_eval, seed_table, seed_sim) -> str:
  rc = config.reuse
  base = next(r for r in rows if r["run"] == rc.baseline)
  control = rc.random_labels_run
  pm = lambda ms: f"{ms[0]:.3f} ± {ms[1]:.3f}"
  control_note = ("" if control is None else
                  f" `random labels`: the baseline architecture trained as run `{control}` "
                  "on the same images with every training label drawn uniformly at random "
                  "(data.random_labels, seeded; its test accuracy is at chance by design); "
                  "`random init`: the baseline architecture untrained. Redundancy that comes "
                  "from natural data shows as trained > random labels.")
  lines = [
      f"P = reused heads per reusing layer, K = last reusing layer (layers 1..K reuse). "
      f"FLOPs: XLA cost analysis of one eval forward pass on {rc.cost_batch_size} test "
      f"images; attn = FLOPs minus those of the same model with every attention "
      f"sub-layer skipped. peak_temp_mb: XLA temp buffer of one loss+grad step at that "
      f"batch; step_ms: best of {rc.timing_repeats} calls on {jax.devices()[0].device_kind}. "
      f"All models trained with the same training block (batch "
      f"{config.train.batch_size}; the table is seed 0). "
      f"{training.stop_note(config.train, rows)}",
      "",
      f"Model choice: the test split is cut into `val` ({n_val} examples) and `eval` "
      f"({n_eval}); the reuse run with the best `val` accuracy at seed 0 is chosen: "
      f"`{chosen}`. Eval accuracy over {rc.num_seeds} seeds (mean ± s.e.): " + ", ".join(
          f"{x} {pm(v['mean_se'])}" for x, v in seed_table.items()
          if x != "chosen_minus_baseline") +
      f"; {chosen} − {rc.baseline} (paired by seed) "
      f"{pm(seed_table['chosen_minus_baseline']['mean_se'])}.",
      "",
      "Seed-0 eval accuracy vs the baseline (difference): " + ", ".join(
          f"{r['run']} {r['eval_accuracy'] - base['eval_accuracy']:+.4f}"
          for r in rows if r["run"] not in (rc.baseline, control)) + ".",
      "",
      f"Attention similarity on {n} test images: mean adjacent-layer similarity (seed 0) "
      + ", ".join(f"{k} {v:.3f}" for k, v in adjacent.items()) + f"; over {rc.num_seeds} "
      "seeds (mean ± s.e.): " + ", ".join(f"{k} {pm(v['mean_se'])}"
                                          for k, v in seed_sim.items()) + "." + control_note,
  ]
  return "\n".join(lines)
