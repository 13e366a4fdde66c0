"""The 15 common corruptions of ImageNet-C / CIFAR-10-C by category, without JAX.

Hendrycks & Dietterich, ICLR 2019 (arXiv 1903.12261). Config files
(`mlcollections_configs/robustness.py`) read `NAMES` here; the corruptions themselves are
`xsens.measures.corruptions.CORRUPTIONS`, in this order.
"""

CATEGORIES: dict[str, list[str]] = {
    "noise": ["gaussian_noise", "shot_noise", "impulse_noise"],
    "blur": ["defocus_blur", "glass_blur", "motion_blur", "zoom_blur"],
    "weather": ["snow", "frost", "fog"],
    "digital": ["brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression"],
}

NAMES: tuple[str, ...] = tuple(name for names in CATEGORIES.values() for name in names)
