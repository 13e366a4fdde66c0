"""Measures: pure functions in one calling convention, re-exported here.

Every measure that takes a model takes it one way,

  measure(apply_fn, variables, inputs, *, labels=None, key=None, mask=None, **options)
      -> dict of arrays

with `apply_fn(variables, inputs) -> logits [B, K]` in eval mode (e.g. a finished run's
`TrainResult.apply_fn`, one stable object per run), `mask` [B] marking real examples of a
padded batch, and `key` a PRNG key. Nothing here jits over a closure that captures weights:
callers jit, with `apply_fn` and the sizes static: `jit(measure)` is
`jax.jit(measure, static_argnums=0, static_argnames=static_argnames(measure))`
(`xsens.measures.convention`), or jit a closure of your own; measures may be `vmap`ped
(e.g. over σ) or differentiated (the smooth sensitivity). Text models take the padding mask
as a third argument, `apply_fn(variables, embeddings, token_mask)`. Model-free statistics
(CKA on features, Fourier coefficients, mCE tables) take arrays.

>>> import functools
>>> import jax
>>> from xsens import measures
>>> from xsens.models import get_model
>>> model = get_model("vit", 10, (28, 28, 1), patch_size=7, width=16, depth=1, num_heads=2,
...                   mlp_dim=32)
>>> x = jax.random.normal(jax.random.key(0), (8, 28, 28, 1))     # Normalised images.
>>> variables = model.init(jax.random.key(1), x)
>>> apply_fn = functools.partial(model.apply, train=False)
>>> sens = measures.jit(measures.token_sensitivity)
>>> out = sens(apply_fn, variables, x, key=jax.random.key(2), sigma=0.5, num_draws=2,
...            patch_size=7)
>>> out["per_token"].shape, sorted(out["plan"])                # Flip rates; sizes used.
((8, 16), ['chunk_size', 'example_chunk_size', 'forward_batch'])

`sigma_sweep` evaluates several σ in one compiled program (a loop, or `vectorize=True`):

>>> curve = measures.sigma_sweep(measures.token_sensitivity, [0.25, 0.5, 1.0], apply_fn,
...                              variables, x, key=jax.random.key(2), num_draws=2,
...                              patch_size=7)
>>> curve["mean"].shape
(3,)

Which corruptions run inside `jit`: `JAX_CORRUPTIONS` (noises, blurs, brightness,
contrast, pixelate, via `corrupt_jax`, on [0, 1] pixels); the rest (`HOST_ONLY`) run on the
host in NumPy. The measures take normalised inputs: `corrupt_normalized_jax` takes them in
the model's space (`normalize` as `data.normalize`: "zero_one", "half" or "standardize"
with stats=(mean, std)), corrupts the [0, 1] pixels and maps back, so corrupt-then-measure
is

>>> noisy = measures.corrupt_normalized_jax(x, "gaussian_noise", 3, normalize="half",
...                                         key=jax.random.key(3))
>>> sens(apply_fn, variables, noisy, key=jax.random.key(2), sigma=0.5, num_draws=2,
...      patch_size=7)["mean"].shape
()
"""

from xsens.measures.adversarial import (accuracy, adversarial_accuracy, attack_accuracy, fgsm,
                                        perturbation_structure, pgd, transfer_attack)
from xsens.measures.attention_eigen import (explained_variance, merge_moments,
                                            partial_reconstruction, score_moments,
                                            subspace_overlap)
from xsens.measures.attention_similarity import (attention_maps, batch_head_similarity,
                                                 head_similarity)
from xsens.measures.boolean import (boolean_sensitivity, degree_spectrum,
                                    fourier_average_sensitivity, fourier_coefficients,
                                    fourier_spectrum)
from xsens.measures.churn import prediction_churn
from xsens.measures.convention import STATIC_ARGNAMES, jit, static_argnames
from xsens.measures.corruption_eval import (corrupt_normalized_jax, corruption_accuracy, mce,
                                            relative_mce)
from xsens.measures.corruptions import corrupt
from xsens.measures.corruptions_jax import HOST_ONLY, JAX_CORRUPTIONS, corrupt_jax
from xsens.measures.label_shift import (kl_divergence, label_shift_accuracy,
                                        project_to_kl_ball, tilted_prior, worst_case_prior)
from xsens.measures.logit_rank import (attention_logit_rank, attention_logits,
                                       numerical_rank)
from xsens.measures.perturbations import (layer_removal_accuracy, sharpness,
                                          weight_noise_accuracy)
from xsens.measures.planning import plan_chunks
from xsens.measures.sensitivity import (global_sensitivity, scattered_pixel_sensitivity,
                                        token_sensitivity)
from xsens.measures.sensitivity_loop import token_sensitivity_loop
from xsens.measures.similarity import (cka_matrix, layer_features, linear_cka,
                                       linear_probe_accuracy, minibatch_cka)
from xsens.measures.spectral import (boolean_tokens, degree_block_eigenvalues, empirical_ntk,
                                     init_ntks, linear_attention_model, ntk_degree_spectrum,
                                     relu_mlp_model, walsh_degree_spectrum, walsh_diagonal,
                                     walsh_kernel)
from xsens.measures.smooth_sensitivity import smooth_token_sensitivity
from xsens.measures.subgroups import subgroup_accuracy
from xsens.measures.sweep import sigma_sweep
from xsens.measures.text_sensitivity import text_global_sensitivity, text_token_sensitivity
from xsens.measures.verification import duality_gap_trace, verified_accuracy

__all__ = [
    # Jitting a measure: its static arguments.
    "jit", "static_argnames", "STATIC_ARGNAMES",
    # Sensitivity (Transformers Learn Low Sensitivity Functions), and how its estimators
    # cut the work into forward calls.
    "token_sensitivity", "token_sensitivity_loop", "global_sensitivity",
    "scattered_pixel_sensitivity", "smooth_token_sensitivity", "boolean_sensitivity",
    "text_token_sensitivity", "text_global_sensitivity", "sigma_sweep", "plan_chunks",
    # Boolean Fourier analysis.
    "fourier_spectrum", "fourier_coefficients", "degree_spectrum",
    "fourier_average_sensitivity",
    # NTK at initialisation and its Walsh spectrum (weak spectral bias, Prop. 2.1).
    "empirical_ntk", "init_ntks", "ntk_degree_spectrum", "walsh_kernel", "walsh_diagonal",
    "walsh_degree_spectrum", "degree_block_eigenvalues", "linear_attention_model",
    "relu_mlp_model", "boolean_tokens",
    # Robustness: accuracy, attacks, corruptions, perturbations of the weights.
    "accuracy", "fgsm", "pgd", "adversarial_accuracy", "attack_accuracy", "transfer_attack",
    "perturbation_structure", "corruption_accuracy", "corrupt", "corrupt_jax",
    "corrupt_normalized_jax",
    "JAX_CORRUPTIONS", "HOST_ONLY", "mce", "relative_mce", "layer_removal_accuracy",
    "weight_noise_accuracy", "sharpness",
    # Representations.
    "layer_features", "linear_cka", "cka_matrix", "minibatch_cka", "linear_probe_accuracy",
    "attention_maps", "head_similarity", "batch_head_similarity",
    # Eigen-analysis of attention scores, reconstruction from partial computation.
    "score_moments", "merge_moments", "explained_variance", "subspace_overlap",
    "partial_reconstruction",
    # Position encodings (DIET, Theorem 1): numerical rank of the attention logits.
    "attention_logit_rank", "attention_logits", "numerical_rank",
    # Reproducibility and subgroups.
    "prediction_churn", "subgroup_accuracy",
    # Label shift (Zhang et al., ICLR 2021): re-weighted accuracy, KL balls over priors.
    "label_shift_accuracy", "worst_case_prior", "project_to_kl_ball", "kl_divergence",
    "tilted_prior",
    # Verification by the nonconvex reformulation (Bunel et al., NeurIPS 2020).
    "verified_accuracy", "duality_gap_trace",
]
