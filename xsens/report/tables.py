"""Result tables: results.json and a markdown results.md in a workdir."""

from __future__ import annotations

import json
import math
import os
from typing import Sequence


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

  Returns the markdown text. Files are replaced atomically.
  """
  os.makedirs(workdir, exist_ok=True)
  payload = {"title": title, "rows": list(rows), **(extra or {})}
  _atomic_write(os.path.join(workdir, "results.json"), json.dumps(payload, indent=2))
  md = f"# {title}\n\n" + markdown_table(rows, columns)
  if notes:
    md += "\n" + notes.strip() + "\n"
  for plot in plots:
    md += f"\n![{os.path.splitext(plot)[0]}]({plot})\n"
  _atomic_write(os.path.join(workdir, "results.md"), md)
  return md


def _atomic_write(path: str, text: str) -> None:
  with open(path + ".tmp", "w") as f:
    f.write(text)
  os.replace(path + ".tmp", path)
