"""The one build step pyproject.toml does not state: compiling ``cache/_intmap.c`` (a table of
block hashes, see :mod:`kvsim.cache.intmap`). Optional: without a C compiler the install goes
on and kvsim uses Python dicts instead."""

import warnings

from setuptools import Extension, setup

if __name__ == "__main__":      # (as setuptools runs it; importing it does nothing)
    # setuptools' note on every editable install of a package with a compiled part (a
    # folder named like the package could shadow it: none here): not for a newcomer's screen
    warnings.filterwarnings("ignore", message="Editable installation")
    setup(ext_modules=[Extension("kvsim.cache._intmap", ["cache/_intmap.c"], optional=True)])
