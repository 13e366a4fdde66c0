"""Command-line entry point: `xsens --config=mlcollections_configs/FILE.py[:args] --workdir=DIR`.

Also `python -m xsens`. Parses flags, then calls `xsens.studies.run(config, workdir)`;
the library below never reads flags. `--help` lists the flags and configs;
`--print_config` prints the resolved config and exits without writing anything. The CLI
logs at INFO (`xsens` loggers; other libraries only warn) unless `--verbosity` is given. Bad input (a config file that does not load, an
unknown or mistyped `--config.<field>`, a value the study refuses) exits with code 2 and
one line `xsens: error: --<flag>: <message>` before anything is written; a diverged run
exits with code 1 and keeps its last good checkpoint; a run stopped by SIGTERM / SIGINT
saves a checkpoint at its current step and exits with 143 / 130 (128 + the signal) after
one line saying so (docs/faults.md, "Preemption and resume"); a process of a multi-process run
whose peer is gone (or a wait on storage that runs out, `XSENS_WAIT_TIMEOUT_S`) exits with
75 after one line naming what it waited for (docs/launch.md).
"""

from __future__ import annotations

import ast
import difflib
import importlib.machinery
import importlib.util
import os
import re
import signal
import sys
import traceback

from absl import app, flags, logging
import ml_collections
from ml_collections import config_flags

from xsens.errors import EXIT_UNAVAILABLE, ConfigError, Unavailable
from xsens.train import legacy_fields

EXAMPLE = "--config=mlcollections_configs/train.py:model=vit"
# What `--config.<field>=VALUE` expects, per field type (ml_collections' parsers).
_EXPECTED = {int: "an int", float: "a number", bool: "true or false", str: "a string",
             tuple: 'a tuple such as "(0.5,2.0)"'}


def define_flags(flag_values: flags.FlagValues = flags.FLAGS, sys_argv: list[str] | None = None
                 ) -> tuple[flags.FlagHolder, ...]:
  """Defines --config, --workdir, --overwrite and --print_config on `flag_values`.

  `sys_argv` is the command line in which ml_collections looks for `--config.<field>`
  overrides (default: `sys.argv`); tests pass their own with a fresh `FlagValues`.
  """
  config = config_flags.DEFINE_config_file(
      "config", None, "Path to a config file, optionally with ':variant,args'.",
      flag_values=flag_values, lock_config=True, sys_argv=sys_argv)
  workdir = flags.DEFINE_string(
      "workdir", None, "Directory for checkpoints, metrics and the report "
      "(default: ./workdirs/<study>). Rerunning with it resumes.", flag_values=flag_values)
  overwrite = flags.DEFINE_bool(
      "overwrite", False, "Start again in a workdir whose checkpoints come from another "
      "config, or that holds another study's results (they are removed).",
      flag_values=flag_values)
  print_config = flags.DEFINE_bool(
      "print_config", False, "Print the resolved config (every field, with the "
      "--config.<field> overrides applied) and exit; nothing is run or written.",
      flag_values=flag_values)
  return config, workdir, overwrite, print_config


_CONFIG, _WORKDIR, _OVERWRITE, _PRINT_CONFIG = define_flags()
HELP_FLAGS = ("--help", "-help", "-h", "--helpshort", "-helpshort", "-?")
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "mlcollections_configs")


def help_text(flag_values: flags.FlagValues = flags.FLAGS, config_dir: str = CONFIG_DIR
              ) -> str:
  """What `xsens --help` prints: usage, the xsens flags, how to see a config's fields,
  logging, and the configs of `config_dir` (each with its docstring's first paragraph)."""
  def flag(name, value):
    return f"  --{name}={value}\n      {flag_values[name].help}"
  lines = [
      "Usage: xsens --config=mlcollections_configs/FILE.py[:VARIANT,...] [--workdir=DIR] "
      "[--overwrite] [--config.FIELD=VALUE ...]",
      "       (or python -m xsens ...; from any directory FILE.py or FILE names a packaged "
      "config)", "",
      "Runs the study a config names; results.md, results.json, plots, metrics.jsonl, "
      "TensorBoard events (tb/) and checkpoints go to the workdir. Rerunning the same "
      "command resumes.", "",
      "Flags:",
      flag("config", "PATH[:VARIANT,...]"),
      flag("workdir", "DIR"),
      f"  --[no]overwrite\n      {flag_values['overwrite'].help}",
      f"  --[no]print_config\n      {flag_values['print_config'].help}",
      "  --config.FIELD=VALUE\n      Override one field of the config, e.g. "
      "--config.train.total_steps=200 (a typo is refused with the closest field names); "
      "=None sets an optional field to None (e.g. --config.train.total_steps=None "
      "--config.train.total_epochs=10).",
      "  --verbosity=N\n      Log level: by default xsens logs INFO lines (training: step/total, "
      "loss, accuracy, steps/s, ETA every log_every steps; progress of long sweeps) and "
      "other libraries only warnings; -1: warnings only; 0: INFO of every library; "
      "1: debug.",
      "  --helpfull\n      Every flag, including those of absl and JAX.", "",
      "See a config's fields (and its variants' effect) without running anything:",
      f"  xsens {EXAMPLE} --print_config",
  ]
  configs = _config_summaries(config_dir)
  if configs:
    lines += ["", "Configs (mlcollections_configs/; each file's docstring gives its variants):"]
    lines += [f"  {name:<30} {summary}" for name, summary in configs]
  return "\n".join(lines) + "\n"


def _config_summaries(config_dir: str) -> list[tuple[str, str]]:
  """(file name, first docstring paragraph) of each study config in `config_dir`."""
  if not os.path.isdir(config_dir):
    return []
  out = []
  for name in sorted(os.listdir(config_dir)):
    if not name.endswith(".py") or name.startswith("_") or name == "common.py":
      continue
    try:
      with open(os.path.join(config_dir, name)) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    except (OSError, SyntaxError, ValueError):
      doc = ""
    out.append((name, " ".join(doc.strip().split("\n\n")[0].split())))
  return out


def configure_logging(verbosity_given: bool) -> None:
  """The CLI's logging: without --verbosity, the `xsens` loggers at INFO (progress lines)
  and every other library at absl's default (warnings); with it, exactly what it says."""
  import logging as std_logging  # pylint: disable=g-import-not-at-top
  if verbosity_given:
    std_logging.getLogger("xsens").setLevel(std_logging.NOTSET)
    return
  logging.set_verbosity(logging.WARNING)
  std_logging.getLogger("xsens").setLevel(std_logging.INFO)


def main(argv) -> None:
  del argv
  config = _CONFIG.value
  workdir = _WORKDIR.value or os.path.join("workdirs", str(config.get("study", "run")))
  configure_logging(flags.FLAGS["verbosity"].present)
  # Outside the loop (which saves first); the caller's handlers are back on return, so
  # calling main() from Python (tests, experiments/main.py) leaves no handler behind.
  from xsens.train import stop_signals  # pylint: disable=g-import-not-at-top
  previous = {signum: signal.signal(signum, stop_signals.stop_outside_loop)
              for signum in (signal.SIGTERM, signal.SIGINT)}
  try:
    _run_study(config, workdir)
    stop_signals.exit_if_stopped_outside_loop()   # Its SystemExit was swallowed (a gc callback).
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
    stop_signals.forget_signals_outside_loop()


def _several_processes() -> bool:
  """Whether this process is one of a multi-process run (`jax.distributed` initialised)."""
  jax = sys.modules.get("jax")
  return jax is not None and jax.distributed.is_initialized() and jax.process_count() > 1


def _end_now(code) -> None:
  """Ends a process that stops with a nonzero `code` at once when it is one of a
  multi-process run, or when another process or the storage stopped answering (75): its
  output flushed and its workdir locks released, but without the exit handlers of JAX and
  orbax, which would wait (minutes) for processes or a bucket that may be gone. Returns
  otherwise."""
  if code in (0, None) or not (_several_processes() or code == EXIT_UNAVAILABLE):
    return
  from xsens.train import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  workdir_lib.release_held_locks()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code if isinstance(code, int) else 1)  # pylint: disable=protected-access


def _run_study(config, workdir: str) -> None:
  """Runs the study of `config` in `workdir` and prints its report; every expected failure
  is one line on stderr and an exit code (2: bad input, 1: diverged, 128 + signal)."""
  # Imported here so `--help` stays fast and flags are parsed before JAX starts.
  from xsens import paths, studies  # pylint: disable=g-import-not-at-top
  from xsens.train import multihost  # pylint: disable=g-import-not-at-top
  from xsens.train import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from xsens.train import sharding  # pylint: disable=g-import-not-at-top
  from xsens.train import streams  # pylint: disable=g-import-not-at-top
  from xsens.train.loop import Preempted, TrainingDivergedError  # pylint: disable=g-import-not-at-top

  try:
    # A bad XSENS_STREAMS or XSENS_WAIT_TIMEOUT_S: one line, before anything runs.
    streams.from_environment()
    multihost.wait_timeout_s()
  except ValueError as e:
    _fail(str(e))
  try:
    paths.check_workdir(workdir)  # A bad URL or a bucket that does not answer: one line.
    # Multi-host (JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, or
    # XSENS_DISTRIBUTED=1): before anything touches a device (the lock asks the process index).
    sharding.maybe_initialize_distributed()
    with workdir_lib.locked(workdir):  # One process per workdir, before anything else.
      out = studies.run(config, workdir, overwrite=_OVERWRITE.value)
  except ConfigError as e:
    # A remote workdir refused by its probe: the storage client's threads may still run.
    _fail(f"{e.flag}: {e.message}", at_once=e.field == "workdir" and paths.is_remote(workdir))
  except TrainingDivergedError as e:
    print(f"xsens: {e}", file=sys.stderr)
    sys.exit(1)
  except Preempted as e:  # SIGTERM / SIGINT: checkpoint committed; 128 + signal number.
    print(f"xsens: {e}", file=sys.stderr)
    sys.exit(e.exit_code)
  except Unavailable as e:  # Another process is gone, or the storage stopped answering.
    print(f"xsens: error: {e}", file=sys.stderr)
    sys.exit(e.exit_code)
  except Exception as e:  # pylint: disable=broad-except
    if not (_several_processes() and multihost.is_peer_failure(e)):
      raise
    # A collective outside the loop (restore, evaluation) found another process gone.
    lost = multihost.WaitFailed("a collective with the other processes", None,
                                multihost.first_line(e))
    print(f"xsens: error: {lost}", file=sys.stderr)
    sys.exit(lost.exit_code)
  if not paths.is_writer():  # Multi-host: process 0 reports (and alone wrote the files).
    return
  if out.get("markdown"):
    print(out["markdown"])
  print(f"Results in {paths.absolute(workdir)}: results.md, results.json and plots; "
        "per-run metrics.jsonl, TensorBoard events (tb/) and checkpoints.")


class UsageError(Exception):
  """Bad command-line input; its str is the one line printed after `xsens: error: `."""


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """`app.run`'s flags parser: on bad input prints one line and exits with code 2;
  `--help` prints `help_text` and `--print_config` the resolved config, both exit 0."""
  if any(a in HELP_FLAGS for a in argv[1:argv.index("--") if "--" in argv else None]):
    sys.stdout.write(help_text(flag_values))
    sys.exit(0)
  try:
    rest = parse_or_raise(argv, flag_values)
  except UsageError as e:
    _fail(str(e))
  if "print_config" in flag_values and flag_values["print_config"].value:
    sys.stdout.write(str(flag_values["config"].value))
    sys.exit(0)
  return rest


def parse_or_raise(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """Parses `argv` into `flag_values`; raises UsageError naming the flag on bad input.

  Loads the config file itself first (so a file that does not load, a bad variant and an
  unknown `--config.<field>` are reported against the loaded config), then lets absl and
  ml_collections parse everything and translates their errors.
  """
  try:
    args = flag_values.read_flags_from_files(argv, force_gnu=False)
  except flags.Error as e:
    raise UsageError(_one_line(e)) from None
  argv = args = _resolve_config_args(args)
  spec, overrides = _scan(args)
  config = None
  if spec is not None:
    config = load_config(spec)
    for path, value in overrides.items():
      check_field(config, path)
      check_tuple(config, path, value)
      if value == NONE:
        check_nullable(config, path)
  elif overrides:
    raise UsageError(f"--config: missing (needed by --config.{next(iter(overrides))}), "
                     f"e.g. {EXAMPLE}")
  nulls = [path for path, value in overrides.items() if value == NONE]
  argv = _without_overrides(argv, nulls)
  try:
    rest = flag_values(argv)
  except flags.IllegalFlagValueError as e:
    raise UsageError(_illegal_value(e, config, overrides)) from None
  except flags.UnrecognizedFlagError as e:
    tip = difflib.get_close_matches(e.flagname, list(flag_values), n=1)
    raise UsageError(f"--{e.flagname}: unknown flag"
                     + (f"; did you mean --{tip[0]}?" if tip else "")) from None
  except (flags.Error, ValueError, TypeError, AttributeError, KeyError, OSError) as e:
    raise UsageError(_unsupported(e) or _one_line(e)) from None
  if spec is None:
    raise UsageError(f"--config: missing, e.g. {EXAMPLE}")
  if not isinstance(flag_values["config"].value, ml_collections.ConfigDict):
    raise UsageError(f"--config: {spec} did not load")  # A config that loads only once.
  if len(rest) > 1:
    raise UsageError(f"unexpected argument {rest[1]!r} (flags are written --name=value)")
  for path in nulls:
    _set_field(flag_values["config"].value, path, None)
  return rest


# `--config.FIELD=None` sets an optional field (see `check_nullable`) to None.
NONE = "None"


def check_nullable(config: ml_collections.ConfigDict, path: str) -> None:
  """UsageError unless `config.<path>` may be None: its default is None, or it is declared
  optional (a typed `ml_collections.FieldReference`, e.g. `total_steps` beside
  `total_epochs`)."""
  *parents, leaf = path.split(".")
  node = config
  for part in parents:
    node = node[part]
  if node[leaf] is None or isinstance(node._fields.get(leaf), ml_collections.FieldReference):  # pylint: disable=protected-access
    return
  raise UsageError(f"--config.{path}: cannot be None (a required "
                   f"{type(node[leaf]).__name__} field; None is allowed where the default "
                   "is None or the field is optional)")


def _set_field(config: ml_collections.ConfigDict, path: str, value) -> None:
  *parents, leaf = path.split(".")
  for part in parents:
    config = config[part]
  config[leaf] = value


def _without_overrides(args: list[str], paths: list[str]) -> list[str]:
  """`args` without the `--config.<path>=VALUE` / `--config.<path> VALUE` of `paths`."""
  out, skip = [], False
  for i, arg in enumerate(args):
    if skip:
      skip = False
      continue
    if arg == "--":
      out += args[i:]
      break
    m = re.match(r"^--?config\.([^=]+)(=.*)?$", arg, re.S)
    if m and m.group(1) in paths:
      skip = m.group(2) is None
      continue
    out.append(arg)
  return out


def resolve_config_path(path: str, config_dir: str = CONFIG_DIR) -> str:
  """`path` if it exists; else the packaged config of that name, so `train.py`,
  `train` and `mlcollections_configs/train.py` work from any working directory; else `path`."""
  if os.path.exists(path):
    return path
  head, name = os.path.split(path)
  if head not in ("", "mlcollections_configs") or not name:
    return path
  packaged = os.path.join(config_dir, name if name.endswith(".py") else name + ".py")
  return packaged if os.path.isfile(packaged) else path


def _resolve_config_args(args: list[str]) -> list[str]:
  """`args` with the PATH of every `--config=PATH[:arg]` and `--config PATH[:arg]` resolved
  by `resolve_config_path`."""
  out = list(args)
  for i, arg in enumerate(args):
    if arg == "--":
      break
    if m := re.match(r"^(--?config=)(.*)$", arg, re.S):
      prefix, spec, at = m.group(1), m.group(2), i
    elif arg in ("--config", "-config") and i + 1 < len(args):
      prefix, spec, at = "", args[i + 1], i + 1
    else:
      continue
    path, colon, variant = spec.partition(":")
    out[at] = prefix + resolve_config_path(path) + colon + variant
  return out


def _scan(args: list[str]) -> tuple[str | None, dict[str, str | None]]:
  """The last `--config` value (None if absent) and {override path: its last raw value}."""
  spec, overrides = None, {}
  for i, arg in enumerate(args[1:], 1):
    if arg == "--":
      break
    nxt = args[i + 1] if i + 1 < len(args) else None
    if m := re.match(r"^--?config(?:=(.*))?$", arg, re.S):
      spec = m.group(1) if m.group(1) is not None else (nxt or "")
    elif m := re.match(r"^--?(no)?config\.([^=]+)(?:=(.*))?$", arg, re.S):
      value = m.group(3) if m.group(3) is not None else (None if m.group(1) else nxt)
      overrides.pop(m.group(2), None)
      overrides[m.group(2)] = value
  return spec, overrides


def load_config(spec: str) -> ml_collections.ConfigDict:
  """`get_config(arg)` of `PATH[:arg]` as ml_collections loads it; UsageError if it fails."""
  path, colon, arg = spec.partition(":")
  if not path:
    raise UsageError(f"--config: no config file given, e.g. {EXAMPLE}")
  if os.path.isdir(path):
    raise UsageError(f"--config: {path} is a directory, not a config file")
  if not os.path.isfile(path):
    names = [name for name, _ in _config_summaries(CONFIG_DIR)]
    raise UsageError(f"--config: no such file {path!r}; packaged configs (usable by name "
                     f"from anywhere): {', '.join(names)}")
  loader = importlib.machinery.SourceFileLoader("xsens_cli_config", path)
  module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
  try:
    loader.exec_module(module)
  except SyntaxError as e:
    raise UsageError(f"--config: {e.filename}:{e.lineno}: {e.msg}") from None
  except Exception as e:  # pylint: disable=broad-except
    raise UsageError(f"--config: {_describe(e, path)}") from None
  if not callable(getattr(module, "get_config", None)):
    raise UsageError(f"--config: {path} defines no get_config()")
  try:
    config = module.get_config(*([arg] if colon else []))
  except ConfigError as e:
    raise UsageError(f"{e.flag}: {e.message}") from None
  except Exception as e:  # pylint: disable=broad-except
    raise UsageError(f"--config: {_describe(e, spec)}") from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise UsageError(f"--config: {spec}: get_config() returned a {type(config).__name__}, "
                     "not a ConfigDict")
  return config


def check_field(config: ml_collections.ConfigDict, path: str) -> None:
  """UsageError unless `config.<path>` exists (with a did-you-mean naming the closest)."""
  if "[" in path:  # Indexing (`a[0]`): left to ml_collections.
    return
  parts = path.split(".")
  node = config
  for i, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict):
      raise UsageError(f"--config.{path}: no such field; config.{'.'.join(parts[:i])} holds "
                       f"a value ({type(node).__name__}), not a block of fields")
    if part not in node:
      if legacy := legacy_fields.legacy_field_error(path):
        raise UsageError(f"--config.{path}: {legacy}")
      tips = _suggestions(config, parts)
      if tips:
        raise UsageError(f"--config.{path}: no such field; did you mean "
                         f"{' or '.join('--config.' + t for t in tips)}?")
      where = "config" + "".join(f".{p}" for p in parts[:i])
      raise UsageError(f"--config.{path}: no such field; {where} has: "
                       f"{', '.join(sorted(node.keys()))}")
    node = node[part]


def check_tuple(config: ml_collections.ConfigDict, path: str, value: str | None) -> None:
  """UsageError for `(a,b)` given to a tuple field with unquoted strings: ml_collections
  would silently read it as the one string `"(a,b)"`."""
  if value is None or _field_type(config, path) is not tuple or not value.strip().startswith("("):
    return
  try:
    ast.literal_eval(value)
  except (ValueError, SyntaxError):
    raise UsageError(f"--config.{path}: expected {_EXPECTED[tuple]} (strings quoted: "
                     f"'(\"a\",\"b\")'), got {value!r}") from None


def _suggestions(config: ml_collections.ConfigDict, parts: list[str]) -> list[str]:
  """Existing dotted paths close to `parts` (difflib): each part matched among its
  siblings; else up to two paths whose last part is (or is close to) the wanted one."""
  fixed, node = [], config
  for part in parts:
    keys = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
    match = [part] if part in keys else difflib.get_close_matches(part, keys, n=1)
    if not match:
      break
    fixed.append(match[0])
    node = node[match[0]]
  else:
    return [".".join(fixed)]
  paths = list(_dotted_paths(config))
  leaves = {p: p.rsplit(".", 1)[-1] for p in paths}
  same = ([p for p in paths if leaves[p] == parts[-1]]
          or [p for p in paths if difflib.get_close_matches(parts[-1], [leaves[p]])])
  return difflib.get_close_matches(".".join(parts), same, n=2, cutoff=0.0)


def _dotted_paths(config: ml_collections.ConfigDict, prefix: str = ""):
  for key in config.keys():
    yield prefix + key
    if isinstance(config[key], ml_collections.ConfigDict):
      yield from _dotted_paths(config[key], f"{prefix}{key}.")


def _illegal_value(e: flags.IllegalFlagValueError, config, overrides: dict) -> str:
  """`--config.<field>: expected <type>, got '<value>'` for a value its type cannot parse."""
  m = re.match(r"^flag --(\S+?)=", str(e))
  name = m.group(1) if m else None
  if name and name.startswith("config.") and config is not None:
    path = name[len("config."):]
    expected = _EXPECTED.get(_field_type(config, path))
    if expected:
      return f"--{name}: expected {expected}, got {overrides.get(path)!r}"
  message = str(e)[m.end():].partition(": ")[2] if m else str(e)
  return f"--{name}: {_one_line(message)}" if name else _one_line(e)


def _field_type(config: ml_collections.ConfigDict, path: str) -> type | None:
  *parents, leaf = path.split(".")
  node = config
  for part in parents:
    node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
  return node.get_type(leaf) if isinstance(node, ml_collections.ConfigDict) else None


def _unsupported(e: Exception) -> str | None:
  """The line for ml_collections' "Type ... of field ... is not supported for overriding"."""
  m = re.match(r"^Type (.+?) of field (\S+) is not supported", str(e))
  if not m:
    return None
  kind = re.sub(r"<class '(?:.*\.)?([^'.]+)'>", r"\1", m.group(1))
  return (f"--{m.group(2)}: cannot be set from the command line (a {kind} field); "
          "the config file should hold a tuple, int, float, bool or str there")


def _describe(e: Exception, where: str) -> str:
  """One line for an exception from loading a config: `where: message` for a ValueError (a
  refused variant), else `file:line: Type: message` at the innermost frame (a bug)."""
  if isinstance(e, ValueError):
    return f"{where}: {_one_line(e)}"
  frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<")]
  if frames:
    where = f"{frames[-1].filename}:{frames[-1].lineno}"
  return f"{where}: {type(e).__name__}: {_one_line(e)}"


def _one_line(message) -> str:
  return " ".join(str(message).split())


def _fail(message: str, at_once: bool = False) -> None:
  """Prints `xsens: error: <message>` and exits with 2; `at_once`: without the interpreter's
  shutdown (a storage client's threads left by a probe that timed out can abort it; nothing
  has been written yet)."""
  print(f"xsens: error: {message}", file=sys.stderr)
  if at_once:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(2)  # pylint: disable=protected-access
  sys.exit(2)


def run() -> None:
  """Console-script entry point (`xsens`, `python -m xsens`). A process of a multi-process
  run that ends with an error, and any process whose peer or storage stopped answering, ends
  at once (`_end_now`) rather than in exit handlers that wait on them."""
  try:
    app.run(main, flags_parser=parse_flags)
  except SystemExit as e:
    _end_now(e.code)
    raise
  except BaseException:  # pylint: disable=broad-except  (a bug: its traceback, then out)
    if _several_processes():
      traceback.print_exc()
      _end_now(1)
    raise


if __name__ == "__main__":
  run()
