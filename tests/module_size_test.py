"""Modules of one concern: no module under xsens/ over 800 lines, no study over 600.

Lines are counted as `wc -l` counts them (newline characters). A module that grows past its
limit is split by concern (docs/architecture.md), not exempted here.
"""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULE_LIMIT = 800
STUDY_LIMIT = 600


def line_count(path: pathlib.Path) -> int:
  """Newline characters in `path` (what `wc -l` prints)."""
  return path.read_bytes().count(b"\n")


def oversized(folder: pathlib.Path, limit: int, root: pathlib.Path = ROOT) -> list[str]:
  """`"<path>: <n> lines"` (path relative to `root`) for every .py file under `folder` with
  more than `limit` lines."""
  return [f"{p.relative_to(root)}: {n} lines" for p in sorted(folder.rglob("*.py"))
          if (n := line_count(p)) > limit]


def test_no_module_over_800_lines():
  offenders = oversized(ROOT / "xsens", MODULE_LIMIT)
  assert not offenders, (f"modules over {MODULE_LIMIT} lines (split them by concern): "
                         + "; ".join(offenders))


def test_no_study_over_600_lines():
  offenders = oversized(ROOT / "xsens" / "studies", STUDY_LIMIT)
  assert not offenders, (f"studies over {STUDY_LIMIT} lines (move shared parts to "
                         f"xsens/lab/): " + "; ".join(offenders))


def test_the_counts_are_those_of_wc(tmp_path):
  folder = tmp_path / "pkg"
  folder.mkdir()
  (folder / "small.py").write_text("a = 1\n" * 3)
  (folder / "big.py").write_text("a = 1\n" * 5 + "b = 2")   # No newline at the end.
  assert line_count(folder / "big.py") == 5 and line_count(folder / "small.py") == 3
  assert oversized(folder, 4, root=tmp_path) == ["pkg/big.py: 5 lines"]
  assert oversized(folder, 5, root=tmp_path) == []
