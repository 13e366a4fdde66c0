"""Datasets: embedded TFDS builders, synthetic sources, loading and batching (see pipeline)."""
