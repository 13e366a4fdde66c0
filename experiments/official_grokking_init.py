"""Writes the official grokking code's initial weights to an .npz for `grokking.py:init_npz=`.

  pip install -e ".[bench]"      # PyTorch (CPU); not needed by anything else
  python -m experiments.official_grokking_init --out=official_init.npz           # seeds 42..46
  xsens --config=mlcollections_configs/grokking.py:paper,seeds=5,init_npz=official_init.npz \
      --workdir=workdirs/grokking_paper_official_s5

The official script (Vasudeva et al., ICLR 2025; estija/sensitivity language/sens_addition.py,
`train_and_evaluate`) calls `torch.manual_seed(seed)` and then builds `SimpleTransformer`
before drawing anything else from torch. `official_model` below declares the same modules
in the same order (token embedding, positional embedding, nn.MultiheadAttention, fc1, fc2,
fc_out; written here from that file, not copied), so under the same seed PyTorch draws the
same initial weights. The file holds the state_dict's keys, each stacked over seeds
[S, ...] in `--seeds` order, the layout `model.init_npz` reads
(xsens/models/grokking_transformer.py documents the mapping).
"""

from absl import app
from absl import flags
import numpy as np

_OUT = flags.DEFINE_string("out", "official_init.npz", "Where to write the .npz.")
_SEEDS = flags.DEFINE_list("seeds", ["42", "43", "44", "45", "46"],
                           "torch.manual_seed values, one per xsens seed (config.seed + i).")
_MODULUS = flags.DEFINE_integer("modulus", 113, "p (vocabulary p + 1: the numbers and '=').")
_WIDTH = flags.DEFINE_integer("width", 128, "d_model.")
_HEADS = flags.DEFINE_integer("heads", 4, "Attention heads.")
_MLP = flags.DEFINE_integer("mlp_dim", 512, "dim_feedforward.")


def official_model(vocab_size: int, seq_len: int, width: int, heads: int, mlp_dim: int):
  """A torch module with the official SimpleTransformer's parameters, declared in its order,
  and its forward (noise_std = 0)."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  class OfficialInit(nn.Module):

    def __init__(self):
      super().__init__()
      self.token_embed = nn.Embedding(vocab_size, width)
      self.pos_embed = nn.Parameter(torch.zeros(seq_len, width))
      self.attention = nn.MultiheadAttention(embed_dim=width, num_heads=heads, dropout=0.0)
      self.fc1 = nn.Linear(width, mlp_dim)
      self.relu = nn.ReLU()
      self.fc2 = nn.Linear(mlp_dim, width)
      self.fc_out = nn.Linear(width, vocab_size)

    def forward(self, ids):
      """ids [B, T] long -> logits [B, vocab] (the official forward without its noise)."""
      x = (self.token_embed(ids) + self.pos_embed).transpose(0, 1)  # [T, B, d]
      x, _ = self.attention(x, x, x)
      x = self.fc2(self.relu(self.fc1(x.transpose(0, 1))))
      return self.fc_out(x[:, -1, :])

  return OfficialInit()


def official_init(seeds, modulus: int, width: int, heads: int, mlp_dim: int) -> dict:
  """{state_dict key: float32 [len(seeds), ...]}: each seed's weights after torch.manual_seed."""
  import torch  # pylint: disable=g-import-not-at-top
  states = []
  for seed in seeds:
    torch.manual_seed(int(seed))
    model = official_model(modulus + 1, 3, width, heads, mlp_dim)
    states.append({k: v.detach().numpy().copy() for k, v in model.state_dict().items()})
  return {k: np.stack([s[k] for s in states]).astype(np.float32) for k in states[0]}


def main(argv):
  del argv
  state = official_init(_SEEDS.value, _MODULUS.value, _WIDTH.value, _HEADS.value, _MLP.value)
  np.savez(_OUT.value, **state)
  print(f"wrote {_OUT.value}: seeds {','.join(_SEEDS.value)}; "
        + ", ".join(f"{k} {tuple(v.shape)}" for k, v in state.items()))


if __name__ == "__main__":
  app.run(main)
