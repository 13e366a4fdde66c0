"""ViT vs ResNet robustness per pre-training set, for the pretrained-model robustness study
("Understanding Robustness of Transformers for Image Classification", Bhojanapalli et al.,
ICCV 2021, arXiv 2103.14586: with enough pre-training data ViTs are at least as robust)."""

import os

from xsens.report import plots

# Measures compared across pre-training sets (row keys; FGSM / PGD at the main ε).
SCALE_MEASURES = ("clean_accuracy", "mCA", "rel_mCE", "FGSM", "PGD", "worst_removal_acc")
FAMILY = {"vit": "ViT", "bit_resnet": "ResNet"}


def row_measure(row: dict, measure: str):
  """`row[measure]`, or its first `measure@...` entry (an attack at one ε); None if absent."""
  key = next((k for k in row if k == measure or k.startswith(f"{measure}@")), None)
  return None if key is None else row[key]


def comparison(rows: list[dict], kinds: dict[str, str]) -> dict:
  """ViT vs ResNet per pre-training set: the paper's data-scale claim ("when pre-trained
  with a sufficient amount of data, ViT models are at least as robust as the ResNet
  counterparts").

  Args:
    rows: the report rows (key "pretraining": the run's `runs.<run>.pretraining` or None).
    kinds: {run: model kind} ("vit" / "bit_resnet").

  Returns:
    {pre-training set: {"ViT": run, "ResNet": run, <measure>: {"ViT": v, "ResNet": v,
    "ViT - ResNet": d}}} for every set with one ViT and one ResNet run ({} if none; a set
    with several runs of one family is left out).
  """
  by_set: dict[str, dict[str, list[dict]]] = {}
  for row in rows:
    family = FAMILY.get(kinds.get(row["run"], ""))
    if row.get("pretraining") and family:
      by_set.setdefault(row["pretraining"], {}).setdefault(family, []).append(row)
  out = {}
  for data, families in by_set.items():
    if sorted(families) != ["ResNet", "ViT"] or any(len(v) != 1 for v in families.values()):
      continue
    vit, resnet = families["ViT"][0], families["ResNet"][0]
    entry = {"ViT": vit["run"], "ResNet": resnet["run"]}
    for m in SCALE_MEASURES:
      a, b = row_measure(vit, m), row_measure(resnet, m)
      entry[m] = {"ViT": a, "ResNet": b,
                  "ViT - ResNet": None if a is None or b is None else a - b}
    out[data] = entry
  return out


def note(scale: dict) -> str:
  """One sentence of ViT minus ResNet per pre-training set ('' for none)."""
  if not scale:
    return ""
  parts = []
  for data, e in scale.items():
    d = {m: e[m]["ViT - ResNet"] for m in ("clean_accuracy", "mCA", "PGD",
                                             "worst_removal_acc")}
    parts.append(f"{data} ({e['ViT']} vs {e['ResNet']}): " + ", ".join(
        f"{m} {v:+.3f}" for m, v in d.items() if v is not None))
  return (" Pre-training data (`runs.<run>.pretraining`), ViT minus ResNet: "
          + "; ".join(parts) + ". The paper's claim: with enough pre-training data the ViT is "
          "at least as robust (differences >= 0 on the robustness measures).")


def plot(workdir: str, rows: list[dict]) -> str:
  """Bars of the robustness measures of every run with a named pre-training set."""
  named = [r for r in rows if r.get("pretraining")]
  measures = ("clean_accuracy", "mCA", "PGD", "worst_removal_acc")
  return plots.grouped_bar_plot(
      os.path.join(workdir, "pretraining_scale.png"), list(measures),
      {f"{r['run']} ({r['pretraining']})": [row_measure(r, m) or 0.0 for m in measures]
       for r in named},
      ylabel="top-1 accuracy (fraction correct)", xlabel="measure",
      title="Robustness by pre-training data")
