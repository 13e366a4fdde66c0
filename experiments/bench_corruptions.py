"""Host CPU cost of synthesising the 15 common corruptions (xsens.measures.corruptions).

The ImageNet variant of the robustness study synthesises ImageNet-C per batch when
imagenet2012_corrupted is not prepared; this prints what that costs per image.

  python experiments/bench_corruptions.py                    # 224x224x3, 8 images
  python experiments/bench_corruptions.py --size=32 --num_images=64

Prints, per corruption, CPU seconds (process time, all threads) per image summed over the
5 severities, and the total over all 15 — the figure in docs/benchmarks.md.
"""

import time

from absl import app
from absl import flags
import numpy as np

from xsens.measures import corruptions

_SIZE = flags.DEFINE_integer("size", 224, "Image height and width.")
_NUM = flags.DEFINE_integer("num_images", 8, "Images per call.")


def cpu_seconds_per_image(name: str, images: np.ndarray) -> float:
  """CPU seconds per image for `name` at every severity (summed over severities)."""
  start = time.process_time()
  for severity in corruptions.SEVERITIES:
    corruptions.corrupt(images, name, severity, seed=severity)
  return (time.process_time() - start) / len(images)


def main(argv):
  del argv
  rng = np.random.default_rng(0)
  images = rng.uniform(0.0, 1.0, (_NUM.value, _SIZE.value, _SIZE.value, 3)).astype(np.float32)
  total = 0.0
  print(f"{_NUM.value} images of {_SIZE.value}x{_SIZE.value}x3; CPU s per image, "
        f"summed over severities {corruptions.SEVERITIES}")
  for name in corruptions.CORRUPTIONS:
    cost = cpu_seconds_per_image(name, images)
    total += cost
    print(f"{name:20s} {cost:8.3f}")
  print(f"{'all 15':20s} {total:8.3f}  (= {total / len(corruptions.SEVERITIES):.3f} per image "
        "per severity)")


if __name__ == "__main__":
  app.run(main)
