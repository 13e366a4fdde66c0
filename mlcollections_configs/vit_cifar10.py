"""Train a ViT-S/4 from scratch on CIFAR-10 (32²), streaming with random crops and flips.

  python -m xsens --config=mlcollections_configs/vit_cifar10.py --workdir=workdirs/vit_cifar10
  python -m xsens --config=mlcollections_configs/vit_cifar10.py:smoke --workdir=/tmp/s

Choices, and why:
- Model: ViT-S (width 384, depth 12, 6 heads, MLP 1536; big_vision's "S" size) with 4×4
  patches, so a 32² image gives 8×8 = 64 tokens (+ class token), the sequence length a 224²
  image has at patch 28: small enough for CIFAR-sized compute, fine enough to see objects.
- Optimiser: AdamW (lr 1e-3, weight decay 0.05, b2 0.999), cosine decay after 5 warm-up epochs
  (488 steps), gradient clipping at 1.0, batch 512, 200 epochs (19,531 steps): the usual
  from-scratch ViT recipe (DeiT, Touvron et al. 2021, scaled to CIFAR), without label smoothing.
- Augmentation: the classic CIFAR random crop (zero-pad 4 pixels, crop 32²) and horizontal
  flip, per example from the streamed split (`data.stream`, crop "pad_crop"); no RandAugment or
  mixup, so the numbers isolate the architecture. Expect a ViT trained this way to trail a
  ResNet on CIFAR-10 (ViTs need strong augmentation or pre-training at this scale); not run
  here.
- Data: TFDS `cifar10` prepared as ArrayRecord, read with grain (4 worker processes); the
  iterator's position is checkpointed, so a resumed run sees the same batches.

Variants: `smoke` (a tiny ViT, 4 steps; the tests run it on `tfds.testing.mock_data`).

Shows: CIFAR-10 test accuracy of the ViT (results.md).
"""

import ml_collections

from mlcollections_configs import common
from xsens.config_utils import parse_arg
from xsens.data.config import stream_config

TRAIN_EXAMPLES = 50_000


def get_config(arg=None):
  arg = parse_arg(arg, smoke=False)
  config = ml_collections.ConfigDict()
  config.study = "train"
  c = config.train = common.train_config()
  c.data.update(name="cifar10", train_split="train", test_split="test", image_size=(32, 32),
                normalize="half")
  c.data.stream = stream_config(crop="pad_crop", pad=4, flip=True, eval_crop="resize",
                                num_workers=4, eval_threads=4)
  c.model = common.model_config("vit", patch_size=4, width=384, depth=12, num_heads=6,
                                mlp_dim=1536)
  # bfloat16 compute (float32 params and optimizer state) and the fused attention call;
  # on a GPU, --config.train.model.attention_impl=cudnn selects cuDNN's flash attention.
  c.model.update(dtype="bfloat16", attention_impl="xla_fused")
  c.optimizer.update(name="adamw", learning_rate=1e-3, weight_decay=0.05,
                     schedule="cosine", warmup_steps=5 * TRAIN_EXAMPLES // 512,
                     grad_clip_norm=1.0)
  c.loss = "cross_entropy"
  c.batch_size = 512
  c.total_steps = 200 * TRAIN_EXAMPLES // 512
  c.eval_every = 1000
  c.eval_batch_size = 1000
  c.eval_train_examples = 10_000
  c.log_every = 50
  c.checkpoint_every = 1000
  if arg.smoke:
    c.model.update(patch_size=8, width=16, depth=1, num_heads=2, mlp_dim=32)
    c.data.stream.update(num_workers=0, eval_threads=1)
    c.optimizer.warmup_steps = 1
    c.update(batch_size=8, total_steps=4, eval_every=2, log_every=2, checkpoint_every=2,
             eval_batch_size=8, eval_train_examples=8, progress=False)
  return config


def validate(config) -> None:
  """Nothing beyond the trainer's block: every field is one of `config.train`, checked
  with its data and model where the run is built (`xsens.train.trainer.validate_config`)."""
  del config
