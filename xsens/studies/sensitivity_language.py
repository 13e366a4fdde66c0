"""Study `sensitivity_language`: token-wise sensitivity of RoBERTa, GPT-2 and an LSTM.

"Transformers Learn Low Sensitivity Functions: Investigations and Implications" (ICLR
2025, arXiv 2403.06925), §5 and App. Fig. 20; docs/results.md (sensitivity sections)
§2.3, §7, §8. Trains every run of `config.runs` (text models of `xsens.models.text`) on
one text dataset (`xsens.data.text`) and, on a fixed set of training examples, measures

  token-wise: Pr_eps[argmax f(X^(i,eps)) != argmax f(X)], x_i <- x_i + eps,
              eps ~ N(0, sigma^2 I_D) right after the embedding LayerNorm (GPT-2: after
              wte + wpe), one position i at a time, R draws, every real position;
  global:     the same with noise on every measured token at once (App. A.2);

every `every_steps` training steps (through the trainer's hooks, written to each run's
metrics.jsonl) and once more, with more draws, on the final model. Reports the three
aggregates of docs/papers/sensitivity.md §2.3: (a) pooled over tokens, (b) mean of per-sentence
means and (c) the per-position curve right-aligned to the sequence end; plus, as our summary of
(c), the recency ratio: pooled sensitivity of the last half of each sentence's tokens over
that of its first half. The paper's claim: "transformers tend to have uniform
sensitivity to all tokens while LSTMs are more sensitive to more recent tokens", and
transformers have lower sensitivity at comparable accuracy.

Options (`config.sensitivity`): `noise_scale` (`xsens.measures.sensitivity.NOISE_SCALES`:
σ as given, or times each model's clean-token RMS); `noise_placement`: "after_norm" (the
paper's, above) or "before_norm" (our variant: on the word + position embedding sum before
the embedding LayerNorm, `embed_pre_norm` of `xsens.models.text`; GPT-2's two placements
coincide). Every row also gives σ / token RMS (`nsr`, the noise-to-signal ratio of the
noise actually added) and the per-token-type breakdown: pooled token-wise sensitivity on
the signal words (the words the synthetic label rule reads,
`xsens.data.text.signal_token_ids`), on the other words and on the special tokens.

Seeds: with `config.num_seeds` = n > 1 every run trains n times (`multirun.run_ids`: ids
`<run>`, `<run>_seed1`, ...; same data, shifted init / order / dropout seeds); results.md
has the per-seed rows and a table of mean ± standard error over the seeds per run, and
the plots show seed means.

Design choices (not confirmed from the paper): the same noise key at every report
(common random numbers, smoother curves over training); the content-token aggregates
(specials excluded) are reported beside the headline ones, from the same one-position-
at-a-time measurement (a position's flip rate does not depend on which others are
measured).
"""

from __future__ import annotations

import functools
import os
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from mlcollections_configs import sensitivity_language as configs
from xsens.config_utils import run_config
from xsens.data import pipeline
from xsens.data import text as text_data
from xsens.errors import ConfigError
from xsens.lab import multirun
from xsens.measures import sensitivity as sens
from xsens.measures import text_sensitivity as ts
from xsens.models import text as text_models
from xsens.report import plots, tables
from xsens.report import seed_stats, training
from xsens.train import evaluators, trainer
from xsens.train.metrics import read_metrics

PREFIX = "sens/"
SPECIAL_IDS = (text_data.BOS_ID, text_data.EOS_ID)
# Where the noise enters: the model methods (tokens, tokens -> logits) of each placement.
NOISE_PLACEMENTS = {"after_norm": ("embed", "encode"),
                    "before_norm": ("embed_pre_norm", "encode_pre_norm")}
TOKEN_TYPES = ("signal", "other", "special")


def validate_sensitivity_config(sc, num_train: int) -> None:
  """Checks `sensitivity.num_examples` against the `num_train` training examples (the
  fields of `config.sensitivity`: the config file's `validate`)."""
  if sc.num_examples > num_train:
    raise ConfigError("sensitivity.num_examples", f"{sc.num_examples} exceeds the "
                      f"{num_train} training examples; allowed: 1..{num_train}")


def token_type_masks(data_config, seed: int, ids: np.ndarray) -> dict[str, np.ndarray]:
  """Masks [N, L] of the real tokens of `ids` by type (`TOKEN_TYPES`): on the synthetic
  languages, the signal words of their label rule (`text_data.token_types`); on GLUE no
  word is marked as signal (every word is "other")."""
  if data_config.name == text_data.SYNTHETIC:
    task = data_config.synthetic.task
    return text_data.token_types(ids, task, seed)
  special = np.isin(ids, (text_data.BOS_ID, text_data.EOS_ID, text_data.UNK_ID))
  return {"signal": np.zeros(ids.shape, bool),
          "other": (ids != text_models.PAD_ID) & ~special, "special": special}


def validate(config) -> dict[str, trainer.Experiment]:
  """Validates the runs (text models on a text dataset) and `config.sensitivity`."""
  if not pipeline.is_text(config.train.data):
    raise ConfigError("train.data.name", f"{config.train.data.name!r} is not a text "
                      f"dataset; allowed: {', '.join(text_data.DATASETS)}")
  for name in config.runs:
    model_name = run_config(config, name).model.name
    if model_name not in text_models.TEXT_MODELS:
      raise ConfigError(multirun.run_field(config, name, "model.name"),
                        f"{model_name!r} is not a text model (run {name}); allowed: "
                        f"{', '.join(text_models.TEXT_MODELS)}")
  configs.validate(config)
  experiments = multirun.validate_runs(config)  # Keyed by run id (`multirun.run_ids`).
  validate_sensitivity_config(config.sensitivity,
                              min(len(e.train) for e in experiments.values()))
  return experiments


@functools.lru_cache(maxsize=None)
def _token_sq_fn(model, placement: str):
  """`fn(batch, variables)` -> the batch's float32 {"sq": sum of squared token coordinates
  over the real tokens of its real rows, "coords": their number}, where the noise of
  `placement` enters."""
  def fn(batch, variables):
    mask = text_models.padding_mask(batch["ids"]) * batch["mask"][:, None]
    tokens = model.apply(variables, batch["ids"],
                         method=getattr(model, NOISE_PLACEMENTS[placement][0]))
    return {"sq": jnp.sum(jnp.square(tokens) * mask[..., None]),
            "coords": jnp.sum(mask) * tokens.shape[-1]}
  return fn


def token_rms(model, variables, ids: np.ndarray, batch_size: int,
              placement: str = "after_norm") -> float:
  """Root-mean-square coordinate of the clean tokens (real positions) of `ids`, where the
  noise of `placement` enters: float32 totals of each batch of `batch_size`
  (`evaluators.over_split`), added in float64."""
  outs = evaluators.over_split(_token_sq_fn(model, placement), {"ids": ids},
                               args=(variables,), reduce="per_batch", batch_size=batch_size)
  total, count = 0.0, 0.0
  for out in outs:
    total, count = total + float(out["sq"]), count + float(out["coords"])
  return float(np.sqrt(total / max(count, 1.0)))


@functools.lru_cache(maxsize=None)
def _measure_fn(model, num_draws: int, global_draws: int, chunk_size, include_special: bool,
                placement: str):
  """`fn(batch, variables, key, sigma, global_sigma)` -> {"per_token" [B, T] flip rates
  over all real positions, "global" [B], "pred" [B] clean argmax} of batch["ids"], the
  noise of each example keyed by batch["index"]."""
  embed, enc = (getattr(model, m) for m in NOISE_PLACEMENTS[placement])
  encode = functools.partial(model.apply, method=enc)

  def fn(batch, variables, key, sigma, global_sigma):
    ids, example_ids = batch["ids"], batch["index"]
    mask = text_models.padding_mask(ids)
    content = mask & ~jnp.isin(ids, jnp.asarray(SPECIAL_IDS))
    tokens = model.apply(variables, ids, method=embed)
    pred = jnp.argmax(encode(variables, tokens, mask), -1)
    per_token = ts.text_token_sensitivity(
        encode, variables, tokens, key=jax.random.fold_in(key, 0), token_mask=mask,
        sigma=sigma, num_draws=num_draws, measure_mask=mask, example_ids=example_ids,
        chunk_size=chunk_size)["per_token"]
    glob = ts.text_global_sensitivity(
        encode, variables, tokens, key=jax.random.fold_in(key, 1), token_mask=mask,
        sigma=global_sigma, num_draws=global_draws,
        measure_mask=mask if include_special else content, example_ids=example_ids,
        chunk_size=None)["per_example"]
    return {"per_token": per_token, "global": glob, "pred": pred}
  return fn


def measure(model, variables, ids: np.ndarray, labels: np.ndarray, sc, key,
            num_draws: int, type_masks: dict[str, np.ndarray] | None = None) -> dict:
  """Token-wise and global sensitivity of one model on `ids` [N, L]; aggregates in numpy.

  Returns {"all": aggregates over every real token, "content": over non-special tokens,
  "headline": the one selected by include_special_tokens, "global": (mean, s.e.),
  "accuracy": clean accuracy on the set, "early"/"late"/"recency_ratio" (first vs last
  half of each sentence, `text_sensitivity.early_late`), "token_rms" (where the noise of
  `sc.noise_placement` enters), "sigma"/"global_sigma" (the noise std actually added),
  "types": {type: (pooled, s.e.)} over each mask of `type_masks` (`token_type_masks`;
  none when None)}.
  """
  bs = sc.batch_size
  placement = sc.noise_placement
  rms = token_rms(model, variables, ids, bs, placement)
  scale = sens.noise_multiplier(sc.noise_scale, rms)
  out = evaluators.over_split(
      _measure_fn(model, num_draws, sc.global_num_draws, sc.chunk_size,
                  sc.include_special_tokens, placement), {"ids": ids},
      args=(variables, key, jnp.float32(sc.sigma * scale),
            jnp.float32(sc.global_sigma * scale)), reduce="concat", batch_size=bs)
  per_token, glob, pred = out["per_token"], out["global"], out["pred"]
  mask = ids != text_models.PAD_ID
  content = mask & ~np.isin(ids, SPECIAL_IDS)
  end = ts.last_index(jnp.asarray(mask))
  agg = {k: jax.tree.map(np.asarray, ts.text_aggregates(jnp.asarray(per_token),
                                                        jnp.asarray(m), end))
         for k, m in (("all", mask), ("content", content))}
  headline = agg["all" if sc.include_special_tokens else "content"]
  early, late = (float(v) for v in ts.early_late(
      jnp.asarray(per_token), jnp.asarray(mask if sc.include_special_tokens else content)))
  types = {}
  for name, m in (type_masks or {}).items():
    if m.any():
      t = ts.text_aggregates(jnp.asarray(per_token), jnp.asarray(m & mask), end)
      types[name] = (float(t["pooled"]), float(t["pooled_se"]))
    else:
      types[name] = (float("nan"), float("nan"))
  return {"all": agg["all"], "content": agg["content"], "headline": headline,
          "global": (float(glob.mean()), _stderr(glob)),
          "accuracy": float((pred == labels).mean()), "early": early, "late": late,
          "recency_ratio": late / early if early > 0 else float("nan"),
          "token_rms": rms, "sigma": float(sc.sigma * scale),
          "global_sigma": float(sc.global_sigma * scale), "types": types,
          "per_token": per_token}


def _stderr(x: np.ndarray) -> float:
  return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def _scalars(m: dict) -> dict:
  """The scalars a report writes to metrics.jsonl (finite values only)."""
  h = m["headline"]
  out = {"token_pooled": h["pooled"], "token_sentence_mean": h["sentence_mean"],
         "token_content_pooled": m["content"]["pooled"], "global": m["global"][0],
         "clean_accuracy": m["accuracy"], "recency_ratio": m["recency_ratio"],
         "token_rms": m["token_rms"]}
  for k, (v, c) in enumerate(zip(h["curve"], h["curve_count"])):
    if c > 0:
      out[f"curve/{k}"] = v
  for name, (v, _) in m["types"].items():
    out[f"token_{name}_pooled"] = v
  return {PREFIX + k: float(v) for k, v in out.items() if np.isfinite(v)}


def make_hook(model, ids, labels, sc, key, type_masks=None):
  """The trainer hook: a report every `every_steps` steps (and at step 0)."""
  def hook(step, variables):
    if step != 0 and (not sc.every_steps or step % sc.every_steps):
      return None
    return _scalars(measure(model, variables, ids, labels, sc, key, sc.num_draws,
                            type_masks))
  return hook


def history(workdir: str, batch_size: int) -> dict[str, np.ndarray]:
  """Reports of one run from its metrics.jsonl: examples seen and the logged scalars."""
  records = [r for r in read_metrics(workdir) if PREFIX + "token_pooled" in r]
  out = {"examples": np.asarray([r["step"] * batch_size for r in records], float)}
  for key in ("token_pooled", "token_sentence_mean", "global", "clean_accuracy",
              "recency_ratio", *(f"token_{t}_pooled" for t in TOKEN_TYPES)):
    out[key] = np.asarray([r.get(PREFIX + key, np.nan) for r in records], float)
  return out


# The per-run columns of results.md, and those averaged over seeds (`seed_stats.seed_rows`).
COLUMNS = ["run", "params", "steps", "stop_reason", "train_accuracy", "test_accuracy",
           "S_token", "s.e._token", "S_token_sentence", "s.e._sentence", "S_token_content",
           "S_signal", "S_other", "S_special", "S_global", "s.e._global", "S_early",
           "S_late", "recency_ratio", "token_rms", "sigma", "nsr", "global_nsr",
           "wall_s", "measure_s"]
SEED_COLUMNS = ["steps", "train_accuracy", "test_accuracy", "S_token", "S_token_sentence",
                "S_token_content", "S_signal", "S_other", "S_special", "S_global",
                "recency_ratio", "token_rms", "nsr", "wall_s"]


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every run (once per seed) with the sensitivity hook, measures the final
  models, reports."""
  sc = config.sensitivity
  experiments = validate(config)  # Nothing trained, compiled or written before this.
  ids = multirun.run_ids(config)
  workdirs = multirun.check_run_workdirs(workdir, experiments, overwrite)
  key = jax.random.key(sc.seed)
  results, measured, measure_s = {}, {}, {}
  for run_id, exp in experiments.items():
    wd = workdirs[run_id]
    wd.prepare(exp.config, overwrite=overwrite)
    x = exp.train.images[:sc.num_examples]
    labels = exp.train.labels[:sc.num_examples]
    types = token_type_masks(exp.config.data, exp.config.seed, x)
    hook = make_hook(exp.model, x, labels, sc, key, types)
    with multirun.run_errors(config, ids[run_id][0]):
      results[run_id] = trainer.run_experiment(exp, wd, hooks=(hook,))
    t0 = time.time()
    measured[run_id] = measure(exp.model, results[run_id].variables, x, labels, sc, key,
                               sc.final_num_draws, types)
    measure_s[run_id] = round(time.time() - t0, 1)

  rows = multirun.summary_rows(results)
  for row in rows:
    m = measured[row["run"]]
    h = m["headline"]
    row.update({
        "S_token": float(h["pooled"]), "s.e._token": float(h["pooled_se"]),
        "S_token_sentence": float(h["sentence_mean"]),
        "s.e._sentence": float(h["sentence_mean_se"]),
        "S_token_content": float(m["content"]["pooled"]),
        **{f"S_{t}": m["types"][t][0] for t in TOKEN_TYPES},
        "S_global": m["global"][0], "s.e._global": m["global"][1],
        "S_early": m["early"], "S_late": m["late"], "recency_ratio": m["recency_ratio"],
        "token_rms": m["token_rms"], "sigma": m["sigma"],
        "nsr": m["sigma"] / m["token_rms"], "global_nsr": m["global_sigma"] / m["token_rms"],
        "measure_s": measure_s[row["run"]]})
  names = list(results)
  hist = {n: history(multirun.run_workdir(workdir, n), experiments[n].config.batch_size)
          for n in names}
  seeds = multirun.num_seeds(config)
  seed_summary = seed_stats.seed_rows(rows, ids, SEED_COLUMNS)
  plot_files = [_plot_history(workdir, seed_history(hist, ids), sc,
                              results[names[0]].train.num_classes),
                _plot_positions(workdir, seed_curves(measured, ids), sc)]
  n = min(sc.num_examples, min(len(e.train) for e in experiments.values()))
  seed_table = (seed_stats.seed_summary_markdown(seed_summary, SEED_COLUMNS, "; its ± is over "
                                                "sentences") if seeds > 1 else "")
  md = tables.write_results(
      workdir, f"Token-wise sensitivity of language models on {config.train.data.name}",
      rows, columns=COLUMNS,
      notes=seed_table + _notes(config, rows if seeds == 1 else seed_summary, n, rows),
      plots=plot_files,
      extra={"curves": {k: _curve_json(measured[k]) for k in names},
             "history": {k: {f: v.tolist() for f, v in hist[k].items()} for k in names},
             "seed_summary": seed_summary, "num_seeds": seeds,
             "sensitivity": sc.to_dict()})
  return {"rows": rows, "markdown": md, "measured": measured, "history": hist,
          "seed_summary": seed_summary}


def _groups(values: dict, ids: dict) -> dict[str, list]:
  out: dict[str, list] = {}
  for run_id, v in values.items():
    out.setdefault(ids[run_id][0], []).append(v)
  return out


def seed_history(hist: dict, ids: dict) -> dict[str, dict[str, np.ndarray]]:
  """Per run: the mean over its seeds of each logged series, at every report step any
  seed reached (runs stopped at a target accuracy have different lengths)."""
  out = {}
  for name, hs in _groups(hist, ids).items():
    grid = np.unique(np.concatenate([h["examples"] for h in hs]))
    agg = {"examples": grid}
    for f in hs[0]:
      if f == "examples":
        continue
      stack = np.full((len(hs), len(grid)), np.nan)
      for i, h in enumerate(hs):
        stack[i, np.searchsorted(grid, h["examples"])] = h[f]
      with warnings.catch_warnings():  # All-NaN columns (a series no seed logged) stay NaN.
        warnings.simplefilter("ignore", RuntimeWarning)
        agg[f] = np.nanmean(stack, 0) if len(hs) > 1 else stack[0]
    out[name] = agg
  return out


def seed_curves(measured: dict, ids: dict) -> dict[str, dict]:
  """Per run: the per-position curve (headline) averaged over its seeds; its s.e. is over
  the seeds (over sentences for one seed); count is the smallest over the seeds."""
  out = {}
  for name, ms in _groups(measured, ids).items():
    curves = np.stack([m["headline"]["curve"] for m in ms])
    count = np.min(np.stack([m["headline"]["curve_count"] for m in ms]), 0)
    with warnings.catch_warnings():  # Positions no sentence reaches stay NaN.
      warnings.simplefilter("ignore", RuntimeWarning)
      if len(ms) == 1:
        curve, se = curves[0], ms[0]["headline"]["curve_se"]
      else:
        curve = np.nanmean(curves, 0)
        se = np.nanstd(curves, 0, ddof=1) / np.sqrt(len(ms))
    out[name] = {"headline": {"curve": curve, "curve_se": se, "curve_count": count}}
  return out


def _curve_json(m: dict) -> dict:
  h = m["headline"]
  clean = lambda a: [None if not np.isfinite(v) else float(v) for v in a]
  return {"curve": clean(h["curve"]), "curve_se": clean(h["curve_se"]),
          "count": [int(c) for c in h["curve_count"]]}


def _plot_history(workdir, hist, sc, num_classes=None) -> str:
  panels = {
      f"token-wise (σ={sc.sigma:.3g}, one position at a time)":
          {n: (h["examples"], h["token_pooled"]) for n, h in hist.items()},
      f"global (σ={sc.global_sigma:.3g}, all tokens)":
          {n: (h["examples"], h["global"]) for n, h in hist.items()},
      "clean accuracy on the measured training examples":
          {n: (h["examples"], h["clean_accuracy"]) for n, h in hist.items()},
      "token-wise on signal words vs on the other words":
          {**{f"{n} signal": (h["examples"], h["token_signal_pooled"])
              for n, h in hist.items()},
           **{f"{n} other": (h["examples"], h["token_other_pooled"])
              for n, h in hist.items()}},
  }
  return plots.panels_plot(os.path.join(workdir, "sensitivity_vs_examples.png"), panels,
                           xlabel="training examples seen",
                           ylabels=["sensitivity (flip probability)",
                                    "sensitivity (flip probability)",
                                    "accuracy (fraction correct)",
                                    "sensitivity (flip probability)"],
                           title="Sensitivity over training (means over seeds)",
                           num_classes=[None, None, num_classes, None])


def _plot_positions(workdir, measured, sc) -> str:
  series = {}
  for name, m in measured.items():
    h = m["headline"]
    ok = h["curve_count"] >= 5  # Positions too few sentences reach are left out.
    k = np.flatnonzero(ok)
    series[name] = (k, h["curve"][ok], h["curve_se"][ok])
  which = "all real tokens" if sc.include_special_tokens else "content tokens"
  return plots.panels_plot(
      os.path.join(workdir, "sensitivity_per_position.png"),
      {f"final models (means over seeds), {which}, σ={sc.sigma:.3g}": series},
      xlabel="position before the sequence end (0 = last token)",
      ylabels=["flip probability"], invert_x=True,
      title="Token-wise sensitivity per position")


def _notes(config, rows, n, run_rows) -> str:
  """The notes below the tables; `rows` are the per-run rows or, with several seeds, the
  seed means (`seed_stats.seed_rows`); `run_rows` the per-run rows (where each stopped)."""
  sc = config.sensitivity
  ranked = sorted(rows, key=lambda r: r["S_token"])
  order = " < ".join(f"{r['run']} ({r['S_token']:.3g})" for r in ranked)
  recency = ", ".join(f"{r['run']} {r['recency_ratio']:.2f}" for r in rows)
  ratio = ", ".join(f"{r['run']} {r['S_signal'] / r['S_other']:.2f}" for r in rows
                    if r["S_other"] > 0)
  where = ("after the embedding LayerNorm; GPT-2: after wte + wpe"
           if sc.noise_placement == "after_norm" else
           "before the embedding LayerNorm, on the raw embedding sum; GPT-2: after "
           "wte + wpe")
  task = (config.train.data.synthetic.task
          if config.train.data.name == text_data.SYNTHETIC else None)
  signal = {"polarity": "the positive/negative adjectives and 'not'",
            "weak_sum": "the top third of content words by |score|",
            None: "none marked on this dataset"}[task]
  scale = (" × token_rms (the RMS coordinate of each model's clean tokens)"
           if sc.noise_scale == "token_rms" else "")
  which = ("every real token (specials included, as the official code)"
           if sc.include_special_tokens else "content tokens (specials excluded)")
  return (
      f"Token-wise sensitivity: label-flip probability when one position's embedding "
      f"({where}) gets N(0, σ²I) noise, "
      f"σ = {sc.sigma:.4g}{scale}, {sc.final_num_draws} draws per position, over {which}, on the "
      f"first {n} training examples. S_token is aggregate (a), pooled over tokens; "
      f"S_token_sentence is (b), the mean of per-sentence means; S_token_content pools "
      f"the non-special tokens only; S_global puts noise (σ = {sc.global_sigma:.3g}) on "
      f"all tokens at once ({sc.global_num_draws} draws). ± are standard errors over "
      f"sentences. recency_ratio = S_late / S_early, the pooled sensitivity of the last "
      f"half of each sentence's tokens over that of its first half (1 = uniform); "
      f"token_rms is the RMS coordinate of the clean tokens where the noise enters "
      f"(about 1 after a LayerNorm); sigma is the noise std added, nsr = sigma / token_rms "
      f"its noise-to-signal ratio (global_nsr that of S_global). S_signal / S_other / "
      f"S_special pool the signal words ({signal}), the other words and the special "
      f"tokens. {training.stop_note(config.train, run_rows)}\n\n"
      f"Ordering of S_token: {order}. Recency ratios: {recency}. S_signal / S_other: "
      f"{ratio}.")
