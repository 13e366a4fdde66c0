"""Device mesh, shardings and multi-host set-up for data-parallel training.

The mesh has a `data` axis (the batch is split over it) and, when asked for, a `model`
axis: a (data, model) mesh of `n / m` by `m` devices. With FSDP (`fsdp_shardings`) large
leaves of the train state are split over the `data` axis, big_vision style.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from xsens.errors import ConfigError
from xsens.train import multihost

DATA_AXIS = "data"
MODEL_AXIS = "model"


class EnvironmentSettingError(ConfigError):
  """A multi-host environment variable is missing or invalid; the CLI prints
  `xsens: error: <VARIABLE>: <message>` and exits with code 2."""

  @property
  def flag(self) -> str:
    return self.field


# The variables of an explicit multi-host launch, with the `initialize` argument each sets.
DISTRIBUTED_VARIABLES = (("JAX_COORDINATOR_ADDRESS", "coordinator_address"),
                         ("JAX_NUM_PROCESSES", "num_processes"),
                         ("JAX_PROCESS_ID", "process_id"))


def distributed_arguments(environ: Mapping[str, str]) -> dict | None:
  """The keyword arguments of `jax.distributed.initialize` that `environ` asks for, or None.

  - `JAX_COORDINATOR_ADDRESS` (host:port of process 0), `JAX_NUM_PROCESSES` and
    `JAX_PROCESS_ID` all set: those three (an explicit launch, e.g. several CPU / GPU hosts).
  - `XSENS_DISTRIBUTED=1`: the ones of the three that are set, JAX auto-detecting the rest
    (Cloud TPU, SLURM, Open MPI; jax `clusters.ClusterEnv`).
  - None of them: None (a single-process run).
  Some but not all of the three without `XSENS_DISTRIBUTED=1`, or a value that is not a
  valid count / id: EnvironmentSettingError naming the variable.
  """
  given = {name: environ[name] for name, _ in DISTRIBUTED_VARIABLES if environ.get(name)}
  auto = environ.get("XSENS_DISTRIBUTED") == "1"
  if not given and not auto:
    return None
  if not auto:
    for name, _ in DISTRIBUTED_VARIABLES:
      if name not in given:
        raise EnvironmentSettingError(
            name, f"not set, but {', '.join(given)} {'is' if len(given) == 1 else 'are'}; a "
            "multi-host launch sets JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and "
            "JAX_PROCESS_ID on every process (or XSENS_DISTRIBUTED=1 to auto-detect a TPU / "
            "SLURM / Open MPI cluster)")
  out = {}
  for name, arg in DISTRIBUTED_VARIABLES:
    if name not in given:
      continue
    value = given[name]
    if arg != "coordinator_address":
      if not value.strip().isdigit():
        raise EnvironmentSettingError(name, f"must be a non-negative integer, got {value!r}")
      value = int(value)
    out[arg] = value
  if out.get("num_processes") == 0:
    raise EnvironmentSettingError("JAX_NUM_PROCESSES", "must be at least 1, got 0")
  if "num_processes" in out and out.get("process_id", 0) >= out["num_processes"]:
    raise EnvironmentSettingError(
        "JAX_PROCESS_ID", f"must be below JAX_NUM_PROCESSES={out['num_processes']}, got "
        f"{out['process_id']}")
  return out


def maybe_initialize_distributed(environ: Mapping[str, str] | None = None,
                                 timeout_s: float | None = None) -> None:
  """Calls `jax.distributed.initialize(...)` when `environ` (default: `os.environ`) asks for
  a multi-host run (`distributed_arguments`). A no-op otherwise, and when already
  initialised. Must run before anything touches a device (the CLI calls it first).

  `timeout_s` (default: `multihost.wait_timeout_s(environ)`) bounds the wait for every
  process to connect (`multihost.WaitFailed` naming the coordinator after it). JAX's
  heartbeat timeout is 30 s longer, so the loop's own bounded waits (one line each) come
  first. A process that dies can still make JAX's coordination service end the others first
  (its message, exit 134): `jax_enable_recoverability` would stop that, but then process 0
  does not wait for the others at exit and their normal shutdown fails.
  """
  environ = os.environ if environ is None else environ
  kwargs = distributed_arguments(environ)
  if kwargs is None or jax.distributed.is_initialized():
    return
  timeout_s = multihost.wait_timeout_s(environ) if timeout_s is None else timeout_s
  # The loop's stop agreement (`multihost.StopAgreement`) replaces JAX's preemption service,
  # whose own SIGTERM handler would swallow a signal outside the loop.
  jax.config.update("jax_enable_preemption_service", False)
  try:
    jax.distributed.initialize(**kwargs, initialization_timeout=math.ceil(timeout_s),
                               heartbeat_timeout_seconds=math.ceil(timeout_s) + 30)
  except jax.errors.JaxRuntimeError as e:
    count = kwargs.get("num_processes")
    raise multihost.WaitFailed(
        f"{f'all {count}' if count else 'all'} processes to connect to the coordinator at "
        f"{kwargs.get('coordinator_address', 'the detected address')}", None,
        multihost.first_line(e), process=kwargs.get("process_id", -1)) from None


def data_mesh(devices=None, model_axis_size: int = 1) -> Mesh:
  """A mesh over all devices (automatic sharding propagation): 1-D `data` when
  `model_axis_size` is 1 (the default), else 2-D (data, model) of shape (n / m, m).

  `jax.make_mesh` defaults to Explicit axes, which reject implicit resharding in
  user code (see shared/NOTES.md); the classic `Mesh` constructor keeps Auto axes.
  """
  devices = jax.devices() if devices is None else devices
  if model_axis_size == 1:
    return Mesh(np.asarray(devices), (DATA_AXIS,))
  if len(devices) % model_axis_size:
    raise ValueError(f"model_axis_size {model_axis_size} does not divide the "
                     f"{len(devices)} devices")
  grid = np.asarray(devices).reshape(len(devices) // model_axis_size, model_axis_size)
  return Mesh(grid, (DATA_AXIS, MODEL_AXIS))


def round_to_devices(size: int, num_devices: int) -> int:
  """The smallest multiple of `num_devices` >= `size`: a global batch size that splits
  evenly over the devices of a mesh (`mesh.size`)."""
  return -(-int(size) // num_devices) * num_devices


def batch_axes(mesh: Mesh) -> str | tuple[str, ...]:
  """The mesh axes the batch is split over: `data` on a 1-D mesh, all axes otherwise (no
  example is computed twice; the `model` axis only holds copies of replicated leaves)."""
  return DATA_AXIS if mesh.axis_names == (DATA_AXIS,) else tuple(mesh.axis_names)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over `batch_axes(mesh)`."""
  return NamedSharding(mesh, P(batch_axes(mesh)))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local_arrays, mesh: Mesh):
  """Builds global jax.Arrays, batch-sharded over the mesh, from this host's numpy shards."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(
      lambda a: jax.make_array_from_process_local_data(sharding, np.asarray(a)), local_arrays)


def fsdp_spec(shape: tuple[int, ...], axis_size: int, min_size: int,
              axis: str = DATA_AXIS) -> P:
  """FSDP rule of big_vision's `sharding.py` (github.com/google-research/big_vision): a
  leaf of at least `min_size` elements is split over `axis` along its largest dimension
  divisible by `axis_size` (ties: the later dimension); other leaves are replicated."""
  if axis_size <= 1 or int(np.prod(shape, dtype=np.int64)) < max(min_size, 1):
    return P()
  for dim in sorted(range(len(shape)), key=lambda d: (-shape[d], -d)):
    if shape[dim] % axis_size == 0:
      return P(*(axis if d == dim else None for d in range(len(shape))))
  return P()


def fsdp_shardings(abstract, mesh: Mesh, min_size: int):
  """`NamedSharding`s of every leaf of `abstract` (arrays or ShapeDtypeStructs) by
  `fsdp_spec` over the mesh's `data` axis; the `model` axis holds copies."""
  size = mesh.shape[DATA_AXIS]
  return jax.tree.map(lambda a: NamedSharding(mesh, fsdp_spec(tuple(a.shape), size, min_size)),
                      abstract)


def abstract_with_shardings(abstract_state, shardings):
  """`jax.ShapeDtypeStruct`s of `abstract_state` carrying `shardings` (for restore)."""
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings)
