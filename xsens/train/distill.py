"""Knowledge distillation in the one trainer (`config.distill`), with per-class mitigations.

Base loss (Hinton, Vinyals and Dean 2015, "Distilling the knowledge in a neural network",
arXiv 1503.02531), per example i with label y_i:

  L_i = (1 − α_{y_i})·CE(softmax(f(x_i) − m_{y_i}·e_{y_i}), y_i)
        + α_{y_i}·τ²·KL(p_t^τ(x_i) ‖ p_s^τ(x_i)),      p^τ = softmax(logits / τ).

The τ² factor keeps the gradient of the KL term w.r.t. the student logits,
τ·(p_s^τ − p_t^τ), of the same size as τ changes (Hinton et al. §2).

With `per_class_alpha = None` and `margin = None` this is plain distillation (α_y = α,
m_y = 0). The two mitigations follow "Teacher's pet" (Lukasik et al., TMLR 2022, arXiv
2106.10494, docs/papers/google_papers.md §B), whose abstract says only: "soften the teacher
influence for subgroups where it is less reliable". The exact formulas are NOT known; ours
are the candidate forms of docs/papers/google_papers.md §B (our design, not confirmed from the
paper):

- per-class α: α_c = α·clip(acc_T(c)/acc_T, 0, 1) from the teacher's accuracy on held-out
  data (computed by the study, `xsens.studies.distillation.class_alpha`, passed here as the
  list `per_class_alpha`);
- per-class margin: the one-hot term becomes CE(softmax(f − m_y·e_y), y). Sign convention
  (ours): m_y ≥ 0 is SUBTRACTED from the true-class logit, so the loss stays large until the
  student's true-class logit beats every other logit by more than m_y (an LDAM-style
  margin, Cao et al. 2019, arXiv 1906.07413): a larger m_y puts more weight on the label of
  class y. The study sets m_y larger where the teacher's held-out margin on class y is small
  (`xsens.studies.distillation.class_margin`). A negative m_y would relax the label.

Teacher logits come from one of two places:
- `teacher_mode = "precomputed"` (default): the teacher (a finished xsens run in
  `teacher_workdir`) predicts the whole train split once, in eval mode, before training;
  each batch then carries `batch["teacher_logits"]` indexed like its images. Or
  `teacher_logits` names a `.npy` file [N_train, K] aligned with the train split as
  `xsens.data.pipeline.load_split` orders it (e.g. from another framework);
- `teacher_mode = "in_step"`: the teacher's variables are an argument of the jitted step and
  its logits are computed there on the same (possibly augmented) images, in eval mode
  under `stop_gradient`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import logging
import math
import os
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from xsens import choices
from xsens import models as models_lib
from xsens import paths
from xsens.errors import ConfigError
from xsens.train import evaluators

FIELDS = ("alpha", "temperature", "teacher_workdir", "teacher_logits", "teacher_mode",
          "per_class_alpha", "margin")
TEACHER_MODES = choices.TEACHER_MODES
# Data fields that must agree between teacher and student: the same dataset and label ids
# (logit k must mean the student's class k), and inputs scaled as in the teacher's training.
_MATCHING_DATA_FIELDS = ("name", "classes", "normalize", "image_size")


@dataclasses.dataclass(frozen=True)
class DistillSpec:
  """What the jitted step needs (hashable, closed over by `make_train_step`).

  `teacher_model` is set only in the in-step mode; its variables are then passed to the
  step as its fourth argument.
  """
  alpha: float
  temperature: float
  class_alpha: tuple[float, ...] | None = None
  margin: tuple[float, ...] | None = None
  teacher_model: nn.Module | None = None


@dataclasses.dataclass
class DistillSetup:
  """A validated `config.distill`: the step's spec and where the teacher comes from.

  `teacher_model` is the module of the run in `teacher_workdir` (None without one, or when
  validated with `check_teacher=False`).
  """
  spec: DistillSpec
  mode: str
  teacher_workdir: str | None
  teacher_logits_path: str | None
  teacher_model: nn.Module | None = None


# ----------------------------------------------------------------------------- the loss


def kd_term(student_logits: jax.Array, teacher_logits: jax.Array, temperature: float
            ) -> jax.Array:
  """τ²·KL(p_t^τ ‖ p_s^τ) per example. [B, K], [B, K] -> [B]. No gradient to the teacher."""
  t = jax.lax.stop_gradient(teacher_logits.astype(jnp.float32)) / temperature
  s = student_logits.astype(jnp.float32) / temperature
  log_pt, log_ps = jax.nn.log_softmax(t, -1), jax.nn.log_softmax(s, -1)
  kl = jnp.sum(jnp.exp(log_pt) * (log_pt - log_ps), -1)
  return temperature ** 2 * kl


def margin_logits(logits: jax.Array, labels: jax.Array, margin: jax.Array) -> jax.Array:
  """f − m_y·e_y: subtracts the per-class margin m [K] from each true-class logit. [B, K]."""
  return logits - margin[labels][:, None] * jax.nn.one_hot(labels, logits.shape[-1],
                                                           dtype=logits.dtype)


def distill_loss(student_logits: jax.Array, teacher_logits: jax.Array, labels: jax.Array,
                 base_loss: Callable, spec: DistillSpec) -> jax.Array:
  """(1 − α_y)·base_loss(f − m_y·e_y, y) + α_y·τ²·KL(p_t^τ ‖ p_s^τ). Returns [B]."""
  one_hot_logits = student_logits
  if spec.margin is not None:
    one_hot_logits = margin_logits(student_logits, labels, jnp.asarray(spec.margin,
                                                                       jnp.float32))
  if spec.class_alpha is not None:
    alpha = jnp.asarray(spec.class_alpha, jnp.float32)[labels]
  else:
    alpha = jnp.full(labels.shape, spec.alpha, jnp.float32)
  ce = base_loss(one_hot_logits, labels)
  return (1.0 - alpha) * ce + alpha * kd_term(student_logits, teacher_logits,
                                              spec.temperature)


# ----------------------------------------------------------------------------- validation


def _is_real(v) -> bool:
  return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) \
      and math.isfinite(float(v))


def _per_class(values, field: str, num_classes: int, low: float | None, high: float | None
               ) -> tuple[float, ...] | None:
  if values is None:
    return None
  allowed = (f"None or a list of {num_classes} numbers"
             + (f" in [{low}, {high}]" if low is not None else " (finite)"))
  if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
    raise ConfigError(f"distill.{field}", f"must be {allowed}, got {values!r}")
  values = list(values)
  if len(values) != num_classes or not all(_is_real(v) for v in values):
    raise ConfigError(f"distill.{field}", f"must be {allowed} (one per class), got {values!r}")
  if low is not None and not all(low <= v <= high for v in values):
    raise ConfigError(f"distill.{field}", f"must be {allowed}, got {values!r}")
  return tuple(float(v) for v in values)


def validate_distill_config(dc, num_classes: int, image_shape, data_config, num_train: int,
                            *, check_teacher: bool = True) -> DistillSetup:
  """Checks `config.distill` (no compile, no write) and returns the setup.

  `check_teacher=False` skips the checks of the teacher's files (a study validates its
  students before it has trained their teacher).
  """
  unknown = [k for k in dc.keys() if k not in FIELDS]
  if unknown:
    raise ConfigError(f"distill.{unknown[0]}", f"unknown field; allowed: {', '.join(FIELDS)}")
  get = lambda k, d=None: dc[k] if k in dc else d
  alpha, temperature = get("alpha", 0.5), get("temperature", 1.0)
  if not _is_real(alpha) or not 0 <= alpha <= 1:
    raise ConfigError("distill.alpha", f"must be in [0, 1], got {alpha!r}")
  if not _is_real(temperature) or temperature <= 0:
    raise ConfigError("distill.temperature", f"must be > 0, got {temperature!r}")
  mode = get("teacher_mode", "precomputed")
  if mode not in TEACHER_MODES:
    raise ConfigError("distill.teacher_mode", f"got {mode!r}; allowed: "
                      f"{', '.join(TEACHER_MODES)}")
  class_alpha = _per_class(get("per_class_alpha"), "per_class_alpha", num_classes, 0.0, 1.0)
  margin = _per_class(get("margin"), "margin", num_classes, None, None)
  workdir, logits_path = get("teacher_workdir"), get("teacher_logits")
  if workdir is not None and logits_path is not None:
    raise ConfigError("distill.teacher_logits", "set at most one of distill.teacher_workdir "
                      "and distill.teacher_logits")
  if mode == "in_step" and workdir is None:
    raise ConfigError("distill.teacher_workdir", "teacher_mode='in_step' needs a teacher "
                      "run directory (a finished xsens run)")
  uses_teacher = alpha > 0 if class_alpha is None else any(a > 0 for a in class_alpha)
  if uses_teacher and workdir is None and logits_path is None and check_teacher:
    raise ConfigError("distill.teacher_workdir", "distillation with alpha > 0 needs a "
                      "teacher: set distill.teacher_workdir (a finished xsens run) or "
                      "distill.teacher_logits (a .npy file [N_train, K])")
  teacher_model = None
  if check_teacher and workdir is not None:
    teacher_model = build_teacher(workdir, num_classes, image_shape, data_config)
  if check_teacher and logits_path is not None:
    _check_logits_file(logits_path, num_train, num_classes)
  spec = DistillSpec(float(alpha), float(temperature), class_alpha, margin,
                     teacher_model if mode == "in_step" else None)
  return DistillSetup(spec, mode, workdir, logits_path, teacher_model)


def _check_logits_file(path: str, num_train: int, num_classes: int) -> None:
  if not paths.isfile(path):
    raise ConfigError("distill.teacher_logits", f"no file at {path!r} (a .npy array "
                      f"[{num_train}, {num_classes}])")
  try:
    arr = _load_npy(path, mmap_mode="r")
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError("distill.teacher_logits", f"cannot read {path!r} as .npy: {e}") from e
  if arr.shape != (num_train, num_classes) or not np.issubdtype(arr.dtype, np.floating):
    raise ConfigError("distill.teacher_logits", f"{path!r} holds {arr.dtype}{list(arr.shape)}"
                      f"; need float [{num_train}, {num_classes}] (the train split)")


def _load_npy(path: str, **kwargs) -> np.ndarray:
  """`np.load` of a .npy file, local (memory-mapped if asked) or remote (read whole)."""
  if paths.is_remote(path):
    return np.load(io.BytesIO(paths.read_bytes(path)), allow_pickle=False)
  return np.load(path, **kwargs)


# ----------------------------------------------------------------------------- the teacher


TEACHER_FLAG = "distill.teacher_workdir"


def _run_config(workdir: str, flag: str) -> dict:
  from xsens.train import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, workdir_lib.CONFIG_FILE)
  if not paths.isdir(workdir) or not paths.isfile(path):
    raise ConfigError(flag, f"{workdir!r} is not an xsens run directory (no "
                      f"{workdir_lib.CONFIG_FILE}); train that run first")
  if workdir_lib.Workdir(workdir).latest_step() is None:
    raise ConfigError(flag, f"{workdir!r} holds no checkpoint; train that run first")
  return json.loads(paths.read_text(path))


def build_teacher(workdir: str, num_classes: int, image_shape, data_config,
                  flag: str = TEACHER_FLAG) -> nn.Module:
  """The module of the finished run in `workdir` (a teacher, or a peer for an evaluator),
  checked against this run's data.

  Reads config.json only (and the checkpoint's metadata). Raises ConfigError naming `flag`.
  """
  saved = _run_config(workdir, flag)
  model_cfg = dict(saved.get("model") or {})
  name = model_cfg.pop("name", None)
  for field in _MATCHING_DATA_FIELDS:
    t_val, s_val = (saved.get("data") or {}).get(field), data_config.get(field)
    if (list(t_val) if isinstance(t_val, (list, tuple)) else t_val) != (
        list(s_val) if isinstance(s_val, (list, tuple)) else s_val):
      raise ConfigError(flag, f"the run in {workdir!r} was trained with data.{field}="
                        f"{t_val!r}, this run uses {s_val!r}; they must agree")
  try:
    model = models_lib.get_model(name, num_classes, tuple(image_shape), **model_cfg)
  except ConfigError as e:
    raise ConfigError(flag, f"the model of the run in {workdir!r} does not fit this run's "
                      f"data ({num_classes} classes, inputs {tuple(image_shape)}): {e}"
                      ) from None
  _restore_target(workdir, model, image_shape, flag)  # Shapes checked against the checkpoint.
  return model


def _checkpoint_path(workdir: str) -> str:
  from xsens.train import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  wd = workdir_lib.Workdir(workdir)
  return os.path.join(paths.absolute(wd.checkpoint_dir()), str(wd.latest_step()), "default")


@contextlib.contextmanager
def _quiet_orbax():
  """Orbax warns that the step-level metadata file is missing when a checkpointer opens one
  item of a CheckpointManager's step directory (its layout); the item itself is complete."""
  logger = logging.getLogger("absl")
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


def _restore_target(workdir: str, model: nn.Module, image_shape, flag: str = TEACHER_FLAG
                    ) -> dict:
  """The saved train state's abstract tree, after checking its params / batch_stats shapes
  against `model` on `image_shape` (reads checkpoint metadata only)."""
  # Token ids [L] for the text models, float images [H, W, C] otherwise.
  dtype = jnp.int32 if len(image_shape) == 1 else jnp.float32
  dummy = jnp.zeros((1, *image_shape), dtype)
  abstract = jax.eval_shape(lambda k: model.init({"params": k, "dropout": k}, dummy,
                                                 train=False), jax.random.key(0))
  with _quiet_orbax(), ocp.StandardCheckpointer() as checkpointer:
    meta = checkpointer.metadata(_checkpoint_path(workdir))
  tree = getattr(meta, "item_metadata", meta)
  tree = getattr(tree, "tree", tree)
  shapes = lambda t: jax.tree.map(lambda a: tuple(a.shape), t)
  for item in ("params", "batch_stats"):
    want = shapes(abstract.get(item, {}))
    have = shapes(tree.get(item) or {}) if item in tree else {}
    if want != have:
      raise ConfigError(flag, f"the checkpoint in {workdir!r} does not match the model "
                        f"built for this run's data ({item} differ: different classes or "
                        "input shape?)")
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), dict(tree))


def load_teacher_variables(workdir: str, model: nn.Module, image_shape,
                           flag: str = TEACHER_FLAG) -> dict:
  """{"params", "batch_stats"?} of the latest checkpoint in `workdir` (a teacher or peer)."""
  target = _restore_target(workdir, model, image_shape, flag)
  with _quiet_orbax(), ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(_checkpoint_path(workdir), target)
  variables = {"params": restored["params"]}
  if restored.get("batch_stats"):
    variables["batch_stats"] = restored["batch_stats"]
  return variables


@functools.lru_cache(maxsize=64)  # Jitted functions per model, bounded.
def _logits_fn(model: nn.Module):
  """`fn(batch, variables) -> eval-mode logits [B, K] float32 of batch["image"]`, one per
  model (modules hash by value), so `over_split` compiles it once per batch shape."""
  return lambda batch, variables: model.apply(variables, batch["image"],
                                              train=False).astype(jnp.float32)


def predict_logits(model: nn.Module, variables: dict, images: np.ndarray,
                   batch_size: int = 500) -> np.ndarray:
  """Eval-mode logits of `images` [N, H, W, C] -> host [N, K] float32, over batches of
  min(batch_size, N) examples (`evaluators.over_split`, reduce "concat")."""
  return evaluators.over_split(_logits_fn(model), {"image": images}, args=(variables,),
                               reduce="concat", batch_size=min(batch_size, len(images)))


def prepare(setup: DistillSetup, train_images: np.ndarray, num_classes: int
            ) -> tuple[Any, np.ndarray | None]:
  """(teacher variables for the in-step mode or None, precomputed train logits or None).

  Without a teacher (every α is 0) the KL term gets zero logits and weight 0.
  """
  if setup.teacher_logits_path is not None:
    return None, np.asarray(_load_npy(setup.teacher_logits_path), np.float32)
  if setup.teacher_model is None:
    if setup.teacher_workdir is not None:  # Never distil silently from a uniform teacher.
      raise ValueError("the teacher in distill.teacher_workdir was not loaded: build the "
                       "experiment with check_teacher=True before training it")
    return None, np.zeros((len(train_images), num_classes), np.float32)
  variables = load_teacher_variables(setup.teacher_workdir, setup.teacher_model,
                                     train_images.shape[1:])
  if setup.mode == "in_step":
    return variables, None
  return None, predict_logits(setup.teacher_model, variables, train_images)
