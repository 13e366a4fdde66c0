"""The `position_encoding` study (DIET, issue 18 D): smoke run end to end, config errors."""

import os

import pytest

from mlcollections_configs import position_encoding as pe_config
from xsens import studies
from xsens.errors import ConfigError
from xsens.models import position
from xsens.train import workdir as workdir_lib


@pytest.mark.slow
def test_smoke_study_writes_the_report(tmp_path):
  config = pe_config.get_config("smoke")
  out = studies.run(config, str(tmp_path))
  rows = {r["run"]: r for r in out["rows"]}
  assert set(rows) == {"match_absolute", "match_diet_abs", "match_diet_rel"}
  for name in rows:
    assert workdir_lib.Workdir(os.path.join(tmp_path, "runs", name)).latest_step() == 4
    assert 0.0 <= rows[name]["test_accuracy"] <= 1.0
  # Theorem 1 on the smoke model (width 8, 2 heads: d_h = 4; L = 12): input PE <= d_h,
  # DIET-ABS <= d_h + d_p + 2 segment blocks, DIET-REL up to L.
  assert rows["match_absolute"]["logit_rank_max"] <= 4
  assert 4 < rows["match_diet_abs"]["logit_rank_max"] <= 10
  assert rows["match_diet_rel"]["logit_rank_max"] > 10
  costs = {c["mode"]: c for c in out["costs"]}
  for c in costs.values():   # ratios to the input-PE baseline, from the measured columns
    assert c["flops_ratio"] == pytest.approx(c["forward_flops"]
                                             / costs["absolute"]["forward_flops"])
    assert c["step_time_ratio"] == pytest.approx(c["step_ms"] / costs["absolute"]["step_ms"])
  # DIET-REL adds an L × L bias per head and layer to the scores: more forward FLOPs.
  assert costs["diet_rel"]["forward_flops"] > costs["absolute"]["forward_flops"]
  # Parameters: the input table (L_max · D) is replaced by each mode's own terms.
  m = config.runs.match_absolute.model
  d_h = m.width // m.num_heads
  extra_abs = 2 * m.num_heads * m.max_length * d_h + 4 * m.num_heads
  extra_rel = m.depth * (m.num_heads * (2 * m.max_length - 1) + 4 * m.num_heads)
  table = m.max_length * m.width
  assert costs["diet_abs"]["params"] == costs["absolute"]["params"] - table + extra_abs
  assert costs["diet_rel"]["params"] == costs["absolute"]["params"] - table + extra_rel
  for name in ("results.md", "accuracy.png", "diet_abs_maps.png", "diet_rel_maps.png"):
    assert os.path.exists(tmp_path / name), name


def test_config_variants_and_errors(tmp_path):
  config = pe_config.get_config("")
  assert config.num_seeds == 3
  modes = {r.model.position for r in config.runs.values()}
  assert modes <= set(position.POSITIONS) and {"absolute", "diet_abs", "diet_rel"} <= modes
  glue = pe_config.get_config("setup=glue")
  assert {r.data.name for r in glue.runs.values()} == {"glue/mrpc", "glue/qqp", "glue/rte"}
  with pytest.raises(ValueError, match="unknown mode 'alibi'"):
    pe_config.get_config("modes=absolute+alibi")
  config = pe_config.get_config("smoke")
  config.runs.match_diet_abs.model.position = "alibi"
  with pytest.raises(ConfigError, match=r"runs\.match_diet_abs\.model\.position") as e:
    studies.run(config, str(tmp_path))
  assert "\n" not in str(e.value)
  config = pe_config.get_config("smoke")
  config.position_encoding.baseline_mode = "t5"
  with pytest.raises(ConfigError, match=r"position_encoding\.baseline_mode"):
    studies.run(config, str(tmp_path))
  assert not os.listdir(tmp_path)
