"""The README's "Use it from Python" example runs, and the README shows the code it runs."""

import pytest
import os
import re

import numpy as np

from tests.helpers import REPO


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(workdir, the example's numbers): the smoke run trained once for this module."""
  from experiments import use_from_python  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path_factory.mktemp("use_from_python") / "run")
  return workdir, use_from_python.main(workdir)


@pytest.mark.slow
def test_readme_example_runs_and_gives_sane_numbers(trained):
  out = trained[1]
  sens = np.asarray(out["sensitivity"])
  assert sens.shape == (3,) and np.all((sens >= 0) & (sens <= 1))
  assert sens[0] <= sens[1] <= sens[2]  # More noise, more flips (same draws, larger σ).
  assert 0.0 <= float(out["cka_first_last"]) <= 1.0 + 1e-6
  for k in ("clean_accuracy", "fgsm_accuracy", "gaussian_noise_3"):
    assert 0.0 <= float(out[k]) <= 1.0
  assert float(out["fgsm_accuracy"]) <= float(out["clean_accuracy"])


def test_readme_shows_the_example_verbatim():
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  block = re.search(r"## Use it from Python.*?```python\n(.*?)```", readme, re.S).group(1)
  with open(os.path.join(REPO, "experiments", "use_from_python.py"), encoding="utf-8") as f:
    source = f.read()
  for line in block.strip().splitlines():
    if not line.startswith(("workdir =", "print(")):  # The file's main() has these as
      assert line.strip() in source, line              # an argument and a loop.


@pytest.mark.slow
def test_every_block_of_the_readme_python_section_runs_as_written(trained):
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    section = re.search(r"## Use it from Python\n(.*?)\n## ", f.read(), re.S).group(1)
  blocks = re.findall(r"```python\n(.*?)```", section, re.S)
  assert len(blocks) >= 2
  workdir_line = 'workdir = "workdirs/use_from_python"'
  assert workdir_line in blocks[0]
  blocks[0] = blocks[0].replace(workdir_line, f"workdir = {trained[0]!r}")  # Resumes.
  namespace = {}
  for i, block in enumerate(blocks):
    exec(compile(block, f"README.md, Use it from Python, block {i}", "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["noisy"].shape == namespace["x"].shape
  curve = np.asarray(namespace["curve"]["mean"])
  assert curve.shape == (3,) and np.all((curve >= 0) & (curve <= 1))
