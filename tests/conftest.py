"""Test-wide settings: fast XLA compiles and a private TFDS data dir (never the network)."""

import os
import tempfile

# A private data dir for the whole session (inherited by CLI subprocesses): embedded
# datasets are prepared there once; nothing reads or writes ~/tensorflow_datasets.
os.environ.setdefault("TFDS_DATA_DIR", tempfile.mkdtemp(prefix="xsens_tfds_"))

import jax  # pylint: disable=g-import-not-at-top

jax.config.update("jax_disable_most_optimizations", True)
