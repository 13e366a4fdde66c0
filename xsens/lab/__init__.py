"""The lab: what the studies share, between `xsens.train` and `xsens.studies`.

A study (`xsens.studies.<name>`) imports the lab, `xsens.train`, `xsens.measures` and
`xsens.report`, never another study; the lab never imports a study
(tests/layers_test.py checks both).

  multirun         train several runs under one training block, once per seed
  pretrained_runs  runs loaded from public checkpoints (the ImageNet set-ups)
  robustness       config checks, timing and split-level pooling of the robustness measures
  corruptions      common-corruption accuracy of finished runs, mCE
  sensitivity      the train-set sensitivity of a finished run
  eigen_analysis   eigen-analysis of the attention of finished runs, and its report
  model_cost       forward FLOPs, attention FLOPs, training-step memory and time
  selection        val/eval splits, model choice on the validation split only, mean ± s.e.

Parts of one study that stand on their own (benchmarks, notebooks and tests use them):

  head_similarity  attention similarity between heads pooled over a split (reuse)
  gd_sweep         a resumable sweep of pure runs over a grid, in chunks of one program
                   (benign_overfitting)
  phase_boundary   where a grid's loss crosses a level, power-law and logistic fits
                   (benign_overfitting)
  modular_addition the grokking transformer's official initial weights and measures
  token_tasks      the synthetic token tasks: data, generating rule, sensitivity rows
  boolean_spectrum Boolean spectral-bias runs, when each Fourier component is learned
  cloze            cloze accuracy, recall and known facts of a masked LM
"""
