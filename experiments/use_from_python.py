"""The README's "Use it from Python" example: train a smoke ViT, then measure it in one jit.

Run: `python experiments/use_from_python.py` (about a minute on 2 CPU cores). The test
`tests/use_from_python_test.py` runs this file, so the README example cannot rot.
"""

import jax
import jax.numpy as jnp

from mlcollections_configs import train as train_cfg
from xsens import measures
from xsens.train import trainer


def main(workdir: str = "workdirs/use_from_python") -> dict:
  config = train_cfg.get_config("model=vit,smoke").train
  config.model.depth, config.total_steps, config.eval_every = 2, 60, 0
  run = trainer.train_and_evaluate(config, workdir)   # Resumes if workdir holds the run.
  apply_fn, variables = run.apply_fn, run.variables   # One stable pair per run.
  x, y = jnp.asarray(run.test.images[:64]), jnp.asarray(run.test.labels[:64])

  @jax.jit
  def measure_all(variables, x, y, key):
    sigmas = jnp.asarray([0.25, 0.5, 1.0])
    sens = jax.vmap(lambda s: measures.token_sensitivity(
        apply_fn, variables, x, key=key, sigma=s, num_draws=2, patch_size=7)["mean"])(sigmas)
    feats = measures.layer_features(apply_fn, variables, x)
    first, last = sorted(feats)[0], sorted(feats)[-1]
    adv = measures.fgsm(apply_fn, variables, x, labels=y, epsilon=0.1)["adv_inputs"]
    return {
        "sensitivity": sens,                                            # [3], one per σ
        "cka_first_last": measures.linear_cka(feats[first], feats[last]),
        "clean_accuracy": measures.accuracy(apply_fn, variables, x, labels=y)["accuracy"],
        "fgsm_accuracy": measures.accuracy(apply_fn, variables, adv, labels=y)["accuracy"],
        "gaussian_noise_3": measures.corruption_accuracy(
            apply_fn, variables, x, labels=y, name="gaussian_noise", severity=3,
            key=key)["accuracy"],
    }

  return jax.device_get(measure_all(variables, x, y, jax.random.key(0)))


if __name__ == "__main__":
  for name, value in main().items():
    print(f"{name:>18}: {value}")
