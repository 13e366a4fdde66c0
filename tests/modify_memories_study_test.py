"""The modify_memories study end to end (config `smoke`), and its resume."""

import json
import os

import numpy as np
import pytest

from mlcollections_configs import modify_memories as mm_config
from xsens.errors import ConfigError
from xsens.studies import modify_memories as mm


@pytest.mark.slow
def test_smoke_end_to_end(tmp_path):
  config = mm_config.get_config("smoke")
  workdir = str(tmp_path / "mm")
  out = mm.run(config, workdir, log=lambda *_: None)
  results = json.load(open(os.path.join(workdir, "results.json")))
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
  # A rerun resumes every finished run from its checkpoint: the same numbers.
  again = mm.run(config, workdir, log=lambda *_: None)
  np.testing.assert_array_equal([r["A_M"] for r in again["rows"]],
                                [r["A_M"] for r in out["rows"]])
  np.testing.assert_array_equal([r["A_FS"] for r in again["rows"]],
                                [r["A_FS"] for r in out["rows"]])
  # Another config in the same workdir is refused before anything runs.
  changed = mm_config.get_config("smoke")
  changed.edit.steps = 7
  with pytest.raises(ConfigError, match=r"config\.workdir: .*edit\.steps"):
    mm.run(changed, workdir, log=lambda *_: None)
