"""Statistics over training seeds: mean ± standard error per run, and their table.

A run trained under several seeds has one row per run id (`xsens.lab.multirun.run_ids`:
`<run>` for seed 0, `<run>_seed<i>` for seed i); `seed_rows` groups them into one row per
run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from xsens.report import tables


def mean_and_stderr(values) -> tuple[float, float]:
  """Mean and standard error (sample std / √n; NaN for n < 2) of finite `values`; NaNs
  are ignored (NaN mean when none is finite)."""
  v = np.asarray([x for x in values if x is not None], np.float64)
  v = v[np.isfinite(v)]
  if not len(v):
    return float("nan"), float("nan")
  se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
  return float(v.mean()), se


def seed_rows(rows: list[dict], ids: dict[str, tuple[str, int]], columns,
              group_by: Sequence[str] = ()) -> list[dict]:
  """One row per run of `rows` (one per run id, key "run"), and per value of the keys
  `group_by`: for each of `columns`, the mean over its seeds and `<column> s.e.` their
  standard error (NaN where no seed has a value); `seeds` = n."""
  groups: dict[tuple, list[dict]] = {}
  for row in rows:
    key = (ids[row["run"]][0],) + tuple(row[k] for k in group_by)
    groups.setdefault(key, []).append(row)
  out = []
  for (name, *values), group in groups.items():
    agg = {"run": name, **dict(zip(group_by, values)), "seeds": len(group)}
    for c in columns:
      agg[c], agg[f"{c} s.e."] = mean_and_stderr([r.get(c) for r in group])
    out.append(agg)
  return out


def seed_summary_markdown(summary: list[dict], columns, per_seed_note: str = "") -> str:
  """The table of `seed_rows`: one row per run, each column "mean ± s.e." over its seeds;
  `per_seed_note` follows "one row per seed is above" (e.g. what that row's ± is over)."""
  def cell(row, c):
    mean, se = row[c], row[f"{c} s.e."]
    return tables.format_value(mean) + ("" if not np.isfinite(se) else
                                        f" ± {tables.format_value(se, 2)}")
  table = [{"run": r["run"], "seeds": r["seeds"], **{c: cell(r, c) for c in columns}}
           for r in summary]
  return (f"Mean ± standard error over the training seeds (one row per seed is above"
          f"{per_seed_note}):\n\n" + tables.markdown_table(table, ["run", "seeds", *columns])
          + "\n")
