"""The command line's commands, one module per family (``cli.py`` registers them), and the
option groups they share (:mod:`kvsim.commands.options`)."""
