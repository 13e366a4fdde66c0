"""Shared plumbing of the notebook tests: cleanliness checks and smoke-mode execution."""

import os
import shutil

import nbformat
import pytest
from nbclient import NotebookClient

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


def execute_smoke(path: str, timeout: int = 300, keep_tmp: str | None = None):
  """Runs the notebook in a real kernel with XSENS_NOTEBOOK_SMOKE=1; returns it executed.

  The kernel is a subprocess: it inherits os.environ, including the session's private
  TFDS_DATA_DIR (tests/conftest.py). It runs on the CPU (on a GPU host the pytest process
  may hold the GPU memory) with fast compiles. A failing cell raises CellExecutionError.
  `keep_tmp`: a directory: what the notebook makes in its TMPDIR (its workdirs, from
  `tempfile.mkdtemp`) is copied there before the cell that removes them runs (a cell
  calling `shutil.rmtree`), so that a test can read or resume them.
  """
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("XSENS_NOTEBOOK_SMOKE", "1")
    mp.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    mp.setenv("JAX_PLATFORMS", "cpu")
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
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": REPO}}, **hooks).execute()
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
