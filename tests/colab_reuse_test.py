"""Executes colab/reuse_attention.ipynb end to end in smoke mode (a real kernel)."""

import re

import pytest

from tests import notebooks

NOTEBOOK = notebooks.notebook_path("reuse_attention.ipynb")
# e.g. "ViT (trained): adjacent-layer similarity = 0.612".
LINE = re.compile(r"^(?P<name>.+?): adjacent-layer similarity = (?P<value>[0-9.]+)$",
                  re.MULTILINE)


def test_committed_notebook_is_clean():
  source = notebooks.committed_source(NOTEBOOK)
  assert re.search(r"^TRAIN_STEPS = ", source, re.MULTILINE)
  assert "2110.06821" in source and "XSENS_NOTEBOOK_SMOKE" in source


@pytest.mark.slow
def test_notebook_runs_in_smoke_mode():
  nb = notebooks.execute_smoke(NOTEBOOK)
  assert not notebooks.outputs(nb, "error")
  stdout = notebooks.stdout(nb)
  assert "smoke=True" in stdout
  found = {m["name"]: float(m["value"]) for m in LINE.finditer(stdout)}
  assert set(found) == {"ViT (trained)", "ViT (random init)", "Reuse ViT (trained)"}, stdout
  assert all(0.0 <= v <= 1.0 for v in found.values())
  assert len(notebooks.png_outputs(nb)) == 2  # the two figures
