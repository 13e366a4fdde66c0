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
  head_similarity  attention similarity between heads pooled over a split
  model_cost       forward FLOPs, attention FLOPs, training-step memory and time
"""
