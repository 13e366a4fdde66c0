"""Executes colab/modify_memories.ipynb end to end in smoke mode (a real kernel)."""

import re

import pytest

from tests import notebooks

NOTEBOOK = notebooks.notebook_path("modify_memories.ipynb")
# e.g. "|S|=4 linf δ=0.01: A_M=0.000 A_FS=0.117 A_M_para=0.000 background=0.031".
LINE = re.compile(r"^\|S\|=(?P<size>\d+) (?P<method>\w+) (?P<variant>\S+): A_M=(?P<am>[0-9.]+) "
                  r"A_FS=(?P<afs>[0-9.]+) A_M_para=[0-9.]+ background=[0-9.]+$", re.MULTILINE)


def test_committed_notebook_is_clean():
  source = notebooks.committed_source(NOTEBOOK)
  assert re.search(r"^VARIANT = ", source, re.MULTILINE)
  assert "2012.00363" in source and "XSENS_NOTEBOOK_SMOKE" in source


@pytest.mark.slow
def test_notebook_runs_in_smoke_mode():
  nb = notebooks.execute_smoke(NOTEBOOK)
  assert not notebooks.outputs(nb, "error")
  stdout = notebooks.stdout(nb)
  assert "smoke=True facts=96 sizes=[4] seeds=2 edit_steps=6" in stdout
  found = {(m["method"], m["variant"]): (float(m["am"]), float(m["afs"]))
           for m in LINE.finditer(stdout)}
  assert {m for m, _ in found} == {"finetune", "replay", "linf", "l2", "parts"}, stdout
  assert all(0.0 <= v <= 1.0 for pair in found.values() for v in pair)
  assert len(notebooks.png_outputs(nb)) == 2  # the two figures
