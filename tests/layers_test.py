"""The layer rule: studies never import studies; the lab never imports a study.

Every module of xsens/studies/ (but the dispatcher `__init__.py`) and of xsens/lab/ is
parsed; any import of `xsens.studies` or one of its modules fails the test, wherever it
stands (inside a function too): `import xsens.studies.x`, `from xsens.studies import x`,
`from xsens.studies.x import y`, `from xsens import studies`, and relative imports.
"""

import ast
import pathlib

import pytest

from tests.helpers import REPO

STUDIES = pathlib.Path(REPO) / "xsens" / "studies"
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
