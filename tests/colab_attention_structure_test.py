"""Executes colab/attention_structure.ipynb end to end in smoke mode (a real kernel)."""

import re

import pytest

from tests import notebooks

NOTEBOOK = notebooks.notebook_path("attention_structure.ipynb")
# e.g. "layer 0: row dim 12.0 (random init 11), matrix dim 50.0, overlap next layer 0.56, ..."
LINE = re.compile(r"^layer (?P<layer>\d+): row dim (?P<dim>[0-9.]+) \(random init \d+\), "
                  r"matrix dim [0-9.]+, overlap next layer (?:[0-9.]+|nan), heads [0-9.]+, "
                  r"random-init model [0-9.]+, random subspace [0-9.]+ \(k/T = 0\.24\)$",
                  re.MULTILINE)


def test_committed_notebook_is_clean():
  source = notebooks.committed_source(NOTEBOOK)
  assert re.search(r"^VARIANT = ", source, re.MULTILINE)
  assert "2106.08823" in source and "XSENS_NOTEBOOK_SMOKE" in source
  assert "position_encoding" in source and "2104.08698" in source


@pytest.mark.slow
def test_notebook_runs_in_smoke_mode():
  nb = notebooks.execute_smoke(NOTEBOOK)
  assert not notebooks.outputs(nb, "error")
  stdout = notebooks.stdout(nb)
  assert "smoke=True runs=['eigen_m6', 'vit'] seeds=1 m=(4, 17) k=(2,)" in stdout
  found = {int(m["layer"]): float(m["dim"]) for m in LINE.finditer(stdout)}
  assert set(found) == {0, 1}, stdout
  assert all(1 <= d <= 17 for d in found.values())
  assert re.search(r"^eigen_m6: m=6 k=4 test accuracy [0-9.]+, FLOPs x", stdout, re.MULTILINE)
  assert re.search(r"^mode diet_abs: params x[0-9.]+, FLOPs x", stdout, re.MULTILINE)  # DIET
  assert len(notebooks.png_outputs(nb)) == 3  # the three figures
