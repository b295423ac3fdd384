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
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from kvsim.errors import ConfigError, WorkerLost

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


#: What a worker process that ended without its result (the pool is broken) leaves to say.
WORKER_LOST = ("a worker process ended without its result (killed, or out of memory; a Python "
               "script that starts workers must call kvsim under "
               "`if __name__ == \"__main__\":`, as each worker imports it); try fewer workers")


def _run_pool(fn, items, workers: int, report: Progress) -> list:
    out: list = [None] * len(items)
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=context,
                               initializer=_worker_signals)
    try:
        futures = {pool.submit(_in_worker, fn, item): i for i, item in enumerate(items)}
        for done, future in enumerate(as_completed(futures), start=1):
            out[futures[future]] = future.result()
            report(done, len(items), out[futures[future]])
    except BrokenProcessPool:
        _stop_workers(pool)
        raise WorkerLost(WORKER_LOST) from None
    except BaseException:   # an error, Ctrl-C or SIGTERM: stop the workers now
        _stop_workers(pool)
        raise
    pool.shutdown()
    return out


def _stop_workers(pool: ProcessPoolExecutor, wait_s: float = 30.0) -> None:
    """Stop the pool's workers (SIGTERM: each ends its task as an interrupted one, so a run's
    ``--out`` is cleaned up) and wait for them to be gone; a second Ctrl-C meanwhile waits
    too (the parent cleans up only after them)."""
    held = _hold_signals()
    try:
        processes = list((pool._processes or {}).values())
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(wait_s)
        pool.shutdown(wait=False, cancel_futures=True)
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)


def _hold_signals() -> dict:
    """Ignore SIGINT and SIGTERM for a while (the main thread only); the handlers to put back."""
    try:
        return {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:      # (not the main thread: nothing held)
        return {}


class _Stopped(BaseException):
    """A worker's task was stopped by its parent (SIGTERM)."""


_running_task = False


def _worker_signals() -> None:
    """Workers leave Ctrl-C to the parent, which stops them with SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_stop)


def _on_stop(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)     # (once: a second one would cut the
    if _running_task:                                 # cleanup short)
        raise _Stopped       # unwinds the task (its --out cleaned up); _in_worker then exits
    os._exit(128 + signum)


def _in_worker(fn: Callable[[Any], Any], item: Any) -> Any:
    """``fn(item)`` in a worker; a stop ends the worker once the task has unwound (also one
    that lands as the task returns)."""
    global _running_task
    try:
        _running_task = True
        try:
            return fn(item)
        finally:
            _running_task = False
    except _Stopped:
        os._exit(128 + signal.SIGTERM)


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
