"""Executes colab/sensitivity_patches.ipynb end to end in smoke mode (a real kernel)."""

import os
import re

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers import REPO

NOTEBOOK = os.path.join(REPO, "colab", "sensitivity_patches.ipynb")
MODELS = ("ViT (patch 7)", "CNN")
# e.g. "CNN: sensitivity(sigma=1.0) = 0.0203 ± 0.0044 (256 images x 16 patches x ...)".
SENSITIVITY_LINE = re.compile(
    r"^(?P<model>.+?): sensitivity\(sigma=(?P<sigma>[0-9.]+)\) = "
    r"(?P<mean>[0-9.]+) ± (?P<stderr>[0-9.]+)", re.MULTILINE)


def _outputs(nb, kind):
  return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
          if o.get("output_type") == kind]


def test_committed_notebook_is_clean():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  assert nb.metadata["kernelspec"]["name"] == "python3"
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert not cell.outputs and cell.execution_count is None, cell.source[:80]
  source = "\n".join(c.source for c in nb.cells)
  assert re.search(r"^TRAIN_STEPS = ", source, re.MULTILINE)
  assert "2403.06925" in source and "XSENS_NOTEBOOK_SMOKE" in source


@pytest.fixture
def executed_notebook(monkeypatch):
  # The kernel is a subprocess: it inherits os.environ, including the session's private
  # TFDS_DATA_DIR (tests/conftest.py), where it prepares mnist5k.
  monkeypatch.setenv("XSENS_NOTEBOOK_SMOKE", "1")
  monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")  # Faster compiles.
  # CPU only: on a GPU host the pytest process may already hold the GPU memory.
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = NotebookClient(nb, timeout=300, kernel_name="python3",
                          resources={"metadata": {"path": REPO}})
  client.execute()  # Raises CellExecutionError (with the traceback) if a cell fails.
  return nb


def test_notebook_runs_and_reports_both_models(executed_notebook):
  nb = executed_notebook
  assert not _outputs(nb, "error")
  stdout = "".join(o["text"] for o in _outputs(nb, "stream") if o["name"] == "stdout")
  assert "smoke=True" in stdout
  found = {m["model"]: m for m in SENSITIVITY_LINE.finditer(stdout)}
  assert set(found) == set(MODELS), stdout
  for m in found.values():
    assert 0.0 <= float(m["mean"]) <= 1.0
    assert float(m["stderr"]) >= 0.0
  images = [o for o in _outputs(nb, "display_data") + _outputs(nb, "execute_result")
            if "image/png" in o.get("data", {})]
  assert images, "no image/png output (the per-patch heat maps)"
