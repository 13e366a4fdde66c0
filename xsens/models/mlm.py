"""A masked language model on the RoBERTa encoder of `xsens.models.text`.

`RobertaMLM` = `text.RoBERTa`'s embeddings and encoder layers (post-LN, the same
parameters and initialisation; the classification head is never built) + RoBERTa's LM
head (HF `RobertaLMHead`): Dense(width) -> GELU -> LayerNorm -> logits = h @ E^T + b,
with E the word-embedding table (tied embeddings) and b a per-token bias.

  logits = model.apply(v, ids)                            # [B, L, V]
  logits = model.apply(v, ids, positions, method=model.at_positions)   # [B, V]

Parameter tree: {"encoder": {"word_embeddings", "position_embeddings", "embedding_norm",
"layers_0" .. "layers_<depth-1>" (each "attention" {query, key, value, out},
"attention_norm", "intermediate", "output", "output_norm")}, and the LM head's "dense",
"norm" and "bias"}; `part_names` / `part_mask` select parts of it (the modify_memories study tunes
one part at a time).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xsens.errors import ConfigError
from xsens.models import position as position_lib
from xsens.models import pretrained as pretrained_lib
from xsens.models import text

ENCODER = "encoder"     # The encoder's subtree in RobertaMLM's params (and in its .npz).
FIXED_PARTS = ("all", "embeddings", "head", "first", "last", "attention", "feed_forward")
_ATTENTION = ("attention", "attention_norm")
_FEED_FORWARD = ("intermediate", "output", "output_norm")
_EMBEDDINGS = ("word_embeddings", "position_embeddings", "embedding_norm")


class RobertaMLM(nn.Module):
  """RoBERTa encoder + tied-embedding LM head (module docstring); ids [B, L] int32."""
  vocab_size: int
  max_length: int = 128
  width: int = 256
  depth: int = 4
  num_heads: int = 8
  mlp_dim: int = 1024
  dropout_rate: float = 0.0
  position: str = "absolute"     # `text.RoBERTa.position` (`xsens.models.position`).
  diet_dim: int | None = None
  relative_clip: int = 16

  def check_input(self, input_shape) -> None:
    """Raises ConfigError for settings impossible on ids of per-example shape (L,)."""
    self.encoder_module().check_input(input_shape)

  def encoder_module(self) -> text.RoBERTa:
    return text.RoBERTa(num_classes=1, vocab_size=self.vocab_size,
                        max_length=self.max_length, width=self.width, depth=self.depth,
                        num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                        dropout_rate=self.dropout_rate, position=self.position,
                        diet_dim=self.diet_dim, relative_clip=self.relative_clip)

  def setup(self):
    self.encoder = self.encoder_module()
    self.head_dense = nn.Dense(self.width, kernel_init=nn.initializers.normal(0.02),
                               name="dense")
    self.head_norm = nn.LayerNorm(epsilon=1e-5, name="norm")
    self.bias = self.param("bias", nn.initializers.zeros, (self.vocab_size,))

  def hidden(self, ids, train: bool = False):
    """ids [B, L] -> last hidden states [B, L, D]."""
    tokens = self.encoder.embed(ids, train)
    segments = None if self.position == "absolute" else position_lib.segment_ids(ids)
    return self.encoder.hidden_states(tokens, text.padding_mask(ids), train, segments)

  def head(self, h):
    """hidden [..., D] -> logits [..., V] (tied to the word embeddings)."""
    h = self.head_norm(nn.gelu(self.head_dense(h), approximate=False))
    return self.encoder.word_embeddings.attend(h) + self.bias

  def at_positions(self, ids, positions, train: bool = False):
    """ids [B, L], positions [B] int -> logits [B, V] at one position per row."""
    h = self.hidden(ids, train)
    h = jnp.take_along_axis(h, positions[:, None, None], axis=1)[:, 0]
    return self.head(h)

  def __call__(self, ids, train: bool = False):
    return self.head(self.hidden(ids, train))


def part_names(depth: int) -> tuple[str, ...]:
  """Every part `part_mask` accepts for a model of `depth` layers."""
  return FIXED_PARTS + tuple(f"block_{i}" for i in range(depth))


def check_part(part: str, depth: int, field: str) -> None:
  """ConfigError naming `field` unless `part` is one of `part_names(depth)`."""
  allowed = part_names(depth)
  if part not in allowed:
    raise ConfigError(field, f"unknown part {part!r}; allowed: {', '.join(allowed)}")


def _selected(path: tuple[str, ...], part: str, depth: int) -> bool:
  top = path[0]
  if part == "all":
    return True
  if part == "head":
    return top == "lm_head"
  if top != "encoder":
    return False
  name = path[1]
  if part == "embeddings":
    return name in _EMBEDDINGS
  block = {"first": 0, "last": depth - 1}.get(part)
  if block is None and part.startswith("block_"):
    block = int(part[len("block_"):])
  if block is not None:
    return name == f"layers_{block}"
  sub = path[2] if len(path) > 2 else ""
  return name.startswith("layers_") and sub in (_ATTENTION if part == "attention"
                                                else _FEED_FORWARD)


def part_mask(params, part: str, depth: int):
  """A pytree like `params` of float32 scalars: 1 on the leaves of `part`, else 0.

  Parts: "all"; "embeddings" (word + position embeddings and their LayerNorm; the word
  table is also the tied output layer); "head" (the LM head's dense, LayerNorm and bias);
  "first" / "last" / "block_<i>" (one encoder layer); "attention" / "feed_forward" (those
  sublayers, with their LayerNorm, in every layer).
  """
  check_part(part, depth, "part")

  def leaf(path, _):
    keys = tuple(str(getattr(k, "key", k)) for k in path)
    keys = ("lm_head",) + keys if keys[0] in ("dense", "norm", "bias") else keys
    return np.float32(_selected(keys, part, depth))

  return jax.tree_util.tree_map_with_path(leaf, params)


# ------------------------------------------------------------------------------------------
# Pre-train then fine-tune: the encoder of a RobertaMLM checkpoint into a `text.RoBERTa`.


def for_classifier(model: text.RoBERTa) -> RobertaMLM:
  """The RobertaMLM whose encoder has `model`'s architecture (its position encoding too)."""
  return RobertaMLM(vocab_size=model.vocab_size, max_length=model.max_length,
                    width=model.width, depth=model.depth, num_heads=model.num_heads,
                    mlp_dim=model.mlp_dim, dropout_rate=model.dropout_rate,
                    position=model.position, diet_dim=model.diet_dim,
                    relative_clip=model.relative_clip)


def save_checkpoint(path: str, params) -> None:
  """Writes RobertaMLM `params` as a flat '/'-keyed `.npz` (`XSENS_MLM`'s format)."""
  flat = pretrained_lib.flatten(jax.device_get(params))
  with open(path, "wb") as f:
    np.savez(f, **{k: np.asarray(v) for k, v in flat.items()})


def config_from_checkpoint(checkpoint) -> dict:
  """RoBERTa fields implied by an `XSENS_MLM` checkpoint (vocab, width, depth)."""
  vocab, width = checkpoint[f"{ENCODER}/word_embeddings/embedding"].shape
  depth = len({k.split("/")[1] for k in checkpoint
               if k.startswith(f"{ENCODER}/layers_")})
  return {"vocab_size": int(vocab), "width": int(width), "depth": depth}


def classifier_params_from_checkpoint(checkpoint, model: text.RoBERTa, input_shape, *,
                                      reinit_head: bool = True, key=None) -> dict:
  """`model`'s params: every encoder leaf from the checkpoint's `encoder/...` (the LM
  head's `dense`, `norm`, `bias` dropped); the classifier head (`head_dense`, `head_out`)
  new, from `model.init` under `key` (required: an MLM checkpoint has no such head).
  Raises `pretrained.CheckpointError` for missing, unexpected or misshaped leaves."""
  if not reinit_head:
    raise pretrained_lib.CheckpointError(
        "an MLM checkpoint has no classifier head; set pretrained.reinit_head=True")
  ids = jnp.zeros((1, *input_shape), jnp.int32)
  fresh = model.init({"params": jax.random.key(0) if key is None else key}, ids)["params"]
  target = {k: tuple(v.shape) for k, v in pretrained_lib.flatten(fresh).items()}
  prefix = f"{ENCODER}/"
  lm_head = ("dense/", "norm/", "bias")
  loaded = {k[len(prefix):]: np.asarray(v) for k, v in checkpoint.items()
            if k.startswith(prefix)}
  unexpected = [k for k in checkpoint if not k.startswith(prefix + "") and
                not k.startswith(lm_head)]
  heads = {k: np.asarray(v) for k, v in pretrained_lib.flatten(fresh).items()
           if k.startswith(("head_dense/", "head_out/"))}
  unexpected += [prefix + k for k in loaded if k in heads]
  loaded = {k: v for k, v in loaded.items() if k not in heads} | heads
  return pretrained_lib.finish(loaded, {}, unexpected, target)


# The format `pretrained.path` loads into the registry's "roberta" (`xsens.models`): a
# RobertaMLM `.npz` from `save_checkpoint` (e.g. the position_encoding study's pre-training).
# Token ids, not images: no input normalisation (the image studies skip such formats).
XSENS_MLM = pretrained_lib.Format("xsens_mlm", config_from_checkpoint,
                                  classifier_params_from_checkpoint, input_normalization=None)
