"""Fine-tune ViT-B/16 on ImageNet-1k from a public vit_jax checkpoint, streaming the images.

  python -m xsens --config=mlcollections_configs/vit_finetune_imagenet.py \\
      --config.train.pretrained.path=/path/to/ViT-B_16.npz \\
      --config.train.data.data_dir=/path/to/tensorflow_datasets --workdir=workdirs/vit_b16_ft
  python -m xsens --config=mlcollections_configs/vit_finetune_imagenet.py:smoke --workdir=/tmp/s

The recipe is the fine-tuning recipe of vit_jax (google-research/vision_transformer,
`vit_jax/configs/common.py` and `DATASET_PRESETS["imagenet2012"]`; big_vision's
`configs/transfer.py` uses the same optimiser): SGD with momentum 0.9, learning rate 0.03,
cosine decay after 500 linear warm-up steps, global gradient-norm clipping at 1.0, no weight
decay, no label smoothing, batch 512, 20,000 steps, on 99% of `train` (the last 1% is
vit_jax's held-out minival) and evaluated on `validation`. Resolution 224² here (vit_jax
fine-tunes at 384²: `--config.train.data.image_size=(384,384)`, the position embeddings are
resized on load). Training crops are the inception crop of vit_jax / big_vision (area 5%-100%,
aspect 3/4-4/3, `xsens.data.image_prep.inception_crop_box`) plus a horizontal flip; the
evaluation image is the whole image resized to 224² (vit_jax's eval pre-processing); pixels
in [-1, 1]. The head is re-initialised for the 1000 classes and the checkpoint's pre-logits
layer dropped, as vit_jax does when fine-tuning.

The data is read with grain from a prepared TFDS `imagenet2012` in ArrayRecord format (prepare
it once, with TensorFlow, from the manually downloaded tars: `tfds build imagenet2012
--file_format=array_record --manual_dir=... --data_dir=...`), 8 worker processes; the data
iterator's position is saved with every checkpoint, so a preempted run resumes on the same
batches. With little accelerator memory,
`--config.train.accum_steps=8` (vit_jax's default) splits each step into 8 micro-batches.

Variants: `smoke` (a tiny ViT at 16², 4 steps, on whatever imagenet2012 is present: the tests
use `tfds.testing.mock_data` and a tiny fake vit_jax checkpoint).

Shows: ImageNet top-1 of the fine-tuned model (results.md; not run here).
"""

import ml_collections

from mlcollections_configs import common
from xsens.config_utils import parse_arg
from xsens.data.config import stream_config


def get_config(arg=None):
  arg = parse_arg(arg, smoke=False)
  config = ml_collections.ConfigDict()
  config.study = "train"
  c = config.train = common.train_config()
  c.data.update(name="imagenet2012", train_split="train[:99%]", test_split="validation",
                image_size=(224, 224), normalize="half")
  c.data.stream = stream_config(
      crop="inception", area_range=(0.05, 1.0), aspect_range=(3 / 4, 4 / 3), flip=True,
      resample="bilinear", eval_crop="resize", eval_resample="bilinear", num_workers=8,
      eval_threads=8)
  c.model = common.model_config("vit", patch_size=16, width=768, depth=12, num_heads=12,
                                mlp_dim=3072)
  # bfloat16 compute (float32 params and optimizer state) and the fused attention call;
  # on a GPU, --config.train.model.attention_impl=cudnn selects cuDNN's flash attention.
  c.model.update(dtype="bfloat16", attention_impl="xla_fused")
  c.pretrained.reinit_head = True
  c.optimizer.update(name="momentum", learning_rate=0.03, momentum=0.9, weight_decay=0.0,
                     schedule="cosine", warmup_steps=500, grad_clip_norm=1.0)
  c.loss = "cross_entropy"
  c.batch_size = 512
  c.total_steps = 20_000
  c.eval_every = 1000
  c.eval_batch_size = 512
  c.eval_train_examples = 10_000     # train accuracy on the first 10k of the split
  c.log_every = 50
  c.checkpoint_every = 1000
  if arg.smoke:
    c.model.update(patch_size=4, width=8, depth=2, num_heads=2, mlp_dim=16)
    c.data.image_size = (16, 16)
    c.data.stream.update(num_workers=0, eval_threads=1)
    c.optimizer.warmup_steps = 1
    c.update(batch_size=8, total_steps=4, eval_every=2, log_every=2, checkpoint_every=2,
             eval_batch_size=8, eval_train_examples=8, progress=False)
  return config


def validate(config) -> None:
  """Nothing beyond the trainer's block: every field is one of `config.train`, checked
  with its data and model where the run is built (`xsens.train.trainer.validate_config`)."""
  del config
