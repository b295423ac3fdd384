"""Run the ``kvsim`` command line in a subprocess, as a user would (shared by the CLI tests)."""

import subprocess
import sys


def kvsim(*args, cwd=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m kvsim.cli ARGS`` (arguments turned into strings), output captured."""
    return subprocess.run([sys.executable, "-m", "kvsim.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)
