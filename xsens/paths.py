"""File access for local and remote paths (`gs://`, `s3://`, any scheme `etils.epath` serves).

Paths stay strings everywhere (`os.path.join` keeps `gs://bucket/x/name` intact); every
file operation goes through this module, which uses `etils.epath` for a remote path and
plain `os` / `open` for a local one. A remote
object store has no rename and no append: `write_bytes` writes a remote object in one
upload (atomic on GCS) and a local file through a temporary name and `os.replace`.

Multi-host: `is_writer()` is True on process 0 only; the `write_*` / `savefig` helpers
write nothing on other processes (orbax checkpoints are written by all, through orbax).

Workdir URLs (`check_workdir`): a local path or `gs://BUCKET/PATH`. Orbax writes arrays
with TensorStore, whose only object-store driver orbax uses is GCS (any other URL becomes
a local file path), so no other scheme can hold checkpoints. A `gs://` workdir needs gcsfs
and a bucket that answers both clients within `PROBE_TIMEOUT_S` (`probe`).

Remote calls are bounded: a connection error, or no answer within `REMOTE_TIMEOUT_S`, is
`Unavailable` naming `--workdir` (exit 75: a rerun resumes), after which every call on that
bucket fails at once
(`check_answering`); orbax's TensorStore gives up a GCS request after `CHECKPOINT_RETRIES`
(`bound_checkpoint_retries`, set by a remote `Workdir`).
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import threading
import time

import numpy as np

from xsens.errors import ConfigError, Unavailable

REMOTE_SCHEMES = ("gs",)   # Object stores a workdir may name (see the module docstring).
ALLOWED_WORKDIRS = "a local path (e.g. workdirs/run) or gs://BUCKET/PATH"
PROBE_TIMEOUT_S = 20.0     # How long `probe` waits for a bucket's answer.
REMOTE_TIMEOUT_S = 45.0    # How long one remote file operation may take (`_remote`).
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(/*)")


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


# ----------------------------------------------------------------------------- workdir URLs


def check_workdir(url, timeout_s: float = PROBE_TIMEOUT_S) -> None:
  """Refuses a `--workdir` a run cannot use: ConfigError naming `workdir` and what is
  allowed (`ALLOWED_WORKDIRS`). A local path passes unchecked; `gs://BUCKET/PATH` needs
  gcsfs and a bucket that answers within `timeout_s` (`probe`). Writes nothing."""
  url = os.fspath(url)
  if not url.strip():
    raise ConfigError("workdir", f"empty; allowed: {ALLOWED_WORKDIRS}")
  m = _URL.match(url)
  if m is None or not m.group(2):
    return                      # A local path (`run:1` is a folder name, not a URL).
  scheme, slashes = m.group(1), m.group(2)
  if len(slashes) == 1:
    raise ConfigError("workdir", f"{url!r} is neither a URL ({scheme}: takes two slashes, "
                      f"{scheme}://...) nor a plain local path; allowed: {ALLOWED_WORKDIRS}")
  if scheme not in REMOTE_SCHEMES:
    why = {"file": "; give the local path itself", "gcs": "; write gs://",
           "s3": "; orbax writes checkpoints to GCS and local disks only",
           "memory": "; an in-memory store does not outlive the run"}.get(scheme.lower(), "")
    raise ConfigError("workdir", f"unsupported scheme {scheme}:// in {url!r}{why}; allowed: "
                      f"{ALLOWED_WORKDIRS}")
  bucket = url[m.start(2) + 2:].split("/", 1)[0]
  if not bucket:
    raise ConfigError("workdir", f"{url!r} names no bucket; allowed: {ALLOWED_WORKDIRS}")
  try:
    import gcsfs  # pylint: disable=g-import-not-at-top,unused-import
    from etils import epath as unused_epath  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError("workdir", f"{url} needs the {e.name or 'gcsfs'} package (pip install "
                      f"gcsfs); or give a local path") from None
  probe(url, timeout_s)


def probe(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
  """Asks the bucket of the `gs://` URL `url` whether it exists (gcsfs, which writes the
  run's files) and for one object (TensorStore, which writes orbax's arrays), both at once
  in daemon threads; ConfigError naming `workdir` and the endpoint if either fails or has
  not answered after `timeout_s` (a client still retrying is left behind)."""
  bucket, _, prefix = url.split("://", 1)[1].partition("/")
  key = "/".join(p for p in (prefix.strip("/"), "config.json") if p)
  gcs_endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or "storage.googleapis.com"
  ts_endpoint = os.environ.get("TENSORSTORE_GCS_HTTP_URL") or "storage.googleapis.com"

  def ask_gcsfs():
    return None if epath(f"gs://{bucket}").exists() else (
        f"bucket {bucket!r} does not exist at {gcs_endpoint} (or this account cannot see "
        "it)")

  def ask_tensorstore():
    import tensorstore as ts  # pylint: disable=g-import-not-at-top
    retries = {"max_retries": 2, "initial_delay": "0.5s", "max_delay": "2s"}
    spec = {"driver": "gcs", "bucket": bucket, "context": {"gcs_request_retries": retries}}
    kv = ts.KvStore.open(spec).result(timeout=timeout_s)
    kv.read(key).result(timeout=timeout_s)

  # gcsfs logs each failed retry with a traceback; xsens reports a bucket that does not
  # answer itself, in one line (here, and in `_remote` during the run).
  logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
  answers = {}

  def ask(name, fn):
    try:
      answers[name] = ("ok", fn())
    except TimeoutError:
      pass                        # No answer (TensorStore's own wait ran out).
    except Exception as e:  # pylint: disable=broad-except  (each client raises its own)
      answers[name] = ("error", " ".join(f"{type(e).__name__}: {e}".split())[:200])

  threads = [threading.Thread(target=ask, args=(name, fn), daemon=True,
                              name=f"xsens-probe-{name}")
             for name, fn in (("gcsfs", ask_gcsfs), ("tensorstore", ask_tensorstore))]
  deadline = time.monotonic() + timeout_s
  for t in threads:
    t.start()
  while (time.monotonic() < deadline and len(answers) < len(threads)
         and not any(kind == "error" for kind, _ in list(answers.values()))):
    time.sleep(0.05)   # Until both answered, one failed, or the time is up.
  endpoints = {"gcsfs": gcs_endpoint, "tensorstore": ts_endpoint}
  for name, (kind, detail) in list(answers.items()):
    if kind == "error":
      raise ConfigError("workdir", f"gs://{bucket} cannot be reached ({name} at "
                        f"{endpoints[name]}: {detail}); check the bucket and the "
                        "credentials, or give a local path")
    if detail:
      raise ConfigError("workdir", f"{detail}; create it, or give a local path")
  for name, endpoint in endpoints.items():
    if name not in answers:
      raise ConfigError("workdir", f"gs://{bucket} did not answer within {timeout_s:g} s "
                        f"({name} at {endpoint}); check the network, the bucket and "
                        "the credentials, or give a local path")


# ----------------------------------------------------------------------------- remote calls


def _bucket(path) -> str:
  """`scheme://bucket` of a remote path."""
  scheme, _, rest = os.fspath(path).partition("://")
  return f"{scheme}://{rest.split('/', 1)[0]}"


def _is_transport_error(e: BaseException) -> bool:
  """An error of the connection to the store (not a missing file): the clients' own
  errors (aiohttp, gcsfs, google-auth) and the connection / timeout OSErrors."""
  if isinstance(e, (ConnectionError, TimeoutError)):
    return True
  module = type(e).__module__.split(".")[0]
  return module in ("aiohttp", "gcsfs", "google", "fsspec") and not isinstance(
      e, (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError))


_UNANSWERED: dict[tuple[str, str], str] = {}   # (bucket, endpoint) -> why it is given up.


def _key(path) -> tuple[str, str]:
  return _bucket(path), os.environ.get("STORAGE_EMULATOR_HOST", "")


def check_answering(path) -> None:
  """`Unavailable` naming `--workdir` if the bucket of the remote `path` stopped answering
  an earlier call of this process (`_remote`); a no-op for a local path. Cheap: no call."""
  if is_remote(path) and _key(path) in _UNANSWERED:
    raise Unavailable(f"--workdir: {_UNANSWERED[_key(path)]}")


def _remote(what: str, path, fn):
  """`fn()`, a call of a remote client about `path`, bounded: a connection error, or no
  answer within REMOTE_TIMEOUT_S (the call is left behind in a daemon thread), is
  `Unavailable` naming `--workdir`; from then on every call on that bucket fails at once
  (the run stops in one line instead of waiting out each call's retries)."""
  check_answering(path)
  key = _key(path)
  out = {}

  def call():
    try:
      out["value"] = fn()
    except BaseException as e:  # pylint: disable=broad-except  (re-raised below)
      out["error"] = e

  thread = threading.Thread(target=call, daemon=True, name="xsens-remote-call")
  thread.start()
  thread.join(REMOTE_TIMEOUT_S)
  if thread.is_alive():
    why = f"no answer within {REMOTE_TIMEOUT_S:g} s"
  elif "error" in out and _is_transport_error(out["error"]):
    why = " ".join(f"{type(out['error']).__name__}: {out['error']}".split())[:200]
  elif "error" in out:
    raise out["error"]
  else:
    return out.get("value")
  _UNANSWERED.setdefault(key, (
      f"{key[0]} stopped answering ({what} {os.fspath(path)}: {why}); the newest committed "
      "checkpoint is kept; rerun the same command to resume once the bucket answers"))
  raise Unavailable(f"--workdir: {_UNANSWERED[key]}")


# TensorStore's retries of one GCS request in orbax's checkpoints: about 30 s in all (as
# long as gcsfs's own), instead of its default 32 retries up to 32 s apart (~15 minutes).
CHECKPOINT_RETRIES = {"max_retries": 6, "initial_delay": "1s", "max_delay": "8s"}


def bound_checkpoint_retries() -> None:
  """Makes orbax's TensorStore give up a GCS request after CHECKPOINT_RETRIES, so that a
  save to a bucket that stopped answering fails, and its (non-daemon) threads end, instead
  of retrying for minutes. Sets `gcs_request_retries` in the TensorStore context orbax
  builds for every read and write (a dict of orbax's `tensorstore_utils`; skipped where
  orbax has none); leaves a value already set."""
  try:
    from orbax.checkpoint._src.serialization import tensorstore_utils  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  for name in ("_BASE_TS_CONTEXT", "_DEFAULT_OCDBT_TS_CONTEXT"):
    context = getattr(tensorstore_utils, name, None)
    if isinstance(context, dict):
      context.setdefault("gcs_request_retries", dict(CHECKPOINT_RETRIES))


# ----------------------------------------------------------------------------- queries


def exists(path) -> bool:
  if is_remote(path):
    return _remote("asking for", path, lambda: epath(path).exists())
  return os.path.exists(path)


def isdir(path) -> bool:
  if is_remote(path):
    return _remote("asking for", path, lambda: epath(path).is_dir())
  return os.path.isdir(path)


def isfile(path) -> bool:
  if is_remote(path):
    return _remote("asking for", path,
                   lambda: epath(path).exists() and not epath(path).is_dir())
  return os.path.isfile(path)


def listdir(path) -> list[str]:
  """Names in the directory `path` (not full paths), unsorted."""
  if is_remote(path):
    return _remote("listing", path, lambda: [p.name for p in epath(path).iterdir()])
  return os.listdir(path)


def mtime(path) -> float:
  """Last modification time (seconds since the epoch; OSError if absent)."""
  if is_remote(path):
    if not exists(path):
      raise FileNotFoundError(path)
    return _remote("asking for", path, lambda: float(epath(path).stat().mtime))
  return os.path.getmtime(path)


# ----------------------------------------------------------------------------- changes


def makedirs(path) -> None:
  """Creates `path` and its parents (a no-op on object stores without directories)."""
  if is_remote(path):
    _remote("creating", path, lambda: epath(path).mkdir(parents=True, exist_ok=True))
  else:
    os.makedirs(path, exist_ok=True)


def remove(path, missing_ok: bool = True) -> None:
  """Removes the file `path`."""
  try:
    if is_remote(path):
      _remote("removing", path, lambda: epath(path).unlink())
    else:
      os.remove(path)
  except FileNotFoundError:
    if not missing_ok:
      raise


def rmtree(path) -> None:
  if is_remote(path):
    _remote("removing", path, lambda: epath(path).rmtree(missing_ok=True))
  else:
    shutil.rmtree(path)


def rename(src, dst) -> None:
  """Moves `src` (a file or directory) to `dst` (copy + delete on an object store, where
  `dst`'s parent need not exist: folders are only name prefixes there)."""
  if is_remote(src) or is_remote(dst):
    from etils.epath import backend  # pylint: disable=g-import-not-at-top
    if exists(dst):
      raise FileExistsError(f"{dst} already exists; cannot move {src} there")
    src, dst = os.fspath(src), os.fspath(dst)
    _remote("moving", src,
            lambda: backend.fsspec_backend.fs(src).rename(src, dst, recursive=True))
  else:
    os.replace(src, dst)


# ----------------------------------------------------------------------------- contents


def read_bytes(path) -> bytes:
  if is_remote(path):
    return _remote("reading", path, lambda: epath(path).read_bytes())
  with open(path, "rb") as f:
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
    _remote("writing", path, lambda: epath(path).write_bytes(data))
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
