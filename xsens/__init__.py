"""xsens: measuring and shaping the inductive biases of transformers (JAX/Flax)."""

__version__ = "0.1.0"
