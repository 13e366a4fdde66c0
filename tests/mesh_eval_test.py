"""Study-level evaluation on the mesh (`xsens.train.evaluators.over_split`, which
`xsens.lab.robustness.split_accuracy`, `host_corruption_accuracy` and the adversarial
section run through): each batch is split over all devices, with the numbers of the
one-device loop. Runs on 8 simulated CPU devices in a subprocess (the device count is fixed
when JAX starts)."""

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
    from xsens.train import evaluators, sharding

    assert jax.device_count() == 8, jax.devices()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(37, 4, 4, 1)).astype(np.float32)
    y = (np.arange(37) % 3).astype(np.int32)
    seen = []
    split = {"image": x, "label": y}

    def fn(batch):
      a, b = batch["image"], batch["label"]
      seen.append(a.shape)  # At tracing: the global batch.
      return {"z": a.sum((1, 2, 3)) * 2 + b, "n": jnp.ones_like(b)}

    placed = evaluators.batches(x, y, 16, sharding.data_mesh())
    assert {(b["image"].shape, len(b["image"].sharding.device_set)) for b in placed} == {
        ((16, 4, 4, 1), 8)}

    # batch_size 10 is rounded up to 16 = 2 x 8 devices.
    out = evaluators.over_split(fn, split, reduce="concat", batch_size=10)
    np.testing.assert_allclose(out["z"], x.sum((1, 2, 3)) * 2 + y, rtol=1e-5, atol=1e-5)
    assert out["n"].shape == (37,)
    assert seen == [(16, 4, 4, 1)], seen
    one = sharding.data_mesh(jax.devices()[:1])
    ref = evaluators.over_split(fn, split, reduce="concat", batch_size=10, mesh=one)
    np.testing.assert_allclose(out["z"], ref["z"], rtol=1e-6)

    w = rng.normal(size=(16, 3)).astype(np.float32)
    linear = lambda v, a: a.reshape(a.shape[0], -1) @ v
    want = np.mean(np.argmax(x.reshape(37, -1) @ w, -1) == y)
    assert abs(common.split_accuracy(linear, w, x, y, batch_size=8) - want) < 1e-9
    print("MESH_EVAL_OK")
""")


@pytest.mark.slow
def test_batched_evaluation_is_split_over_eight_devices():
  proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  assert "MESH_EVAL_OK" in proc.stdout
