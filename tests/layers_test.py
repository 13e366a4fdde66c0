"""The layer rule (docs/architecture.md, "Layers"): each part of xsens imports only lower
layers; in particular studies never import studies and the lab never imports a study.

Every module of xsens/studies/ (but the dispatcher `__init__.py`) and of xsens/lab/ is
parsed; any import of `xsens.studies` or one of its modules fails the test, wherever it
stands (inside a function too): `import xsens.studies.x`, `from xsens.studies import x`,
`from xsens.studies.x import y`, `from xsens import studies`, and relative imports.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

from tests.helpers import REPO

ROOT = pathlib.Path(REPO)
STUDIES = ROOT / "xsens" / "studies"
LAB = pathlib.Path(REPO) / "xsens" / "lab"


def study_imports(path: pathlib.Path) -> list[str]:
  """`line: statement` of every import of `xsens.studies` (or a module of it) in `path`."""
  tree = ast.parse(path.read_text(), filename=str(path))
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level:  # Relative: within xsens/studies (or xsens/lab) it names a sibling.
        names = ["." * node.level + (node.module or "")]
      elif node.module == "xsens":
        names = [f"xsens.{a.name}" for a in node.names]
      else:
        names = [node.module or ""]
    else:
      continue
    for name in names:
      if name.startswith(".") or name == "xsens.studies" or name.startswith("xsens.studies."):
        found.append(f"{node.lineno}: {ast.unparse(node)}")
  return found


def _modules(folder: pathlib.Path, skip=()) -> list[pathlib.Path]:
  return sorted(p for p in folder.glob("*.py") if p.name not in skip)


@pytest.mark.parametrize("path", _modules(STUDIES, skip=("__init__.py",)),
                         ids=lambda p: p.name)
def test_studies_never_import_studies(path):
  assert not study_imports(path), (
      f"{path.relative_to(REPO)} imports a study; move what is shared to xsens/lab/: "
      + "; ".join(study_imports(path)))


@pytest.mark.parametrize("path", _modules(LAB), ids=lambda p: p.name)
def test_lab_never_imports_studies(path):
  assert not study_imports(path), (
      f"{path.relative_to(REPO)} imports a study: " + "; ".join(study_imports(path)))


def _plotting_imports(path: pathlib.Path) -> list[str]:
  tree = ast.parse(path.read_text(), filename=str(path))
  names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
  names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
  return [n for n in names if n.split(".")[0] == "matplotlib"]


@pytest.mark.parametrize("path", _modules(LAB), ids=lambda p: p.name)
def test_lab_leaves_plotting_to_report(path):
  """Figures are drawn in xsens/report; the lab computes what they show."""
  assert not _plotting_imports(path), f"{path.relative_to(REPO)} imports matplotlib"


def test_the_plotting_check_sees_matplotlib():
  assert _plotting_imports(ROOT / "xsens" / "report" / "plots.py")


def test_the_check_sees_every_spelling(tmp_path):
  """Each spelling of a study import, at module level or inside a function, is caught."""
  source = "\n".join([
      "import os",
      "from xsens.lab import multirun",
      "from xsens import measures",
      "import xsens.studies.compare",
      "from xsens.studies import compare",
      "from xsens.studies.compare import run",
      "from xsens import studies",
      "from . import reuse",
      "from .reuse import run",
      "def f():",
      "  from xsens.studies import reuse  # pylint: disable=g-import-not-at-top",
      "  import xsens.studies",
  ])
  path = tmp_path / "fake_study.py"
  path.write_text(source + "\n")
  assert [line.split(":")[0] for line in study_imports(path)] == [
      "4", "5", "6", "7", "8", "9", "11", "12"]
  assert STUDIES.is_dir() and len(_modules(STUDIES)) > 10 and len(_modules(LAB)) > 3



# Each part of the package with its layer: a module may import its own part, the base
# (layer 0) and any part of a lower layer. main and launch are the entry points above all.
LAYERS = {
    "errors": 0, "paths": 0, "config_utils": 0, "boolean_cube": 0, "choices": 0,
    "model_defaults": 0,
    "data": 1, "models": 1,
    "verify": 2,
    "measures": 3,
    "train": 4,
    "report": 5,
    "lab": 6,
    "studies": 7,
    "main": 8, "launch": 8,
    "__main__": 9,
}


def _part(module: str) -> str | None:
  """`xsens.<part>...` -> part (a subpackage or a top-level module); None otherwise."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 and parts[0] == "xsens" else None


def xsens_imports(source: str, package: str):
  """(line, part) for every import of an xsens part in `source` (a module of `package`,
  e.g. "xsens.train"), at any depth, relative imports resolved."""
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      for alias in node.names:
        if _part(alias.name):
          yield node.lineno, _part(alias.name)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        up = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
      if base == "xsens":
        for alias in node.names:
          yield node.lineno, alias.name
      elif _part(base):
        yield node.lineno, _part(base)


def layer_violations(part: str, source: str, package: str) -> list[str]:
  """`line: part (layer) imports other (layer)` for each import of `source` that breaks the
  rule."""
  wrong = []
  for line, target in xsens_imports(source, package):
    if target == part or target not in LAYERS:
      continue
    if LAYERS[target] >= LAYERS[part] and not LAYERS[target] == LAYERS[part] == 0:
      wrong.append(f"{line}: {part} (layer {LAYERS[part]}) imports {target} "
                   f"(layer {LAYERS[target]})")
  return wrong


def test_every_part_imports_only_lower_layers():
  wrong = []
  for path in sorted((ROOT / "xsens").rglob("*.py")):
    rel = path.relative_to(ROOT / "xsens").with_suffix("").parts
    if rel == ("__init__",):
      continue
    assert rel[0] in LAYERS, f"{path}: a part with no layer; add it to LAYERS and the docs"
    package = ".".join(("xsens",) + rel[:-1])
    wrong += [f"{path.relative_to(ROOT)}:{w}"
              for w in layer_violations(rel[0], path.read_text(), package)]
  assert not wrong, "\n".join(wrong)


def test_the_layer_check_sees_upward_imports():
  source = "\n".join([
      "from xsens import errors, measures",        # 1: allowed for train
      "from xsens.report import plots",           # 2: report is above train
      "import xsens.lab.multirun",                # 3: lab is above train
      "from ..studies import reuse",              # 4: relative, studies above train
      "from . import loop",                       # 5: its own part
      "def f():",
      "  from xsens import report",               # 7: inside a function
  ])
  assert [w.split(":")[0] for w in layer_violations("train", source, "xsens.train")] == [
      "2", "3", "4", "7"]
  # A study may import every part below it (a study importing a study is the rule above).
  assert layer_violations("studies", source, "xsens.studies") == []


# The config files (mlcollections_configs/) hold each study's defaults and field checks; they
# load without JAX, so they import only these xsens modules (each checked below to import
# no JAX). xsens.studies and xsens.lab (and the CLI) may import the config files.
JAX_FREE = ("xsens.errors", "xsens.config_utils", "xsens.choices", "xsens.model_defaults",
            "xsens.paths", "xsens.data", "xsens.data.config", "xsens.data.long_tail",
            "xsens.data.text", "xsens.data.text_config", "xsens.data.knowledge")
CONFIGS = ROOT / "mlcollections_configs"


def config_xsens_imports(path: pathlib.Path) -> list[str]:
  """The xsens modules `path` imports (`from xsens.data import text` names
  `xsens.data.text`; `from xsens.errors import require` names `xsens.errors`)."""
  out = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out += [a.name for a in node.names if a.name.split(".")[0] == "xsens"]
    elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "xsens":
      for a in node.names:  # A submodule (`from xsens.data import text`) or a name.
        sub = ROOT / node.module.replace(".", "/") / a.name
        is_module = sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()
        out.append(f"{node.module}.{a.name}" if is_module else node.module)
  return out


@pytest.mark.parametrize("path", _modules(CONFIGS), ids=lambda p: p.name)
def test_configs_import_only_jax_free_modules(path):
  wrong = [m for m in config_xsens_imports(path) if m not in JAX_FREE]
  assert not wrong, f"{path.relative_to(REPO)} imports {wrong}; allowed: {JAX_FREE}"


def test_the_jax_free_modules_import_no_jax():
  code = ("import sys\n" + "".join(f"import {m}\n" for m in JAX_FREE)
          + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax')))")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                       text=True, check=True, env={"PYTHONPATH": REPO, "PATH": ""})
  assert out.stdout.strip() == "[]"


def test_only_studies_lab_and_the_cli_import_config_files():
  wrong = []
  for path in sorted((ROOT / "xsens").rglob("*.py")):
    part = path.relative_to(ROOT / "xsens").parts[0]
    if part in ("studies", "lab", "main.py", "launch.py", "__main__.py"):
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      wrong += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names
                if n.split(".")[0] == "mlcollections_configs"]
  assert not wrong, wrong
