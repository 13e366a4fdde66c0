"""Shared plumbing of the notebook tests: cleanliness checks and smoke-mode execution in a
fresh virtual environment that installs xsens from the notebook's own first cell."""

import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import nbformat
import pytest
from nbclient import NotebookClient
from packaging.requirements import Requirement

from tests.helpers import REPO


def notebook_path(name: str) -> str:
  return os.path.join(REPO, "colab", name)


def committed_source(path: str) -> str:
  """Validates a committed notebook; returns its code+text.

  Notebooks are stored with the outputs of experiments/execute_notebooks.py: a python3
  kernel, no error outputs, no stderr streams, no timing metadata, no machine paths.
  """
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  assert nb.metadata["kernelspec"]["name"] == "python3"
  for cell in nb.cells:
    assert "execution" not in cell.metadata, cell.source[:80]
    for out in cell.get("outputs", []):
      assert out["output_type"] != "error", cell.source[:80]
      assert out.get("name") != "stderr", cell.source[:80]
      text = out.get("text", "") + out.get("data", {}).get("text/plain", "")
      assert REPO not in text and "/work/" not in text, text[:200]
  return "\n".join(c.source for c in nb.cells)


# ----------------------------------------------------------------- the fresh environment
# Every notebook test executes its notebook with a kernel of a fresh virtual environment
# where xsens is NOT installed; the notebook's own first cell installs it, from a copy of
# this checkout (`XSENS_SOURCE`), with pip, as on Colab. So that this takes seconds, not
# minutes, the third-party dependencies come from a shared environment ("deps venv":
# xsens's and ipykernel's requirement closure, pinned to the versions installed here,
# installed `--no-deps` from the pip cache or registry once, reused while the pins are the
# same), which each notebook's own small venv sees through a .pth line; xsens itself is
# never in it.
VENV_TIMEOUT_S = 900      # Building the deps venv (pip install of the pinned wheels).
INSTALL_TIMEOUT_S = 240   # The notebook's install cell (pip builds and installs xsens).
LOCK_TIMEOUT_S = 1200     # Waiting for another test process that builds the deps venv.
KERNEL_NAME = "xsens-fresh-venv"


def _key(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def requirement_pins(roots=("xsens", "ipykernel", "setuptools", "wheel")) -> list[str]:
  """`name==version` of the installed requirement closure of `roots`, without xsens
  (`wheel` unpinned where it is not installed here).

  setuptools (this environment's, with its own bdist_wheel) lets the install cell's pip
  build xsens without an isolated build environment (PIP_NO_BUILD_ISOLATION below), which
  would fetch setuptools from the index for every notebook: 28 s against 4 s per install.
  """
  pins, seen, todo = {}, set(), [(r, frozenset()) for r in roots]
  while todo:
    name, extras = todo.pop()
    if (_key(name), extras) in seen:
      continue
    seen.add((_key(name), extras))
    try:
      dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
      continue  # A requirement for another platform or Python, or not installed here.
    pins[_key(name)] = f"{_key(name)}=={dist.version}"
    for line in dist.requires or []:
      req = Requirement(line)
      if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in {"", *extras}):
        todo.append((req.name, frozenset(req.extras)))
  pins.pop("xsens", None)
  # setuptools < 70.1 (Python 3.11's venv default) builds wheels only with `wheel`.
  pins.setdefault("wheel", "wheel")
  return sorted(pins.values())


def _site_packages(venv: str) -> str:
  return os.path.join(venv, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                      "site-packages")


def _run(cmd, what: str, timeout: float, **kwargs):
  """Runs `cmd`; fails the test saying `what` it waited for if it errs or times out."""
  t0 = time.time()
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
  except subprocess.TimeoutExpired:
    pytest.fail(f"{what}: not done after {timeout:.0f} s (hard timeout)")
  if proc.returncode:
    pytest.fail(f"{what}: exit {proc.returncode} after {time.time() - t0:.0f} s\n"
                f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return proc


def deps_venv() -> str:
  """The shared environment of the notebooks' third-party dependencies (no xsens)."""
  pins = requirement_pins()
  digest = hashlib.sha256("\n".join([sys.version, *pins]).encode()).hexdigest()[:12]
  root = os.path.join(tempfile.gettempdir(), f"xsens_notebook_deps_{digest}")
  venv = os.path.join(root, "venv")
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, "lock"), "w") as lock:
    deadline = time.time() + LOCK_TIMEOUT_S
    while True:  # Another test process (xdist worker) may be building it.
      try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
      except BlockingIOError:
        if time.time() > deadline:
          pytest.fail(f"waited {LOCK_TIMEOUT_S} s for another process building {venv}")
        time.sleep(1)
    if not os.path.exists(os.path.join(venv, "complete")):
      shutil.rmtree(venv, ignore_errors=True)
      _run([sys._base_executable, "-m", "venv", venv], f"python -m venv {venv}", 120)
      _run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q",
            "--disable-pip-version-check", "--no-deps", "--no-compile", *pins],
           f"pip install --no-deps of the {len(pins)} pinned dependencies into {venv}",
           VENV_TIMEOUT_S)
      with open(os.path.join(venv, "complete"), "w") as f:
        f.write("\n".join(pins))
  return venv


def fresh_venv(where: str) -> str:
  """A new venv in `where` that sees deps_venv()'s packages and has no xsens; its python."""
  venv = os.path.join(where, "venv")
  _run([sys._base_executable, "-m", "venv", "--without-pip", venv], "python -m venv", 120)
  with open(os.path.join(_site_packages(venv), "_xsens_deps.pth"), "w") as f:
    f.write(_site_packages(deps_venv()) + "\n")  # A path line: its .pth files do not run.
  python = os.path.join(venv, "bin", "python")
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  probe = subprocess.run([python, "-c", "import xsens"], capture_output=True, text=True,
                         cwd=where, env=env, timeout=60)
  assert probe.returncode != 0, "xsens is importable in the fresh venv"
  kernel_dir = os.path.join(where, "jupyter", "kernels", KERNEL_NAME)
  os.makedirs(kernel_dir)
  with open(os.path.join(kernel_dir, "kernel.json"), "w") as f:
    json.dump({"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
               "display_name": "xsens fresh venv", "language": "python"}, f)
  return python


def copy_checkout(dest: str) -> str:
  """Copies this checkout's files (tracked and untracked, not ignored) to `dest`."""
  files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.split("\n")
  for rel in filter(None, files):
    if os.path.isfile(os.path.join(REPO, rel)) and not rel.endswith(".ipynb"):
      os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
      shutil.copy2(os.path.join(REPO, rel), os.path.join(dest, rel))
  return dest


def execute_smoke(path: str, timeout: int = 300, keep_tmp: str | None = None):
  """Runs the notebook in smoke mode (XSENS_NOTEBOOK_SMOKE=1) in a fresh venv; returns it.

  The kernel is the python of a new virtual environment without xsens (fresh_venv), run
  outside any checkout, so the notebook's first cell installs xsens with pip from a copy
  of this checkout (XSENS_SOURCE), then the notebook runs as on Colab; the test fails if
  that cell did not install it. The kernel inherits os.environ, including the session's
  private TFDS_DATA_DIR (tests/conftest.py). It runs on the CPU (on a GPU host the pytest
  process may hold the GPU memory) with fast compiles. A failing cell raises
  CellExecutionError. `timeout`: seconds per cell (the install cell: INSTALL_TIMEOUT_S).
  `keep_tmp`: a directory: what the notebook makes in its TMPDIR (its workdirs, from
  `tempfile.mkdtemp`) is copied there before the cell that removes them runs (a cell
  calling `shutil.rmtree`), so that a test can read or resume them.
  """
  where = tempfile.mkdtemp(prefix="xsens_notebook_")
  try:
    python = fresh_venv(where)
    source = copy_checkout(os.path.join(where, "xsens_checkout"))
    run_dir = os.path.join(where, "run")  # Not in a checkout: the cell must install.
    os.makedirs(run_dir)
    with pytest.MonkeyPatch.context() as mp:
      mp.setenv("XSENS_NOTEBOOK_SMOKE", "1")
      mp.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
      mp.setenv("JAX_PLATFORMS", "cpu")
      mp.setenv("XSENS_SOURCE", source)
      mp.setenv("JUPYTER_PATH", os.path.join(where, "jupyter"))
      mp.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
      mp.setenv("PIP_NO_BUILD_ISOLATION", "0")  # pip reads "0" as --no-build-isolation.
      mp.delenv("PYTHONPATH", raising=False)
      hooks = {}
      if keep_tmp is not None:
        kernel_tmp = os.path.join(keep_tmp, ".kernel_tmp")
        os.makedirs(kernel_tmp)
        mp.setenv("TMPDIR", kernel_tmp)

        def keep(cell, cell_index):
          del cell_index
          if "shutil.rmtree(" in cell.source:
            for name in os.listdir(kernel_tmp):
              if os.path.isdir(os.path.join(kernel_tmp, name)):
                shutil.copytree(os.path.join(kernel_tmp, name), os.path.join(keep_tmp, name),
                                dirs_exist_ok=True)
        hooks["on_cell_execute"] = keep
      nb = nbformat.read(path, as_version=4)
      client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL_NAME,
                              resources={"metadata": {"path": run_dir}}, **hooks)
      client.timeout_func = lambda cell: (INSTALL_TIMEOUT_S if cell.get("id") == "xsens-install"
                                          else timeout)
      client.execute()
    installed = "".join(o.get("text", "") for o in nb.cells[1].outputs)
    assert re.fullmatch(r"xsens \S+ \(installed\)\n", installed), installed
    assert os.path.isdir(os.path.join(_site_packages(os.path.dirname(os.path.dirname(python))),
                                      "xsens")), "xsens not installed into the fresh venv"
  finally:
    shutil.rmtree(where, ignore_errors=True)
  return nb


def kept_dir(keep_tmp: str, prefix: str) -> str:
  """The one directory `tempfile.mkdtemp(prefix=prefix)` made, as kept by execute_smoke."""
  found = [n for n in os.listdir(keep_tmp) if n.startswith(prefix)]
  assert len(found) == 1, (prefix, os.listdir(keep_tmp))
  return os.path.join(keep_tmp, found[0])


def outputs(nb, kind: str) -> list:
  return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
          if o.get("output_type") == kind]


def stdout(nb) -> str:
  return "".join(o["text"] for o in outputs(nb, "stream") if o["name"] == "stdout")


def png_outputs(nb) -> list:
  return [o for o in outputs(nb, "display_data") + outputs(nb, "execute_result")
          if "image/png" in o.get("data", {})]
