"""Test-wide settings: fast XLA compiles and a private TFDS data dir (never the network)."""

import atexit
import importlib.metadata
import os
import shutil
import tempfile

import pytest

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

# The suite's xdist workers (pytest.ini: `-n 2`) already occupy the cores, so each keeps to
# one stream (`xsens.train.streams`); measured: the whole suite 772 s with XSENS_STREAMS=1
# against 846 s with one stream per core per worker. Tests of the streams set them
# explicitly. Inherited by subprocesses.
if os.environ.get("PYTEST_XDIST_WORKER"):
  os.environ.setdefault("XSENS_STREAMS", "1")

import jax  # pylint: disable=g-import-not-at-top

jax.config.update("jax_disable_most_optimizations", True)

# A compilation cache per test worker, removed at exit. Tests re-jit the same program under
# new function objects (a fresh `jax.jit(lambda ...)` per call); the cache keys on the
# lowered program, so each one compiles once per worker. It is exported to the worker's
# subprocesses (CLI runs, notebook kernels, the multihost pairs): a run killed and rerun
# by a fault test loads what its first life compiled. A process killed while writing an
# entry leaves it truncated; JAX reads such an entry as an error, warns
# ("Error reading persistent compilation cache entry") and compiles (checked with
# truncated and empty entries, jax 0.10). Measured with `-n 2` on subprocess-heavy
# modules: preemption, train, multihost, grokking, benign_overfitting, the two notebooks,
# logging, cli (184 tests) 225 s -> 196 s; preemption, train, multihost, the reuse and
# distillation studies and four notebooks (63 tests) 222 s -> 185 s.
_CACHE_DIR = tempfile.mkdtemp(prefix="xsens_jax_cache_")
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.1"


# ------------------------------------------------------------------------- module order
# pytest.ini's `--dist loadscope` hands whole modules to the two workers in the order of
# the collected items (xdist >= 3.7 would reorder them by test count, which puts the
# one-test end-to-end modules last: turned off below). They are sorted here longest
# first, so that the modules that start last are short ones and neither worker waits long
# for the other at the end (LPT scheduling). Seconds per module (tests/NAME_test.py), summed
# from `--durations=0` on 2 cores: (its fast-tier tests, its slow tests). A module not
# listed counts 1 s per test; the numbers only order the modules, so rough ones suffice.
MODULE_SECONDS = {
    "robustness_study": (0, 103), "attention_impl": (2, 80), "benign_overfitting": (15, 47),
    "multihost": (2, 60), "preemption": (0, 61), "train": (1, 54),
    "bench_experiments": (4, 46), "colab_attention_structure": (0, 47), "models": (1, 47),
    "modify_memories_study": (0, 45), "sensitivity_language": (0, 44),
    "verification": (16, 23), "grokking": (2, 37), "attention_eigen_study": (0, 37),
    "synthetic_sensitivity": (4, 31), "sensitivity_vision": (3, 32), "sharding": (0, 33),
    "perturbations": (0, 31), "robustness_imagenet": (1, 29), "input_pipeline": (3, 27),
    "colab_robustness": (0, 29), "text_models": (4, 23), "sensitivity": (4, 22),
    "verification_study": (0, 24), "reuse_study": (0, 24), "position_encoding": (15, 9),
    "colab_reuse": (0, 23), "logging": (3, 19), "distillation_study": (0, 22),
    "attention_eigen": (13, 9), "fsdp": (0, 21), "similarity": (4, 16),
    "colab_distillation": (0, 19), "colab_benign_overfitting": (0, 19),
    "colab_grokking": (0, 18), "position_encoding_study": (0, 18), "colab": (0, 18),
    "distill": (3, 14), "label_shift_study": (0, 16), "faults": (9, 8), "cli": (15, 0),
    "use_from_python": (0, 15), "adversarial": (7, 8), "finetune_configs": (3, 11),
    "evaluators": (5, 8), "interventions": (2, 11), "accumulation": (3, 10),
    "mixup": (8, 4), "corruptions": (2, 9), "attention_similarity": (3, 7), "data": (4, 6),
    "codistill": (0, 8), "label_shift": (5, 3), "pretrained": (5, 3),
    "modify_memories": (8, 0), "plots": (4, 3), "objectives": (1, 6), "reuse": (2, 4),
    "sensitivity_imagenet": (0, 6), "configs": (0, 5), "boolean": (3, 2),
    "tensorboard": (5, 0), "convnext": (4, 0), "spectral": (4, 0), "streams": (4, 0),
    "vit_spt_lsa": (4, 0), "validation": (1, 2), "measures_api": (3, 0),
    "mesh_eval": (0, 3), "subgroups_churn": (2, 0), "remote_paths": (3, 27), "loop": (2, 0),
    "remote_gcs": (7, 85), "dependencies": (2, 0), "multiprocess": (13, 200),
    "bf16": (10, 70), "study_record": (5, 60), "sharded_measures": (0, 29),
    "losses": (1, 0), "optim": (1, 0), "text_data": (1, 0), "import_cycles": (1, 0),
    "notebook_format": (0, 0), "colab_modify_memories": (0, 0), "batching": (0, 0),
}


def pytest_configure(config):
  if hasattr(config.option, "loadscopereorder"):
    config.option.loadscopereorder = False


def _module(item) -> str:
  return os.path.basename(item.nodeid.split("::")[0]).removesuffix(".py").removesuffix("_test")


@pytest.hookimpl(trylast=True)  # After `-m` / `-k` deselected items: only the ones that run.
def pytest_collection_modifyitems(items):
  count, slow = {}, {}
  for item in items:
    name = _module(item)
    count[name] = count.get(name, 0) + 1
    slow.setdefault(name, set()).add(item.get_closest_marker("slow") is not None)

  def seconds(name):
    if name not in MODULE_SECONDS:
      return float(count[name])
    fast_s, slow_s = MODULE_SECONDS[name]
    return fast_s * (False in slow[name]) + slow_s * (True in slow[name])

  cost = {name: seconds(name) for name in count}
  items.sort(key=lambda item: -cost[_module(item)])  # Stable: a module's order is kept.
