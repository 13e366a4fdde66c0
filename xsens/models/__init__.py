"""Vision model zoo: one registry of flax.linen classifiers.

Every model maps float32 [B, H, W, C] to float32 logits [B, num_classes] via
`model.apply(variables, x, train=False)` and validates its config against an
input shape with `check_input((H, W, C))` before anything is traced.

  model = get_model("vit", num_classes=10, image_shape=(28, 28, 1), patch_size=7)
  variables = model.init({"params": key, "dropout": key}, x, train=False)
"""

import dataclasses

import flax.linen as nn

from xsens.errors import ConfigError
from xsens.models.bit import BiTResNet
from xsens.models.cnn import CNN
from xsens.models.convmixer import ConvMixer
from xsens.models.densenet import DenseNet
from xsens.models.mlp import MLP
from xsens.models.resnet import ResNet18
from xsens.models.reuse_vit import ReuseViT
from xsens.models.text import TEXT_MODELS
from xsens.models.vit import ViT

MODELS: dict[str, type[nn.Module]] = {
    "vit": ViT,
    "resnet18": ResNet18,
    "densenet": DenseNet,
    "convmixer": ConvMixer,
    "mlp": MLP,
    "cnn": CNN,
    "bit_resnet": BiTResNet,
    "reuse_vit": ReuseViT,
    # Text classifiers on int32 token ids [B, L] (xsens.models.text).
    **TEXT_MODELS,
}

_NOT_CONFIG = ("parent", "name", "num_classes")


def config_fields(name: str) -> tuple[str, ...]:
  """The config fields (keyword arguments of `get_model`) of model `name`."""
  return tuple(f.name for f in dataclasses.fields(MODELS[name])
               if f.name not in _NOT_CONFIG)


def _as_tuple(value):
  """Lists (e.g. from ml_collections) -> tuples, so module fields stay hashable."""
  return tuple(value) if isinstance(value, list) else value


def get_model(name: str, num_classes: int, image_shape: tuple[int, int, int],
              **kwargs) -> nn.Module:
  """Builds registered model `name` and checks it against `image_shape`.

  Args:
    name: a key of `MODELS`.
    num_classes: size of the logits.
    image_shape: (H, W, C) of the inputs; (L,) for the text models (token ids).
    **kwargs: config fields of that model (see `config_fields(name)`).

  Returns:
    The unbound module.

  Raises:
    ConfigError: naming `model.<field>` for an unknown name or field, or a
      setting impossible for `image_shape`.
  """
  if name not in MODELS:
    raise ConfigError(
        "model.name", f"unknown model {name!r}; allowed: {', '.join(sorted(MODELS))}")
  allowed = config_fields(name)
  for key in kwargs:
    if key not in allowed:
      raise ConfigError(
          f"model.{key}",
          f"unknown field for model {name!r}; allowed: {', '.join(sorted(allowed))}")
  model = MODELS[name](num_classes=num_classes,
                       **{k: _as_tuple(v) for k, v in kwargs.items()})
  model.check_input(image_shape)
  return model


__all__ = ["BiTResNet", "CNN", "ConvMixer", "DenseNet", "MLP", "MODELS", "ResNet18",
           "TEXT_MODELS", "ViT",
           "config_fields", "get_model"]
