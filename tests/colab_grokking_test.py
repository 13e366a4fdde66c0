"""Executes colab/grokking.ipynb end to end in smoke mode (a real kernel)."""

import re

import nbformat
import pytest

from tests import notebooks

NOTEBOOK = notebooks.notebook_path("grokking.ipynb")
# e.g. "seed 42: memorised at epoch None, sensitivity falls at epoch 12, grokked at epoch
# None, lead = None, final test accuracy = 0.083".
LINE = re.compile(r"^seed (?P<seed>\d+): memorised at epoch (?:\d+|None), sensitivity falls "
                  r"at epoch (?:\d+|None), grokked at epoch (?:\d+|None), lead = (?:-?\d+|None), "
                  r"final test accuracy = (?P<acc>[0-9.]+)$", re.MULTILINE)


def test_committed_notebook_is_clean():
  source = notebooks.committed_source(NOTEBOOK)
  assert re.search(r"^VARIANT = ", source, re.MULTILINE)
  assert "2403.06925" in source and "XSENS_NOTEBOOK_SMOKE" in source


def test_stored_run_groks():
  # The stored outputs come from the CPU default (p = 59, 7,500 epochs): the model memorises
  # its training set early and the test accuracy jumps thousands of epochs later.
  nb = nbformat.read(NOTEBOOK, as_version=4)
  stdout = notebooks.stdout(nb)
  assert "smoke=False p=59 epochs=7500" in stdout
  m = re.search(r"^seed 42: memorised at epoch (\d+), sensitivity falls at epoch (\d+), grokked "
                r"at epoch (\d+), lead = (-?\d+), final test accuracy = ([0-9.]+)$", stdout, re.M)
  assert m, stdout[-500:]
  memorised, _, grokked, _, final = (float(g) for g in m.groups())
  assert memorised < 200 and grokked > memorised + 2000 and final >= 0.95, m.group(0)


@pytest.mark.slow
def test_notebook_runs_in_smoke_mode():
  nb = notebooks.execute_smoke(NOTEBOOK)
  assert not notebooks.outputs(nb, "error")
  stdout = notebooks.stdout(nb)
  assert "smoke=True p=11 epochs=30 seeds=2" in stdout
  found = {int(m["seed"]): float(m["acc"]) for m in LINE.finditer(stdout)}
  assert set(found) == {42, 43}, stdout
  assert all(0.0 <= v <= 1.0 for v in found.values())
  assert len(notebooks.png_outputs(nb)) == 2  # the two figures
