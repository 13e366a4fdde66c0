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
                  r"A_FS=(?P<afs>[0-9.]+) A_M_train=[0-9.]+ background=[0-9.]+$", re.MULTILINE)


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
  e = config.edit
  assert len(results["runs"]) == e.num_seeds * len(e.learning_rates) * (
      1 + len(e.linf_deltas) + len(e.l2_deltas) + len(e.parts) * len(e.parts_deltas) + 1)
  by = {(r["method"], r["variant"]): r for r in out["rows"]}
  # δ = 0 changes nothing: the parameters stay θ₀, so both norms give the same metrics.
  lr = e.learning_rates[0]
  zero_inf, zero_l2 = by[("linf", f"δ=0 lr={lr:g}")], by[("l2", f"δ=0 lr={lr:g}")]
  assert zero_inf["‖θ−θ₀‖"] == 0.0 and zero_l2["‖θ−θ₀‖"] == 0.0
  for k in mm.METRICS:
    assert zero_inf[k] == zero_l2[k]
  # The ℓ∞ radius holds for every constrained variant; plain fine-tuning moves further.
  for r in results["runs"]:
    if r["method"] in ("linf", "parts") and r["delta"] > 0:
      assert r["distance"] <= r["delta"] * (1 + 1e-6) + 1e-7
  assert by[("finetune", f"δ=∞ lr={lr:g}")]["‖θ−θ₀‖"] > 0
  # One chosen row per method (per part for parts), each the validation argmax.
  assert len(out["chosen"]) == len(e.methods) - 1 + len(e.parts)
  for c in out["chosen"]:
    group = [r for r in out["rows"] if mm.selection_group(r) == mm.selection_group(c)]
    assert c["A_bar_val"] == max(r["A_bar_val"] for r in group)
  for r in out["rows"]:
    assert all(0.0 <= r[k] <= 1.0 for k in mm.METRICS)
  # The rerun resumed every finished run from its checkpoint: the same numbers.
  # results.json: "rows" the chosen settings (the headline table), "sweep" every setting.
  for k in ("A_M", "A_FS"):
    np.testing.assert_array_equal([r[k] for r in out["rows"]],
                                  [r[k] for r in results["sweep"]])
    np.testing.assert_array_equal([r[k] for r in out["chosen"]],
                                  [r[k] for r in results["rows"]])
  # Another config in the same workdir is refused before anything runs.
  changed = mm_config.get_config("smoke")
  changed.edit.steps = 7
  with pytest.raises(ConfigError, match=r"config\.workdir: .*edit\.steps"):
    mm.run(changed, workdir, log=lambda *_: None)
