"""The modify_memories study end to end (config `smoke`), and its resume.

The smoke study is trained once per session: by colab/modify_memories.ipynb, executed in
smoke mode (a real kernel; it runs `modify_memories.run` on the `smoke` config), whose
workdir the study test then resumes in this process.
"""

import json
import os
import re

import numpy as np
import pytest

from mlcollections_configs import modify_memories as mm_config
from tests import notebooks
from xsens.errors import ConfigError
from xsens.studies import modify_memories as mm

NOTEBOOK = notebooks.notebook_path("modify_memories.ipynb")
# e.g. "|S|=4 linf δ=0.01: A_M=0.000 A_FS=0.117 A_M_para=0.000 background=0.031".
LINE = re.compile(r"^\|S\|=(?P<size>\d+) (?P<method>\w+) (?P<variant>\S+): A_M=(?P<am>[0-9.]+) "
                  r"A_FS=(?P<afs>[0-9.]+) A_M_para=[0-9.]+ background=[0-9.]+$", re.MULTILINE)


@pytest.fixture(scope="module")
def notebook_run(tmp_path_factory):
  """(the executed notebook, the workdir of the smoke study it ran)."""
  keep = str(tmp_path_factory.mktemp("mm_notebook"))
  nb = notebooks.execute_smoke(NOTEBOOK, keep_tmp=keep)
  return nb, notebooks.kept_dir(keep, "xsens_modify_memories_")


@pytest.mark.slow
def test_notebook_runs_in_smoke_mode(notebook_run):
  """colab/modify_memories.ipynb end to end in smoke mode (tests/colab_modify_memories_test.py
  checks the committed notebook)."""
  nb, _ = notebook_run
  assert not notebooks.outputs(nb, "error")
  stdout = notebooks.stdout(nb)
  assert "smoke=True facts=96 sizes=[4] seeds=2 edit_steps=6" in stdout
  found = {(m["method"], m["variant"]): (float(m["am"]), float(m["afs"]))
           for m in LINE.finditer(stdout)}
  assert {m for m, _ in found} == {"finetune", "replay", "linf", "l2", "parts"}, stdout
  assert all(0.0 <= v <= 1.0 for pair in found.values() for v in pair)
  assert len(notebooks.png_outputs(nb)) == 2  # the two figures


@pytest.mark.slow
def test_smoke_end_to_end(notebook_run):
  """The `smoke` study as the notebook trained it (`modify_memories.run` from scratch, in
  its kernel), and a rerun here, which resumes every finished run from its checkpoint."""
  config = mm_config.get_config("smoke")
  workdir = notebook_run[1]
  results = json.load(open(os.path.join(workdir, "results.json")))   # Of the first run.
  out = mm.run(config, workdir, log=lambda *_: None)
  for name in ("trade_off.png", "parts.png", "steps.png", "results.md"):
    assert os.path.exists(os.path.join(workdir, name)), name
  methods = {r["method"] for r in out["rows"]}
  assert methods == set(config.edit.methods)
  assert len(results["runs"]) == config.edit.num_seeds * (
      1 + len(config.edit.linf_deltas) + len(config.edit.l2_deltas) + len(config.edit.parts) + 1)
  by = {(r["method"], r["variant"]): r for r in out["rows"]}
  # δ = 0 changes nothing: the parameters stay θ₀, so both norms give the same metrics.
  zero_inf, zero_l2 = by[("linf", "δ=0")], by[("l2", "δ=0")]
  assert zero_inf["‖θ−θ₀‖"] == 0.0 and zero_l2["‖θ−θ₀‖"] == 0.0
  for k in mm.METRICS:
    assert zero_inf[k] == zero_l2[k]
  # The ℓ∞ radius holds for every constrained variant; plain fine-tuning moves further.
  for r in results["runs"]:
    if r["method"] in ("linf", "parts") and r["variant"] != "δ=0":
      delta = float(config.edit.parts_delta if r["method"] == "parts"
                    else r["variant"].split("=")[1])
      assert r["distance"] <= delta * (1 + 1e-6) + 1e-7
  assert by[("finetune", "δ=∞")]["‖θ−θ₀‖"] > 0
  for r in out["rows"]:
    assert all(0.0 <= r[k] <= 1.0 for k in mm.METRICS)
  # The rerun resumed every finished run from its checkpoint: the same numbers.
  np.testing.assert_array_equal([r["A_M"] for r in out["rows"]],
                                [r["A_M"] for r in results["rows"]])
  np.testing.assert_array_equal([r["A_FS"] for r in out["rows"]],
                                [r["A_FS"] for r in results["rows"]])
  # Another config in the same workdir is refused before anything runs.
  changed = mm_config.get_config("smoke")
  changed.edit.steps = 7
  with pytest.raises(ConfigError, match=r"config\.workdir: .*edit\.steps"):
    mm.run(changed, workdir, log=lambda *_: None)
