"""The streaming reader and the ImageNet setup of the robustness study, on a fake ImageNet.

No network and no real ImageNet: the fake datasets are prepared with TFDS's own
imagenet2012 / imagenet2012_corrupted builders (same name, version, features and ArrayRecord
files) whose generators are replaced by a dozen JPEGs made with PIL, of different sizes, one
grayscale. The registered builders then read them as they would read the real ones. The
checkpoints are the tiny vit_jax / big_transfer-layout `.npz` files of tests/pretrained_test.py
with a 1000-way head.
"""

import io
import json
import os

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
from PIL import Image
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.datasets.imagenet2012 import imagenet2012_dataset_builder as in_lib
from tensorflow_datasets.datasets.imagenet2012_corrupted import (
    imagenet2012_corrupted_dataset_builder as inc_lib)

from mlcollections_configs import robustness as rob_cfg
from tests.pretrained_test import fake_bit_checkpoint, fake_vit_checkpoint
from xsens import studies
from xsens.data import image_prep
from xsens.data import streaming
from xsens.errors import ConfigError
from xsens.lab import corruptions as lab_corruptions
from xsens.lab import pretrained_runs
from xsens.studies import robustness_imagenet as ri

SIZES = [(40, 56), (64, 48), (50, 50), (33, 70), (48, 64), (60, 45), (45, 60), (56, 40),
         (64, 64), (38, 52), (52, 38), (44, 44)]
GRAY = 2                      # Example 2 is a grayscale JPEG.
N = len(SIZES)
SMOKE = rob_cfg.get_config("imagenet,smoke")
IMAGE_SIZE = SMOKE.imagenet.image_size
CORRUPTED = [(c, s) for c in SMOKE.robustness.corruptions.names
             for s in SMOKE.robustness.corruptions.severities]


def _jpeg(rng, h, w, gray=False) -> bytes:
  """A smooth random image as JPEG bytes."""
  small = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
  img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
  if gray:
    img = img.convert("L")
  buf = io.BytesIO()
  img.save(buf, format="JPEG", quality=95)
  return buf.getvalue()


class FakeImagenet(in_lib.Builder, skip_registration=True):
  """imagenet2012 5.1.0 with a validation split generated from `EXAMPLES`."""
  name = "imagenet2012"
  EXAMPLES = []
  # TFDS derives code_path via importlib_resources, absent here (see xsens mnist5k).
  code_path = epath.Path(__file__)

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"validation": self._generate_examples()}

  def _generate_examples(self):  # pylint: disable=arguments-differ
    for i, (data, label) in enumerate(self.EXAMPLES):
      name = f"ILSVRC2012_val_{i + 1:08d}.JPEG"
      yield name, {"image": data, "label": int(label), "file_name": name}


class FakeImagenetC(inc_lib.Builder, skip_registration=True):
  """imagenet2012_corrupted 3.1.0 (any config) generated from `EXAMPLES`."""
  name = "imagenet2012_corrupted"
  EXAMPLES = []
  # TFDS derives code_path via importlib_resources, absent here (see xsens mnist5k).
  code_path = epath.Path(__file__)

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"validation": self._generate_examples()}

  def _generate_examples(self):  # pylint: disable=arguments-differ
    for i, (data, label) in enumerate(self.EXAMPLES):
      name = f"ILSVRC2012_val_{i + 1:08d}.JPEG"
      yield name, {"image": data, "label": int(label), "file_name": name}


def _prepare(cls, data_dir, examples, config=None):
  cls.EXAMPLES = examples
  kwargs = {"config": config} if config else {}
  builder = cls(data_dir=data_dir, file_format="array_record", **kwargs)
  builder.download_and_prepare(file_format="array_record")


def _independent_base(data: bytes) -> np.ndarray:
  """ImageNet-C geometry written out without xsens.data.streaming: uint8 [224, 224, 3]."""
  img = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
  h, w = img.shape[:2]
  side = int(224 / 256 * min(h, w))
  top, left = (h - side + 1) // 2, (w - side + 1) // 2
  crop = Image.fromarray(np.ascontiguousarray(img[top:top + side, left:left + side]))
  return np.asarray(crop.resize((224, 224), Image.BICUBIC))


def _predict(model, variables, base_uint8):
  """Model predictions on [n, 224, 224, 3] uint8 at the smoke resolution, [-1, 1]."""
  x = jnp.asarray(base_uint8, jnp.float32) / 255.0
  x = jax.image.resize(x, (len(x), IMAGE_SIZE, IMAGE_SIZE, 3), "bilinear", antialias=True)
  return np.asarray(jnp.argmax(model.apply(variables, (x - 0.5) / 0.5, train=False), -1))


def _labels(pred: np.ndarray, num_right: int) -> np.ndarray:
  """The predictions for the first `num_right` examples, a wrong class for the rest."""
  return np.where(np.arange(len(pred)) < num_right, pred, (pred + 1) % 1000)


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
  """A data_dir with imagenet2012 (validation) and the smoke ImageNet-C sets; npz files.

  The labels are the fake ViT's predictions for a known number of examples, so its accuracy
  is known exactly if (and only if) the study reads and preprocesses the images right.
  """
  root = tmp_path_factory.mktemp("fake_imagenet")
  data_dir = str(root / "tfds")
  rng = np.random.default_rng(0)
  jpegs = [_jpeg(rng, h, w, gray=i == GRAY) for i, (h, w) in enumerate(SIZES)]
  vit_ck = fake_vit_checkpoint(num_classes=1000)
  bit_ck = fake_bit_checkpoint(num_classes=1000)
  np.savez(root / "ViT-B_16.npz", **vit_ck)
  np.savez(root / "BiT-M-R50x1-ILSVRC2012.npz", **bit_ck)
  run_cfg = ml_collections.ConfigDict({"model": {"name": "vit"},
                                       "pretrained": {"path": str(root / "ViT-B_16.npz")}})
  run = pretrained_runs.load_run("vit", run_cfg, (IMAGE_SIZE, IMAGE_SIZE, 3), 1000)
  base = np.stack([_independent_base(j) for j in jpegs])
  right = {"clean": 8}
  _prepare(FakeImagenet, data_dir, list(zip(jpegs, _labels(_predict(run.model, run.variables,
                                                                      base), 8))))
  corrupted_base = {}
  for k, (c, s) in enumerate(CORRUPTED):
    # A stand-in "corruption": darker images, 224 x 224 JPEGs as ImageNet-C stores them.
    dark = (base.astype(np.float32) * (0.9 - 0.1 * k)).astype(np.uint8)
    data = []
    for img in dark:
      buf = io.BytesIO()
      Image.fromarray(img).save(buf, format="JPEG", quality=95)
      data.append(buf.getvalue())
    decoded = np.stack([np.asarray(Image.open(io.BytesIO(d)).convert("RGB")) for d in data])
    right[(c, s)] = 3 * k
    labels = _labels(_predict(run.model, run.variables, decoded), 3 * k)
    _prepare(FakeImagenetC, data_dir, list(zip(data, labels)), config=f"{c}_{s}")
    corrupted_base[(c, s)] = decoded
  return {"data_dir": data_dir, "root": root, "jpegs": jpegs, "base": base,
          "vit": run, "right": right, "corrupted_base": corrupted_base}


# ------------------------------------------------------------------------- geometry (no data)


def test_center_crop_box_arithmetic():
  assert image_prep.center_crop_box(10, 20, 0.5) == (3, 8, 5)
  assert image_prep.center_crop_box(256, 300, 224 / 256) == (16, 38, 224)
  assert image_prep.center_crop_box(7, 7, 1.0) == (0, 0, 7)


def test_preprocess_image_crop_and_resize_on_a_known_image():
  img = np.arange(10 * 20 * 3, dtype=np.int64).reshape(10, 20, 3).astype(np.uint8)
  out = image_prep.preprocess_image(img, (5, 5), crop="center", crop_fraction=0.5)
  np.testing.assert_array_equal(out, img[3:8, 8:13])  # The crop alone: exact pixels.
  np.testing.assert_array_equal(
      image_prep.preprocess_image(img, (10, 20), crop="resize"), img)
  small = np.array([[[0] * 3, [100] * 3], [[200] * 3, [50] * 3]], np.uint8)
  up = image_prep.preprocess_image(small, (4, 4), crop="resize", resample="nearest")
  np.testing.assert_array_equal(up, np.repeat(np.repeat(small, 2, 0), 2, 1))
  assert image_prep.to_rgb(np.zeros((3, 4), np.uint8)).shape == (3, 4, 3)
  assert image_prep.to_rgb(np.zeros((3, 4, 4), np.uint8)).shape == (3, 4, 3)


def test_stream_order_is_seeded_and_nested():
  a = streaming.stream_order(50, 20, seed=1)
  np.testing.assert_array_equal(a, streaming.stream_order(50, 20, seed=1))
  np.testing.assert_array_equal(streaming.stream_order(50, 7, seed=1), a[:7])
  assert not np.array_equal(a, streaming.stream_order(50, 20, seed=2))
  assert len(set(a.tolist())) == 20
  np.testing.assert_array_equal(streaming.stream_order(50, None, 0, shuffle=False),
                                np.arange(50))


# ----------------------------------------------------------------------------- the stream


def _fname(ex) -> str:
  name = ex["file_name"]
  return name.decode() if isinstance(name, bytes) else str(name)


def _open(fake, **kw):
  return streaming.open_stream("imagenet2012", split="validation", data_dir=fake["data_dir"],
                               **{"image_size": 24, "batch_size": 4, "num_workers": 2, **kw})


@pytest.mark.slow
def test_batches_fixed_shape_padding_and_pixels(fake):
  stream = _open(fake, limit=5, seed=3, normalize="uint8")
  assert len(stream) == 5 and stream.num_batches == 2 and stream.num_classes == 1000
  batches = list(stream.batches())
  assert [b["image"].shape for b in batches] == [(4, 24, 24, 3)] * 2
  assert all(b["image"].dtype == np.uint8 for b in batches)
  np.testing.assert_array_equal(batches[0]["mask"], [1, 1, 1, 1])
  np.testing.assert_array_equal(batches[1]["mask"], [1, 0, 0, 0])
  index = np.concatenate([b["index"] for b in batches])
  np.testing.assert_array_equal(index[:5], stream.indices)
  assert (index[5:] == index[4]).all()  # Padding repeats the last real example.
  np.testing.assert_array_equal(batches[1]["image"][1:], np.repeat(batches[1]["image"][:1], 3, 0))
  # Every image is the independently computed crop + resize of the JPEG at that position.
  source = stream.source
  for b in batches:
    for row in range(int(b["mask"].sum())):
      ex = source[int(b["index"][row])]
      i = int(_fname(ex)[-13:-5]) - 1
      img = np.asarray(Image.open(io.BytesIO(fake["jpegs"][i])).convert("RGB"))
      h, w = img.shape[:2]
      side = int(0.875 * min(h, w))
      top, left = (h - side + 1) // 2, (w - side + 1) // 2
      want = np.asarray(Image.fromarray(np.ascontiguousarray(
          img[top:top + side, left:left + side])).resize((24, 24), Image.BICUBIC))
      np.testing.assert_array_equal(b["image"][row], want)
      assert b["label"][row] == ex["label"]


def test_grayscale_and_normalisation(fake):
  stream = _open(fake, limit=None, shuffle=False, normalize="half", crop="resize")
  batches = list(stream.batches())
  assert sum(int(b["mask"].sum()) for b in batches) == N
  x = np.concatenate([b["image"] for b in batches])[:N]
  assert x.dtype == np.float32 and x.min() >= -1 and x.max() <= 1
  raw = np.concatenate([b["image"] for b in _open(fake, limit=None, shuffle=False,
                                                  normalize="uint8", crop="resize").batches()])
  np.testing.assert_allclose(x, raw[:N] / 127.5 - 1, atol=1e-6)
  files = [_fname(stream.source[i]) for i in range(N)]
  gray = files.index(f"ILSVRC2012_val_{GRAY + 1:08d}.JPEG")
  assert np.array_equal(raw[gray, ..., 0], raw[gray, ..., 1])  # Gray -> 3 equal channels.


def test_same_seed_same_batches_and_materialize(fake):
  a = [b["index"] for b in _open(fake, limit=7, seed=5).batches()]
  b = [b["index"] for b in _open(fake, limit=7, seed=5).batches()]
  np.testing.assert_array_equal(np.concatenate(a), np.concatenate(b))
  split = _open(fake, limit=7, seed=5, normalize="zero_one").materialize(6)
  assert split.images.shape == (6, 24, 24, 3) and split.num_classes == 1000
  np.testing.assert_array_equal(split.labels, [
      int(_open(fake).source[int(i)]["label"]) for i in np.concatenate(a)[:6]])


def test_open_from_a_data_config(fake, tmp_path):
  from xsens.data.config import default_data_config  # pylint: disable=g-import-not-at-top
  cfg = default_data_config()
  cfg.update(name="imagenet2012", data_dir=fake["data_dir"], test_split="validation[:5]")
  stream = streaming.open_stream(data_config=cfg, image_size=24, batch_size=4, num_workers=1)
  assert len(stream) == 5 and stream.split == "validation[:5]"
  cfg.data_dir = str(tmp_path)
  with pytest.raises(ConfigError, match="config.data.name: dataset 'imagenet2012' not found"):
    streaming.open_stream(data_config=cfg)


def test_missing_dataset_and_bad_fields_name_the_field(fake, tmp_path):
  with pytest.raises(ConfigError) as e:
    streaming.open_stream("imagenet2012", data_dir=str(tmp_path), field="imagenet.name")
  assert e.value.field == "imagenet.name"
  assert "dataset 'imagenet2012' not found in data_dir" in str(e.value)
  assert "never downloads" in str(e.value)
  with pytest.raises(ConfigError, match="config.imagenet.split: unknown split 'train'"):
    streaming.open_stream("imagenet2012", split="train", data_dir=fake["data_dir"],
                          field="imagenet.name", split_field="imagenet.split")
  with pytest.raises(ConfigError, match="config.imagenet.label_key: .*no feature 'y'"):
    streaming.open_stream("imagenet2012", data_dir=fake["data_dir"], label_key="y",
                          field="imagenet.name")
  with pytest.raises(ConfigError, match="config.data.crop: .*allowed: center, resize"):
    streaming.open_stream("imagenet2012", data_dir=fake["data_dir"], crop="pad")


# ----------------------------------------------------------------------------- the study


def _config(fake, **imagenet):
  config = rob_cfg.get_config("imagenet,smoke")
  config.imagenet.data_dir = fake["data_dir"]
  config.imagenet.update(imagenet)
  config.runs.vit_b16.pretrained.path = str(fake["root"] / "ViT-B_16.npz")
  config.runs.bit_m_r50x1.pretrained.path = str(fake["root"] / "BiT-M-R50x1-ILSVRC2012.npz")
  config.runs.bit_m_r50x1.model.num_groups = 4  # The fake BiT is 1/8 wide.
  return config


@pytest.fixture(scope="module")
def study(fake, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("rob_imagenet"))
  return workdir, studies.run(_config(fake), workdir)


@pytest.mark.slow
def test_imagenet_study_end_to_end(fake, study):
  workdir, out = study
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  rows = {r["run"]: r for r in results["rows"]}
  assert set(rows) == {"vit_b16", "bit_m_r50x1"}
  assert results["corruption_source"] == "tfds"
  # The fake ViT's exact accuracies: labels were its own predictions on a known share.
  assert rows["vit_b16"]["clean_accuracy"] == pytest.approx(fake["right"]["clean"] / N)
  for (c, s) in CORRUPTED:
    assert results["corruption_accuracy"]["vit_b16"][f"{c}:{s}"] == pytest.approx(
        fake["right"][(c, s)] / N), (c, s)
  assert rows["bit_m_r50x1"]["mCE"] == pytest.approx(1.0)  # The baseline's own mCE.
  assert rows["vit_b16"]["mCE_alexnet"] is None  # Only 2 x 2 corruptions in the smoke run.
  ck = fake_vit_checkpoint(num_classes=1000)  # Its 2 x 2 position grid is resized to 8 x 8.
  pe = ck["Transformer/posembed_input/pos_embedding"]
  assert rows["vit_b16"]["params"] == sum(v.size for v in ck.values()) - pe.size + 64 * pe.shape[-1]
  for row in rows.values():
    for key in ("mCA", "acc_noise", "acc_weather", "FGSM@8/255", "PGD@8/255",
                "low_freq_share", "patch_alignment"):
      assert 0.0 <= row[key] <= 1.0, key
  removal = results["layer_removal"]
  assert set(removal["vit_b16"]["accuracy"]) == {f"{l}:{p}" for l in range(2)
                                                 for p in ("block", "attention", "mlp")}
  # The fake BiT has units (1, 2, 1, 1): only block2/unit02 (flat 2) has an identity shortcut.
  assert set(removal["bit_m_r50x1"]["accuracy"]) == {"2:block"}
  assert set(results["adversarial"]["transfer"]) == {"vit_b16->bit_m_r50x1",
                                                     "bit_m_r50x1->vit_b16"}
  for energy in results["patch_energy"].values():
    assert np.asarray(energy).shape == (4, 4)  # 32 x 32 on the 8-pixel grid.
    assert np.sum(energy) == pytest.approx(1.0, abs=1e-4)
  for plot in ("corruption_severity.png", "corruption_categories.png",
               "adversarial_epsilon.png", "perturbation_patch_energy.png",
               "layer_removal_vit_b16.png", "layer_removal_bit_m_r50x1.png"):
    assert os.path.getsize(os.path.join(workdir, plot)) > 1000
  assert "Robustness of pretrained models on imagenet2012" in out["markdown"]


@pytest.mark.slow
def test_pretraining_scale_variant_compares_vit_and_resnet_per_pretraining_set(fake, tmp_path):
  """`:imagenet,scale`: four checkpoints (fake files of the vit_jax / big_transfer layouts,
  seeds standing in for the two pre-training sets), one report column and a ViT - ResNet
  comparison per pre-training set."""
  config = rob_cfg.get_config("imagenet,smoke,scale")
  assert {n: r.pretraining for n, r in config.runs.items()} == {
      "vit_b16_i1k": "ImageNet-1k", "vit_b16_i21k": "ImageNet-21k",
      "bit_s_r50x1": "ImageNet-1k", "bit_m_r50x1": "ImageNet-21k"}
  config.imagenet.data_dir = fake["data_dir"]
  config.imagenet.limit = 6
  rc = config.robustness
  rc.num_examples, rc.corruptions.names, rc.corruptions.severities = 4, ("fog",), (5,)
  rc.adversarial.epsilons, rc.adversarial.pgd_steps = (8 / 255,), 1
  for seed, (vit, bit) in enumerate((("vit_b16_i1k", "bit_s_r50x1"),
                                     ("vit_b16_i21k", "bit_m_r50x1"))):
    np.savez(tmp_path / f"{vit}.npz", **fake_vit_checkpoint(seed=seed, num_classes=1000))
    np.savez(tmp_path / f"{bit}.npz", **fake_bit_checkpoint(seed=seed, num_classes=1000))
    config.runs[vit].pretrained.path = str(tmp_path / f"{vit}.npz")
    config.runs[bit].pretrained.path = str(tmp_path / f"{bit}.npz")
    config.runs[bit].model.num_groups = 4  # The fake BiT is 1/8 wide.
  out = studies.run(config, str(tmp_path / "wd"))
  rows = {r["run"]: r for r in out["rows"]}
  assert rows["vit_b16_i1k"]["pretraining"] == "ImageNet-1k"
  assert rows["bit_m_r50x1"]["pretraining"] == "ImageNet-21k"
  comparison = out["pretraining_comparison"]
  assert set(comparison) == {"ImageNet-1k", "ImageNet-21k"}
  for data, (vit, bit) in (("ImageNet-1k", ("vit_b16_i1k", "bit_s_r50x1")),
                           ("ImageNet-21k", ("vit_b16_i21k", "bit_m_r50x1"))):
    entry = comparison[data]
    assert (entry["ViT"], entry["ResNet"]) == (vit, bit)
    for measure, key in (("mCA", "mCA"), ("PGD", "PGD@8/255"),
                         ("clean_accuracy", "clean_accuracy")):
      assert entry[measure]["ViT - ResNet"] == pytest.approx(rows[vit][key] - rows[bit][key])
  md = (tmp_path / "wd" / "results.md").read_text()
  assert "pretraining" in md and "ImageNet-21k (vit_b16_i21k vs bit_m_r50x1)" in md
  assert os.path.getsize(tmp_path / "wd" / "pretraining_scale.png") > 1000
  payload = json.loads((tmp_path / "wd" / "results.json").read_text())
  assert payload["pretraining"]["bit_s_r50x1"] == "ImageNet-1k"


def test_bad_pretraining_name_is_refused(fake, tmp_path):
  config = _config(fake)
  config.runs.vit_b16.pretraining = "  "
  with pytest.raises(ConfigError, match="config.runs.vit_b16.pretraining: must be None or"):
    studies.run(config, str(tmp_path / "wd"))


def _subset(fake, n):
  """(model-space images, labels) of the first n stream examples, computed independently."""
  order = streaming.stream_order(N, SMOKE.imagenet.limit, SMOKE.imagenet.seed)[:n]
  source = _open(fake).source
  labels = np.array([int(source[int(i)]["label"]) for i in order])
  files = [_fname(source[int(i)]) for i in order]
  base = fake["base"][[int(f[-13:-5]) - 1 for f in files]]
  x = jnp.asarray(base, jnp.float32) / 255.0
  x = jax.image.resize(x, (n, IMAGE_SIZE, IMAGE_SIZE, 3), "bilinear", antialias=True)
  return (x - 0.5) / 0.5, labels


@pytest.mark.slow
def test_adversarial_and_removal_subset_match_direct_computation(fake, study):
  _, out = study
  n = SMOKE.robustness.num_examples
  x, labels = _subset(fake, n)
  model, variables = fake["vit"].model, fake["vit"].variables
  predict = jax.jit(lambda z: model.apply(variables, z, train=False))
  acc = lambda z: float(np.mean(np.asarray(jnp.argmax(predict(z), -1)) == labels))
  # Layer removal's intact baseline is the clean accuracy of the first num_examples images.
  assert out["layer_removal"]["vit_b16"]["baseline"] == pytest.approx(acc(x))
  from xsens.measures import adversarial  # pylint: disable=g-import-not-at-top
  apply_fn = fake["vit"].apply_fn
  fgsm = jax.jit(lambda x, eps: adversarial.fgsm(
      apply_fn, variables, x, labels=jnp.asarray(labels), epsilon=eps, clip_min=-1.0,
      clip_max=1.0)["adv_inputs"])
  for e, eps in enumerate(SMOKE.robustness.adversarial.epsilons):
    x_f = fgsm(x, 2 * eps)
    assert out["adversarial"]["fgsm"]["vit_b16"][e] == pytest.approx(acc(x_f)), eps


def test_synthesised_corruptions_equal_direct_computation(fake):
  config = _config(fake)
  ic, rc = config.imagenet, config.robustness
  rc.corruptions.names, rc.corruptions.severities = ["contrast"], [5]
  rc.baseline_run = "vit_b16"
  runs = {"vit_b16": fake["vit"]}
  out = ri.corruption_section(runs, ic, rc, "synthesize", batch_size=8)
  # Direct: the same base images, corrupted in the same batches with the same seeds.
  order = streaming.stream_order(N, ic.limit, ic.seed)
  stream = _open(fake)
  files = [_fname(stream.source[int(i)]) for i in order]
  labels = np.array([int(stream.source[int(i)]["label"]) for i in order])
  base = fake["base"][[int(f[-13:-5]) - 1 for f in files]].astype(np.float32) / 255
  from xsens.measures import corruptions  # pylint: disable=g-import-not-at-top
  x = np.concatenate([corruptions.corrupt(base[s:s + 8], "contrast", 5, seed=(0, b, 0, 5))
                      for b, s in enumerate(range(0, N, 8))])
  xm = jax.image.resize(jnp.asarray(x), (N, IMAGE_SIZE, IMAGE_SIZE, 3), "bilinear",
                        antialias=True)
  pred = np.asarray(jnp.argmax(fake["vit"].model.apply(
      fake["vit"].variables, (xm - 0.5) / 0.5, train=False), -1))
  assert out["accuracy"]["vit_b16"][("contrast", 5)] == pytest.approx(np.mean(pred == labels))
  assert out["summary"]["vit_b16"]["clean"] == pytest.approx(fake["right"]["clean"] / N)
  assert out["source"] == "synthesize"


@pytest.mark.parametrize("field, value, match", [
    ("runs.vit_b16.pretrained.path", None, "must be set to a local vit checkpoint"),
    ("runs.vit_b16.pretrained.path", "/nonexistent/ViT-B_16.npz", "no checkpoint file"),
    ("imagenet.data_dir", "EMPTY", "dataset 'imagenet2012' not found"),
    ("imagenet.corruption_source", "web", "allowed: auto, tfds, synthesize"),
    ("robustness.num_examples", 100, "exceeds imagenet.limit"),
])
def test_bad_settings_refused_before_anything_is_written(fake, tmp_path, field, value, match):
  config = _config(fake)
  node = config
  *parents, leaf = field.split(".")
  for p in parents:
    node = node[p]
  node[leaf] = str(tmp_path / "empty") if value == "EMPTY" else value
  field_name = "imagenet.name" if field == "imagenet.data_dir" else field
  with pytest.raises(ConfigError, match=f"config.{field_name}: .*{match}"):
    studies.run(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


def test_tfds_corruptions_demanded_but_missing(fake, tmp_path):
  config = _config(fake, corruption_source="tfds")
  config.robustness.corruptions.names = ["frost"]
  with pytest.raises(ConfigError, match="config.imagenet.corrupted_name: 2 of the 2 ImageNet-C "
                     "sets are not prepared"):
    studies.run(config, str(tmp_path / "wd"))
  assert ri.corruption_source(_config(fake).imagenet, config.robustness) == "synthesize"


def test_wrong_head_size_is_refused(fake, tmp_path):
  np.savez(tmp_path / "vit10.npz", **fake_vit_checkpoint(num_classes=10))
  config = _config(fake)
  config.runs.vit_b16.pretrained.path = str(tmp_path / "vit10.npz")
  with pytest.raises(ConfigError, match="10-way head but the dataset has 1000 classes"):
    studies.run(config, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


@pytest.mark.slow
def test_bit_unit_removal_equals_a_zero_residual_branch():
  """Skipping unit k is the identity on the residual stream: the same as zeroing the kernel
  of its last conv (weight standardisation maps a zero kernel to zero)."""
  from xsens.measures import perturbations as pert  # pylint: disable=g-import-not-at-top
  from xsens.models import bit as bit_lib  # pylint: disable=g-import-not-at-top
  model = bit_lib.BiTResNet(num_classes=7, block_units=(1, 3, 1, 1), width_factor=0.125,
                            num_groups=4)
  x = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
  variables = jax.jit(model.init)(jax.random.key(1), x)
  assert bit_lib.identity_units(model.block_units) == (2, 3)
  assert pert.removable_layers(model) == ((2, "block"), (3, "block"))
  # Jitted, not op by op: the intact forward compiles once for the original and both
  # zeroed variable trees.
  apply = jax.jit(lambda m, v: m.apply(v, x), static_argnums=0)
  for k, name in ((2, "unit02"), (3, "unit03")):
    zeroed = jax.tree_util.tree_map_with_path(
        lambda p, v, name=name: jnp.zeros_like(v) if (
            name in jax.tree_util.keystr(p) and "'c'" in jax.tree_util.keystr(p)
            and "block2" in jax.tree_util.keystr(p)) else v, variables)
    got = apply(pert.remove_layers(model, [(k, "block")]), variables)
    np.testing.assert_allclose(got, apply(model, zeroed), rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, apply(model, variables), atol=1e-3)
  with pytest.raises(ConfigError, match="block2/unit01 has a projection shortcut"):
    model.clone(skip=(1,)).check_input((32, 32, 3))


def test_mock_data_streams_without_tensorflow(tmp_path):
  """`tfds.testing.mock_data` serves random decoded arrays for an unprepared builder."""
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    stream = streaming.open_stream("imagenet2012", data_dir=str(tmp_path), image_size=16,
                                   batch_size=4, num_workers=1, normalize="zero_one")
    batches = list(stream.batches())
  assert len(stream) == 6 and stream.num_classes == 1000
  assert [b["image"].shape for b in batches] == [(4, 16, 16, 3)] * 2
  np.testing.assert_array_equal(batches[1]["mask"], [1, 1, 0, 0])
  assert all(0 <= b["image"].min() and b["image"].max() <= 1 for b in batches)


def test_alexnet_mce():
  errors = {(c, s): e for c, e in lab_corruptions.ALEXNET_ERRORS.items() for s in range(1, 6)}
  assert lab_corruptions.alexnet_mce(errors) == pytest.approx(1.0)  # AlexNet itself.
  half = {k: v / 2 for k, v in errors.items()}
  half[("fog", 5)] += 0.05 * 5 * lab_corruptions.ALEXNET_ERRORS["fog"]  # fog's CE rises by 0.05.
  assert lab_corruptions.alexnet_mce(half) == pytest.approx(0.5 + 0.05 / 15)
  with pytest.raises(ValueError, match="all 15 corruptions"):
    lab_corruptions.alexnet_mce({k: v for k, v in errors.items() if k[1] != 5})
