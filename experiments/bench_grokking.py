"""Time per full-batch epoch of the grokking study (xsens/studies/grokking.py).

  python experiments/bench_grokking.py                       # p in {59, 97, 113}, 1 seed
  python experiments/bench_grokking.py --moduli=113 --seeds=3

For each modulus p, trains `--epochs` epochs (one jitted, vmapped `lax.scan` chunk, compiled
before timing) with every per-epoch measurement of the study (train loss/accuracy,
sensitivity, weight norm; test every 100 epochs) and prints ms per epoch and the projected
time of the paper's 20,000 epochs — the figures in docs/benchmarks.md.
"""

import tempfile

from absl import app
from absl import flags

from mlcollections_configs import grokking as grokking_config
from xsens.studies import grokking

_MODULI = flags.DEFINE_list("moduli", ["59", "97", "113"], "Moduli p to time.")
_EPOCHS = flags.DEFINE_integer("epochs", 200, "Timed epochs (one chunk).")
_SEEDS = flags.DEFINE_integer("seeds", 1, "Seeds trained together (vmapped).")


def ms_per_epoch(modulus: int, epochs: int, seeds: int) -> tuple[float, float]:
  """(ms per epoch, compile seconds) of one chunk of `epochs` epochs at modulus p."""
  config = grokking_config.get_config(f"modulus={modulus},epochs={epochs},seeds={seeds}")
  config.train.chunk_epochs = epochs
  with tempfile.TemporaryDirectory() as workdir:
    out = grokking.train(config, workdir, log=lambda _: None)
  return 1e3 * out["wall_s"] / out["epochs_done"], out["compile_s"]


def main(argv):
  del argv
  print(f"{_EPOCHS.value} epochs, {_SEEDS.value} seed(s) per run")
  print(f"{'p':>5} {'train pairs':>12} {'ms/epoch':>9} {'compile s':>10} {'20k epochs':>11}")
  for p in map(int, _MODULI.value):
    ms, compile_s = ms_per_epoch(p, _EPOCHS.value, _SEEDS.value)
    pairs = round(0.3 * p * p)
    print(f"{p:5d} {pairs:12d} {ms:9.1f} {compile_s:10.1f} {20000 * ms / 6e4:9.1f} min")


if __name__ == "__main__":
  app.run(main)
