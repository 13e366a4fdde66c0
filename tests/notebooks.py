"""Shared plumbing of the notebook tests: cleanliness checks and smoke-mode execution."""

import os

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


def execute_smoke(path: str, timeout: int = 300):
  """Runs the notebook in a real kernel with XSENS_NOTEBOOK_SMOKE=1; returns it executed.

  The kernel is a subprocess: it inherits os.environ, including the session's private
  TFDS_DATA_DIR (tests/conftest.py). It runs on the CPU (on a GPU host the pytest process
  may hold the GPU memory) with fast compiles. A failing cell raises CellExecutionError.
  """
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("XSENS_NOTEBOOK_SMOKE", "1")
    mp.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    mp.setenv("JAX_PLATFORMS", "cpu")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": REPO}}).execute()
  return nb


def outputs(nb, kind: str) -> list:
  return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
          if o.get("output_type") == kind]


def stdout(nb) -> str:
  return "".join(o["text"] for o in outputs(nb, "stream") if o["name"] == "stdout")


def png_outputs(nb) -> list:
  return [o for o in outputs(nb, "display_data") + outputs(nb, "execute_result")
          if "image/png" in o.get("data", {})]
