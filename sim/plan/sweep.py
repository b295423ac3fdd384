"""Run independent tasks (one per planner candidate) in a process pool or as Ray tasks.

:func:`run_tasks` calls ``fn(item)`` for every item and returns the results **in the order of
the items**, whatever order they finish in, so a deterministic ``fn`` gives the same list on
every backend:

- ``workers <= 1`` (or a single item): in this process, one after the other;
- otherwise a local :class:`concurrent.futures.ProcessPoolExecutor` of ``workers`` processes
  (started with ``spawn``, safe beside threads such as a progress bar);
- ``use_ray``: Ray tasks. ``ray_address`` ``None`` starts a local Ray runtime with ``workers``
  CPUs (or uses the one already initialised in this process); ``"auto"`` or
  ``"ray://host:port"`` joins an existing cluster, whose workers must be able to import
  ``kvsim`` and read the trace at the same path.

``fn`` and the items must be picklable (a module-level function, frozen dataclasses).
``progress(done, total, result)`` is called after each finished task, with its result.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from kvsim.errors import ConfigError

Progress = Callable[[int, int, Any], None]


@dataclass(frozen=True)
class SweepOptions:
    """Where the tasks run (see the module doc)."""

    workers: int = 1
    use_ray: bool = False
    ray_address: str | None = None


def default_workers() -> int:
    """``min(4, number of CPUs)``."""
    return max(1, min(4, os.cpu_count() or 1))


def run_tasks(fn: Callable[[Any], Any], items: Sequence[Any], options: SweepOptions,
              progress: Progress | None = None) -> list:
    """``[fn(item) for item in items]``, computed on the backend of ``options``."""
    if options.workers < 1:
        raise ConfigError(f"must be at least 1, got {options.workers}", field="workers")
    report = progress or (lambda done, total, result: None)
    if options.use_ray:
        return _run_ray(fn, items, options, report)
    if options.workers == 1 or len(items) <= 1:
        return _run_serial(fn, items, report)
    return _run_pool(fn, items, options.workers, report)


def _run_serial(fn, items, report: Progress) -> list:
    out = []
    for item in items:
        out.append(fn(item))
        report(len(out), len(items), out[-1])
    return out


def _run_pool(fn, items, workers: int, report: Progress) -> list:
    out: list = [None] * len(items)
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=context,
                               initializer=_ignore_interrupts)
    try:
        futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
        for done, future in enumerate(as_completed(futures), start=1):
            out[futures[future]] = future.result()
            report(done, len(items), out[futures[future]])
    except BaseException:   # an error, Ctrl-C or SIGTERM: stop the workers now
        for process in list((pool._processes or {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return out


def _ignore_interrupts() -> None:
    """Workers leave Ctrl-C to the parent, which stops them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def import_ray():
    """The ``ray`` module, or a :class:`ConfigError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("Ray is not installed; pip install 'kvsim[ray]' (or 'ray>=2.9')",
                          field="ray") from None
    return ray


def _run_ray(fn, items, options: SweepOptions, report: Progress) -> list:
    ray = import_ray()
    started = _init_ray(ray, options)
    try:
        remote = ray.remote(num_cpus=1)(fn)
        refs = [remote.remote(item) for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        out: list = [None] * len(items)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            out[index[ready[0]]] = ray.get(ready[0])
            report(len(items) - len(pending), len(items), out[index[ready[0]]])
        return out
    finally:
        if started:
            ray.shutdown()


def _init_ray(ray, options: SweepOptions) -> bool:
    """Initialise Ray unless this process already did; True when this call started it."""
    if ray.is_initialized():
        return False
    import logging
    kwargs = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    if options.ray_address is None:
        kwargs["num_cpus"] = options.workers
    try:
        ray.init(address=options.ray_address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ConfigError(f"cannot start or reach Ray: {str(e).splitlines()[0]}",
                          field="ray_address") from None
    return True
