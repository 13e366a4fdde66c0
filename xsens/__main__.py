"""`python -m xsens --config=... --workdir=...`."""

from xsens.main import run

run()
