"""What a report says about how its models were trained: the length of a training block and
where each run stopped, in words (never a `None` where a number is meant)."""

from __future__ import annotations

from collections.abc import Sequence


def length(train) -> str:
  """The length of training block `train`: "1,000 steps", or "10 epochs" for an
  epochs-based one (`total_steps` None)."""
  steps, epochs = train.total_steps, train.total_epochs
  if steps is not None:
    return f"{int(steps):,} steps"
  if epochs is not None:
    return f"{float(epochs):g} epochs"
  raise ValueError("a training block with neither total_steps nor total_epochs")


def stop_note(train, rows: Sequence[dict]) -> str:
  """One or two sentences on how the runs of `rows` (`run`, `steps`, `stop_reason`,
  `train_accuracy`, as `xsens.lab.multirun.summary_rows` writes them) trained under block
  `train`: a fixed length, or until a train-accuracy target, naming the runs that reached
  it (at which step) and those that did not (their final train accuracy, and why)."""
  target = train.target_train_accuracy
  if target is None:
    return f"Every model trained for {length(train)} (no train-accuracy target)."
  if train.get("evals") is None:  # `evals` is an optional block (`trainer.evaluate`).
    examples = train.eval_train_examples
    on = (f"{int(examples):,} training examples" if examples is not None
          else "the whole training split")
    where = f"on {on}, checked every {int(train.eval_every):,} steps"
  else:
    where = "by the `train` evaluator of config.evals"
  text = (f"Every model trained until its train accuracy ({where}) reached {target:g}, for "
          f"at most {length(train)}.")
  reached = [r for r in rows if r.get("stop_reason") == "target_train_accuracy"]
  missed = [r for r in rows if r.get("stop_reason") != "target_train_accuracy"]
  if reached:
    text += " Reached by " + ", ".join(f"{r['run']} (step {int(r['steps']):,})"
                                       for r in reached) + "."
  if missed:
    text += (" Not reached by " + ", ".join(
        f"{r['run']} (train accuracy {r['train_accuracy']:.4g} after {int(r['steps']):,} "
        f"steps: {_why(r.get('stop_reason'))})" for r in missed)
             + "; compare those models at their final step, not at the target.")
  return text


def _why(stop_reason: str | None) -> str:
  if stop_reason == "max_steps":
    return "its training length ran out first"
  if stop_reason is None:
    return "interrupted"
  return f"stopped by {stop_reason}"
