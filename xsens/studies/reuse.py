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
import numpy as np

from mlcollections_configs import reuse as configs
from xsens.errors import ConfigError
from xsens.lab import head_similarity, model_cost, multirun
from xsens.measures import attention_similarity as asim
from xsens.report import plots, tables, training


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
  results = multirun.train_runs(config, workdir, overwrite=overwrite, experiments=probe)
  rows = multirun.summary_rows(results)
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

  # Attention similarity: trained baseline vs the same architecture at random init and
  # (`reuse.random_labels_run`) trained on randomly labelled data.
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

  plot_files = [
      _scatter(os.path.join(workdir, "accuracy_vs_flops.png"), rows, "fwd_gflops",
               "test_accuracy", xlabel=f"forward GFLOPs (batch {rc.cost_batch_size})",
               ylabel="test accuracy (fraction correct)", title="Accuracy vs compute",
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
  adjacent = {n: float(np.mean([m[l, l - 1] for l in range(1, len(m))]))
              if len(m) > 1 else float("nan") for n, m in layer_sim.items()}
  columns = ["run", "reuse_heads", "reuse_layers", "params", "steps", "train_accuracy",
             "test_accuracy", "fwd_gflops", "attn_gflops", "attn_share", "flops_vs_base",
             "attn_flops_vs_base", "peak_temp_mb", "mem_vs_base", "step_ms", "wall_s"]
  notes = _notes(config, rows, adjacent, len(images))
  md = tables.write_results(
      workdir, f"Reuse attention on {config.train.data.name}", rows, columns=columns,
      notes=notes, plots=plot_files,
      extra={"layer_similarity": {n: m.tolist() for n, m in layer_sim.items()},
             "adjacent_kth_best": {n: m.tolist() for n, m in kth.items()},
             "adjacent_layer_similarity": adjacent,
             "device": jax.devices()[0].device_kind})
  return {"rows": rows, "markdown": md, "layer_similarity": layer_sim,
          "adjacent_kth_best": kth}


def _notes(config, rows, adjacent, n) -> str:
  rc = config.reuse
  base = next(r for r in rows if r["run"] == rc.baseline)
  control = rc.random_labels_run
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
      f"{config.train.batch_size}, one seed). {training.stop_note(config.train, rows)}",
      "",
      "Accuracy vs the baseline (test accuracy difference): " + ", ".join(
          f"{r['run']} {r['test_accuracy'] - base['test_accuracy']:+.4f}"
          for r in rows if r["run"] not in (rc.baseline, control)) + ".",
      "",
      f"Attention similarity on {n} test images: mean adjacent-layer similarity "
      + ", ".join(f"{k} {v:.3f}" for k, v in adjacent.items()) + "." + control_note,
  ]
  return "\n".join(lines)
