"""Result tables: results.json and a markdown results.md in a workdir (local or remote;
written by process 0 only)."""

from __future__ import annotations

import json
import math
import os
from typing import Sequence

from xsens import paths


def format_value(value, digits: int = 4) -> str:
  if isinstance(value, bool) or value is None:
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
  """Writes `results.json` (rows + extra) and `results.md` (title, table, notes, plots).

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
  if notes:
    md += "\n" + notes.strip() + "\n"
  for plot in plots:
    md += f"\n![{os.path.splitext(plot)[0]}]({plot})\n"
  if writer:
    paths.write_text(os.path.join(workdir, "results.md"), md)
  return md
