"""Model zoo: one registry of flax.linen models, one `ModelEntry` per name.

An entry builds its module for `num_classes` and the per-example `input_shape`, checks the
config against that shape before anything is traced (`ConfigError` naming
`model.<field>`), and knows its input dtype, its removable layers and its
pretrained-checkpoint loader. Every module maps inputs [B, *input_shape] to float32
outputs via `model.apply(variables, x, train=False)`; every one has the config field `dtype`
("float32" | "bfloat16"), its compute dtype (params stay float32; `xsens.models.precision`):

  name                               inputs (per example)         outputs
  vit, resnet18, densenet, convmixer,
  mlp, cnn, bit_resnet, reuse_vit,
  convnext                           float32 images (H, W, C)      logits [B, num_classes]
  roberta, gpt2, lstm                int32 token ids (L,)          logits [B, num_classes]
  grokking_transformer               int32 ids "a b =" (3,)        logits [B, num_classes]
  one_layer_attention, token_mlp     float32 tokens (n, d)         outputs [B, num_classes]
  one_layer_vit, two_layer_cnn       float32 tokens (M, d)         one score f [B] (labels
                                                                   ±1; num_classes is 2)

  model = get_model("vit", num_classes=10, input_shape=(28, 28, 1), patch_size=7)
  variables = model.init({"params": key, "dropout": key}, x, train=False)
  entry = REGISTRY["vit"]   # entry.input_dtype, entry.removable_layers(model),
                            # entry.remove_layers(model, layers), entry.load_pretrained(...)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from xsens.errors import ConfigError
from xsens.models import mlm as mlm_lib
from xsens.models import pretrained as pretrained_lib
from xsens.models.bit import BiTResNet
from xsens.models.cnn import CNN
from xsens.models.convmixer import ConvMixer
from xsens.models.convnext import ConvNeXt
from xsens.models.densenet import DenseNet
from xsens.models.eigen_vit import EigenViT
from xsens.models.grokking_transformer import GrokkingTransformer
from xsens.models.mlp import MLP
from xsens.models.one_layer_attention import OneLayerAttention, TokenMLP
from xsens.models.one_layer_vit import OneLayerViT
from xsens.models.resnet import ResNet18
from xsens.models.reuse_vit import ReuseViT
from xsens.models.text import TEXT_MODELS
from xsens.models.two_layer_cnn import TwoLayerCNN
from xsens.models.vit import ViT

Layer = tuple[int, str]


def _as_tuple(value):
  """Lists (e.g. from ml_collections) -> tuples, so module fields stay hashable."""
  return tuple(value) if isinstance(value, list) else value


@dataclasses.dataclass(frozen=True)
class ModelEntry:
  """One registered model: how to build it and what it knows about itself.

  Attributes:
    name: the registry key (`config.model.name`).
    module: the flax.linen class; its dataclass fields other than `parent`, `name`
      and `classes_field` are the config fields.
    input_dtype: dtype of the inputs: jnp.float32 (images, tokens) or jnp.int32
      (token ids).
    classes_field: the module field that receives `num_classes` ("num_classes",
      "num_outputs"); None for a binary model with one score f [B] (label sign),
      which only takes num_classes = 2.
    pretrained: the checkpoint release the model loads (`pretrained.Format`), or None.
  """
  name: str
  module: type[nn.Module]
  input_dtype: Any = jnp.float32
  classes_field: Optional[str] = "num_classes"
  pretrained: Optional[pretrained_lib.Format] = None

  @property
  def config_fields(self) -> tuple[str, ...]:
    """The keyword arguments `build` accepts (the model's config fields)."""
    skip = ("parent", "name", self.classes_field)
    return tuple(f.name for f in dataclasses.fields(self.module) if f.name not in skip)

  def build(self, num_classes: int, input_shape: Sequence[int], **kwargs) -> nn.Module:
    """The unbound module for `num_classes` on inputs of per-example `input_shape`.

    Raises:
      ConfigError: naming `model.<field>` for an unknown field or a setting impossible
        for `input_shape` (or `num_classes`).
    """
    allowed = self.config_fields
    for key in kwargs:
      if key not in allowed:
        raise ConfigError(
            f"model.{key}",
            f"unknown field for model {self.name!r}; allowed: {', '.join(sorted(allowed))}")
    fields = {k: _as_tuple(v) for k, v in kwargs.items()}
    if self.classes_field is None:
      if isinstance(num_classes, bool) or num_classes != 2:
        raise ConfigError("model.name", f"{self.name!r} is a binary classifier (one score "
                          f"f [B], the label its sign); the data has {num_classes!r} classes")
    else:
      fields[self.classes_field] = num_classes
    model = self.module(**fields)
    model.check_input(input_shape)
    return model

  def _check_module(self, model: nn.Module) -> None:
    if not isinstance(model, self.module):
      raise TypeError(f"model must be a {self.module.__name__} (entry {self.name!r}), got "
                      f"{type(model).__name__}")

  @property
  def supports_removal(self) -> bool:
    """Whether the module can drop residual branches (`removable_layers`)."""
    return hasattr(self.module, "remove_layers")

  def removable_layers(self, model: nn.Module,
                       parts: Optional[Sequence[str]] = None) -> tuple[Layer, ...]:
    """The (layer, part) pairs `remove_layers` can drop from `model`.

    Args:
      model: a module of this entry.
      parts: subset of ('block', 'attention', 'mlp'); None: every part the model has
        (a ViT all three, the ResNets 'block').

    Raises:
      ValueError: for a model without removable layers, or parts it lacks.
    """
    self._check_module(model)
    if not self.supports_removal:
      raise ValueError(f"model {self.name!r} has no removable layers")
    return model.removable_layers() if parts is None else model.removable_layers(tuple(parts))

  def remove_layers(self, model: nn.Module, layers: Sequence[Layer]) -> nn.Module:
    """A copy of `model` with the residual branches `layers` dropped (same variables)."""
    self._check_module(model)
    if not self.supports_removal:
      raise ValueError(f"model {self.name!r} has no removable layers")
    return model.remove_layers(tuple((int(i), str(p)) for i, p in layers))

  def load_pretrained(self, path: Union[str, os.PathLike], model: nn.Module,
                      input_shape: Sequence[int], *, reinit_head: bool = False,
                      key: Optional[jax.Array] = None) -> dict[str, Any]:
    """Variables {"params": ...} for `model` from the checkpoint file at `path` (the
    release's `.npz` or `.safetensors`).

    Args:
      path: a local file of this entry's release (`pretrained.name`).
      model: a module of this entry (e.g. from `pretrained.config_from_checkpoint`).
      input_shape: per-example input shape (a ViT's position embedding is resized).
      reinit_head: replace the head by a fresh one of the model's num_classes.
      key: PRNG key of the fresh head (None: zeros).

    Raises:
      ValueError: for an entry without a loader.
      pretrained.CheckpointError: listing what does not fit the model.
    """
    if self.pretrained is None:
      raise ValueError(f"model {self.name!r} has no pretrained-checkpoint loader; models "
                       f"with one: {', '.join(pretrained_formats())}")
    self._check_module(model)
    return self.pretrained.load(path, model, input_shape, reinit_head=reinit_head, key=key)


# "roberta" loads the encoder of an xsens masked LM (`mlm.XSENS_MLM`: pre-train, fine-tune).
_TEXT = tuple(ModelEntry(name, module, input_dtype=jnp.int32,
                         pretrained=mlm_lib.XSENS_MLM if name == "roberta" else None)
              for name, module in TEXT_MODELS.items())

REGISTRY: dict[str, ModelEntry] = {e.name: e for e in (
    ModelEntry("vit", ViT, pretrained=pretrained_lib.VIT_JAX),
    ModelEntry("resnet18", ResNet18),
    ModelEntry("densenet", DenseNet),
    ModelEntry("convmixer", ConvMixer),
    ModelEntry("mlp", MLP),
    ModelEntry("cnn", CNN),
    ModelEntry("bit_resnet", BiTResNet, pretrained=pretrained_lib.BIG_TRANSFER),
    ModelEntry("reuse_vit", ReuseViT),
    # ViT with attention from partial computation (xsens.models.eigen_vit).
    ModelEntry("eigen_vit", EigenViT),
    # ConvNeXt (presets in xsens.models.convnext.PRESETS); loads timm .safetensors.
    ModelEntry("convnext", ConvNeXt, pretrained=pretrained_lib.TIMM_CONVNEXT),
    # Text classifiers on int32 token ids [B, L] (xsens.models.text).
    *_TEXT,
    # The grokking study's one-block transformer on ids "a b =" [B, 3].
    ModelEntry("grokking_transformer", GrokkingTransformer, input_dtype=jnp.int32),
    # The synthetic_sensitivity study's models on float tokens [B, n, d].
    ModelEntry("one_layer_attention", OneLayerAttention, classes_field="num_outputs"),
    ModelEntry("token_mlp", TokenMLP, classes_field="num_outputs"),
    # The benign_overfitting study's binary models on float tokens [B, M, d].
    ModelEntry("one_layer_vit", OneLayerViT, classes_field=None),
    ModelEntry("two_layer_cnn", TwoLayerCNN, classes_field=None),
)}

# The module class of every entry (e.g. for `dataclasses.fields`).
MODELS: dict[str, type[nn.Module]] = {name: e.module for name, e in REGISTRY.items()}


def get_entry(name: str) -> ModelEntry:
  """`REGISTRY[name]`; ConfigError naming `model.name` for an unknown name."""
  if name not in REGISTRY:
    raise ConfigError(
        "model.name", f"unknown model {name!r}; allowed: {', '.join(sorted(REGISTRY))}")
  return REGISTRY[name]


def config_fields(name: str) -> tuple[str, ...]:
  """The config fields (keyword arguments of `get_model`) of model `name`."""
  return get_entry(name).config_fields


def pretrained_formats() -> dict[str, pretrained_lib.Format]:
  """{name: checkpoint format} of the entries that load pretrained weights, registry order."""
  return {name: e.pretrained for name, e in REGISTRY.items() if e.pretrained is not None}


def get_model(name: str, num_classes: int, input_shape: Sequence[int], **kwargs) -> nn.Module:
  """Builds registered model `name` and checks it against `input_shape`.

  Args:
    name: a key of `REGISTRY`.
    num_classes: size of the logits (2 for the binary one-score models).
    input_shape: per-example shape of the inputs: (H, W, C) images, (L,) token ids,
      (n, d) tokens (see the module docstring).
    **kwargs: config fields of that model (see `config_fields(name)`).

  Returns:
    The unbound module.

  Raises:
    ConfigError: naming `model.<field>` for an unknown name or field, or a
      setting impossible for `input_shape`.
  """
  return get_entry(name).build(num_classes, input_shape, **kwargs)


__all__ = ["BiTResNet", "CNN", "ConvMixer", "ConvNeXt", "DenseNet", "GrokkingTransformer", "MLP",
           "MODELS", "ModelEntry", "OneLayerAttention", "OneLayerViT", "REGISTRY",
           "ResNet18", "ReuseViT", "TEXT_MODELS", "TokenMLP", "TwoLayerCNN", "ViT",
           "config_fields", "get_entry", "get_model", "pretrained_formats"]
