"""Model choice on a validation split (`xsens.lab.selection`) and the studies' choices."""

import numpy as np
import pytest

from mlcollections_configs import churn as churn_config
from mlcollections_configs import distillation as distill_config
from mlcollections_configs import reuse as reuse_config
from xsens.lab import selection
from xsens.studies import churn as churn_study
from xsens.studies import distillation as distill_study
from xsens.studies import reuse as reuse_study

# A fake table where validation and eval disagree: `b` is best on val, `c` on eval.
TABLE = [{"run": "a", "val": 0.80, "eval": 0.81},
         {"run": "b", "val": 0.90, "eval": 0.79},
         {"run": "c", "val": 0.85, "eval": 0.95}]


@pytest.mark.parametrize("n, fraction", [(1000, 0.5), (364, 0.5), (10, 0.3)])
def test_split_is_disjoint_covering_and_seeded(n, fraction):
  val, ev = selection.split_val_eval(n, fraction, seed=0)
  assert len(val) == round(fraction * n) and len(val) + len(ev) == n
  assert not set(val.tolist()) & set(ev.tolist())
  np.testing.assert_array_equal(np.sort(np.concatenate([val, ev])), np.arange(n))
  again, _ = selection.split_val_eval(n, fraction, seed=0)
  np.testing.assert_array_equal(val, again)
  other, _ = selection.split_val_eval(n, fraction, seed=1)
  assert not np.array_equal(val, other)


def test_pick_on_val_uses_only_the_validation_column():
  assert selection.pick_on_val(TABLE, "val")["run"] == "b"
  assert selection.pick_on_val(TABLE, "eval")["run"] == "c"   # What eval would have picked.
  assert selection.pick_on_val(TABLE, "val", higher_is_better=False)["run"] == "a"
  # Eval numbers cannot move the choice.
  shuffled = [{**r, "eval": e} for r, e in zip(TABLE, (1.0, 0.0, 0.5))]
  assert selection.pick_on_val(shuffled, "val")["run"] == "b"
  # Ties: the first candidate.
  tied = [{"run": "x", "val": 0.5}, {"run": "y", "val": 0.5}]
  assert selection.pick_on_val(tied, "val")["run"] == "x"
  assert selection.pick_on_val(tied, "val", higher_is_better=False)["run"] == "x"
  with pytest.raises(ValueError, match="non-finite"):
    selection.pick_on_val([{"val": float("nan")}, {"val": 0.1}], "val")
  with pytest.raises(ValueError, match="no candidates"):
    selection.pick_on_val([], "val")


def test_distillation_choice_grid_and_val_only_pick():
  config = distill_config.get_config()
  cands = distill_study.kd_candidates(config)
  # 2 students x 2 α x 2 τ, distinct run names; selection runs use `select_seed`.
  assert len(cands) == 8 and len({c["run"] for c in cands}) == 8
  assert {c["student"] for c in cands} == {"cnn", "mlp"}
  assert config.distillation.select_seed not in config.distillation.seeds
  val = {c["run"]: 0.5 for c in cands}
  best = distill_study.select_name("mlp", 0.9, 1.0)
  val[best] = 0.7
  chosen = distill_study.choose(cands, val)
  assert (chosen["run"], chosen["student"], chosen["alpha"], chosen["temperature"]) == (
      best, "mlp", 0.9, 1.0)
  # Overrides of a selection run: its student's model, the select seed, α and τ.
  over = distill_study.student_overrides(config, "kd", 100, "<t>", student="mlp", alpha=0.9,
                                         temperature=1.0)
  assert over["model"]["name"] == "mlp" and over["init_seed"] == 100
  assert over["distill"]["alpha"] == 0.9 and over["distill"]["temperature"] == 1.0
  paths = distill_study.field_path(config, {best: "mlp"})
  assert paths(best, "init_seed") == "distillation.select_seed"
  assert paths(best, "model.hidden_dims") == "students.mlp.model.hidden_dims"
  assert paths(best, "distill.alpha") == "distillation.alphas"
  assert paths("teacher_s1", "init_seed") == "distillation.seeds"
  assert paths("teacher_s1", "model.features") == "teacher.model.features"


def test_churn_disjoint_pairs_share_no_run_and_choice_reads_val_only():
  names = [f"r{j}" for j in range(10)]
  disjoint = churn_study.pairs(names, "disjoint")
  assert disjoint == [("r0", "r1"), ("r2", "r3"), ("r4", "r5"), ("r6", "r7"), ("r8", "r9")]
  used = [n for p in disjoint for n in p]
  assert len(used) == len(set(used))
  assert len(churn_study.pairs(names[:3], "all")) == 3
  val_churn = {"baseline": 0.03, "me": 0.025, "me_strong": 0.02, "co": 0.028, "co_b1": 0.029}
  groups = {"me": ["me", "me_strong"], "co": ["co", "co_b1"]}
  assert churn_study.choose_methods(val_churn, groups) == {"me": "me_strong", "co": "co"}


def test_reuse_candidates_exclude_baseline_and_control():
  config = reuse_config.get_config()
  cands = reuse_study.reuse_candidates(config)
  assert set(cands) == {"reuse_p2_k2", "reuse_p2_k3", "reuse_p4_k2", "reuse_p4_k3"}
  assert config.reuse.num_seeds >= 3


@pytest.mark.parametrize("module, field, value, match", [
    (distill_config, "distillation.select_seed", 0, "not in distillation.seeds"),
    (distill_config, "distillation.alphas", (0.5, 1.5), "in \\[0, 1\\]"),
    (distill_config, "distillation.temperatures", (), "> 0"),
    (distill_config, "distillation.margin_scales", (1.0, 1.0), "distinct"),
    (churn_config, "churn.pairing", "some", "allowed: disjoint, all"),
    (churn_config, "churn.num_seeds", 5, "must be even"),
    (churn_config, "churn.baseline", "nope", "is not a method"),
    (churn_config, "churn.select", {"g": ("nope",)}, "distinct method names"),
    (churn_config, "churn.val_fraction", 1.0, "in \\(0, 1\\)"),
    (reuse_config, "reuse.num_seeds", 0, "positive int"),
    (reuse_config, "reuse.val_fraction", 0.0, "in \\(0, 1\\)"),
])
def test_bad_selection_fields_are_one_line_errors(module, field, value, match):
  from xsens.errors import ConfigError  # pylint: disable=g-import-not-at-top
  config = module.get_config("smoke")
  node, leaf = config, field.split(".")
  for part in leaf[:-1]:
    node = node[part]
  node[leaf[-1]] = value
  with pytest.raises(ConfigError, match=f"config.{field}(\\.g)?: .*{match}"):
    module.validate(config)
