"""Executes colab/robustness.ipynb end to end in smoke mode (a real kernel, < 60 s)."""

import re

import pytest

from tests import notebooks

NOTEBOOK = notebooks.notebook_path("robustness.ipynb")
MODELS = ("ViT", "ResNet-18")
# e.g. "ViT: clean accuracy 0.850, mean corruption accuracy 0.770 (drop +0.080; 3 ...".
CORRUPTION_LINE = re.compile(
    r"^(?P<model>.+?): clean accuracy (?P<clean>[0-9.]+), "
    r"mean corruption accuracy (?P<mca>[0-9.]+) \(", re.MULTILINE)
# e.g. "ResNet-18: intact accuracy 0.943, worst removal stage1_block1 -> 0.140, mean ...".
REMOVAL_LINE = re.compile(
    r"^(?P<model>.+?): intact accuracy (?P<intact>[0-9.]+), "
    r"worst removal (?P<variant>.+?) -> (?P<worst>[0-9.]+), ", re.MULTILINE)
MCE_LINE = re.compile(r"^(?P<model>.+?): mCE (?P<mce>[0-9.]+)", re.MULTILINE)
NUM_SMOKE_IMAGES = 64


def test_committed_notebook_is_clean():
  source = notebooks.committed_source(NOTEBOOK)
  assert re.search(r"^TRAIN_STEPS = ", source, re.MULTILINE)
  assert "2103.14586" in source and "1903.12261" in source
  assert "XSENS_NOTEBOOK_SMOKE" in source



@pytest.fixture(scope="module")
def executed_notebook():
  return notebooks.execute_smoke(NOTEBOOK, timeout=180)


def _stdout(nb):
  return notebooks.stdout(nb)


@pytest.mark.slow
def test_notebook_runs_without_errors(executed_notebook):
  nb = executed_notebook
  assert not notebooks.outputs(nb, "error")
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert cell.execution_count is not None, cell.source[:80]
  assert "smoke=True" in _stdout(nb)


@pytest.mark.slow
def test_notebook_reports_accuracies_of_both_models(executed_notebook):
  stdout = _stdout(executed_notebook)
  corr = {m["model"]: m for m in CORRUPTION_LINE.finditer(stdout)}
  removal = {m["model"]: m for m in REMOVAL_LINE.finditer(stdout)}
  mce = {m["model"]: float(m["mce"]) for m in MCE_LINE.finditer(stdout)}
  assert set(corr) == set(MODELS), stdout
  assert set(removal) == set(MODELS), stdout
  assert set(mce) == set(MODELS), stdout
  assert mce["ResNet-18"] == pytest.approx(1.0)  # The baseline of the mCE.
  for model in MODELS:
    clean, mca = float(corr[model]["clean"]), float(corr[model]["mca"])
    intact, worst = float(removal[model]["intact"]), float(removal[model]["worst"])
    for value in (clean, mca, intact, worst):
      assert 0.0 <= value <= 1.0, (model, value)
    assert worst <= intact
    # Same images, same eval-mode model, two code paths (argmax ties aside).
    assert abs(clean - intact) <= 2 / NUM_SMOKE_IMAGES, (model, clean, intact)
  # One "  without <branch>" line per removed branch: ViT depth 2 (the smoke setting; 4 in
  # full mode) x (block, attention, mlp); the ResNet-18's 5 identity-shortcut blocks.
  vit_part, resnet_part = stdout.split("ResNet-18: intact accuracy")[-2:]
  vit_part = vit_part.split("ViT: intact accuracy")[-1]
  assert len(re.findall(r"^  without (block|attention|mlp) \d", vit_part, re.M)) == 6
  assert len(re.findall(r"^  without stage\d_block\d", resnet_part, re.M)) == 5


@pytest.mark.slow
def test_notebook_shows_figures(executed_notebook):
  nb = executed_notebook
  images = [o for o in notebooks.outputs(nb, "display_data") + notebooks.outputs(nb, "execute_result")
            if "image/png" in o.get("data", {})]
  # Corruption gallery, accuracy vs severity, per-category bars, layer-removal bars.
  assert len(images) >= 4, f"{len(images)} image/png outputs"
