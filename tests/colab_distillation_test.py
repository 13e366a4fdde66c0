"""Executes colab/distillation.ipynb end to end in smoke mode (a real kernel)."""

import re

import pytest

from tests import notebooks

NOTEBOOK = notebooks.notebook_path("distillation.ipynb")
# e.g. "kd_margin: worst-class accuracy = 0.412".
LINE = re.compile(r"^(?P<name>\w+): worst-class accuracy = (?P<value>[0-9.]+)$", re.MULTILINE)


def test_committed_notebook_is_clean():
  source = notebooks.committed_source(NOTEBOOK)
  assert re.search(r"^IMBALANCE = ", source, re.MULTILINE)
  assert "2106.10494" in source and "XSENS_NOTEBOOK_SMOKE" in source


@pytest.mark.slow
def test_notebook_runs_in_smoke_mode():
  nb = notebooks.execute_smoke(NOTEBOOK)
  assert not notebooks.outputs(nb, "error")
  stdout = notebooks.stdout(nb)
  assert "smoke=True" in stdout
  found = {m["name"]: float(m["value"]) for m in LINE.finditer(stdout)}
  assert set(found) == {"teacher", "onehot", "kd", "kd_class_alpha", "kd_margin"}, stdout
  assert all(0.0 <= v <= 1.0 for v in found.values())
  assert "kd: mean per-class gain" in stdout
  assert len(notebooks.png_outputs(nb)) == 2  # the two figures
