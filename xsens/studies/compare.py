"""Study `compare`: train several models under one training block and tabulate them.

`config.train` is shared, `config.runs[name]` overrides it per run (the multi-run kit of
`xsens.lab.multirun`); writes one row per run (size, steps, accuracies, losses) to
results.md / results.json.
"""

from __future__ import annotations

from xsens.lab import multirun
from xsens.report import tables


def run(config, workdir: str, *, overwrite: bool = False) -> dict:
  """Trains every run of `config.runs` and writes results.md / results.json."""
  results = multirun.train_runs(config, workdir, overwrite=overwrite)
  rows = multirun.summary_rows(results)
  title = f"Model comparison on {config.train.data.name}"
  md = tables.write_results(workdir, title, rows, columns=multirun.TABLE_COLUMNS)
  return {"rows": rows, "markdown": md}
