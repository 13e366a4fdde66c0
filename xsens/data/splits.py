"""The in-memory `Split` and the TFDS split helpers shared by every dataset loader.

`xsens.data.pipeline` (images, synthetic sources, and the dispatch of `load_split`),
`xsens.data.text` (token-id datasets) and `xsens.data.streaming` (ImageNet-scale sources)
all build on this module; it imports none of them, so none of them imports another back.
"""

from collections.abc import Sequence
import dataclasses
import os
import re
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from xsens.errors import ConfigError

ROLES = ("train", "test")

_SPLIT_NAME = re.compile(r"^\s*([^\[\]+\s]+)\s*(\[.*\])?\s*$")


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: array fields do not compare.
class Split:
  """One split in host memory after preprocessing.

  `inputs` are images [N, H, W, C] float32 (preprocessed) or, for text, token ids [N, L]
  int32; `images` and `image_shape` are the same arrays under their image names.
  """
  inputs: np.ndarray
  labels: np.ndarray  # [N] int32 in [0, num_classes)
  num_classes: int
  vocab_size: int | None = None  # text datasets (xsens.data.text): ids are < vocab_size

  @property
  def input_shape(self) -> tuple[int, ...]:
    """The shape of one input: (H, W, C), or (L,) for text."""
    return tuple(self.inputs.shape[1:])

  @property
  def images(self) -> np.ndarray:
    """`inputs` under its image name (token ids for text)."""
    return self.inputs

  @property
  def image_shape(self) -> tuple[int, ...]:
    """`input_shape` under its image name."""
    return self.input_shape

  def __len__(self) -> int:
    return len(self.labels)


def default_data_dir() -> str:
  """$TFDS_DATA_DIR if set, else ~/tensorflow_datasets."""
  return os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")


def resolve_data_dir(data_config) -> str:
  """`data.data_dir` as a path string: the default if None, `~` expanded for local paths."""
  data_dir = data_config["data_dir"]
  if data_dir is None:
    return default_data_dir()
  data_dir = os.fspath(data_dir)
  return data_dir if "://" in data_dir else os.path.expanduser(data_dir)


def split_names(spec: str, field: str) -> list[str]:
  """Base split names of a TFDS split string, e.g. "train[:10%]+test" -> ["train", "test"].

  Raises `ConfigError` naming `field` (a config path) when `spec` does not parse.
  """
  if not isinstance(spec, str) or not spec.strip():
    raise ConfigError(field, f"must be a TFDS split string such as 'train' or 'train[:10%]', "
                      f"got {spec!r}")
  try:
    tfds.core.ReadInstruction.from_spec(spec)
  except (ValueError, TypeError, AssertionError) as e:
    raise ConfigError(field, f"cannot parse split {spec!r}; use TFDS split syntax such as "
                      "'train', 'train[:10%]', 'train[100:200]+test'") from e
  names = []
  for part in spec.split("+"):
    match = _SPLIT_NAME.match(part)
    if not match:
      raise ConfigError(field, f"cannot parse split {spec!r}")
    names.append(match.group(1))
  return names


def check_split_names(spec: str, field: str, available: Sequence[str]) -> None:
  """Raises `ConfigError` naming `field` if `spec` uses a split outside `available`."""
  unknown = [n for n in split_names(spec, field) if n not in available]
  if unknown:
    raise ConfigError(field, f"unknown split {unknown[0]!r} in {spec!r}; allowed: "
                      f"{', '.join(available)} (with TFDS slicing such as 'train[:10%]')")


def not_found(name: str, data_dir: str) -> ConfigError:
  """The error for a dataset missing from `data_dir`, saying how to prepare it elsewhere."""
  return ConfigError(
      "data.name",
      f"dataset {name!r} not found in data_dir {data_dir!r} (xsens never downloads); prepare it "
      "on a machine with internet and TensorFlow: `python -c \"import tensorflow_datasets as "
      f"tfds; tfds.data_source('{name}', data_dir='{data_dir}')\"` (or `tfds build {name} "
      f"--data_dir={data_dir} --file_format=array_record`), then copy it here")


def get_items(source, indices: list[int]) -> list[dict[str, Any]]:
  """Batched random access into a TFDS data source, falling back to one by one.

  TFDS 4.9.10's `tfds.testing.mock_data` mocks `__getitems__` with a wrong signature (TypeError).
  """
  getitems = getattr(source, "__getitems__", None)
  if getitems is not None:
    try:
      return list(getitems(indices))
    except TypeError:
      pass
  return [source[i] for i in indices]


def split_role(data_config, split: str) -> str:
  """"train" or "test": `split` is `data.train_split`, `data.test_split`, or a role name.

  An exact match with a configured split string wins over a role name.
  """
  for role in ROLES:
    if split == data_config[f"{role}_split"]:
      return role
  if split in ROLES:
    return split
  raise ValueError(f"split must be data.train_split ({data_config['train_split']!r}), "
                   f"data.test_split ({data_config['test_split']!r}), 'train' or 'test'; "
                   f"got {split!r}")


def subset_indices(num_examples: int, num_keep: int, seed: int) -> np.ndarray:
  """The first `num_keep` of `default_rng([seed, 2]).permutation(num_examples)`, sorted. [M]."""
  return np.sort(np.random.default_rng([seed, 2]).permutation(num_examples)[:num_keep])
