"""The command line (`xsens.main`): bad input is one line and exit code 2; every kind of
config field can be overridden through the real flag parser."""

import os
import signal
import subprocess
import sys

from absl import flags
import pytest

from tests.helpers import REPO, run_cli
from xsens import main
from xsens.errors import ConfigError

TRAIN = "--config=mlcollections_configs/train.py"
SV = "--config=mlcollections_configs/sensitivity_vision.py"


def _write(tmp_path, text: str) -> str:
  path = tmp_path / "cfg.py"
  path.write_text(text)
  return str(path)


# (args, the whole stderr line). Each fails before any study module (or JAX backend) loads.
BAD_INPUT = {
    "missing_file": (["--config=mlcollections_configs/nope.py"],
                     "--config: no such file 'mlcollections_configs/nope.py'; packaged "
                     "configs (usable by name from anywhere): " + ", ".join(
                         sorted(n for n in os.listdir(os.path.join(REPO, "mlcollections_configs"))
                                if n.endswith(".py") and not n.startswith("_")
                                and n != "common.py"))),
    "directory": (["--config=mlcollections_configs"],
                  "--config: mlcollections_configs is a directory, not a config file"),
    "no_config": ([], "--config: missing, e.g. --config=mlcollections_configs/train.py:model=vit"),
    "bad_variant_value": (
        [f"{TRAIN}:model=vitt"],
        "--config: mlcollections_configs/train.py:model=vitt: unknown model variant 'vitt'; "
        "allowed: vit, cnn, mlp, resnet18, densenet, convmixer"),
    "misspelt_field": ([TRAIN, "--config.train.batchsize=3"],
                       "--config.train.batchsize: no such field; did you mean "
                       "--config.train.batch_size?"),
    "unknown_field": ([TRAIN, "--config.unknown_field=1"],
                      "--config.unknown_field: no such field; config has: study, train"),
    "int_mismatch": ([TRAIN, "--config.train.batch_size=abc"],
                     "--config.train.batch_size: expected an int, got 'abc'"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, case):
  args, line = BAD_INPUT[case]
  workdir = tmp_path / "wd"
  proc = run_cli(*args, f"--workdir={workdir}", timeout=60)
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.splitlines() == [f"xsens: error: {line}"]
  assert not workdir.exists()


@pytest.mark.parametrize("text, message", [
    ("def get_config(:\n  pass\n", "{path}:1: "),
    ("import math\nx = undefined_name\n", "{path}:2: NameError: name 'undefined_name' is "
     "not defined"),
    ("CONFIG = 1\n", "{path} defines no get_config()"),
    ("def get_config():\n  return {'a': 1}\n", "{path}: get_config() returned a dict, not a "
     "ConfigDict"),
])
def test_config_file_that_does_not_load(tmp_path, text, message):
  path = _write(tmp_path, text)
  proc = run_cli(f"--config={path}", f"--workdir={tmp_path / 'wd'}", timeout=60)
  assert proc.returncode == 2, proc.stderr
  [line] = proc.stderr.splitlines()
  assert line.startswith("xsens: error: --config: " + message.format(path=path)), line
  assert not (tmp_path / "wd").exists()


def test_help_print_config_and_config_errors_do_not_import_jax():
  """`--help`, `--print_config` and every error found while parsing stay clear of JAX,
  flax, optax, orbax and TensorFlow (tests/config_imports_test.py: every config loads
  without them)."""
  heavy = ("jax", "flax", "optax", "orbax", "tensorflow", "tensorflow_datasets")
  code = ("import sys\nfrom xsens import main\nsys.argv = ['xsens'] + sys.argv[1:]\n"
          "try:\n  main.run()\nfinally:\n"
          f"  print(sorted(m for m in {heavy!r} if m in sys.modules))\n")
  for args, rc in ((["--help"], 0), (["--config=nope.py"], 2),
                   (["--config=mlcollections_configs"], 2),
                   ([f"{TRAIN}:smoke", "--print_config"], 0),
                   (["--config=sensitivity_language.py:smoke", "--print_config"], 0),
                   ([TRAIN, "--config.train.batchsize=3"], 2),
                   ([TRAIN, "--config.train.batch_size=None"], 2),
                   ([f"{TRAIN}:model=vitt"], 2)):
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == rc, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]", (args, proc.stdout[-500:])
  assert "--config" in subprocess.run(
      [sys.executable, "-m", "xsens", "--help"], cwd=REPO, capture_output=True, text=True,
      timeout=60, check=False).stdout


# ------------------------------------------------------------------ in-process parsing


def _parse(*args: str):
  """The config that `xsens ARGS` would run, parsed by a fresh copy of the real flags."""
  argv = ["xsens", *args]
  flag_values = flags.FlagValues()
  main.define_flags(flag_values, sys_argv=argv)
  main.parse_or_raise(argv, flag_values)
  return flag_values["config"].value


@pytest.mark.parametrize("args, path, value", [
    ([TRAIN, "--config.train.batch_size=64"], "train.batch_size", 64),                 # int
    ([TRAIN, "--config.train.optimizer.learning_rate=3e-4"],
     "train.optimizer.learning_rate", 3e-4),                                           # float
    ([TRAIN, "--config.train.progress=false"], "train.progress", False),               # bool
    ([TRAIN, "--noconfig.train.progress"], "train.progress", False),
    ([TRAIN, "--config.train.optimizer.name=sgd"], "train.optimizer.name", "sgd"),     # str
    ([SV, "--config.sensitivity.sigmas=(0.5,2.0)"], "sensitivity.sigmas", (0.5, 2.0)),
    ([f"{TRAIN}:model=mlp", "--config.train.model.hidden_dims=(64,)"],
     "train.model.hidden_dims", (64,)),                                                # tuple
    ([SV, "--config.runs.mlp_relu.model.hidden_dims=(64,32)"],
     "runs.mlp_relu.model.hidden_dims", (64, 32)),
    (["--config=mlcollections_configs/benign_overfitting.py",
      "--config.sweep.mu_norms=(1.0,2.0)"], "sweep.mu_norms", (1.0, 2.0)),
    (["--config=mlcollections_configs/benign_overfitting.py", '--config.models=("cnn",)'],
     "models", ("cnn",)),                                                 # tuple of strings
    (["--config=mlcollections_configs/robustness.py",
      '--config.robustness.corruptions.names=("fog","contrast")'],
     "robustness.corruptions.names", ("fog", "contrast")),
    ([TRAIN, "--config.train.target_train_accuracy=0.9"],
     "train.target_train_accuracy", 0.9),                                 # None default
    ([TRAIN, "--config.train.model.representation_size=32"],
     "train.model.representation_size", 32),
    ([TRAIN, "--config.train.data.data_dir=/data/tfds"], "train.data.data_dir", "/data/tfds"),
    (["--config=mlcollections_configs/grokking.py", "--config.model.init_npz=/w/init.npz"],
     "model.init_npz", "/w/init.npz"),                                   # None default, str
])
def test_override_each_kind_of_field(args, path, value):
  config = _parse(*args)
  got = config
  for part in path.split("."):
    got = got[part]
  assert got == value and type(got) is type(value)


@pytest.mark.parametrize("args, path, other", [
    # A steps-based config switched to epochs; a None-default field set back to None, in
    # both spellings, after a value (the last one wins).
    ([TRAIN, "--config.train.total_steps=None", "--config.train.total_epochs=2"],
     "train.total_steps", ("train.total_epochs", 2.0)),
    ([TRAIN, "--config.train.init_seed=3", "--config.train.init_seed=None"],
     "train.init_seed", None),
    ([TRAIN, "--config.train.target_train_accuracy", "None", "--config.train.seed=5"],
     "train.target_train_accuracy", ("train.seed", 5)),
    (["--config=mlcollections_configs/grokking.py:init_npz=/w/init.npz",
      "--config.model.init_npz=None"], "model.init_npz", None),
])
def test_none_sets_an_optional_field_to_none(args, path, other):
  config = _parse(*args)
  node = config
  for part in path.split("."):
    node = node[part]
  assert node is None
  if other:
    got = config
    for part in other[0].split("."):
      got = got[part]
    assert got == other[1]


def test_none_for_a_required_field_is_one_line():
  with pytest.raises(main.UsageError, match=r"^--config\.train\.batch_size: cannot be None "
                     r"\(a required int field"):
    _parse(TRAIN, "--config.train.batch_size=None")


def test_every_sequence_in_every_config_is_a_tuple():
  """ml_collections overrides tuples but not lists (`Type <class 'list'> ... is not
  supported for overriding`)."""
  config = _parse(SV)
  assert config.sensitivity.sigmas == (1.0, 2.0, 4.0, 8.0)
  for name in ("benign_overfitting", "churn", "distillation", "grokking", "reuse", "robustness",
               "sensitivity_language", "sensitivity_regularization", "sensitivity_vision",
               "synthetic_sensitivity", "train", "compare_vision"):
    for variant in ("", ":smoke"):
      config = _parse(f"--config=mlcollections_configs/{name}.py{variant}")
      lists = [p for p, v in _leaves(config) if isinstance(v, list)]
      assert not lists, (name, variant, lists)


def _leaves(config, prefix=""):
  for key, value in config.items():
    if hasattr(value, "items"):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield prefix + key, value


@pytest.mark.parametrize("args, message", [
    ([TRAIN, "--config.trian.batch_size=3"],
     "--config.trian.batch_size: no such field; did you mean --config.train.batch_size?"),
    ([TRAIN, "--config.train.learning_rate=3"], "--config.train.learning_rate: no such "
     "field; did you mean --config.train.optimizer.learning_rate?"),
    ([SV, "--config.batch_size=3"], "--config.batch_size: no such field; did you mean "
     "--config.train.batch_size or --config.sensitivity.batch_size?"),
    ([TRAIN, "--config.train.batch_size.x=3"], "--config.train.batch_size.x: no such field; "
     "config.train.batch_size holds a value (int), not a block of fields"),
    ([f"{TRAIN}:modle=vit"], "--config: mlcollections_configs/train.py:modle=vit: unknown "
     "config variant 'modle'; allowed: dataset, model, smoke, stream"),
    ([TRAIN, "--config.train.progress=maybe"],
     "--config.train.progress: expected true or false, got 'maybe'"),
    ([TRAIN, "--config.train.total_epochs=x"],
     "--config.train.total_epochs: expected a number, got 'x'"),
    ([SV, "--config.sensitivity.sigmas=(0.5 2.0)"], "--config.sensitivity.sigmas: expected "
     'a tuple such as "(0.5,2.0)" (strings quoted: \'("a","b")\'), got \'(0.5 2.0)\''),
    ([SV, "--config.sensitivity.sigmas=0.5 2.0"], "--config.sensitivity.sigmas: expected "
     'a tuple such as "(0.5,2.0)", got \'0.5 2.0\''),
    (["--config.train.batch_size=3"], "--config: missing (needed by "
     "--config.train.batch_size), e.g. --config=mlcollections_configs/train.py:model=vit"),
    ([TRAIN, "--wokrdir=/tmp/x"], "--wokrdir: unknown flag; did you mean --workdir?"),
    ([TRAIN, "--config.train.regularizer.name=sensitivity"],
     "--config.train.regularizer.name: regularizer: replaced by objective terms "
     "(xsens/train/objectives.py): set "
     "config.objective, e.g. {'ce': {'kind': 'cross_entropy', 'weight': 0.5}, 'penalty': "
     "{'kind': 'sensitivity', 'weight': 0.5}} (or kind 'min_entropy', weight λ, beside a "
     "cross_entropy term of weight 1)"),
    ([TRAIN, "extra"], "unexpected argument 'extra' (flags are written --name=value)"),
    (["--config=mlcollections_configs/robustness.py",
      "--config.robustness.corruptions.names=(fog,contrast)"],
     "--config.robustness.corruptions.names: expected a tuple such as \"(0.5,2.0)\" (strings "
     "quoted: '(\"a\",\"b\")'), got '(fog,contrast)'"),
])
def test_bad_input_messages(args, message):
  with pytest.raises(main.UsageError) as e:
    _parse(*args)
  assert str(e.value) == message


def test_list_field_in_a_user_config_is_named(tmp_path):
  path = _write(tmp_path, "import ml_collections\n\ndef get_config():\n"
                "  return ml_collections.ConfigDict({'sigmas': [1.0]})\n")
  with pytest.raises(main.UsageError) as e:
    _parse(f"--config={path}", "--config.sigmas=(2.0,)")
  assert str(e.value) == ("--config.sigmas: cannot be set from the command line (a list "
                          "field); the config file should hold a tuple, int, float, bool or "
                          "str there")


@pytest.mark.parametrize("field, line", [
    ("train.batch_size", "xsens: error: --config.train.batch_size: must be > 0"),
    ("workdir", "xsens: error: --workdir: must be > 0"),
])
def test_config_error_from_the_study_names_the_flag(monkeypatch, capsys, field, line):
  from xsens import studies  # pylint: disable=g-import-not-at-top

  def refuse(config, workdir, overwrite=False):
    del config, workdir, overwrite
    raise ConfigError(field, "must be > 0")

  monkeypatch.setattr(studies, "run", refuse)
  fv = flags.FlagValues()
  holders = main.define_flags(fv, sys_argv=["xsens", TRAIN])
  main.parse_or_raise(["xsens", TRAIN, "--workdir=/nonexistent/wd"], fv)
  monkeypatch.setattr(main, "_CONFIG", holders[0])
  monkeypatch.setattr(main, "_WORKDIR", holders[1])
  monkeypatch.setattr(main, "_OVERWRITE", holders[2])
  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  with pytest.raises(SystemExit) as e:
    main.main(["xsens"])
  assert e.value.code == 2
  assert capsys.readouterr().err == line + "\n"
  assert not os.path.exists("/nonexistent/wd")
  # main() puts the caller's signal handlers back.
  assert {s: signal.getsignal(s) for s in handlers} == handlers


@pytest.mark.parametrize("kind", ["regular_file", "not_creatable"])
def test_unusable_workdir_is_one_line_and_exit_code_2(tmp_path, kind):
  if kind == "regular_file":
    target = tmp_path / "f"
    target.write_text("keep me")
    line = f"--workdir: '{target}' exists and is not a directory"
  else:
    target = tmp_path / "f" / "sub"
    (tmp_path / "f").write_text("keep me")   # A parent that is a file: never creatable.
    line = f"--workdir: cannot create '{target}': "
  proc = run_cli(f"{TRAIN}:model=mlp,smoke", f"--workdir={target}", timeout=120)
  assert proc.returncode == 2, proc.stderr
  [got] = proc.stderr.splitlines()
  assert got.startswith("xsens: error: " + line), got
  assert (tmp_path / "f").read_text() == "keep me"


@pytest.mark.parametrize("spec", ["train.py:model=mlp,smoke", "train:model=mlp,smoke",
                                  "mlcollections_configs/train.py:model=mlp,smoke"])
def test_a_packaged_config_by_name_from_any_directory(tmp_path, spec):
  """Outside a checkout (here: a temporary working directory), a config given by its file
  name, its name, or its path in the repository is the packaged one."""
  env = {**os.environ, "PYTHONPATH": REPO}
  for form in ([f"--config={spec}"], ["--config", spec]):
    proc = subprocess.run([sys.executable, "-m", "xsens", *form, "--print_config"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "study: train" in proc.stdout and "name: mlp" in proc.stdout, proc.stdout[:500]
  assert main.resolve_config_path("nope.py") == "nope.py"
  assert main.resolve_config_path("elsewhere/train.py") == "elsewhere/train.py"
