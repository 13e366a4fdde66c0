"""Config errors name the field's full path, and bad values are refused before any compile.

Every study validates its sub-configs (`config.train`, a run merged from `train` and
`runs.<name>`, a churn method, the distillation teacher / student) with code that names
fields relative to them; `studies.run` must re-raise those errors naming the path the user
sets on the command line (`--config.<path>`). Nothing here trains or compiles: each case
must fail while the workdir does not exist yet.
"""

import importlib

import ml_collections
import pytest

from tests.helpers import run_cli
from xsens import studies
from xsens.errors import ConfigError, prefixed, require_finite
from xsens.lab import multirun
from xsens.train import interventions

NAN, INF = float("nan"), float("inf")


def _config(name: str, arg: str = "smoke"):
  return importlib.import_module(f"mlcollections_configs.{name}").get_config(arg)


def _set(config, path: str, value) -> None:
  *parents, last = path.split(".")
  node = config
  for part in parents:
    node = node[part]
  with node.unlocked():
    node[last] = value


def _get(config, path: str):
  for part in path.split("."):
    config = config[part]
  return config


def _refused(config, tmp_path) -> ConfigError:
  """The ConfigError of `studies.run`, checking the workdir was never created."""
  workdir = tmp_path / "wd"
  with pytest.raises(ConfigError) as e:
    studies.run(config, str(workdir))
  assert not workdir.exists()
  return e.value


# ----------------------------------------------------------------------------- helpers


def test_prefixed_names_the_full_path_and_keeps_the_message():
  with pytest.raises(ConfigError) as e:
    with prefixed("train"):
      raise ConfigError("model.patch_size", "5 must divide the image size 28")
  assert (e.value.field, e.value.message) == ("train.model.patch_size",
                                             "5 must divide the image size 28")
  assert str(e.value) == "config.train.model.patch_size: 5 must divide the image size 28"
  with pytest.raises(ConfigError) as e:
    with prefixed(lambda f: f"churn.methods.m.{f}", " (run m_base)"):
      raise ConfigError("objective.penalty.weight", "must be >= 0")
  assert (str(e.value)
          == "config.churn.methods.m.objective.penalty.weight: must be >= 0 (run m_base)")


def test_prefixed_leaves_workdir_errors_and_other_errors_alone():
  with pytest.raises(ConfigError) as e:
    with prefixed("train"):
      raise ConfigError("workdir", "holds a checkpoint written by a different config")
  assert e.value.field == "workdir"
  with pytest.raises(ValueError, match="^plain$"):
    with prefixed("train"):
      raise ValueError("plain")


@pytest.mark.parametrize("field, expected", [
    ("model.patch_size", True),          # The run's model names a model: replaced whole.
    ("model.anything", True),
    ("augment.gaussian_std", True),      # Set by the run.
    ("augment.gaussian_prob", False),    # Merged: the base's value.
    ("batch_size", False),
    ("evals.test.split", True),          # The base has no evals block: the run's whole.
])
def test_overrides_field_follows_run_config_merging(field, expected):
  base = {"model": {"name": "vit", "patch_size": 4}, "batch_size": 8, "evals": None,
          "augment": {"gaussian_std": 0.0, "gaussian_prob": 1.0}}
  overrides = {"model": {"name": "cnn"}, "augment": {"gaussian_std": 0.5},
               "evals": {"test": {"kind": "classification"}}}
  assert multirun.overrides_field(base, overrides, field) is expected


def test_overrides_field_merged_model_block_without_a_name():
  base = {"model": {"name": "vit", "patch_size": 4, "width": 8}}
  assert multirun.overrides_field(base, {"model": {"width": 16}}, "model.width")
  assert not multirun.overrides_field(base, {"model": {"width": 16}}, "model.patch_size")


# ----------------------------------------------------- item 1: full paths, every study

# (config, variant, field set, value, the full path the error must name, message part).
NESTED_CASES = [
    ("train", "smoke", "train.model.patch_size", 5, "train.model.patch_size",
     "5 must divide the image size 28"),
    ("compare_vision", "smoke", "train.augment.gaussian_std", -1.0,
     "train.augment.gaussian_std", "must be >= 0"),
    ("compare_vision", "smoke", "runs.vit.model.patch_size", 5, "runs.vit.model.patch_size",
     "5 must divide"),
    ("sensitivity_vision", "smoke", "train.augment.gaussian_std", -1.0,
     "train.augment.gaussian_std", "must be >= 0"),
    ("sensitivity_vision", "setup=imagenet,smoke", "imagenet.seed", 0,
     "runs.convnext_t.pretrained.path", "must be set to a local convnext checkpoint"),
    ("sensitivity_regularization", "smoke", "runs.vit_gaussian_aug.augment.gaussian_std", -1.0,
     "runs.vit_gaussian_aug.augment.gaussian_std", "must be >= 0"),
    ("sensitivity_regularization", "smoke", "runs.vit_sensitivity_reg.objective.penalty.weight",
     -2.0, "runs.vit_sensitivity_reg.objective.penalty.weight",
     "must be a finite number >= 0, got -2.0"),
    ("robustness", "smoke", "train.augment.gaussian_prob", 2.0, "train.augment.gaussian_prob",
     "must be in [0, 1]"),
    ("reuse", "smoke", "train.augment.gaussian_std", -1.0, "train.augment.gaussian_std",
     "must be >= 0"),
    ("distillation", "smoke", "students.cnn.model.features", [0], "students.cnn.model.features",
     "positive ints"),
    ("distillation", "smoke", "teacher.total_steps", 0, "teacher.total_steps", "must be > 0"),
    ("distillation", "smoke", "train.augment.gaussian_std", -1.0, "train.augment.gaussian_std",
     "must be >= 0"),
    ("churn", "smoke", "churn.methods.codistill.codistill.beta", -1.0,
     "churn.methods.codistill.codistill.beta", "must be a finite number >= 0"),
    ("churn", "smoke", "churn.methods.min_entropy.objective.penalty.weight", -1.0,
     "churn.methods.min_entropy.objective.penalty.weight", "must be a finite number >= 0"),
    ("churn", "smoke", "train.model.features", [0], "train.model.features", "positive ints"),
    ("sensitivity_language", "smoke", "train.data.max_length", 4, "train.data.max_length",
     "4 cannot hold"),
    ("benign_overfitting", "smoke", "data.sigma_p", -1.0, "data.sigma_p", "must be > 0"),
    ("grokking", "smoke", "optimizer.learning_rate", -1.0, "optimizer.learning_rate",
     "must be > 0"),
    ("synthetic_sensitivity", "smoke", "sparse.num_draws", 0, "sparse.num_draws",
     "must be a positive int"),
    ("label_shift", "smoke", "runs.dro.objective.task.radius", -1.0,
     "runs.dro.objective.task.radius", "must be a finite number >= 0"),
    ("modify_memories", "smoke", "edit.linf_deltas", (1e-3, -1.0), "edit.linf_deltas",
     "δ >= 0"),
    ("attention_eigen", "smoke", "eigen.key_counts", (4, 18), "eigen.key_counts",
     "exceeds the T=17 tokens"),
    ("attention_eigen", "setup=imagenet,smoke", "eigen.seed", 0,
     "runs.vit_b16.pretrained.path", "must be set"),
    ("position_encoding", "smoke", "runs.match_diet_abs.model.position", "alibi",
     "runs.match_diet_abs.model.position", "unknown position encoding"),
    ("verification", "smoke", "verification.epsilons", (-0.1,), "verification.epsilons",
     "finite number >= 0"),
]


def test_every_study_has_a_nested_field_case():
  assert {_config(c, v).study for c, v, *_ in NESTED_CASES} == set(studies.STUDIES)


@pytest.mark.parametrize("name, variant, path, value, field, message", NESTED_CASES)
def test_bad_nested_field_names_its_full_path(tmp_path, name, variant, path, value, field,
                                              message):
  config = _config(name, variant)
  _set(config, path, value)
  err = _refused(config, tmp_path)
  assert err.field == field
  assert message in err.message


def test_shared_train_field_names_the_run_that_refused_it(tmp_path):
  config = _config("compare_vision")
  _set(config, "train.augment.gaussian_std", -1.0)
  first = next(iter(config.runs))
  assert _refused(config, tmp_path).message.endswith(f" (run {first})")


def test_derived_run_fields_name_the_block_the_user_sets(tmp_path):
  """Distillation students and churn runs are derived; no `runs.<name>` exists to set."""
  config = _config("distillation")
  _set(config, "distillation.seeds", [0, 1])
  _set(config, "students.cnn.model.dense_dim", 0)
  err = _refused(config, tmp_path)
  assert err.field == "students.cnn.model.dense_dim"
  assert err.message.endswith("(run select_cnn_a0p5_t4)")


def test_robustness_imagenet_setup_names_its_blocks(tmp_path):
  config = _config("robustness", "imagenet,smoke")
  for name in config.runs:
    path = tmp_path / f"{name}.npz"
    path.write_bytes(b"")
    _set(config, f"runs.{name}.pretrained.path", str(path))
  _set(config, "imagenet.image_size", 0)
  assert _refused(config, tmp_path).field == "imagenet.image_size"


@pytest.mark.parametrize("name", ["train", "compare_vision"])
def test_error_while_a_run_starts_names_the_full_path(tmp_path, monkeypatch, name):
  """A field refused after validation (e.g. a checkpoint that does not fit the model, found
  when it is loaded) is named by its full path too; workdir errors keep their name."""
  from xsens.train import trainer  # pylint: disable=g-import-not-at-top

  def refuse(exp, *args, **kwargs):
    raise ConfigError("pretrained.path", "'w.npz' does not fit the model")
  monkeypatch.setattr(trainer, "run_experiment", refuse)
  with pytest.raises(ConfigError) as e:
    studies.run(_config(name), str(tmp_path / "wd"))
  first = "" if name == "train" else next(iter(_config(name).runs))
  assert e.value.field == "train.pretrained.path"
  assert e.value.message == "'w.npz' does not fit the model" + (
      f" (run {first})" if first else "")


# ------------------------------------------- item 2: fields that were not validated


@pytest.mark.parametrize("field, value, message", [
    ("sigma", -0.1, "must be a finite σ >= 0, got -0.1"),
    ("num_draws", 0, "must be an int > 0, got 0"),
    ("num_pixels", 0, "must be an int > 0 (positions drawn with replacement per mask), got 0"),
])
def test_scattered_settings_are_refused_before_training(tmp_path, field, value, message):
  config = _config("sensitivity_vision")
  _set(config, f"sensitivity.scattered.{field}", value)
  err = _refused(config, tmp_path)
  assert (err.field, err.message) == (f"sensitivity.scattered.{field}", message)


@pytest.mark.parametrize("name, field", [
    ("sensitivity_vision", "sensitivity.patch_size"),
    ("sensitivity_regularization", "sensitivity.patch_size"),
    ("robustness", "robustness.patch_size"),
])
def test_measured_patches_must_be_the_vit_tokens(tmp_path, name, field):
  config = _config(name)
  assert config.runs.vit.model.patch_size == 7
  _set(config, field, 4)  # Divides 28, but is not the ViT's patch size.
  err = _refused(config, tmp_path)
  assert str(err) == (f"config.{field}: 4 differs from the patch size of the ViT of run 'vit' "
                      "(runs.vit.model.patch_size=7); the measured patches must be the ViT's "
                      "tokens: use 7")


@pytest.mark.parametrize("path, value, message", [
    ("robustness.adversarial.norm", "l3", "got 'l3'; allowed: linf, l2"),
    ("robustness.adversarial.pgd_steps", 0, "must be an int > 0, got 0"),
    ("robustness.perturbations.num_draws", 0, "must be an int > 0, got 0"),
    ("robustness.perturbations.relative_scale", -1.0, "must be a finite number >= 0, got -1.0"),
    ("robustness.representations.num_examples", 0, "must be an int > 0, got 0"),
])
def test_robustness_measure_settings_are_refused_before_training(tmp_path, path, value,
                                                                 message):
  config = _config("robustness")
  _set(config, path, value)
  err = _refused(config, tmp_path)
  assert (err.field, err.message) == (path, message)


@pytest.mark.parametrize("field, value", [
    ("augment.gaussian_std", NAN), ("augment.gaussian_std", INF),
    ("augment.gaussian_prob", NAN)])
def test_interventions_refuse_non_finite_values(field, value):
  """Also without `studies.run` (the trainer called from Python)."""
  config = ml_collections.ConfigDict({"augment": {"gaussian_std": 0.0, "gaussian_prob": 1.0}})
  _set(config, field, value)
  with pytest.raises(ConfigError) as e:
    interventions.validate_augment_config(config)
  assert e.value.field == field
  assert repr(value) in e.value.message


# ------------------------------------------------ item 3: NaN / inf anywhere is refused

CONFIGS = ["train", "compare_vision", "sensitivity_vision", "robustness",
           "sensitivity_regularization", "benign_overfitting", "reuse", "distillation", "churn",
           "sensitivity_language", "grokking", "synthetic_sensitivity"]


def _float_leaves(node, path=""):
  """Dotted paths of the float fields and of the lists holding a float, in `node`."""
  for key, value in node.items():
    full = f"{path}.{key}" if path else key
    if isinstance(value, ml_collections.ConfigDict):
      yield from _float_leaves(value, full)
    elif isinstance(value, float) or (
        isinstance(value, (list, tuple)) and any(isinstance(v, float) for v in value)):
      yield full


def test_no_config_holds_a_non_finite_value():
  for name in CONFIGS:
    for variant in ("smoke", None):
      require_finite(_config(name, variant))


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_non_finite_value_anywhere_is_refused_with_its_path(tmp_path, name, bad):
  config = _config(name)
  paths = list(_float_leaves(config))
  assert paths
  for path in paths:
    config = _config(name)
    node = _get(config, path)
    is_list = isinstance(node, (list, tuple))
    value = type(node)([bad]) if is_list else bad
    _set(config, path, value)
    with pytest.raises(ConfigError) as e:
      studies.run(config, str(tmp_path / "wd"))
    # The first path holding it (configs may alias a block, e.g. one model in several runs).
    holding = [p for p in _float_leaves(config) if repr(_get(config, p)) == repr(value)]
    assert path in holding
    assert e.value.field == holding[0]
    assert e.value.message == (f"must hold finite numbers, got {value!r}" if is_list
                               else f"must be a finite number, got {bad!r}")
  assert not (tmp_path / "wd").exists()


def test_require_finite_walks_lists_and_dicts():
  require_finite({"a": [1.0, [2, 3.5]], "b": {"c": None, "d": "nan"}})
  with pytest.raises(ConfigError, match=r"^config.a: must hold finite numbers, got \[1.0, "
                                        r"\[2, nan\]\]$"):
    require_finite({"a": [1.0, [2, NAN]]})
  with pytest.raises(ConfigError, match=r"^config.b.c: must be a finite number, got inf$"):
    require_finite(ml_collections.ConfigDict({"b": {"c": INF}}))
  require_finite({"b": {"c": INF}}, allow=("b.c",))


@pytest.mark.slow
def test_cli_refuses_nan_with_exit_code_2_before_anything_is_written(tmp_path):
  workdir = tmp_path / "wd"
  proc = run_cli("--config=mlcollections_configs/sensitivity_vision.py:smoke",
                 "--config.sensitivity.scattered.sigma=nan", f"--workdir={workdir}")
  assert proc.returncode == 2, proc.stderr
  assert "sensitivity.scattered.sigma: must be a finite number, got nan" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert not workdir.exists()
