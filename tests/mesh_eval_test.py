"""Study-level evaluation on the mesh (`xsens.lab.robustness.batched`, which
`split_accuracy`, `host_corruption_accuracy` and the adversarial section run through): each
batch is split over all devices, with the numbers of the one-device loop. Runs on 8
simulated CPU devices in a subprocess (the device count is fixed when JAX starts)."""

import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO

_SCRIPT = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from xsens.lab import robustness as common
    from xsens.train import sharding

    assert jax.device_count() == 8, jax.devices()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(37, 4, 4, 1)).astype(np.float32)
    y = (np.arange(37) % 3).astype(np.int32)
    seen = []
    step = jax.jit(lambda a, b: {"z": a.sum((1, 2, 3)) * 2 + b, "n": jnp.ones_like(b)})

    def fn(a, b):
      seen.append((a.shape, len(a.sharding.device_set)))
      return step(a, b)

    out = common.batched(fn, x, y, batch_size=10)  # Rounded up to 16 = 2 x 8 devices.
    np.testing.assert_allclose(out["z"], x.sum((1, 2, 3)) * 2 + y, rtol=1e-5, atol=1e-5)
    assert out["n"].shape == (37,)
    assert set(seen) == {((16, 4, 4, 1), 8)}, seen
    one = sharding.data_mesh(jax.devices()[:1])
    ref = common.batched(step, x, y, batch_size=10, mesh=one)
    np.testing.assert_allclose(out["z"], ref["z"], rtol=1e-6)

    w = rng.normal(size=(16, 3)).astype(np.float32)
    correct_fn = common.bind(lambda v, a: a.reshape(a.shape[0], -1) @ v, w)
    want = np.mean(np.argmax(x.reshape(37, -1) @ w, -1) == y)
    assert abs(common.split_accuracy(correct_fn, x, y, batch_size=8) - want) < 1e-9
    print("MESH_EVAL_OK")
""")


@pytest.mark.slow
def test_batched_evaluation_is_split_over_eight_devices():
  proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  assert "MESH_EVAL_OK" in proc.stdout
