"""Every colab/ notebook: badge, install cell first, stored outputs with a figure (fast).

The install cell's logic also runs here in a subprocess, with no network: inside a checkout
it imports the checkout; outside one it calls `pip install $XSENS_SOURCE` (stubbed) with the
installed jax pinned, or says in one line what to set.
"""

import base64
import importlib.metadata
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


def test_eight_notebooks():
  # Six, plus colab/attention_structure.ipynb (issue 18) and colab/modify_memories.ipynb
  # (issue 19).
  assert len(NAMES) == 8, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_badge_and_install_cell_first(name):
  nb = _read(name)
  first = nb.cells[0]
  assert first.cell_type == "markdown"
  if en.URL is None:  # No public URL: no badge (no broken link), the note comes first.
    assert first.source.startswith(en.STORED_MARKER), first.source[:80]
    assert "[![Open In Colab]" not in first.source
  else:
    assert first.source.splitlines()[0] == en.badge(name)
    assert f"/blob/main/colab/{name})" in first.source
  assert en.STORED_MARKER in first.source
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert nb.cells[1] is code[0]
  assert code[0].source == en.install_cell_source()  # One template, one URL.
  assert "XSENS_SOURCE" not in "".join(c.source for c in code[1:])
  if name in en.SMOKE_ONLY:
    assert "smoke run" in first.source


@pytest.mark.parametrize("name", NAMES)
def test_asks_colab_for_a_gpu_and_prints_the_device(name):
  nb = _read(name)
  assert nb.metadata["accelerator"] == "GPU"
  assert nb.metadata["colab"]["gpuType"]
  code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
  assert "jax.devices()" in code
  assert re.search(r"\bon \[?(Cpu|cpu)", notebooks.stdout(nb)), "no device in the outputs"


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
  assert smoke == (name in en.SMOKE_ONLY), "stored from a smoke run, not from its CPU run"


def test_readme_table_matches_the_one_url():
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  assert en.readme_badges(NAMES) in readme
  for name in NAMES:  # Each notebook is also named in the README's prose.
    assert f"`{name.removesuffix('.ipynb')}`" in readme.split("<!-- colab-badges")[0], name
  with open(os.path.join(REPO, "docs", "usage.md"), encoding="utf-8") as f:
    usage = f.read()
  assert "`URL` in `setup.py`" in usage  # Where to set it.


def test_url_is_stated_once_in_setup_py():
  assert en.URL == en.setup_url(os.path.join(REPO, "setup.py"))
  with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
    assert "url=URL," in f.read()


def test_no_placeholder_anywhere():
  # `grep -r` for the placeholder owner over the tracked files finds nothing (split here).
  word = "OWN" + "ER"
  files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split()
  hits = []
  for rel in files:
    path = os.path.join(REPO, rel)
    if not os.path.isfile(path):
      continue
    with open(path, "rb") as f:
      if word.encode() in f.read():
        hits.append(rel)
  assert not hits, hits


def test_badges_and_default_source_follow_the_url():
  url = "https://github.com/me/xsens"
  assert en.default_source(url) == "git+https://github.com/me/xsens.git"
  assert en.default_source(url + ".git") == "git+https://github.com/me/xsens.git"
  assert en.colab_url("x.ipynb", url) == (
      "https://colab.research.google.com/github/me/xsens/blob/main/colab/x.ipynb")
  assert en.badge("x.ipynb", url).endswith("(https://colab.research.google.com/github/me/"
                                            "xsens/blob/main/colab/x.ipynb)")
  assert "XSENS_SOURCE\") or 'git+https://github.com/me/xsens.git'" in (
      en.install_cell_source(url))
  assert "[![Open In Colab]" in en.readme_badges(["x.ipynb"], url)
  # No URL, or one that is not on GitHub: no default source, no badge, no Colab link.
  for none in (None, "https://gitlab.com/me/xsens"):
    assert en.colab_url("x.ipynb", none) is None and en.badge("x.ipynb", none) is None
    assert "[![Open In Colab]" not in en.readme_badges(["x.ipynb"], none)
  assert en.default_source(None) is None
  assert 'XSENS_SOURCE") or None\n' in en.install_cell_source(None)


def test_pip_install_args_keep_an_installed_jax():
  env = {"jax": "0.5.2", "jaxlib": "0.5.1", "jax_cuda12_plugin": "0.5.1",
         "jax-cuda12-pjrt": "0.5.1", "flax": "0.10.4", "numpy": "2.0.2"}
  assert en.pip_install_args("/src/xsens", env) == [
      "install", "-q", "/src/xsens", "jax==0.5.2", "jax-cuda12-pjrt==0.5.1",
      "jax-cuda12-plugin==0.5.1", "jaxlib==0.5.1"]
  assert en.pip_install_args("x.whl", {"libtpu": "0.0.17", "jax": "0.6.0"})[3:] == [
      "jax==0.6.0", "libtpu==0.0.17"]
  # No jax installed: nothing pinned, pip resolves jax from xsens's requirements.
  assert en.pip_install_args("x.whl", {"numpy": "2.0.2", "jaxtyping": "0.2"}) == [
      "install", "-q", "x.whl"]


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
  # must ask pip for exactly $XSENS_SOURCE with this environment's jax pinned (then say
  # what to set, as nothing was installed).
  prelude = textwrap.dedent("""\
      import subprocess, sys
      sys.modules["xsens"] = None
      def fake_run(cmd, check):
        print("PIP", cmd[1:])
      subprocess.run = fake_run
      """)
  proc = _run_cell(tmp_path, prelude, {"XSENS_SOURCE": "/wheels/xsens-0.1.0-py3-none-any.whl"})
  assert proc.returncode == 0, proc.stderr
  jax = importlib.metadata.version("jax")
  jaxlib = importlib.metadata.version("jaxlib")
  assert (f"PIP ['-m', 'pip', 'install', '-q', '/wheels/xsens-0.1.0-py3-none-any.whl', "
          f"'jax=={jax}', 'jaxlib=={jaxlib}'") in proc.stdout, proc.stdout
  assert proc.stdout.splitlines()[-1].startswith("xsens is not installed: set XSENS_SOURCE")


def test_install_cell_without_a_source_says_what_to_set_in_one_line(tmp_path):
  prelude = textwrap.dedent("""\
      import subprocess, sys
      sys.modules["xsens"] = None
      def fake_run(cmd, check):
        raise AssertionError("pip must not run without a source")
      subprocess.run = fake_run
      """)
  proc = _run_cell(tmp_path, prelude, {"XSENS_SOURCE": ""})
  assert proc.returncode == 0, proc.stderr
  if en.URL is None:
    assert proc.stdout.splitlines() == [
        "xsens is not installed: set XSENS_SOURCE (a checkout's path, a wheel or a git URL) "
        "and rerun this cell."], proc.stdout
    assert not proc.stderr.strip(), proc.stderr


@pytest.mark.parametrize("name", NAMES)
def test_sync_is_idempotent(name):
  nb = _read(name)
  before = [c.source for c in nb.cells]
  outputs = nb.cells[1].outputs
  smoke = "smoke=True" in notebooks.stdout(nb)
  for _ in range(2):
    en.sync(nb, name, smoke=smoke)
  assert [c.source for c in nb.cells] == before
  assert nb.cells[1].outputs == outputs  # --sync-only keeps the stored outputs.
