"""Result tables: results.json and a markdown results.md in a workdir (local or remote;
written by process 0 only)."""

from __future__ import annotations

import json
import math
import os
from typing import Sequence

from xsens import paths


# What a table shows for a value that is None (an event not reached, a quantity not
# measured); results.json keeps null.
NO_VALUE = "—"


def format_value(value, digits: int = 4) -> str:
  if value is None:
    return NO_VALUE
  if isinstance(value, bool):
    return str(value)
  if isinstance(value, int):
    return f"{value:,}"
  if isinstance(value, float):
    return "nan" if math.isnan(value) else f"{value:.{digits}g}"
  return str(value)


def markdown_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
  """A GitHub markdown table; `columns` defaults to the keys of the first row, in order."""
  if not rows:
    return "(no rows)\n"
  columns = list(columns or rows[0].keys())
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for row in rows:
    lines.append("| " + " | ".join(format_value(row.get(c, "")) for c in columns) + " |")
  return "\n".join(lines) + "\n"


def write_results(workdir: str, title: str, rows: Sequence[dict], *,
                  columns: Sequence[str] | None = None, notes: str = "",
                  extra: dict | None = None, plots: Sequence[str] = ()) -> str:
  """Writes `results.json` (rows + extra) and `results.md` (title, table, notes, plots);
  a None cell shows as `NO_VALUE`, explained below the table.

  Returns the markdown text (on every process). Files are replaced atomically, by process 0
  only (`xsens.paths.is_writer`).
  """
  writer = paths.is_writer()
  if writer:
    paths.makedirs(workdir)
  payload = {"title": title, "rows": list(rows), **(extra or {})}
  if writer:
    paths.write_text(os.path.join(workdir, "results.json"), json.dumps(payload, indent=2))
  md = f"# {title}\n\n" + markdown_table(rows, columns)
  if any(row.get(c, "") is None for row in rows for c in (columns or rows[0].keys())):
    md += f"\n{NO_VALUE}: no value (not reached within the run, or not measured).\n"
  if notes:
    md += "\n" + notes.strip() + "\n"
  for plot in plots:
    md += f"\n![{os.path.splitext(plot)[0]}]({plot})\n"
  if writer:
    paths.write_text(os.path.join(workdir, "results.md"), md)
    write_tensorboard(workdir, rows, md, extra)
  return md


RESULTS_SUFFIX = ".results"   # tb/events.out.tfevents.<time>.<host>.results


def headline_scalars(rows: Sequence[dict], extra: dict | None = None) -> dict[str, float]:
  """`{"results/<row>/<column>": value}` for every finite number of the table (a row is
  named by its "run", "model" or "name" cell, else its index), plus `results/<key>` for
  the top-level numbers of `extra`."""
  out = {}
  for i, row in enumerate(rows):
    label = next((str(row[k]) for k in ("run", "model", "name") if k in row), str(i))
    for column, value in row.items():
      if _is_number(value):
        out[f"results/{label}/{column}"] = float(value)
  for key, value in (extra or {}).items():
    if _is_number(value):
      out[f"results/{key}"] = float(value)
  return out


def _is_number(value) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def write_tensorboard(workdir: str, rows: Sequence[dict], markdown: str,
                      extra: dict | None = None) -> None:
  """The headline numbers (`headline_scalars`, at step 0) and the results markdown (text
  summary "results") in `<workdir>/tb`, in one event file named `*.results` that replaces
  the one of an earlier write (a rerun shows each number once)."""
  from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  from xsens.train import metrics  # pylint: disable=g-import-not-at-top
  folder = os.path.join(workdir, metrics.TB_DIR)
  if paths.is_remote(folder):
    metrics.register_epath_writer(folder)
  if paths.isdir(folder):
    for name in paths.listdir(folder):
      if name.startswith(metrics.EVENTS_PREFIX) and (name.endswith(RESULTS_SUFFIX)
                                                     or RESULTS_SUFFIX + "." in name):
        paths.remove(os.path.join(folder, name))
  tb = SummaryWriter(folder, filename_suffix=RESULTS_SUFFIX)
  try:
    for tag, value in headline_scalars(rows, extra).items():
      tb.add_scalar(tag, value, 0)
    tb.add_text("results", markdown, 0)
  finally:
    tb.close()
