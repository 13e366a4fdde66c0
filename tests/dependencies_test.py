"""setup.py declares what xsens/ imports: every third-party top-level module imported anywhere
under xsens/ (an AST walk) is a distribution of install_requires, or of an extra when it is
imported only inside a function (an optional feature that names the package if absent)."""

import ast
import os
import re
import sys

from tests.helpers import REPO

# Import name -> distribution name where they differ.
DISTRIBUTION = {
    "PIL": "pillow",
    "absl": "absl-py",
    "google.protobuf": "protobuf",
    "ml_collections": "ml-collections",
    "orbax": "orbax-checkpoint",
    "sklearn": "scikit-learn",
    "tensorflow_datasets": "tensorflow-datasets",
    "yaml": "pyyaml",
}
# Declared but imported by no module of xsens/, each with why it is declared.
NOT_IMPORTED = {
    "array_record": "TFDS reads and writes the ArrayRecord files of the datasets with it",
}
FIRST_PARTY = {"xsens", "mlcollections_configs", "experiments", "tests"}


def _normalize(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(node: ast.AST) -> set[str]:
  """Distribution names of the requirement strings under `node` (`etils[epath]>=1` ->
  etils)."""
  return {_normalize(re.split(r"[\[<>=!~; ]", n.value, maxsplit=1)[0])
          for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
          and re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[.*\])?\s*([<>=!~].*)?$", n.value)}


def declared() -> tuple[set[str], set[str]]:
  """(install_requires, every extra) of setup.py, as normalized distribution names."""
  with open(os.path.join(REPO, "setup.py")) as f:
    tree = ast.parse(f.read())
  lists = {}
  for node in tree.body:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
      lists[node.targets[0].id] = node.value
  core = _requirement_names(lists["CORE"])
  extras = set().union(*(_requirement_names(v) for k, v in lists.items()
                         if k not in ("CORE", "EXTRAS")),
                       *(_requirement_names(v) for v in lists["EXTRAS"].values))
  return core, extras


def imports() -> dict[str, dict[str, bool]]:
  """{top-level module: {file: imported at module level}} of the imports under xsens/
  (`google.protobuf` keeps two parts: `google` is a namespace)."""
  out = {}
  for root, _, files in os.walk(os.path.join(REPO, "xsens")):
    for name in files:
      if not name.endswith(".py"):
        continue
      path = os.path.join(root, name)
      with open(path) as f:
        tree = ast.parse(f.read())
      top_level = {id(n) for n in tree.body} | {
          id(c) for n in tree.body if isinstance(n, (ast.If, ast.Try))
          for c in ast.walk(n)}
      for node in ast.walk(tree):
        if isinstance(node, ast.Import):
          modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
          modules = [node.module]
        else:
          continue
        for module in modules:
          parts = module.split(".")
          key = ".".join(parts[:2]) if parts[0] == "google" else parts[0]
          if key in sys.stdlib_module_names or key in FIRST_PARTY:
            continue
          rel = os.path.relpath(path, REPO)
          out.setdefault(key, {})[rel] = (out.get(key, {}).get(rel, False)
                                          or id(node) in top_level)
  return out


def test_every_import_under_xsens_is_declared_in_setup_py():
  core, extras = declared()
  found = imports()
  missing = {m: sorted(files) for m, files in found.items()
             if _normalize(DISTRIBUTION.get(m, m)) not in core | extras}
  assert not missing, f"imported but not declared in setup.py: {missing}"
  eager = {m: sorted(f for f, top in files.items() if top) for m, files in found.items()
           if _normalize(DISTRIBUTION.get(m, m)) not in core}
  eager = {m: f for m, f in eager.items() if f}
  assert not eager, f"an extra's package imported at module level (import it where used): {eager}"


def test_declared_packages_that_xsens_does_not_import_are_listed_with_a_reason():
  core, _ = declared()
  imported = {_normalize(DISTRIBUTION.get(m, m)) for m in imports()}
  assert core - imported == {_normalize(n) for n in NOT_IMPORTED}


def test_license_and_citation_file_agree_with_setup_py():
  """LICENSE is the Apache License 2.0 that setup.py declares; CITATION.cff is valid CFF 1.2
  naming the same license and version, with the two papers it reproduces as references."""
  import yaml  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO, "LICENSE"), encoding="utf-8") as f:
    assert "Apache License\n                           Version 2.0, January 2004" in f.read()
  with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
    setup_py = f.read()
  with open(os.path.join(REPO, "CITATION.cff"), encoding="utf-8") as f:
    cff = yaml.safe_load(f)
  assert 'license="Apache-2.0"' in setup_py and cff["license"] == "Apache-2.0"
  assert f'version="{cff["version"]}"' in setup_py
  assert cff["cff-version"] == "1.2.0" and cff["title"] and cff["authors"]
  titles = [r["title"] for r in cff["references"]]
  assert any("Low Sensitivity Functions" in t for t in titles)
  assert any("Benign Overfitting for Transformer in Vision" in t for t in titles)
