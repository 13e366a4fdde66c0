"""Sensitivity measures on a batch split over 8 simulated CPU devices give the one-device
numbers, under `jit` with a batch sharding and under `jax.shard_map`; the sharded snippet of
docs/usage.md runs as written (own process: the device count is fixed when JAX starts)."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO

_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")
    import functools
    import jax
    jax.config.update("jax_disable_most_optimizations", True)  # Both runs in one mode.
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P
    from xsens import measures
    from xsens.models import cnn, text, vit
    from xsens.train import sharding

    assert jax.device_count() == 8, jax.devices()
    mesh, one = sharding.data_mesh(), sharding.data_mesh(jax.devices()[:1])
    split = lambda a: jax.device_put(a, sharding.batch_sharding(mesh))
    whole = lambda a: jax.device_put(a, sharding.batch_sharding(one))
    BATCHED = {"per_example", "per_token", "per_patch_map"}
    key = jax.random.key(2)

    def check(name, fn, variables, *batch, hard=True):
      # fn(variables, *batch, key) on the batch split over 8 devices vs on one device.
      run = jax.jit(fn)
      ref = run(variables, *map(whole, batch), key)
      out = run(variables, *map(split, batch), key)
      assert set(out) == set(ref), name
      plans = [{k: int(v) for k, v in r.pop("plan").items()} for r in (out, ref)]
      assert plans[0] == plans[1], (name, plans)  # The same forward calls, split.
      for k in out:
        a, b = np.asarray(out[k]), np.asarray(ref[k])
        if k in BATCHED:  # Stays split over the batch: nothing gathered.
          assert out[k].sharding.is_equivalent_to(
              sharding.batch_sharding(mesh), a.ndim), (name, k, out[k].sharding)
        else:             # Scalars: replicated on the 8 devices.
          assert out[k].sharding.is_fully_replicated, (name, k, out[k].sharding)
          assert len(out[k].sharding.device_set) == 8, (name, k)
        if hard and k in BATCHED | {"flips", "count"}:
          np.testing.assert_array_equal(a, b, err_msg=f"{name} {k}")
        elif hard or k == "mean":
          np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=f"{name} {k}")
        else:             # Smooth: per-example distances, float rounding.
          np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{name} {k}")
      hlo = run.lower(variables, *map(split, batch), key).compile().as_text()
      for op in ("all-gather", "all-to-all", "collective-permute"):
        assert op not in hlo, (name, op)
      if hard:  # Not vacuous: some flips, not all.
        assert 0 < float(ref["mean"]) < 1, (name, float(ref["mean"]))
      print(name, "ok", float(ref["mean"]))
      return ref

    # Images: a ViT and a CNN, 16 images of 28x28, tokens = 16 patches of 7x7.
    x = jax.random.normal(jax.random.key(0), (16, 28, 28, 1))
    mask = jnp.arange(16) < 13  # A padded batch.
    models = {"vit": vit.ViT(num_classes=10, patch_size=7, width=16, depth=1, num_heads=2,
                             mlp_dim=32),
              "cnn": cnn.CNN(num_classes=10, features=(4, 8), dense_dim=16)}
    image_cases = [
        ("token", measures.token_sensitivity, {"num_draws": 2, "patch_size": 7}),
        ("token_chunked", measures.token_sensitivity,  # lax.map chunks, 2 example blocks.
         {"num_draws": 2, "patch_size": 7, "chunk_size": 5, "example_chunk_size": 8}),
        ("global", measures.global_sensitivity, {"num_draws": 4, "patch_size": 7}),
        ("smooth", measures.smooth_token_sensitivity, {"num_draws": 2, "patch_size": 7}),
        ("scattered", measures.scattered_pixel_sensitivity, {"num_draws": 4,
                                                             "num_pixels": 16}),
    ]
    for model_name, model in models.items():
      variables = model.init(jax.random.key(1), x[:1])
      apply_fn = functools.partial(model.apply, train=False)
      for case, measure, kw in image_cases:
        if model_name == "cnn" and case in ("token_chunked", "smooth"):
          continue
        check(f"{model_name}_{case}", lambda v, x, m, k, measure=measure, kw=kw: measure(
            apply_fn, v, x, key=k, mask=m, sigma=1.0, **kw), variables, x, mask,
            hard=case != "smooth")

    # Text: a one-layer RoBERTa on right-padded ids, noise on the embeddings.
    model = text.RoBERTa(num_classes=3, vocab_size=20, max_length=8, width=16, depth=1,
                         num_heads=2, mlp_dim=32, dropout_rate=0.0)
    ids = jax.random.randint(jax.random.key(3), (16, 8), 1, 20)
    ids = jnp.where(jnp.arange(8) < 3 + jnp.arange(16)[:, None] % 6, ids, 0)
    tv = model.init(jax.random.key(4), ids[:1])
    emb, tmask = model.apply(tv, ids, method=model.embed), text.padding_mask(ids)
    encode = functools.partial(model.apply, method=model.encode)
    text_kw = {"sigma": 1.0, "num_draws": 2}
    text_ref = check("text_token", lambda v, e, m, k: measures.text_token_sensitivity(
        encode, v, e, key=k, token_mask=m, **text_kw), tv, emb, tmask)
    check("text_global", lambda v, e, m, k: measures.text_global_sensitivity(
        encode, v, e, key=k, token_mask=m, **text_kw), tv, emb, tmask)

    # shard_map: each device measures its slice; flips and count pooled with psum.
    # Text: example_ids (global row numbers) key the noise, so the one-device numbers.
    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("data"), P("data"),
                       P("data"), P()), out_specs=(P("data"), P()))
    def text_per_device(v, e, m, ids, k):
      out = measures.text_token_sensitivity(encode, v, e, key=k, token_mask=m,
                                            example_ids=ids, **text_kw)
      return out["per_token"], jax.lax.psum((out["flips"], out["count"]), "data")

    per_token, (flips, count) = text_per_device(tv, split(emb), split(tmask),
                                                split(jnp.arange(16)), key)
    assert per_token.sharding.is_equivalent_to(sharding.batch_sharding(mesh), 2)
    np.testing.assert_array_equal(per_token, text_ref["per_token"])
    assert (int(flips), int(count)) == (int(text_ref["flips"]), int(text_ref["count"]))
    print("text_shard_map ok")

    # Images: example_ids (global row numbers) key each example's noise, so each device's
    # slice draws what the one-device batch draws: the one-device numbers exactly.
    variables = models["vit"].init(jax.random.key(1), x[:1])
    apply_fn = functools.partial(models["vit"].apply, train=False)
    for name, fn, kw in (("token", measures.token_sensitivity,
                          {"sigma": 1.0, "num_draws": 2, "patch_size": 7}),
                         ("global", measures.global_sensitivity,
                          {"sigma": 1.0, "num_draws": 4, "patch_size": 7})):

      @jax.jit
      @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("data"), P("data"),
                         P()), out_specs=(P("data"), P()))
      def per_device(v, x, ids, k):
        out = fn(apply_fn, v, x, key=k, example_ids=ids, **kw)
        return out["per_example"], jax.lax.psum((out["flips"], out["count"]), "data")

      ids = jnp.arange(16, dtype=jnp.int32)
      per_example, (flips, count) = per_device(variables, split(x), split(ids), key)
      ref = jax.jit(lambda v, x, ids, k: fn(apply_fn, v, x, key=k, example_ids=ids, **kw))(
          variables, whole(x), whole(ids), key)
      assert per_example.sharding.is_equivalent_to(sharding.batch_sharding(mesh), 1)
      np.testing.assert_array_equal(per_example, ref["per_example"], err_msg=name)
      assert (int(flips), int(count)) == (int(ref["flips"]), int(ref["count"])), name
      assert 0 < float(ref["mean"]) < 1, name
    print("image_shard_map ok")

    # The docs/usage.md snippet as written, on the names its first example defines.
    scope = {"jax": jax, "measures": measures, "apply_fn": apply_fn,
             "variables": variables, "x": x}
    exec(sys.argv[1], scope)
    ref = scope["sens_fn"](variables, whole(x), jax.random.key(0))  # One device.
    np.testing.assert_array_equal(scope["out"]["per_example"], ref["per_example"])
    np.testing.assert_allclose(scope["out"]["mean"], ref["mean"], rtol=0, atol=1e-6)
    assert scope["out"]["per_example"].sharding.is_equivalent_to(
        sharding.batch_sharding(mesh), 1)
    print("SHARDED_MEASURES_OK")
""")


def docs_snippet() -> str:
  """The sharded-batch block of docs/usage.md: the "Use it from Python" block with
  `batch_sharding`."""
  with open(os.path.join(REPO, "docs", "usage.md"), encoding="utf-8") as f:
    section = f.read().split("## Use it from Python", 1)[1].split("\n## ", 1)[0]
  blocks = [b for b in re.findall(r"```python\n(.*?)```", section, re.S)
            if "batch_sharding" in b]
  assert len(blocks) == 1, blocks
  return blocks[0]


def test_docs_show_a_sharded_batch():
  snippet = docs_snippet()
  for line in ("x_split = jax.device_put(x, sharding.batch_sharding(mesh))",
               "out = sens_fn(variables, x_split, jax.random.key(0))"):
    assert line in snippet, line


@pytest.mark.slow
def test_sharded_measures_match_one_device():
  proc = subprocess.run([sys.executable, "-c", _SCRIPT, docs_snippet()], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  assert "SHARDED_MEASURES_OK" in proc.stdout
