"""Report text says what happened in words: where runs stopped (`xsens.report.training`),
a None table cell as `—` with its meaning (`xsens.report.tables`), never `None`."""

import ml_collections

from xsens.report import tables, training


def _train(**fields):
  block = {"total_steps": 1000, "total_epochs": None, "target_train_accuracy": None,
           "eval_every": 100, "eval_train_examples": 2000, "evals": None}
  block.update(fields)
  return ml_collections.ConfigDict(block)


ROWS = [{"run": "vit", "steps": 300, "stop_reason": "target_train_accuracy",
         "train_accuracy": 0.995},
        {"run": "mlp", "steps": 1000, "stop_reason": "max_steps", "train_accuracy": 0.93}]


def test_fixed_length_in_steps_or_epochs():
  assert training.stop_note(_train(), ROWS) == (
      "Every model trained for 1,000 steps (no train-accuracy target).")
  assert training.stop_note(_train(total_steps=None, total_epochs=10.0), ROWS) == (
      "Every model trained for 10 epochs (no train-accuracy target).")
  assert training.length(_train(total_steps=None, total_epochs=2.5)) == "2.5 epochs"


def test_target_names_the_runs_that_reached_it_and_those_that_did_not():
  note = training.stop_note(_train(target_train_accuracy=0.99), ROWS)
  assert note == (
      "Every model trained until its train accuracy (on 2,000 training examples, checked "
      "every 100 steps) reached 0.99, for at most 1,000 steps. Reached by vit (step 300). "
      "Not reached by mlp (train accuracy 0.93 after 1,000 steps: its training length ran "
      "out first); compare those models at their final step, not at the target.")
  note = training.stop_note(_train(target_train_accuracy=0.99, total_steps=None,
                                   total_epochs=5.0, eval_train_examples=None), ROWS[:1])
  assert "(on the whole training split, checked every 100 steps)" in note
  assert "for at most 5 epochs" in note and "Not reached" not in note and "None" not in note


def test_a_none_cell_shows_as_a_dash_explained_below_the_table(tmp_path):
  rows = [{"seed": 0, "grok_epoch": 5600}, {"seed": 1, "grok_epoch": None}]
  md = tables.write_results(str(tmp_path), "t", rows)
  assert "| 1 | — |" in md and "None" not in md
  assert "—: no value (not reached within the run, or not measured)." in md
  assert "—: no value" not in tables.write_results(str(tmp_path), "t", rows[:1])
