"""Executes colab/benign_overfitting.ipynb end to end in smoke mode (a real kernel, < 60 s)."""

import os
import re

import nbformat
from nbclient import NotebookClient

from tests.helpers import REPO

NOTEBOOK = os.path.join(REPO, "colab", "benign_overfitting.ipynb")
K_LINE = re.compile(r"^vit: k = (?P<k>\S+) \(95% CI", re.MULTILINE)


def _outputs(nb, kind):
  return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
          if o.get("output_type") == kind]


def test_committed_notebook_is_clean():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert not cell.outputs and cell.execution_count is None, cell.source[:80]
  source = "\n".join(c.source for c in nb.cells)
  assert "2409.19345" in source and "XSENS_NOTEBOOK_SMOKE" in source


def test_notebook_runs_in_smoke_mode(monkeypatch):
  monkeypatch.setenv("XSENS_NOTEBOOK_SMOKE", "1")
  monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")  # Faster compiles.
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  NotebookClient(nb, timeout=120, kernel_name="python3",
                 resources={"metadata": {"path": REPO}}).execute()
  assert not _outputs(nb, "error")
  stdout = "".join(o["text"] for o in _outputs(nb, "stream") if o["name"] == "stdout")
  assert "smoke=True" in stdout and K_LINE.search(stdout), stdout
  images = [o for o in _outputs(nb, "display_data") if "image/png" in o.get("data", {})]
  assert len(images) >= 2, "heat map and dynamics figures"
