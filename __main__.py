"""``kvsim`` and ``python -m kvsim``: the entry point. It imports nothing heavy itself, so that
a Ctrl-C (or SIGTERM) while the command line loads (numpy, pandas and the commands take about
half a second) also ends in one line and exit status 130 (143), not a traceback;
:func:`kvsim.cli.main` (the same handler, so no moment goes without one) then ends the run."""

import signal
import sys

from kvsim.errors import Interrupted, raise_interrupted


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, raise_interrupted)
    try:
        from kvsim.cli import main as run_command_line
    except Interrupted as e:
        sys.stderr.write(f"kvsim: interrupted by {signal.Signals(e.signum).name}; "
                         "nothing was written\n")
        sys.exit(128 + e.signum)
    run_command_line()


if __name__ == "__main__":
    main()
