"""Embedded offline datasets as TFDS builders (prepared locally, no download).

The builders skip TFDS's global registration (so a future TFDS dataset of the same name cannot
clash at import time); instantiate them from `BUILDERS`, e.g.
`BUILDERS["mnist5k"](data_dir=..., file_format="array_record")`.
"""

from xsens.data.builders.digits import Digits
from xsens.data.builders.mnist5k import Mnist5k

BUILDERS = {"mnist5k": Mnist5k, "digits": Digits}
