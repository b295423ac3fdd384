"""The one build step pyproject.toml does not state: compiling ``cache/_intmap.c`` (a table of
block hashes, see :mod:`kvsim.cache.intmap`), ``cache/_bulk.c`` (loops over block lists,
see :mod:`kvsim.cache.bulk`) and ``cache/_recency.c`` (the CPU tier's LRU list, see
:mod:`kvsim.cache.recency`). Optional: without a C compiler the install goes on and kvsim
runs the same in Python."""

import warnings

from setuptools import Extension, setup

if __name__ == "__main__":      # (as setuptools runs it; importing it does nothing)
    # setuptools' note on every editable install of a package with a compiled part (a
    # folder named like the package could shadow it: none here): not for a newcomer's screen
    warnings.filterwarnings("ignore", message="Editable installation")
    setup(ext_modules=[Extension(f"kvsim.cache.{name}", [f"cache/{name}.c"], optional=True)
                       for name in ("_intmap", "_bulk", "_recency")])
