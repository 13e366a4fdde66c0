"""Device mesh, shardings and multi-host set-up for data-parallel training."""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def maybe_initialize_distributed() -> None:
  """Calls `jax.distributed.initialize()` when the environment asks for a multi-host run.

  Triggered by `XSENS_DISTRIBUTED=1` (any cluster JAX auto-detects: Cloud TPU, SLURM,
  Open MPI) or by `JAX_COORDINATOR_ADDRESS` being set. A no-op otherwise, and when
  already initialised.
  """
  wanted = os.environ.get("XSENS_DISTRIBUTED") == "1" or "JAX_COORDINATOR_ADDRESS" in os.environ
  if not wanted or jax.distributed.is_initialized():
    return
  jax.distributed.initialize()


def data_mesh(devices=None) -> Mesh:
  """A 1-D mesh over all devices with the `data` axis (automatic sharding propagation).

  `jax.make_mesh` now defaults to Explicit axes, which reject implicit resharding in
  user code (see shared/NOTES.md); the classic `Mesh` constructor keeps Auto axes.
  """
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over `data`."""
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local_arrays, mesh: Mesh):
  """Builds global jax.Arrays, batch-sharded over the mesh, from this host's numpy shards."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(
      lambda a: jax.make_array_from_process_local_data(sharding, np.asarray(a)), local_arrays)


def abstract_with_shardings(abstract_state, shardings):
  """`jax.ShapeDtypeStruct`s of `abstract_state` carrying `shardings` (for restore)."""
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings)
