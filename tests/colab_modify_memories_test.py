"""The committed colab/modify_memories.ipynb. Its smoke-mode execution (a real kernel) is
`test_notebook_runs_in_smoke_mode` in tests/modify_memories_study_test.py, which resumes the
smoke study the notebook trains."""

import re

from tests import notebooks

NOTEBOOK = notebooks.notebook_path("modify_memories.ipynb")


def test_committed_notebook_is_clean():
  source = notebooks.committed_source(NOTEBOOK)
  assert re.search(r"^VARIANT = ", source, re.MULTILINE)
  assert "2012.00363" in source and "XSENS_NOTEBOOK_SMOKE" in source
