"""Parameter sharding (`config.sharding`): the FSDP rule, its validation, and FSDP training
on 8 simulated CPU devices against the replicated run, resume included (own process)."""

import subprocess
import sys
import textwrap

import jax
import pytest
from jax.sharding import PartitionSpec as P

from tests.helpers import REPO
from tests.train_test import smoke_train
from xsens.errors import ConfigError
from xsens.train import sharding, trainer


@pytest.mark.parametrize("shape, size, min_size, spec", [
    ((64, 128), 8, 0, P(None, "data")),        # The largest divisible dimension.
    ((128, 64), 8, 0, P("data", None)),
    ((64, 64), 8, 0, P(None, "data")),         # A tie: the later dimension.
    ((12, 64), 8, 0, P(None, "data")),
    ((64, 12), 8, 0, P("data", None)),         # 64 is divisible, 12 is not.
    ((3, 5, 7), 8, 0, P()),                    # Nothing divisible: replicated.
    ((64, 128), 8, 64 * 128 + 1, P()),         # Below min_size: replicated.
    ((), 8, 0, P()),                           # Scalars (the step counter).
    ((64,), 1, 0, P()),                        # A data axis of one device.
])
def test_fsdp_rule_shards_the_largest_divisible_dimension(shape, size, min_size, spec):
  assert sharding.fsdp_spec(shape, size, min_size) == spec


def test_default_mesh_and_shardings_are_unchanged():
  mesh = sharding.data_mesh()
  assert mesh.axis_names == ("data",) and sharding.batch_sharding(mesh).spec == P("data")
  config = smoke_train("vit")
  assert trainer.config_mesh(config).axis_names == ("data",)
  assert dict(config.sharding) == trainer.SHARDING_DEFAULTS


@pytest.mark.parametrize("overrides, field", [
    ({"sharding.model_axis_size": 3}, "sharding.model_axis_size"),
    ({"sharding.model_axis_size": 0}, "sharding.model_axis_size"),
    ({"sharding.min_size": -1}, "sharding.min_size"),
])
def test_bad_sharding_field_is_one_line_naming_it(overrides, field):
  with pytest.raises(ConfigError) as e:
    trainer.validate_config(smoke_train("vit", **overrides), num_devices=8)
  assert e.value.field == field and "\n" not in str(e.value)


def test_unknown_sharding_field_is_refused():
  config = smoke_train("vit")
  with config.sharding.unlocked():
    config.sharding.axis = "data"
  with pytest.raises(ConfigError, match="allowed: fsdp, min_size, model_axis_size") as e:
    trainer.validate_config(config, num_devices=1)
  assert e.value.field == "sharding.axis"


def test_run_written_before_accum_steps_and_sharding_resumes(tmp_path):
  """A workdir whose config.json predates `accum_steps` and `sharding` matches a config at
  their defaults, and is refused when they change."""
  import json
  import jax.numpy as jnp
  config = smoke_train("vit")
  old = json.loads(config.to_json_best_effort())
  del old["accum_steps"], old["sharding"]
  wd = trainer.make_workdir(str(tmp_path), config)
  wd.write_json("config.json", old)
  wd.save(1, {"x": jnp.zeros(())})
  wd.close()
  trainer.make_workdir(str(tmp_path), config).check(config)
  for field, value in (("accum_steps", 2), ("sharding.fsdp", True)):
    changed = smoke_train("vit", **{field: value})
    with pytest.raises(ConfigError, match=f"differing fields: {field}"):
      trainer.make_workdir(str(tmp_path), changed).check(changed)


_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")
    import jax
    jax.config.update("jax_disable_most_optimizations", True)
    import numpy as np
    from jax.sharding import PartitionSpec as P
    from tests.train_test import smoke_train
    from xsens.train import trainer
    from xsens.train import workdir as workdir_lib

    assert jax.device_count() == 8, jax.devices()
    workdir = sys.argv[1]
    # SGD (see sharding_test.py: Adam magnifies reduction-order noise of zero gradients).
    base = {"optimizer.name": "sgd", "optimizer.learning_rate": 0.1, "batch_size": 32,
            "data.test_split": "test[:256]", "eval_every": 0, "checkpoint_every": 2}
    # min_size 256: the patch embedding, attention and MLP kernels (and their SGD-free
    # state) are split, biases and LayerNorm scales stay replicated.
    fsdp = {"sharding.fsdp": True, "sharding.min_size": 256}
    tol = 1e-3

    # Records what each run restored: (step, the spec of an FSDP-sharded kernel).
    restored = []
    restore_latest = workdir_lib.Workdir.restore_latest
    def spy(self, abstract_state, **kwargs):
      state, step = restore_latest(self, abstract_state, **kwargs)
      if step is not None:
        restored.append((step, state["params"]["encoderblock_0"]["MlpBlock_0"]["Dense_0"][
            "kernel"].sharding.spec))
      return state, step
    workdir_lib.Workdir.restore_latest = spy

    def run(name, **overrides):
      config = smoke_train("vit", **{**base, **overrides})
      return trainer.train_and_evaluate(config, f"{workdir}/{name}")

    def same(a, b):
      worst = 0.0
      for x, y in zip(jax.tree.leaves(a.variables), jax.tree.leaves(b.variables)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol / 10)
        worst = max(worst, float(np.max(np.abs(np.asarray(x) - np.asarray(y)))))
      print("worst |params difference|", worst)
      assert abs(a.summary["test_loss"] - b.summary["test_loss"]) < tol
      assert abs(a.summary["train_loss"] - b.summary["train_loss"]) < tol

    replicated = run("replicated", total_steps=4)
    specs = {leaf.sharding.spec for leaf in jax.tree.leaves(replicated.variables)}
    assert specs == {P()}, specs
    cases = {"fsdp": fsdp,
             "fsdp_2d": {**fsdp, "sharding.model_axis_size": 2},
             "fsdp_2d_accum": {**fsdp, "sharding.model_axis_size": 2, "accum_steps": 2}}
    for name, overrides in cases.items():
      # Two steps, then a second call that restores step 2 into the sharded state and
      # trains on to step 4.
      first = run(name, total_steps=2, **overrides)
      out = run(name, total_steps=4, **overrides)
      assert first.summary["steps"] == 2 and out.summary["steps"] == 4
      assert restored.pop() == (2, P(None, "data")) and not restored, restored
      kernel = out.variables["params"]["encoderblock_0"]["MlpBlock_0"]["Dense_0"]["kernel"]
      assert kernel.sharding.spec == P(None, "data"), kernel.sharding
      data = 4 if "sharding.model_axis_size" in overrides else 8
      assert kernel.addressable_shards[0].data.shape == (16, 32 // data), kernel.shape
      assert kernel.sharding.mesh.axis_names == (("data",) if data == 8 else ("data", "model"))
      same(replicated, out)
      print(name, "OK")
    print("FSDP_OK")
""")


@pytest.mark.slow
def test_fsdp_on_eight_devices_matches_replicated_and_resumes(tmp_path):
  proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path)], cwd=REPO,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  assert "FSDP_OK" in proc.stdout
