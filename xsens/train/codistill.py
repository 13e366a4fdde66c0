"""Co-distillation: two models trained jointly in one jitted step (`config.codistill`).

Anil, Pereyra, Passos, Ormandi, Dahl and Hinton 2018, "Large scale distributed neural
network training through online distillation", arXiv 1804.03235; used against prediction
churn by Bhojanapalli et al., arXiv 2102.03349 (docs/papers/google_papers.md §F, whose "novel
variant" is not known; this is the baseline form). Per step, on the same batch,

  L_i = CE(y, p_i) + β·KL(sg(p_j) ‖ p_i),   i ≠ j ∈ {a, b},   (β = 0 before `burn_in_steps`)

with sg the stop-gradient. One `value_and_grad` of L_a + L_b over both parameter sets gives
each model exactly its own gradient (the peer's logits enter only through sg).

Model a is initialised from `init_seed` (default `config.seed`), model b from
`init_seed + codistill.peer_seed_offset`; both see the same mini-batches (`order_seed`) and
the same step key (`augment_seed`: augmentation, dropout). With β = 0 each model is
therefore exactly the plain trainer's run with those seeds. Training runs through the one
loop (`xsens.train.loop`: resume, schedule, divergence stop) with the trainer's pieces
(data, batching, evaluation); the state is `{"a": state, "b": state}`.
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from xsens.data import pipeline
from xsens.errors import ConfigError
from xsens.train import distill as distill_lib
from xsens.train import interventions, loop, sharding, trainer
from xsens.train.workdir import Workdir

FIELDS = ("beta", "peer_seed_offset", "burn_in_steps")
PEERS = ("a", "b")


@dataclasses.dataclass
class CodistillResult:
  """Both trained models (each a `TrainResult`) and the joint summary."""
  a: trainer.TrainResult
  b: trainer.TrainResult
  summary: dict


def validate_codistill_config(config) -> dict:
  """Checks `config.codistill` and what co-distillation does not support. Returns it."""
  cc = config.get("codistill")
  if cc is None:
    raise ConfigError("codistill", "missing; a block {beta, peer_seed_offset, "
                      "burn_in_steps} (mlcollections_configs.common.codistill_config())")
  unknown = [k for k in cc.keys() if k not in FIELDS]
  if unknown:
    raise ConfigError(f"codistill.{unknown[0]}", f"unknown field; allowed: {', '.join(FIELDS)}")
  beta = cc.get("beta", 0.5)
  if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not (
      math.isfinite(beta) and beta >= 0):
    raise ConfigError("codistill.beta", f"must be a finite number >= 0, got {beta!r}")
  offset = cc.get("peer_seed_offset", 1)
  if isinstance(offset, bool) or not isinstance(offset, int) or offset == 0:
    raise ConfigError("codistill.peer_seed_offset", f"must be a non-zero int (model b's "
                      f"init seed = init_seed + offset), got {offset!r}")
  burn_in = cc.get("burn_in_steps", 0)
  if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 0:
    raise ConfigError("codistill.burn_in_steps", f"must be an int >= 0, got {burn_in!r}")
  if trainer.run_seeds(config)["init_seed"] + offset < 0:
    raise ConfigError("codistill.peer_seed_offset", "init_seed + offset must be >= 0")
  if config.get("distill") is not None:
    raise ConfigError("distill", "co-distillation does not combine with config.distill; "
                      "set it to None")
  scaling = trainer.scaling_options(config)
  for field, default in (("accum_steps", 1), *((f"sharding.{k}", v)
                                               for k, v in trainer.SHARDING_DEFAULTS.items())):
    value = scaling[field.split(".")[-1]]
    if value != default:
      raise ConfigError(field, f"co-distillation trains with its default {default!r} "
                        f"(one pass, replicated state); got {value!r}")
  if trainer.mixup_alpha(config) != 0:
    raise ConfigError("mixup.alpha", "co-distillation trains without mixup; set it to 0")
  if config.get("objective") is not None:
    raise ConfigError("objective", "co-distillation trains each model on config.loss plus "
                      "the coupling; set objective to None")
  if config.get("target_train_accuracy") is not None:
    raise ConfigError("target_train_accuracy", "co-distillation trains a fixed number of "
                      "steps; set it to None")
  if config.get("pretrained", {}).get("path") is not None:
    raise ConfigError("pretrained.path", "co-distillation starts both models from scratch")
  return {"beta": float(beta), "peer_seed_offset": int(offset), "burn_in_steps": int(burn_in)}


def make_codistill_step(model, tx, loss_fn, beta: float, burn_in_steps: int = 0,
                        augment=None):
  """`(state {"a","b"}, batch, key) -> (state, metrics)`: one joint update of both models."""
  use_aug = augment is not None and augment.gaussian_std > 0 and augment.gaussian_prob > 0

  def step(state, batch, key):
    step_key = jax.random.fold_in(key, state["a"]["step"])
    dropout_key, aug_key = (jax.random.fold_in(step_key, i) for i in range(2))
    images, labels = batch["image"], batch["label"]
    if use_aug:
      images = interventions.gaussian_augment(
          images, aug_key, std=augment.gaussian_std, prob=augment.gaussian_prob)
    coupling = jnp.where(state["a"]["step"] >= burn_in_steps, beta, 0.0)

    def forward(params, peer_state):
      variables = {"params": params}
      if peer_state["batch_stats"]:
        variables["batch_stats"] = peer_state["batch_stats"]
      return model.apply(variables, images, train=True, rngs={"dropout": dropout_key},
                         mutable=["batch_stats"])

    def objective(params):
      out = {p: forward(params[p], state[p]) for p in PEERS}
      logits = {p: out[p][0] for p in PEERS}
      ce = {p: loss_fn(logits[p], labels).mean() for p in PEERS}
      # kd_term(student, teacher, τ=1) = KL(sg(p_teacher) ‖ p_student).
      kl = {"a": distill_lib.kd_term(logits["a"], logits["b"], 1.0).mean(),
            "b": distill_lib.kd_term(logits["b"], logits["a"], 1.0).mean()}
      loss = {p: ce[p] + coupling * kl[p] for p in PEERS}
      return loss["a"] + loss["b"], (logits, {p: out[p][1] for p in PEERS}, ce, kl, loss)

    params = {p: state[p]["params"] for p in PEERS}
    (_, (logits, new_vars, ce, kl, loss)), grads = jax.value_and_grad(
        objective, has_aux=True)(params)
    new_state, metrics = {}, {}
    for p in PEERS:
      updates, opt = tx.update(grads[p], state[p]["opt"], state[p]["params"])
      new_params = optax.apply_updates(state[p]["params"], updates)
      new_state[p] = {
          "params": new_params,
          "batch_stats": new_vars[p].get("batch_stats", {}) if state[p]["batch_stats"] else {},
          "opt": opt, "step": state[p]["step"] + 1}
      metrics.update({
          f"{p}/loss": loss[p], f"{p}/ce": ce[p], f"{p}/kl": kl[p],
          f"{p}/accuracy": jnp.mean(jnp.argmax(logits[p], -1) == labels),
          f"{p}/param_norm": optax.global_norm(new_params)})
    metrics["loss"] = loss["a"] + loss["b"]
    metrics["churn"] = jnp.mean(jnp.argmax(logits["a"], -1) != jnp.argmax(logits["b"], -1))
    return new_state, metrics

  return step


def train_and_evaluate(config, workdir: str, *, overwrite: bool = False, mesh=None
                       ) -> CodistillResult:
  """Co-distils two copies of `config.model` on `config.data`; resumes from `workdir`.

  Validates everything first (ConfigError, nothing written). Writes metrics (`a/...`,
  `b/...`, `churn` on the training batch; eval accuracies of both) and
  `train_summary.json` with both models' numbers.
  """
  sharding.maybe_initialize_distributed()
  mesh = sharding.data_mesh() if mesh is None else mesh
  exp = trainer.build_experiment(config, mesh.size)
  cc = validate_codistill_config(config)
  return run_experiment(exp, cc, trainer.open_workdir(workdir, config, overwrite), mesh)


def run_experiment(exp: trainer.Experiment, cc: dict, workdir: str | Workdir, mesh=None, *,
                   max_chunks: int | None = None) -> CodistillResult:
  """Co-distils a validated experiment through the one loop (`xsens.train.loop`).

  `workdir` is a prepared `Workdir` (or its path, already prepared). One call of the
  loop's `advance` is one joint step of both models; evaluation gives both models'
  train/test accuracy (`eval/{a,b}_{train,test}_accuracy`). `max_chunks` stops after
  that many steps with a checkpoint (an interruption, for tests).
  """
  config = exp.config
  t_start = time.time()
  wd = workdir if isinstance(workdir, Workdir) else Workdir(
      workdir, keep_checkpoints=config.keep_checkpoints)
  mesh = sharding.data_mesh() if mesh is None else mesh
  repl = sharding.replicated(mesh)
  seeds = trainer.run_seeds(config)
  # Model a's keys are the plain trainer's; model b's init seed is shifted.
  init_keys = {"a": jax.random.split(jax.random.key(seeds["init_seed"]))[0],
               "b": jax.random.split(jax.random.key(seeds["init_seed"]
                                                    + cc["peer_seed_offset"]))[0]}
  step_key = jax.random.split(jax.random.key(seeds["augment_seed"]))[1]

  dtype = exp.train.inputs.dtype  # float32 images, or int32 token ids (text models).
  init_fn = lambda ka, kb: {
      "a": trainer.init_state(exp.model, exp.tx, exp.train.input_shape, ka, dtype),
      "b": trainer.init_state(exp.model, exp.tx, exp.train.input_shape, kb, dtype)}
  abstract = jax.eval_shape(init_fn, init_keys["a"], init_keys["b"])
  state_sh = jax.tree.map(lambda _: repl, abstract)

  step_fn = jax.jit(
      make_codistill_step(exp.model, exp.tx, exp.loss_fn, cc["beta"], cc["burn_in_steps"],
                          config.get("augment")),
      in_shardings=(state_sh, sharding.batch_sharding(mesh), repl),
      out_shardings=(state_sh, repl), donate_argnums=0)
  eval_step = jax.jit(trainer.make_eval_step(exp.model, exp.loss_fn))
  eval_bs = sharding.round_to_devices(config.eval_batch_size, mesh.size)
  pi, pc = jax.process_index(), jax.process_count()

  def evaluate_both(state, split, limit=None):
    return {p: trainer.evaluate(eval_step, trainer.eval_variables(state[p]), split, eval_bs,
                                mesh, limit) for p in PEERS}

  def advance(state, step, length):
    del length  # One joint step per call (schedule.max_chunk = 1).
    idx = pipeline.batch_indices(len(exp.train), config.batch_size, step,
                                 seeds["order_seed"], pi, pc)
    batch = sharding.global_batch(
        {"image": exp.train.inputs[idx], "label": exp.train.labels[idx]}, mesh)
    state, metrics = step_fn(state, batch, step_key)
    return state, metrics, None

  def evaluate_during(state, step):
    del step
    tr = evaluate_both(state, exp.train, config.get("eval_train_examples"))
    te = evaluate_both(state, exp.test)
    return {f"eval/{p}_{k}": v[p]["accuracy"] for k, v in
            (("train_accuracy", tr), ("test_accuracy", te)) for p in PEERS}

  program = loop.Program(
      init=lambda: jax.jit(init_fn, out_shardings=state_sh)(init_keys["a"], init_keys["b"]),
      abstract_state=sharding.abstract_with_shardings(abstract, state_sh),
      advance=advance, evaluate=evaluate_during)
  schedule = loop.Schedule(exp.total_steps, log_every=config.log_every,
                           eval_every=config.eval_every,
                           checkpoint_every=config.checkpoint_every)
  finished_at = lambda s: trainer._finished_summary(  # pylint: disable=protected-access
      wd.file(trainer.SUMMARY_FILE), s, exp.total_steps)
  out = loop.run(wd, program, schedule,
                 finished_reason=lambda s: finished_at(s).get("stop_reason"),
                 progress=bool(config.get("progress", True)),
                 desc=f"codistill {config.model.name}", max_chunks=max_chunks)
  state, step = out.state, out.step

  tr, te = evaluate_both(state, exp.train), evaluate_both(state, exp.test)
  finished = finished_at(out.restored_step) if out.new_steps == 0 else {}
  wall = finished.get("wall_s", time.time() - t_start)
  per_model = {}
  for p in PEERS:
    per_model[p] = {
        "model": config.model.name, "steps": step, "stop_reason": out.stop_reason,
        "train_accuracy": tr[p]["accuracy"], "train_loss": tr[p]["loss"],
        "test_accuracy": te[p]["accuracy"], "test_loss": te[p]["loss"],
        "num_params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(
            state[p]["params"]))),
        "wall_s": wall}
  summary = {"steps": step, "stop_reason": out.stop_reason, "wall_s": wall, **cc,
             **per_model}
  wd.write_json(trainer.SUMMARY_FILE, summary)
  results = {p: trainer.TrainResult(exp.model, trainer.eval_variables(state[p]), exp.train,
                                    exp.test, per_model[p]) for p in PEERS}
  return CodistillResult(results["a"], results["b"], summary)
