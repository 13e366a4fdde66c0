"""File access for local and remote paths (`gs://`, `s3://`, any scheme `etils.epath` serves).

Paths stay strings everywhere (`os.path.join` keeps `gs://bucket/x/name` intact); every
file operation goes through this module, which uses `etils.epath` for a remote path and
plain `os` / `open` for a local one (so local runs behave exactly as before). A remote
object store has no rename and no append: `write_bytes` writes a remote object in one
upload (atomic on GCS) and a local file through a temporary name and `os.replace`.

Multi-host: `is_writer()` is True on process 0 only; the `write_*` / `savefig` helpers
write nothing on other processes (orbax checkpoints are written by all, through orbax).
"""

from __future__ import annotations

import io
import os
import shutil
from typing import IO

import numpy as np


def is_remote(path) -> bool:
  """True for a URL-like path (`gs://bucket/x`, `s3://...`): served by `etils.epath`."""
  return "://" in os.fspath(path)


def epath(path):
  """`etils.epath.Path(path)` (imported lazily: epath pulls in fsspec)."""
  from etils import epath as epath_lib  # pylint: disable=g-import-not-at-top
  return epath_lib.Path(path)


def absolute(path) -> str:
  """`path` with `~` expanded and made absolute if local; a remote path unchanged."""
  path = os.fspath(path)
  return path if is_remote(path) else os.path.abspath(os.path.expanduser(path))


def is_writer() -> bool:
  """Whether this process writes the run's non-checkpoint files (process 0)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


# ----------------------------------------------------------------------------- queries


def exists(path) -> bool:
  return epath(path).exists() if is_remote(path) else os.path.exists(path)


def isdir(path) -> bool:
  return epath(path).is_dir() if is_remote(path) else os.path.isdir(path)


def isfile(path) -> bool:
  if is_remote(path):
    p = epath(path)
    return p.exists() and not p.is_dir()
  return os.path.isfile(path)


def listdir(path) -> list[str]:
  """Names in the directory `path` (not full paths), unsorted."""
  if is_remote(path):
    return [p.name for p in epath(path).iterdir()]
  return os.listdir(path)


def mtime(path) -> float:
  """Last modification time (seconds since the epoch; OSError if absent)."""
  if is_remote(path):
    p = epath(path)
    if not p.exists():
      raise FileNotFoundError(path)
    return float(p.stat().mtime)
  return os.path.getmtime(path)


# ----------------------------------------------------------------------------- changes


def makedirs(path) -> None:
  """Creates `path` and its parents (a no-op on object stores without directories)."""
  if is_remote(path):
    epath(path).mkdir(parents=True, exist_ok=True)
  else:
    os.makedirs(path, exist_ok=True)


def remove(path, missing_ok: bool = True) -> None:
  """Removes the file `path`."""
  try:
    if is_remote(path):
      epath(path).unlink()
    else:
      os.remove(path)
  except FileNotFoundError:
    if not missing_ok:
      raise


def rmtree(path) -> None:
  if is_remote(path):
    epath(path).rmtree(missing_ok=True)
  else:
    shutil.rmtree(path)


def rename(src, dst) -> None:
  """Moves `src` (a file or directory) to `dst` (copy + delete on an object store)."""
  if is_remote(src) or is_remote(dst):
    epath(src).rename(dst)
  else:
    os.replace(src, dst)


# ----------------------------------------------------------------------------- contents


def open_file(path, mode: str = "r") -> IO:
  """`open(path, mode)` for a local or remote path ('r', 'rb', 'w', 'wb')."""
  return epath(path).open(mode) if is_remote(path) else open(path, mode)


def read_bytes(path) -> bytes:
  with open_file(path, "rb") as f:
    return f.read()


def read_text(path) -> str:
  return read_bytes(path).decode("utf-8")


def write_bytes(path, data: bytes) -> None:
  """Writes `data` to `path` in one piece (parents created): a local file through a
  temporary name and `os.replace`, a remote object in one upload."""
  path = os.fspath(path)
  parent = os.path.dirname(path)
  if is_remote(path):
    if parent:
      makedirs(parent)
    epath(path).write_bytes(data)
    return
  if parent:
    os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, ".tmp." + os.path.basename(path))
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)


def write_text(path, text: str) -> None:
  write_bytes(path, text.encode("utf-8"))


def load_npz(path, **kwargs) -> dict[str, np.ndarray]:
  """All arrays of the .npz at `path`, fully read."""
  with np.load(io.BytesIO(read_bytes(path)), **kwargs) as data:
    return {k: data[k] for k in data.files}


def save_npz(path, arrays: dict) -> None:
  """Writes `arrays` as an .npz in one piece (`write_bytes`)."""
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  write_bytes(path, buffer.getvalue())


def savefig(fig, path, **kwargs) -> str:
  """Saves a matplotlib figure to `path` (process 0 only; local or remote); returns the
  file's base name (what reports link)."""
  if is_writer():
    buffer = io.BytesIO()
    fmt = os.path.splitext(os.fspath(path))[1].lstrip(".") or "png"
    fig.savefig(buffer, format=fmt, **kwargs)
    write_bytes(path, buffer.getvalue())
  return os.path.basename(os.fspath(path))
