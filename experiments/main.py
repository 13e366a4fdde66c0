"""Thin CLI for running from a checkout: `python experiments/main.py --config=... --workdir=...`.

Same as the installed `xsens` console script and `python -m xsens`.
"""

from xsens.main import run

if __name__ == "__main__":
  run()
