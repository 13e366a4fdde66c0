"""Every colab/ notebook: badge, install cell first, stored outputs with a figure (fast).

The install cell's logic also runs here in a subprocess, with no network: inside a checkout
it imports the checkout; outside one it calls `pip install $XSENS_SOURCE` (stubbed).
"""

import base64
import os
import re
import subprocess
import sys
import textwrap

import nbformat
import pytest

from experiments import execute_notebooks as en
from tests import notebooks
from tests.helpers import REPO

NAMES = sorted(n for n in os.listdir(os.path.join(REPO, "colab")) if n.endswith(".ipynb"))
MAX_NOTEBOOK_BYTES = 600_000  # The repository stays lean: PNGs at modest dpi.


def _read(name):
  return nbformat.read(notebooks.notebook_path(name), as_version=4)


def test_six_notebooks():
  # Six, plus colab/attention_structure.ipynb (issue 18) and colab/modify_memories.ipynb
  # (issue 19).
  assert len(NAMES) == 8, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_badge_and_install_cell_first(name):
  nb = _read(name)
  first = nb.cells[0]
  assert first.cell_type == "markdown"
  assert first.source.splitlines()[0] == en.badge(name)
  assert f"/blob/main/colab/{name})" in first.source
  assert en.STORED_MARKER in first.source
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert nb.cells[1] is code[0]
  assert code[0].source == en.install_cell_source()  # One template, one repository.
  assert "XSENS_SOURCE" not in "".join(c.source for c in code[1:])
  if name in en.SMOKE_ONLY:
    assert "smoke run" in first.source


@pytest.mark.parametrize("name", NAMES)
def test_stored_with_outputs_and_a_figure(name):
  path = notebooks.notebook_path(name)
  notebooks.committed_source(path)  # Clean: no errors, stderr, timings or machine paths.
  nb = _read(name)
  assert os.path.getsize(path) < MAX_NOTEBOOK_BYTES, os.path.getsize(path)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert all(c.execution_count is not None for c in code), "not executed in full"
  assert re.match(r"xsens \S+ \(checkout\)", notebooks.stdout(nb)), notebooks.stdout(nb)[:80]
  images = notebooks.png_outputs(nb)
  assert images, "no stored figure"
  for out in images:
    assert base64.b64decode(out["data"]["image/png"])[:4] == b"\x89PNG"
  smoke = "smoke=True" in notebooks.stdout(nb)
  assert smoke == ("its smoke run" in nb.cells[0].source), "stored-outputs note is wrong"


def test_readme_badges_match_the_one_repository():
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  assert en.readme_badges(NAMES) in readme
  for name in NAMES:  # Each notebook is also named in the README's prose.
    assert f"`{name.removesuffix('.ipynb')}`" in readme.split("<!-- colab-badges")[0], name
  with open(os.path.join(REPO, "docs", "usage.md"), encoding="utf-8") as f:
    usage = f.read()
  assert "`REPOSITORY` in\n  `experiments/execute_notebooks.py`" in usage  # Where to set it.
  assert hasattr(en, "REPOSITORY")


def _run_cell(cwd, prelude="", env_extra=None):
  source = en.install_cell_source()
  script = prelude + "\n" + source
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(env_extra or {})
  return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=60)


def test_install_cell_imports_the_checkout_it_runs_in(tmp_path):
  # A fake checkout: its xsens wins over the installed one, and pip never runs (the
  # source is a path that does not exist, so an install would fail).
  (tmp_path / "xsens").mkdir()
  (tmp_path / "xsens" / "__init__.py").write_text('__version__ = "checkout-marker"\n')
  (tmp_path / "setup.py").write_text("")
  (tmp_path / "colab").mkdir()
  proc = _run_cell(tmp_path / "colab", env_extra={"XSENS_SOURCE": "/nonexistent.whl"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == "xsens checkout-marker (checkout)"


def test_install_cell_in_the_repository_imports_it():
  proc = _run_cell(os.path.join(REPO, "colab"),
                   prelude="import os; os.environ['XSENS_SOURCE'] = '/nonexistent.whl'")
  assert proc.returncode == 0, proc.stderr
  assert re.fullmatch(r"xsens \S+ \(checkout\)", proc.stdout.strip()), proc.stdout


def test_install_cell_pip_installs_xsens_source_outside_a_checkout(tmp_path):
  # No checkout above tmp_path, xsens made unimportable, subprocess.run stubbed: the cell
  # must ask pip for exactly $XSENS_SOURCE (then fail to import, as nothing was installed).
  prelude = textwrap.dedent("""\
      import subprocess, sys
      sys.modules["xsens"] = None
      def fake_run(cmd, check):
        print("PIP", cmd[1:])
      subprocess.run = fake_run
      """)
  proc = _run_cell(tmp_path, prelude, {"XSENS_SOURCE": "/wheels/xsens-0.1.0-py3-none-any.whl"})
  assert "PIP ['-m', 'pip', 'install', '-q', '/wheels/xsens-0.1.0-py3-none-any.whl']" in proc.stdout
  assert "ImportError" in proc.stderr or "ModuleNotFoundError" in proc.stderr


def test_default_source_is_the_repository_git_url():
  assert f'"{en.git_source()}"' in en.install_cell_source()
  assert en.git_source() == f"git+https://github.com/{en.REPOSITORY}.git"
  assert en.colab_url("x.ipynb").startswith(
      f"https://colab.research.google.com/github/{en.REPOSITORY}/blob/main/colab/")


@pytest.mark.parametrize("name", NAMES)
def test_sync_is_idempotent(name):
  nb = _read(name)
  before = [c.source for c in nb.cells]
  smoke = "smoke=True" in notebooks.stdout(nb)
  for _ in range(2):
    en.sync(nb, name, smoke=smoke)
  assert [c.source for c in nb.cells] == before
