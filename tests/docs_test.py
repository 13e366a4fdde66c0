"""README.md and the docs/ pages it links: short, runnable as written, true to the repository.

The README stays a five-minute read (at most `MAX_README_LINES` lines); its quick-start
command (2) is what `.ci/run` runs; every link, repository path, `xsens.*` name and
`pip install -e ".[EXTRA]"` it or a user docs page states exists; and every `.md` file cited
by `xsens --help` or a config docstring is in the repository.
"""

import ast
import importlib
import os
import re

import pytest

from tests.helpers import REPO
from xsens import main
from xsens.train import study_record

MAX_README_LINES = 200
# The pages the README sends a user to for what it leaves out (docs/results.md and
# docs/benchmarks.md are records of measurements; docs/architecture.md is for developers).
USER_DOCS = ("README.md", "docs/configs.md", "docs/usage.md", "docs/faults.md",
             "docs/launch.md", "docs/remote_workdirs.md")
BADGES = re.compile(r"<!-- colab-badges:.*?<!-- /colab-badges -->", re.S)


def _read(rel: str) -> str:
  with open(os.path.join(REPO, rel), encoding="utf-8") as f:
    return f.read()


def _prose(rel: str) -> str:
  """The page without the generated badge table (its URLs come from
  `experiments/execute_notebooks.py`, whose tests check them)."""
  return BADGES.sub("", _read(rel))


def _slug(heading: str) -> str:
  """GitHub's anchor of a markdown heading."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def _anchors(rel: str) -> set[str]:
  return {_slug(h) for h in re.findall(r"^#+ (.*)$", _read(rel), re.M)}


def test_readme_is_short():
  n = len(_read("README.md").splitlines())
  assert n <= MAX_README_LINES, f"README.md has {n} lines; move detail to docs/"


def test_quick_start_command_2_is_what_ci_runs():
  section = _read("README.md").split("## Quick start", 1)[1].split("\n## ", 1)[0]
  block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
  commands = [l for l in block.splitlines() if l.strip() and not l.startswith("#")]
  assert commands == [
      "pip install -e . && xsens --config=mlcollections_configs/sensitivity_vision.py "
      "--workdir=workdirs/sensitivity_vision",
      'pip install -e ".[test]" && python -m pytest -q']
  ci = [l for l in _read(".ci/run").splitlines() if l.strip() and not l.startswith(("#", "set ", "cd "))]
  assert ci == [commands[1]]


@pytest.mark.parametrize("rel", USER_DOCS)
def test_links_resolve(rel):
  """Every relative link `[..](path#anchor)` names a file of the repository and a heading
  of it."""
  base = os.path.dirname(rel)
  for target in re.findall(r"\]\(([^)\s]+)\)", _prose(rel)):
    if re.match(r"[a-z]+:", target):
      continue
    path, _, anchor = target.partition("#")
    path = os.path.normpath(os.path.join(base, path)) if path else rel
    assert os.path.exists(os.path.join(REPO, path)), f"{rel}: {target}"
    if anchor:
      assert anchor in _anchors(path), f"{rel}: {target}: no heading with that anchor"


@pytest.mark.parametrize("rel", USER_DOCS)
def test_repository_paths_exist(rel):
  pattern = (r"(?<![\w/.-])((?:xsens|experiments|mlcollections_configs|tests|docs|colab)/"
             r"[\w/.*<>-]*[\w>])")
  for path in set(re.findall(pattern, _prose(rel))):
    if "*" in path or "<" in path:  # A pattern (tests/colab_*_test.py), not one file.
      continue
    assert os.path.exists(os.path.join(REPO, path)), f"{rel}: {path}"


@pytest.mark.parametrize("rel", USER_DOCS)
def test_xsens_names_exist(rel):
  """Every `xsens.a.b[.c]` in backquotes is a module, or a name of one."""
  for name in sorted(set(re.findall(r"`(xsens(?:\.\w+)+)", _prose(rel)))):
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
      try:
        obj = importlib.import_module(".".join(parts[:i]))
      except ModuleNotFoundError:
        continue
      for attr in parts[i:]:
        assert hasattr(obj, attr), f"{rel}: `{name}`: no {attr!r}"
        obj = getattr(obj, attr)
      break
    else:
      raise AssertionError(f"{rel}: `{name}` does not import")


def _extras() -> set[str]:
  tree = ast.parse(_read("setup.py"))
  for node in tree.body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXTRAS":
      return {k.value for k in node.value.keys}
  raise AssertionError("setup.py has no EXTRAS")


@pytest.mark.parametrize("rel", USER_DOCS)
def test_documented_extras_exist(rel):
  for names in re.findall(r'pip install -e "\.\[([\w,-]+)\]"', _read(rel)):
    for name in names.split(","):
      assert name in _extras(), f'{rel}: pip install -e ".[{names}]": no extra {name!r}'


def test_tensorboard_command_comes_with_its_install():
  """Each page that tells the reader to run `tensorboard --logdir` says how to install it."""
  for rel in USER_DOCS:
    text = _read(rel)
    if "tensorboard --logdir" in text:
      assert re.search(r'pip install -e "\.\[[\w,]*tensorboard[\w,]*\]"', text), rel
  assert "tensorboard" in _extras()


@pytest.mark.parametrize("rel", USER_DOCS)
def test_no_placeholder_repository(rel):
  assert "OWN" "ER" not in _prose(rel), rel  # Split: `grep -r` for it finds nothing.


def _cited_md(text: str) -> set[str]:
  return set(re.findall(r"(?<![\w/.-])([\w/.-]*\w\.md)\b", text))


def _config_docstrings() -> dict[str, str]:
  out = {}
  folder = os.path.join(REPO, "mlcollections_configs")
  for name in sorted(os.listdir(folder)):
    if name.endswith(".py"):
      with open(os.path.join(folder, name), encoding="utf-8") as f:
        out[name] = ast.get_docstring(ast.parse(f.read())) or ""
  return out


def test_md_files_cited_by_help_and_config_docstrings_exist():
  """A cited `.md` is a repository path, or a file a run writes into its workdir
  (`study_record.RESULTS_FILES`, e.g. results.md)."""
  texts = {"xsens --help": main.help_text(), **_config_docstrings()}
  cited = {(where, name) for where, text in texts.items() for name in _cited_md(text)}
  assert any(name == "docs/results.md" for _, name in cited)  # The pattern finds paths.
  for where, name in sorted(cited):
    ok = (os.path.isfile(os.path.join(REPO, name))
          or ("/" not in name and name in study_record.RESULTS_FILES))
    assert ok, f"{where} cites {name}, which is not in the repository"


def _source_texts() -> dict[str, str]:
  out = {}
  for top in ("xsens", "mlcollections_configs", "experiments", "tests"):
    for root, _, names in os.walk(os.path.join(REPO, top)):
      for name in names:
        if name.endswith(".py"):
          path = os.path.join(root, name)
          with open(path, encoding="utf-8") as f:
            out[os.path.relpath(path, REPO)] = f.read()
  return out


def _paper_sections(rel: str) -> set[str]:
  """Section labels of a docs/papers page: "2", "2.1", "A", "A.1" from its headings and
  bold item labels (`**A.1 ...**`)."""
  text = _read(rel)
  labels = set(re.findall(r"^## ([A-Z0-9]+)\.", text, re.M))
  labels |= set(re.findall(r"^\*\*([A-Z0-9]+\.\d+)\b", text, re.M))
  labels |= set(re.findall(r"^### ([0-9]+\.\d+)\b", text, re.M))
  return labels


def test_code_cites_paper_notes_in_the_repository():
  """Docstrings and comments cite what is known of a paper as `docs/papers/<page>.md §N`,
  a page and section that exist; never a bare "spec §N" or a page outside the repository."""
  cites = []
  for rel, text in _source_texts().items():
    if rel == "tests/docs_test.py":
      continue
    assert not re.search(r"\bspec:? §|(?<!docs/papers/)google_papers\.md", text), rel
    cites += [(rel, page, sec) for page, sec in
              re.findall(r"docs/papers/(\w+\.md)\s+§([A-Z0-9]+(?:\.\d+)?)", text)]
  assert len(cites) > 50  # The pattern finds the citations.
  for rel, page, sec in cites:
    sections = _paper_sections(f"docs/papers/{page}")
    assert sec in sections or sec.split(".")[0] in sections, f"{rel} cites {page} §{sec}"
