"""Executes colab/benign_overfitting.ipynb end to end in smoke mode (a real kernel, < 60 s)."""

import re

import pytest

from tests import notebooks

NOTEBOOK = notebooks.notebook_path("benign_overfitting.ipynb")
K_LINE = re.compile(r"^vit: k = (?P<k>\S+) \(95% CI", re.MULTILINE)


def test_committed_notebook_is_clean():
  source = notebooks.committed_source(NOTEBOOK)
  assert "2409.19345" in source and "XSENS_NOTEBOOK_SMOKE" in source


@pytest.mark.slow
def test_notebook_runs_in_smoke_mode():
  nb = notebooks.execute_smoke(NOTEBOOK, timeout=120)
  assert not notebooks.outputs(nb, "error")
  stdout = notebooks.stdout(nb)
  assert "smoke=True" in stdout and K_LINE.search(stdout), stdout
  images = notebooks.png_outputs(nb)
  assert len(images) >= 2, "heat map and dynamics figures"
