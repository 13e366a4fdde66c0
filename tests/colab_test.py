"""Executes colab/sensitivity_patches.ipynb end to end in smoke mode (a real kernel)."""

import re

import pytest

from tests import notebooks

NOTEBOOK = notebooks.notebook_path("sensitivity_patches.ipynb")
MODELS = ("ViT (patch 7)", "CNN")
# e.g. "CNN: sensitivity(sigma=1.0) = 0.0203 ± 0.0044 (256 images x 16 patches x ...)".
SENSITIVITY_LINE = re.compile(
    r"^(?P<model>.+?): sensitivity\(sigma=(?P<sigma>[0-9.]+)\) = "
    r"(?P<mean>[0-9.]+) ± (?P<stderr>[0-9.]+)", re.MULTILINE)


def test_committed_notebook_is_clean():
  source = notebooks.committed_source(NOTEBOOK)
  assert re.search(r"^TRAIN_STEPS = ", source, re.MULTILINE)
  assert "2403.06925" in source and "XSENS_NOTEBOOK_SMOKE" in source


@pytest.fixture
def executed_notebook():
  return notebooks.execute_smoke(NOTEBOOK)


@pytest.mark.slow
def test_notebook_runs_and_reports_both_models(executed_notebook):
  nb = executed_notebook
  assert not notebooks.outputs(nb, "error")
  stdout = notebooks.stdout(nb)
  assert "smoke=True" in stdout
  found = {m["model"]: m for m in SENSITIVITY_LINE.finditer(stdout)}
  assert set(found) == set(MODELS), stdout
  for m in found.values():
    assert 0.0 <= float(m["mean"]) <= 1.0
    assert float(m["stderr"]) >= 0.0
  assert notebooks.png_outputs(nb), "no image/png output (the per-patch heat maps)"
