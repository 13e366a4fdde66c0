"""Runs loaded from public pretrained checkpoints instead of trained: the ImageNet set-ups.

`runs.<run>.pretrained.path` names a local checkpoint of a model of the registry with a
loader (`xsens.models.pretrained_formats`: vit_jax and big_transfer `.npz`, timm ConvNeXt
`.safetensors`); `load_run` builds the model the checkpoint implies (plus the run's
`model` overrides) and loads its weights into a `PretrainedRun`.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import numpy as np

from xsens import models as models_lib
from xsens import paths
from xsens.errors import ConfigError
from xsens.models import pretrained

# Where a checkpoint of each model kind can be downloaded (named in the errors).
DOWNLOADS = {
    "vit": "e.g. https://storage.googleapis.com/vit_models/imagenet21k+imagenet2012/"
           "ViT-B_16.npz (google-research/vision_transformer)",
    "bit_resnet": "e.g. https://storage.googleapis.com/bit_models/BiT-M-R50x1-ILSVRC2012.npz "
                  "(google-research/big_transfer)",
    "convnext": "e.g. model.safetensors of timm/convnext_tiny.fb_in1k on the Hugging Face "
                "hub (huggingface/pytorch-image-models)"}


@dataclasses.dataclass(frozen=True, eq=False)
class PretrainedRun:
  """One loaded checkpoint."""
  model: nn.Module
  variables: dict
  num_params: int
  path: str

  @functools.cached_property
  def apply_fn(self):
    """`apply_fn(variables, inputs) -> logits` in eval mode; one object per run."""
    return functools.partial(self.model.apply, train=False)


def validate_checkpoint_runs(runs, formats: dict) -> None:
  """Each run of `runs` names a model of `formats` ({name: checkpoint format}) and an
  existing local checkpoint file in `pretrained.path` (ConfigError naming the field)."""
  for name, run in runs.items():
    kind = run.model.get("name")
    if kind not in formats:
      raise ConfigError(f"runs.{name}.model.name", f"got {kind!r}; the ImageNet set-up "
                        f"evaluates pretrained checkpoints of: {', '.join(formats)}")
    path = run.get("pretrained", {}).get("path")
    hint = DOWNLOADS.get(kind, "")
    if path is None:
      raise ConfigError(f"runs.{name}.pretrained.path", f"must be set to a local {kind} "
                        f"checkpoint fine-tuned on ImageNet-1k, {hint}; e.g. "
                        f"--config.runs.{name}.pretrained.path=/path/to/file"
                        f"{formats[kind].suffix}")
    if not paths.isfile(paths.absolute(str(path))):
      raise ConfigError(f"runs.{name}.pretrained.path", f"no checkpoint file at {path!r} "
                        f"({hint})")


def load_run(name: str, run, image_shape, num_classes: int | None) -> PretrainedRun:
  """Builds the model implied by the checkpoint (+ `runs.<name>.model` overrides) and loads it."""
  field = f"runs.{name}.pretrained.path"
  path = paths.absolute(str(run.pretrained.path))
  kind = run.model.name
  fmt = models_lib.pretrained_formats()[kind]  # (`validate_checkpoint_runs` checks it.)
  try:
    ckpt = fmt.read(path)
    kwargs = fmt.config_from_checkpoint(ckpt)
  except (OSError, ValueError) as e:
    raise ConfigError(field, f"cannot read {path!r} as a {kind} checkpoint "
                      f"({fmt.name} {fmt.suffix}): {pretrained.one_line(e)}") from None
  overrides = {k: v for k, v in run.model.items() if k != "name" and v is not None}
  kwargs.update(overrides)
  classes = kwargs.pop("num_classes")
  if num_classes is not None and classes != num_classes:
    raise ConfigError(field, f"{path!r} has a {classes}-way head but the dataset has "
                      f"{num_classes} classes; use a checkpoint fine-tuned on ImageNet-1k "
                      f"({DOWNLOADS[kind]})")
  try:
    model = models_lib.get_model(kind, classes, image_shape, **kwargs)
  except ConfigError as e:
    raise ConfigError(f"runs.{name}.{e.field}", e.message) from None
  try:
    params = fmt.params_from_checkpoint(ckpt, model, image_shape)
  except pretrained.CheckpointError as e:
    raise ConfigError(field, f"{path!r} does not fit the model: "
                      f"{pretrained.one_line(e)}") from None
  num_params = int(sum(np.prod(p.shape) for p in jax.tree.leaves(params)))
  return PretrainedRun(model=model, variables={"params": params}, num_params=num_params,
                       path=path)
