"""Eigen-analysis of the attention of finished runs, and its report.

Bhojanapalli, Chakrabarti, Jain, Kumar, Lukasik, Veit (2021), "Eigen Analysis of
Self-Attention and its Reconstruction from Partial Computation", arXiv 2106.08823
(docs/papers/google_papers.md §C; definitions in `xsens.measures.attention_eigen`). For a list of
runs (the training seeds of one trained model, or pretrained models) and the first run's
architecture at random init, `analyse_runs`:

1. streams the covariance of score rows (per layer and head) and of vectorised score
   matrices (per layer) over `eigen.num_examples` training examples (logits and
   probabilities; `score_moments` + `merge_moments`, batch by batch);
2. PCA: explained variance vs k per layer, the k reaching each of `eigen.levels`;
   subspace overlap (rank `eigen.overlap_rank`) across layers, across heads of a layer,
   across runs (same layer), trained vs random init, and the random-subspace value k/T;
3. partial computation on the test examples: exact logits on m keys (`eigen.subset_rules`),
   the rest from the top-k PCA basis and mean of each head, for every m in `eigen.key_counts`
   and k in `eigen.ranks`: score MSE and attention TV distance per layer (each layer from
   its own exact scores), and, for ViTs, the test accuracy of the frozen model run with
   reconstructed attention in layers >= 1 (`EigenViT` with the PCA bases, rule
   `eigen.accuracy_rule`), mean ± s.e. over the runs;

then writes results.md/json, explained_variance.png, overlap.png, reconstruction.png and
accuracy_vs_keys.png.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from xsens.lab import robustness
from xsens.measures import attention_eigen as ae
from xsens.models import eigen_vit
from xsens.report import eigen_report, seed_stats, tables
from xsens.train import evaluators


@functools.lru_cache(maxsize=64)  # Jitted functions per model, bounded.
def _moments_fn(apply_fn, kind: str, matrix_tokens):
  """`fn(batch, variables)` -> `score_moments` of one padded batch (one function object per
  model and options, so `over_split` compiles it once per shape)."""
  return lambda batch, variables: ae.score_moments(
      apply_fn, variables, batch["image"], mask=batch["mask"], kind=kind,
      matrix_tokens=matrix_tokens)


def collect_moments(apply_fn, variables, inputs: np.ndarray, *, batch_size: int,
                    kind: str, matrix_tokens) -> dict:
  """`score_moments` over `inputs` [N, ...] (`evaluators.over_split`: padded, masked
  batches), each batch's moments merged on the host in float64."""
  total = None
  for out in evaluators.over_split(_moments_fn(apply_fn, kind, matrix_tokens),
                                   {"image": inputs}, args=(variables,),
                                   reduce="per_batch", batch_size=batch_size):
    out = jax.tree.map(lambda a: np.asarray(a, np.float64), out)
    total = out if total is None else {
        part: ae.merge_moments(total[part], out[part]) for part in out}
  return total


@functools.lru_cache(maxsize=64)  # Jitted functions per model, bounded.
def _reconstruction_fn(apply_fn):
  """`fn(batch, variables, bases, means, keys)` -> `partial_reconstruction` of one padded
  batch."""
  return lambda batch, variables, bases, means, keys: ae.partial_reconstruction(
      apply_fn, variables, batch["image"], mask=batch["mask"], bases=bases, means=means,
      keys=keys)


def reconstruction_errors(apply_fn, variables, inputs, *, batch_size, bases, means, keys
                          ) -> dict[str, np.ndarray]:
  """`partial_reconstruction` pooled over `inputs` (`evaluators.over_split`):
  {"score_mse": [L], "tv": [L]}, batch means weighted by their real examples."""
  sums, count = {"score_mse": 0.0, "tv": 0.0}, 0.0
  for out in evaluators.over_split(_reconstruction_fn(apply_fn), {"image": inputs},
                                   args=(variables, bases, means, jnp.asarray(keys)),
                                   reduce="per_batch", batch_size=batch_size):
    c = float(out["count"])
    for name in sums:
      sums[name] = sums[name] + np.asarray(out[name], np.float64) * c
    count += c
  return {name: v / count for name, v in sums.items()}


def analyse(moments: dict, ec, num_tokens: int) -> dict:
  """PCA of one model's moments: explained variance, dimensions, bases."""
  row_cov = ae.covariance(moments["rows"])                         # [L, H, T, T]
  pooled_cov = ae.covariance(ae.pool_heads(moments["rows"]))        # [L, T, T]
  mat_cov = ae.covariance(moments["matrices"])                     # [L, t², t²]
  ev_rows, ev_mats = ae.explained_variance(pooled_cov), ae.explained_variance(mat_cov)
  return {
      "ev_rows": ev_rows, "ev_matrices": ev_mats,
      "ev_heads": ae.explained_variance(row_cov),
      "dim_rows": {lv: ae.dimension_at(ev_rows, lv) for lv in ec.levels},
      "dim_matrices": {lv: ae.dimension_at(ev_mats, lv) for lv in ec.levels},
      "layer_basis": ae.top_basis(pooled_cov, ec.overlap_rank),     # [L, T, k]
      "head_basis": ae.top_basis(row_cov, ec.overlap_rank),         # [L, H, T, k]
      "head_cov": row_cov, "head_mean": np.asarray(moments["rows"]["mean"]),
      "num_tokens": num_tokens}


def overlaps(analyses: list[dict], random_init: dict, key, num_tokens: int, k: int) -> dict:
  """Layer x layer, head x head, seed vs seed, trained vs random-init overlaps."""
  first = analyses[0]
  layer = ae.pairwise_overlap(first["layer_basis"])
  heads = np.stack([ae.pairwise_overlap(hb) for hb in first["head_basis"]])   # [L, H, H]
  h = heads.shape[-1]
  off = ~np.eye(h, dtype=bool)
  head_mean = heads[:, off].mean(-1) if h > 1 else np.full(len(heads), np.nan)
  seeds = [np.asarray(ae.subspace_overlap(a["layer_basis"], b["layer_basis"]))
           for i, a in enumerate(analyses) for b in analyses[i + 1:]]
  init = [np.asarray(ae.subspace_overlap(a["layer_basis"], random_init["layer_basis"]))
          for a in analyses]
  rand = np.asarray(ae.subspace_overlap(
      first["layer_basis"], ae.random_basis(key, num_tokens, k,
                                            (len(first["layer_basis"]), 64)).transpose(
          1, 0, 2, 3)))                                                      # [64, L]
  cross = lambda a, b: np.asarray(ae.subspace_overlap(a["layer_basis"][:, None],
                                                      b["layer_basis"][None]))
  return {"layers": layer, "heads": heads, "head_mean": head_mean,
          "seed_layers": cross(first, analyses[1]) if len(analyses) > 1 else None,
          "init_layers": cross(first, random_init),
          "seeds": np.stack(seeds) if seeds else None, "random_init": np.stack(init),
          "random_subspace": rand.mean(0), "random_expected": k / num_tokens}


def frozen_accuracy(res, analysis: dict, m: int, k: int, rule: str, ec) -> float:
  """Test accuracy of the trained ViT run with attention reconstructed in layers >= 1."""
  model = res.model
  depth = model.depth
  bases = {i: analysis["head_cov_basis"][i][..., :k] for i in range(1, depth)}
  means = {i: analysis["head_mean"][i] for i in range(1, depth)}
  keys = tuple(tuple(map(tuple, ae.choose_keys(rule, bases[i], m, ec.seed + i).tolist()))
               for i in range(1, depth))
  eig = eigen_vit.EigenViT(**{f: getattr(model, f) for f in _vit_fields(model)},
                           keys_kept=m, basis_rank=k, kept_keys=keys)
  params = eigen_vit.with_basis(res.variables["params"], bases, means)
  return top1_accuracy(eig, {"params": params}, res.test.images, res.test.labels, ec.batch_size)


def _vit_fields(model) -> list[str]:
  """The ViT fields of `model` (an EigenViT built from them has the same params)."""
  del model
  return [f.name for f in dataclasses.fields(eigen_vit.ViT) if f.name not in ("parent", "name")]


@functools.lru_cache(maxsize=64)  # Jitted functions per model, bounded.
def eval_apply(model):
  """`model.apply(variables, x, train=False)`, one function object per model (so the
  jitted evaluations of `xsens.lab.robustness` compile once per model and shape)."""
  return functools.partial(model.apply, train=False)


def top1_accuracy(model, variables, images, labels, batch_size: int) -> float:
  """Top-1 accuracy of `model.apply(variables, ·, train=False)` over a split held on the
  host (`robustness.split_accuracy`: padded batches of `batch_size`). images [N, ...],
  labels [N] int."""
  return robustness.split_accuracy(eval_apply(model), variables, images, labels, batch_size)


def analyse_runs(runs: list, ec, workdir: str, *, num_tokens: int, title: str, data: str,
                 unit: str = "seed", cost_rows=None) -> dict:
  """Steps 1-3 of the module docstring on `runs` (trained seeds, or pretrained models),
  and the report (results.md / results.json and the plots in `workdir`).

  Each run has `apply_fn`, `variables`, `model`, `train.images` (the statistics take the
  first `eigen.num_examples` of runs[0]), `test.images` / `test.labels` (the errors and
  accuracies) and `summary["test_accuracy"]`. runs[0]'s architecture at random init
  (`eigen.seed`) is the control. `cost_rows` (or None): a function returning the rows of
  step 4. `data` / `unit` describe the examples and what the runs are in the notes.
  """
  base = runs[0]
  fit_inputs = base.train.images[:ec.num_examples]
  test_inputs = base.test.images[:ec.num_examples]
  collect = functools.partial(collect_moments, batch_size=ec.batch_size,
                              matrix_tokens=ec.matrix_tokens)

  analyses = []
  for res in runs:
    a = analyse(collect(res.apply_fn, res.variables, fit_inputs, kind="logits"), ec,
                num_tokens)
    a["head_cov_basis"] = ae.top_basis(a["head_cov"], max(ec.ranks))
    analyses.append(a)
  centred = [analyse(collect(res.apply_fn, res.variables, fit_inputs, kind="centered_logits"),
                     ec, num_tokens) for res in runs]
  probs = analyse(collect(base.apply_fn, base.variables, fit_inputs, kind="probs"), ec,
                  num_tokens)
  init_vars = base.model.init(jax.random.key(ec.seed), jnp.asarray(fit_inputs[:1]),
                              train=False)
  random_init = analyse(collect(base.apply_fn, init_vars, fit_inputs, kind="logits"), ec,
                        num_tokens)
  over = overlaps(analyses, random_init, jax.random.key(ec.seed + 1), num_tokens,
                  ec.overlap_rank)

  # Partial computation: per-layer errors on the test inputs (seed 0 model).
  first = analyses[0]
  recon_rows = []
  for rule in ec.subset_rules:
    for k in ec.ranks:
      bases = first["head_cov_basis"][..., :k]
      for m in ec.key_counts:
        keys = np.stack([ae.choose_keys(rule, b, m, ec.seed + i)
                         for i, b in enumerate(bases)])
        err = reconstruction_errors(base.apply_fn, base.variables, test_inputs,
                                    batch_size=ec.batch_size, bases=jnp.asarray(bases),
                                    means=jnp.asarray(first["head_mean"]), keys=keys)
        recon_rows.append({"rule": rule, "k": k, "m": m,
                           "score_mse": float(err["score_mse"].mean()),
                           "tv": float(err["tv"].mean()),
                           "tv_per_layer": err["tv"].tolist()})

  is_vit = type(base.model) is eigen_vit.ViT  # pylint: disable=unidiomatic-typecheck
  acc_rows = []
  if is_vit:
    full = [res.summary["test_accuracy"] for res in runs]
    for k in ec.ranks:
      for m in ec.key_counts:
        accs = [frozen_accuracy(res, a, m, k, ec.accuracy_rule, ec)
                for res, a in zip(runs, analyses)]
        mean, se = seed_stats.mean_and_stderr(accs)
        acc_rows.append({"k": k, "m": m, "accuracy": mean, "accuracy s.e.": se,
                         "full_accuracy": seed_stats.mean_and_stderr(full)[0]})

  cost_rows = cost_rows() if is_vit and cost_rows is not None else []
  summary = eigen_report.summary_rows(analyses, centred, probs, random_init, over, ec)
  plot_files = eigen_report.write_plots(workdir, analyses[0], centred[0], random_init, probs,
                                          over, recon_rows, acc_rows, ec, num_tokens,
                                          cost_rows)
  notes = eigen_report.notes(data, over, num_tokens, len(runs), unit, ec)
  md = tables.write_results(
      workdir, title, summary,
      notes=notes, plots=plot_files,
      extra={"reconstruction": recon_rows, "frozen_accuracy": acc_rows,
             "trained": cost_rows,
             "overlap": {"layers": over["layers"].tolist(),
                         "head_mean": over["head_mean"].tolist(),
                         "seed_layers": None if over["seed_layers"] is None
                         else over["seed_layers"].tolist(),
                         "init_layers": over["init_layers"].tolist(),
                         "seeds": None if over["seeds"] is None else over["seeds"].tolist(),
                         "random_init": over["random_init"].tolist(),
                         "random_subspace": over["random_subspace"].tolist(),
                         "random_expected": over["random_expected"]},
             "explained_variance_rows": analyses[0]["ev_rows"].tolist(),
             "explained_variance_matrices": analyses[0]["ev_matrices"].tolist(),
             "num_tokens": num_tokens, "device": jax.devices()[0].device_kind})
  md = eigen_report.append_tables(workdir, md, recon_rows, acc_rows, cost_rows)
  return {"rows": summary, "markdown": md, "reconstruction": recon_rows,
          "frozen_accuracy": acc_rows, "trained": cost_rows, "overlap": over,
          "num_tokens": num_tokens,
          "explained_variance": {"rows": analyses[0]["ev_rows"],
                                 "matrices": analyses[0]["ev_matrices"],
                                 "rows_centered": centred[0]["ev_rows"],
                                 "rows_probs": probs["ev_rows"],
                                 "rows_random_init": random_init["ev_rows"]}}
