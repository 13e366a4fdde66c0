"""Test-wide settings: fast XLA compiles and a private TFDS data dir (never the network)."""

import atexit
import importlib.metadata
import os
import shutil
import tempfile

# A private data dir for the whole session (inherited by CLI subprocesses): embedded
# datasets are prepared there once; nothing reads or writes ~/tensorflow_datasets.
os.environ.setdefault("TFDS_DATA_DIR", tempfile.mkdtemp(prefix="xsens_tfds_"))

# XLA:CPU's elemental emitters compile the suite's small programs 1.5-3x faster than its
# fusion emitters (the default), e.g. the threefry draws of every model init. Set before
# the backend starts and inherited by subprocesses (CLI runs, notebook kernels). XLA aborts
# on a flag it does not know, so only with the jaxlib this was measured on (0.10).
_FAST_CPU_FLAG = "--xla_cpu_use_fusion_emitters=false"
if (importlib.metadata.version("jaxlib").startswith("0.10.")
    and _FAST_CPU_FLAG not in os.environ.get("XLA_FLAGS", "")):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_CPU_FLAG}".strip()

import jax  # pylint: disable=g-import-not-at-top

jax.config.update("jax_disable_most_optimizations", True)

# A compilation cache private to this process, removed at exit. Tests re-jit the same
# program under new function objects (a fresh `jax.jit(lambda ...)` per call); the cache
# keys on the lowered program, so each one compiles once per process. The directory is
# not exported: subprocesses (CLI runs, notebook kernels), which may be killed mid-write,
# never share it.
_CACHE_DIR = tempfile.mkdtemp(prefix="xsens_jax_cache_")
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
