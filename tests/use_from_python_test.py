"""The "Use it from Python" examples run as written: the README's short one, and the longer
ones of docs/usage.md, which shows the code of experiments/use_from_python.py."""

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


WORKDIR = '"workdirs/use_from_python"'  # The path every example trains in (or resumes).


def python_blocks(rel: str) -> list[str]:
  """The ```python blocks of the "## Use it from Python" section of the page `rel`."""
  with open(os.path.join(REPO, rel), encoding="utf-8") as f:
    section = re.search(r"## Use it from Python\n(.*?)(?:\n## |\Z)", f.read(), re.S).group(1)
  return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_example_is_short_and_points_to_the_rest():
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    section = f.read().split("## Use it from Python", 1)[1].split("\n## ", 1)[0]
  blocks = python_blocks("README.md")
  assert len(blocks) == 1 and len(blocks[0].strip().splitlines()) <= 15, blocks
  assert WORKDIR in blocks[0]
  assert "(docs/usage.md)" in section


def test_docs_show_the_example_verbatim():
  block = python_blocks("docs/usage.md")[0]
  with open(os.path.join(REPO, "experiments", "use_from_python.py"), encoding="utf-8") as f:
    source = f.read()
  for line in block.strip().splitlines():
    if not line.startswith(("workdir =", "print(")):  # The file's main() has these as
      assert line.strip() in source, line              # an argument and a loop.


@pytest.mark.slow
def test_readme_example_runs_as_written(trained, capsys):
  block = python_blocks("README.md")[0].replace(WORKDIR, repr(trained[0]))  # Resumes.
  namespace = {}
  exec(compile(block, "README.md, Use it from Python", "exec"), namespace)  # pylint: disable=exec-used
  sens = float(capsys.readouterr().out.strip())
  assert 0.0 <= sens <= 1.0
  assert namespace["run"].summary["steps"] == 60  # The trained run, resumed as it was.


@pytest.mark.slow
def test_every_block_of_the_docs_python_section_runs_as_written(trained):
  blocks = python_blocks("docs/usage.md")
  assert len(blocks) >= 2
  workdir_line = f"workdir = {WORKDIR}"
  assert workdir_line in blocks[0]
  blocks[0] = blocks[0].replace(workdir_line, f"workdir = {trained[0]!r}")  # Resumes.
  namespace = {}
  for i, block in enumerate(blocks):
    exec(compile(block, f"docs/usage.md, Use it from Python, block {i}", "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["noisy"].shape == namespace["x"].shape
  curve = np.asarray(namespace["curve"]["mean"])
  assert curve.shape == (3,) and np.all((curve >= 0) & (curve <= 1))
