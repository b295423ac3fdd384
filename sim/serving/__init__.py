"""The serving loop: the SimPy replica, router, runner, step and request logs, results."""
