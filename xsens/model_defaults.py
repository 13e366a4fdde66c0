"""The config fields of every registered model with their defaults, without importing JAX.

`MODEL_DEFAULTS[name]` is `{field: default}` for each keyword argument of
`xsens.models.get_model(name, ...)` (the module's dataclass fields but `parent`, `name` and
the classes field), so config files (`mlcollections_configs/common.py`) list a model's fields
without importing flax, and a run saved before a field existed resumes at its default
(`xsens.train.trainer.model_field_defaults`). tests/config_imports_test.py checks that it equals the dataclass
defaults of `xsens.models.REGISTRY`, entry for entry.
"""

from typing import Any

_VIT = {"patch_size": 4, "width": 64, "depth": 2, "num_heads": 4, "mlp_dim": 128,
        "pooling": "cls", "posemb": "learned", "dropout_rate": 0.0,
        "representation_size": None, "skip": (), "tokenizer": "patch",
        "spt_shifts": "diagonal", "attention": "mha", "dtype": "float32", "remat": False,
        "attention_impl": "einsum", "position_bias": "none"}

MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "vit": _VIT,
    "resnet18": {"width_multiplier": 1.0, "skip": (), "dtype": "float32"},
    "densenet": {"growth_rate": 12, "block_sizes": (6, 12, 24, 16), "compression": 0.5,
                 "bottleneck": True, "stem_features": None, "dtype": "float32"},
    "convmixer": {"width": 64, "depth": 4, "kernel_size": 3, "patch_size": 2,
                  "dtype": "float32"},
    "mlp": {"hidden_dims": (512, 128), "activation": "relu", "dtype": "float32"},
    "cnn": {"features": (32, 64, 64), "kernel_size": 3, "dense_dim": 128, "dtype": "float32"},
    "bit_resnet": {"block_units": (3, 4, 6, 3), "width_factor": 1.0, "num_groups": 32,
                   "skip": (), "dtype": "float32"},
    "reuse_vit": {**_VIT, "reuse_heads": -1, "reuse_layers": 1},
    "eigen_vit": {**_VIT, "keys_kept": 0, "basis_rank": 8, "key_rule": "strided",
                  "key_seed": 0, "basis_init": "dct", "eigen_from_layer": 1, "kept_keys": ()},
    "convnext": {"depths": (3, 3, 9, 3), "dims": (96, 192, 384, 768), "patch_size": 4,
                 "kernel_size": 7, "mlp_ratio": 4, "layer_scale_init": 1e-06,
                 "drop_path_rate": 0.0, "skip": (), "dtype": "float32"},
    "roberta": {"vocab_size": 8192, "max_length": 128, "width": 256, "depth": 4,
                "num_heads": 8, "mlp_dim": 3072, "dropout_rate": 0.1, "attention": "softmax",
                "dtype": "float32", "remat": False, "attention_impl": "einsum",
                "position": "absolute", "diet_dim": None, "relative_clip": 16},
    "gpt2": {"vocab_size": 8192, "max_length": 128, "width": 256, "depth": 4, "num_heads": 8,
             "mlp_dim": 1024, "dropout_rate": 0.1, "dtype": "float32", "remat": False,
             "attention_impl": "einsum"},
    "lstm": {"vocab_size": 8192, "width": 256, "hidden_dim": 256, "depth": 4,
             "dropout_rate": 0.1, "official_frozen": False, "dtype": "float32"},
    "grokking_transformer": {"vocab_size": 114, "width": 128, "num_heads": 4, "mlp_dim": 512,
                             "seq_len": 3, "dtype": "float32"},
    "one_layer_attention": {"qk_dim": None, "v_dim": None, "dtype": "float32"},
    "token_mlp": {"hidden_dims": (256, 256), "dtype": "float32"},
    "one_layer_vit": {"d_h": 64, "d_v": 64, "init_scheme": "torch_scaled",
                      "init_divisor": 16.0, "init_std": 0.001, "dtype": "float32"},
    "two_layer_cnn": {"m": 10, "q": 3.0, "sigma_0": 0.01, "dtype": "float32"},
}
