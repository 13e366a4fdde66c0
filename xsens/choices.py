"""The allowed values of config fields that the config checks (`mlcollections_configs`,
which import no JAX) and the library modules that use the values both read.

Each library module names its own constant from here (e.g. `adversarial.NORMS`).
"""

from xsens.errors import ConfigError, is_int

# xsens.data.signal_noise: where the signal and the noise tokens sit.
SIGNAL_NOISE_LAYOUTS = ("two_vectors", "plus_minus")
# xsens.models.one_layer_vit: the weight initialisations.
ONE_LAYER_VIT_INITS = ("torch_scaled", "gaussian")
# xsens.models.grokking_transformer: the tokens of a sequence (a, b, "=").
GROKKING_SEQ_LEN = 3
# xsens.data.sparse_tokens: the label rules and the cues of the sparse tokens.
SPARSE_RULES = ("majority", "parity")
SPARSE_CUES = ("uninformative", "informative")
# xsens.measures.corruptions: the ImageNet-C corruptions (in their table order) and severities.
CORRUPTION_NAMES = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur",
                    "glass_blur", "motion_blur", "zoom_blur", "snow", "frost", "fog",
                    "brightness", "contrast", "elastic_transform", "pixelate",
                    "jpeg_compression")
CORRUPTION_SEVERITIES = (1, 2, 3, 4, 5)
# xsens.measures.adversarial: the norms of an attack's ball.
ADVERSARIAL_NORMS = ("linf", "l2")
# xsens.measures.sensitivity: what σ is relative to.
NOISE_SCALES = ("absolute", "token_rms")
# xsens.measures.attention_eigen: the rules that pick the m keys computed exactly.
SUBSET_RULES = ("strided", "random", "pivoted_qr")
# xsens.models.position: where position information enters a text model (`position`).
POSITION_ENCODINGS = ("none", "absolute", "sinusoidal", "shaw", "t5", "diet_abs", "diet_rel")
# xsens.train.distill: where the teacher's logits come from.
TEACHER_MODES = ("precomputed", "in_step")
# xsens.lab.robustness: the pixel-range scale of each `data.normalize` (ε is given in
# [0, 1] pixel units).
PIXEL_SCALE = {"zero_one": 1.0, "half": 2.0}


def check_streams(field: str, value) -> None:
  """ConfigError naming `field` (e.g. "sweep.streams") unless `value` is None or an int > 0
  (concurrent streams, `xsens.train.streams`)."""
  if value is not None and not (is_int(value) and value > 0):
    raise ConfigError(field, "must be None (auto: one per core on a single CPU device, else "
                      f"1) or an int > 0, got {value!r}")

# xsens.train.optim: every field of a `config.optimizer` block beside `name` and
# `learning_rate`, at its default (`mlcollections_configs.common.optimizer_config`).
OPTIMIZER_DEFAULTS = {
    "weight_decay": 0.0,      # coupled L2 (sgd, momentum, adam) or decoupled (adamw)
    "momentum": 0.9,          # the momentum optimizer's
    "nesterov": False,
    "b1": 0.9, "b2": 0.999, "eps": 1e-8,   # adam and adamw
    "schedule": "constant",   # constant | cosine | step | linear
    "warmup_steps": 0,        # linear warmup from 0
    "decay_steps": None,      # cosine / linear decay length after the warmup (None: the rest)
    "step_every": 1000, "step_gamma": 0.5,  # the step schedule (PyTorch StepLR)
    "grad_clip_norm": None,   # global-norm clipping (None: off)
}
