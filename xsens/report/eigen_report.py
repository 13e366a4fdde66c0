"""The report of the attention eigen-analysis (`xsens.lab.eigen_analysis.analyse_runs`):
the per-layer summary rows, the plots, the extra results.md tables and the notes."""

from __future__ import annotations

import os

from xsens import paths
from xsens.report import plots, seed_stats, tables


def summary_rows(analyses, centred, probs, random_init, over, ec) -> list[dict]:
  """One row per layer: dimensions (mean ± s.e. over seeds) of the logit rows, the centred
  logit rows (`centred`: the same runs' analyses with each row's mean removed) and the
  vectorised matrices, the softmax rows' and the random-init model's, and overlaps."""
  rows = []
  num_layers = len(analyses[0]["ev_rows"])
  lv = max(ec.levels)
  for layer in range(num_layers):
    dims = [float(a["dim_rows"][lv][layer]) for a in analyses]
    mats = [float(a["dim_matrices"][lv][layer]) for a in analyses]
    row = {"layer": layer}
    row["row_dim"], row["row_dim s.e."] = seed_stats.mean_and_stderr(dims)
    row["matrix_dim"], row["matrix_dim s.e."] = seed_stats.mean_and_stderr(mats)
    row["row_dim_centered"], row["row_dim_centered s.e."] = seed_stats.mean_and_stderr(
        [float(a["dim_rows"][lv][layer]) for a in centred])
    row["row_dim_probs"] = float(probs["dim_rows"][lv][layer])
    row["row_dim_random_init"] = float(random_init["dim_rows"][lv][layer])
    k = ec.overlap_rank - 1
    row["ev_rows_at_k"], row["ev_rows_at_k s.e."] = seed_stats.mean_and_stderr(
        [float(a["ev_rows"][layer, k]) for a in analyses])
    row["ev_centered_at_k"], row["ev_centered_at_k s.e."] = seed_stats.mean_and_stderr(
        [float(a["ev_rows"][layer, k]) for a in centred])
    row["ev_probs_at_k"] = float(probs["ev_rows"][layer, k])
    row["overlap_next_layer"] = (float(over["layers"][layer, layer + 1])
                                 if layer + 1 < num_layers else float("nan"))
    row["overlap_heads"] = float(over["head_mean"][layer])
    if over["seeds"] is not None:
      row["overlap_seeds"], row["overlap_seeds s.e."] = seed_stats.mean_and_stderr(
          over["seeds"][:, layer])
    row["overlap_random_init"] = float(over["random_init"][:, layer].mean())
    row["overlap_random_subspace"] = float(over["random_subspace"][layer])
    rows.append(row)
  return rows


def write_plots(workdir, first, first_centred, random_init, probs, over, recon_rows, acc_rows,
                ec, num_tokens, cost_rows=()) -> list[str]:
  """explained_variance.png, overlap.png, reconstruction.png, (ViTs) accuracy_vs_keys.png
  and (trained runs with more than one evaluation) accuracy_vs_steps.png in `workdir`;
  returns their paths."""
  ks = list(range(1, num_tokens + 1))
  series = {f"layer {l}": first["ev_rows"][l] for l in range(len(first["ev_rows"]))}
  series.update({f"layer {l} (centred)": first_centred["ev_rows"][l]
                 for l in range(len(first_centred["ev_rows"]))})
  series.update({f"layer {l} (probs)": probs["ev_rows"][l]
                 for l in range(len(probs["ev_rows"]))})
  series["random init (mean over layers)"] = random_init["ev_rows"].mean(0)
  files = [plots.line_plot(os.path.join(workdir, "explained_variance.png"), ks, series,
                           xlabel="k (principal directions of score rows)",
                           ylabel="explained variance (fraction)", logx=False,
                           title="Score rows: explained variance vs k")]
  maps = {"layers, seed 0 (row) vs seed 0": over["layers"]}
  if over["seed_layers"] is not None:
    maps["seed 0 (row) vs seed 1 (column)"] = over["seed_layers"]
  maps["seed 0 (row) vs random init"] = over["init_layers"]
  maps["heads of layer 0"] = over["heads"][0]
  files.append(plots.heatmap_grid(
      os.path.join(workdir, "overlap.png"), maps, cbar_label="overlap ‖UᵀV‖²/k",
      title=f"Subspace overlap, k={ec.overlap_rank} (random: {over['random_expected']:.2f})",
      xlabel="layer (head in the last panel)", ylabel="layer (head in the last panel)"))
  files.append(plots.line_plot(
      os.path.join(workdir, "reconstruction.png"), list(ec.key_counts),
      {f"{r} k={k}": [max(next(x["tv"] for x in recon_rows
                               if x["rule"] == r and x["k"] == k and x["m"] == m), 1e-8)
                      for m in ec.key_counts]
       for r in ec.subset_rules for k in ec.ranks},
      xlabel="m (keys with exact scores)", ylabel="attention TV distance (mean; 0 shown as 1e-8)",
      title="Reconstruction error vs (m, k)", logy=True))
  if acc_rows:
    series = {f"frozen, k={k}": [next(x["accuracy"] for x in acc_rows
                                      if x["k"] == k and x["m"] == m) for m in ec.key_counts]
              for k in ec.ranks}
    errors = {f"frozen, k={k}": [next(x["accuracy s.e."] for x in acc_rows
                                      if x["k"] == k and x["m"] == m) for m in ec.key_counts]
              for k in ec.ranks}
    series["full attention"] = [acc_rows[0]["full_accuracy"]] * len(ec.key_counts)
    files.append(plots.line_plot(
        os.path.join(workdir, "accuracy_vs_keys.png"), list(ec.key_counts), series,
        errors=errors, xlabel="m (keys with exact scores)", ylabel="test accuracy",
        title=f"Frozen ViT with reconstructed attention ({ec.accuracy_rule})"))
  if any(len(r["curve"]) > 1 for r in cost_rows):
    files.append(plots.panels_plot(
        os.path.join(workdir, "accuracy_vs_steps.png"),
        {"each run until its stop": {
            r["run"]: ([c["step"] for c in r["curve"]],
                       [c["test_accuracy"] for c in r["curve"]],
                       [c["test_accuracy s.e."] for c in r["curve"]]) for r in cost_rows}},
        xlabel="training step", ylabels=["test accuracy (mean ± s.e. over seeds)"],
        title="Test accuracy while training"))
  return files


def append_tables(workdir, md, recon_rows, acc_rows, cost_rows) -> str:
  """Adds the reconstruction, frozen-accuracy and trained-run tables to results.md."""
  parts = [md, "\n## Reconstruction from partial computation (test examples)\n",
           tables.markdown_table(recon_rows, ["rule", "k", "m", "score_mse", "tv"])]
  if acc_rows:
    parts += ["\n## Frozen model with reconstructed attention (layers >= 1)\n",
              tables.markdown_table(acc_rows, ["k", "m", "accuracy", "accuracy s.e.",
                                               "full_accuracy"])]
  if cost_rows:
    parts += ["\n## Trained with the approximation (eigen_vit) vs the ViT\n",
              "Each run under the same stopping rule (`train.total_steps`, or "
              "`train.target_train_accuracy` checked every `train.eval_every` steps); "
              "`steps` is the mean over seeds, `reached_target` the seeds that stopped on "
              "the target.\n",
              tables.markdown_table(cost_rows, [
                  "run", "keys_kept", "basis_rank", "seeds", "steps", "reached_target",
                  "test_accuracy", "test_accuracy s.e.", "fwd_gflops", "attn_gflops",
                  "flops_vs_base", "attn_flops_vs_base", "peak_temp_mb", "mem_vs_base", "step_ms",
                  "step_time_vs_base"])]
    equal = equal_step_rows(cost_rows)
    if equal:
      parts += ["\n## Test accuracy at equal steps (mean ± s.e. over seeds)\n",
                "Steps that every seed of every run trained.\n",
                tables.markdown_table(equal, list(equal[0]))]
  text = "\n".join(parts) + "\n"
  if paths.is_writer():
    paths.write_text(os.path.join(workdir, "results.md"), text)
  return text


def equal_step_rows(cost_rows) -> list[dict]:
  """One row per evaluation step that every run's every seed reached: the step and each
  run's test accuracy and s.e. (from the rows' `curve`)."""
  curves = {r["run"]: {c["step"]: c for c in r["curve"]} for r in cost_rows}
  steps = sorted(set.intersection(*(set(c) for c in curves.values())))
  return [{"step": step, **{f"{run} {col}": curve[step][col] for run, curve in curves.items()
                            for col in ("test_accuracy", "test_accuracy s.e.")}}
          for step in steps]


def notes(data, over, num_tokens, num_runs, unit, ec) -> str:
  """The results.md notes: what was analysed and what each column means."""
  lv = max(ec.levels)
  return (f"Analysed run `{ec.analysed_run}` ({num_runs} {unit}(s)) on "
          f"{data}, T = "
          f"{num_tokens} tokens. Per layer: `row_dim` / `matrix_dim` = smallest k whose top-k "
          f"PCA directions explain {lv:.0%} of the variance of the logit rows (pooled over "
          f"heads) / vectorised logit matrices, mean ± s.e. over seeds; `row_dim_centered` "
          f"the same for logit rows minus their mean over the keys (the offset the softmax "
          f"ignores removed); `row_dim_probs` for softmax rows; `row_dim_random_init` for "
          f"the untrained model. `ev_*_at_k`: the variance fraction of the top k = "
          f"{ec.overlap_rank} directions of those rows. Overlaps "
          f"‖UᵀV‖²/k at k = {ec.overlap_rank}: with the next layer, mean over head pairs, "
          f"same layer across seeds, vs the random-init model, and vs uniformly random "
          f"subspaces (expected k/T = {over['random_expected']:.3f}).")
