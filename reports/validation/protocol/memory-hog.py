"""The busy neighbour of ``protocol/loaded-interleaved``: one core streaming 2 x 128 MiB arrays.

Usage: ``python3 reports/validation/protocol/memory-hog.py &`` (kill it afterwards).
"""

import numpy as np

source = np.ones(2 ** 24)
target = np.empty_like(source)
while True:
    np.copyto(target, source)
    source[::4096] += 1.0
