"""Benchmark: bytes uploaded per logged step of a run on a `gs://` workdir (local emulator).

  python experiments/bench_remote_writes.py                   # 10,000 steps, ~1 min
  python experiments/bench_remote_writes.py --steps=400 --flush_secs=0.2   # seconds (tested)

Trains the `train.py:model=mlp,smoke` run for `--steps` steps (train means logged every
2 steps, evaluation and checkpoint every 1000) on gs://bucket/run of a local GCS server
(experiments/gcs_emulator.py), uploading metrics and TensorBoard events every
`--flush_secs`. Counts the bytes of every file upload that goes through `xsens.paths`
(everything but orbax's checkpoints, which TensorStore writes: their size per checkpoint
does not depend on the run's length). Prints, per fifth of the run's steps, the bytes
uploaded per logged step (flat when each upload costs only its new data), and the figure
a rewrite of each whole file would have cost (growing with the run's length).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from experiments import gcs_emulator, machine  # pylint: disable=g-import-not-at-top,wrong-import-position


def last_step(kind: str, data: bytes) -> int:
  """The highest step of the records (metrics) or events in an upload (-1 if none)."""
  if kind == "metrics":
    return max((json.loads(line)["step"] for line in data.splitlines() if line.strip()),
               default=-1)
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  from xsens.train import metrics  # pylint: disable=g-import-not-at-top
  return max((event_pb2.Event.FromString(data[a + 12:b - 4]).step
              for a, b in metrics._records(data)), default=-1)  # pylint: disable=protected-access


def measure(steps: int, flush_secs: float) -> dict:
  """Runs the study on a fresh emulator: its log uploads (kind, file, bytes, highest step)
  and the steps of its train records."""
  with gcs_emulator.Emulator() as emulator:
    emulator.create_bucket("bucket")
    os.environ.update(emulator.env)   # Before gcsfs is imported (it reads them then).
    # pylint: disable=g-import-not-at-top
    from mlcollections_configs import train as train_config
    from xsens import paths, studies
    from xsens.train import metrics
    from xsens.train import workdir as workdir_lib
    metrics.FLUSH_SECS = flush_secs
    config = train_config.get_config("model=mlp,smoke")
    config.train.total_steps = steps
    config.train.eval_every = config.train.checkpoint_every = 1000
    uploads = []
    write_bytes, t0 = paths.write_bytes, time.time()

    def counted(path, data):
      path = os.fspath(path)
      kind = ("metrics" if "/metrics/part-" in path else
              "events" if f"/tb/{metrics.EVENTS_PREFIX}" in path else "other")
      if kind != "other":
        # The file a rewrite-whole writer would keep: metrics.jsonl, or the event file
        # whose upload this is (`metrics.part_path` appends ".<6 digits>").
        head, _, tail = path.rpartition(".")
        base = ("metrics.jsonl" if kind == "metrics" else
                head if tail.isdigit() and len(tail) == 6 else path)
        uploads.append({"kind": kind, "file": base, "bytes": len(data),
                        "records": data.count(b"\n") if kind == "metrics" else 1,
                        "step": last_step(kind, data)})
      write_bytes(path, data)

    paths.write_bytes = counted
    try:
      with workdir_lib.locked("gs://bucket/run"):
        studies.run(config, "gs://bucket/run")
    finally:
      paths.write_bytes = write_bytes
    train_steps = [r["step"] for r in metrics.read_metrics("gs://bucket/run")
                   if "train/loss" in r]
    return {"uploads": uploads, "train_steps": train_steps, "wall_s": time.time() - t0}


def report(result: dict, steps: int, flush_secs: float) -> str:
  """Markdown: per fifth of the run's steps, the bytes of its log uploads (metric parts and
  event files) per logged step, and what rewriting each whole file would have cost
  (metrics.jsonl at every record, an event file at every flush). An upload's bytes are
  spread evenly over the steps it covers (since the previous upload of its file)."""
  fifths = [{"steps": 0, "bytes": 0.0, "rewrite": 0.0} for _ in range(5)]
  for s in result["train_steps"]:
    fifths[min((s - 1) * 5 // steps, 4)]["steps"] += 1

  def spread(key, amount, first, last):
    """Adds `amount` to the fifths over steps (first, last], evenly per step."""
    first, last = max(first, 0), max(last, 1)
    if last <= first:
      first = last - 1
    for i, row in enumerate(fifths):
      lo, hi = i * steps / 5, (i + 1) * steps / 5
      overlap = max(0.0, min(hi, last) - max(lo, first))
      row[key] += amount * overlap / (last - first)

  sizes, previous = collections.Counter(), {}
  for u in result["uploads"]:
    first, last = previous.get(u["file"], 0), max(u["step"], previous.get(u["file"], 0))
    n = u["records"] or 1
    spread("bytes", u["bytes"], first, last)
    spread("rewrite", sum(sizes[u["file"]] + u["bytes"] * j / n for j in range(1, n + 1)),
           first, last)
    sizes[u["file"]] += u["bytes"]
    previous[u["file"]] = last
  logged = len(result["train_steps"])
  kinds = collections.Counter(u["kind"] for u in result["uploads"])
  out = [f"steps {steps}, logged steps {logged}, uploads: {kinds['metrics']} metric parts, "
         f"{kinds['events']} event files; flush every {flush_secs:g} s; wall "
         f"{result['wall_s']:.0f} s; CPU: {machine.cpu_model()}", "",
         "| steps | logged steps | bytes / logged step | rewrite-whole bytes / logged step |",
         "|---|---|---|---|"]
  for i, row in enumerate(fifths):
    n = max(row["steps"], 1)
    out.append(f"| {i * steps // 5 + 1}-{(i + 1) * steps // 5} | {row['steps']:,} | "
               f"{row['bytes'] / n:,.0f} | {row['rewrite'] / n:,.0f} |")
  total = sum(u["bytes"] for u in result["uploads"])
  out += ["", f"log bytes uploaded: {total:,} ({total / max(logged, 1):,.0f} per logged "
          f"step); a rewrite-whole writer: "
          f"{sum(r['rewrite'] for r in fifths):,.0f}"]
  return "\n".join(out)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--steps", type=int, default=10_000)
  parser.add_argument("--flush_secs", type=float, default=1.0)
  parser.add_argument("--json", default="")
  args = parser.parse_args(argv)
  result = measure(args.steps, args.flush_secs)
  print(report(result, args.steps, args.flush_secs))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f)
  return result


if __name__ == "__main__":
  main()
