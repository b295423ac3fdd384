"""``kvsim profile``: time the real backend over a grid of steps and fit the cost model to it.

Each grid point is one engine step: a batch composition (requests with ``q`` new tokens on ``c``
cached ones) or one block copy. It is timed the way :class:`TorchExecutor` times a step (forward
pass plus greedy sampling; or ``copy_blocks``) in the steady state an engine runs in: after a
warm-up, as the median of several back-to-back calls each preceded by engine-like host work,
and the median of that over a few passes of the grid (see :func:`measure_grid`).

The fit (:mod:`.profile_fit`) is the cost model's *fitted* form (see
``kvsim.sim.perf.profile.Fitted``). ``per_batch_s`` in it is the LM head (logits of one row per
request) timed alone for every batch size up to ``max_num_seqs`` (see
:func:`measure_batch_table`), then corrected by the decode steps of each size
(:func:`~.profile_fit.backfit_table`): on a CPU its time jumps between row counts (BLAS kernels
per shape), which no linear term follows. The linear coefficients are non-negative least
squares on *relative* residuals (each row divided by its measured time), so short decode steps
weigh as much as long prefills, fitted to the measured time less the table; points the linear
form cannot follow at all (see :func:`~.profile_fit.fit_compute`) are left out of the fit but
still reported in the fit error.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kvsim.cache.step_plan import COMPACT, SWAP_OUT

from kvsim.real_backend.torch_executor import clock_fn, interlude
from kvsim.real_backend.profile_fit import fit_errors, fit_profile, predict
from kvsim.real_backend.model_runner import ModelRunner, RequestChunk

MAX_BATCH_TABLE = 512   # per_batch_s covers at most this many requests


@dataclass(frozen=True)
class Point:
    """One timed step: ``batch`` of ``(q new, c cached)`` pairs, or ``copy`` of
    ``(kind, num_blocks)``."""

    group: str
    batch: tuple[tuple[int, int], ...] = ()
    copy: tuple[str, int] | None = None

    def features(self) -> list[float]:
        """``[1, seqs, tokens, kv, units]`` (compute) or ``[1, blocks]`` (copy)."""
        if self.copy is not None:
            return [1.0, float(self.copy[1])]
        tokens = sum(q for q, _ in self.batch)
        kv = sum(q + c for q, c in self.batch)
        units = sum(q * (2 * c + q + 1) for q, c in self.batch)
        return [1.0, float(len(self.batch)), float(tokens), float(kv), float(units)]


@dataclass
class Grid:
    """Which steps to time and how often."""

    points: list[Point] = field(default_factory=list)
    repeats: int = 5     # timed back-to-back calls per point and round (median)
    warmup: int = 2      # untimed calls before them
    rounds: int = 3      # passes over the whole grid (median of the rounds' medians)


@dataclass(frozen=True)
class Limits:
    """The operating range to profile: the engine's batch limits and longest context."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_context: int = 2048


def _decode(contexts) -> tuple[tuple[int, int], ...]:
    return tuple((1, max(int(c), 2) - 1) for c in contexts)


def _around(rng, context: int, batch: int, limit: int) -> list[int]:
    """``batch`` contexts spread over ``context`` x [0.5, 1.5] (within ``[2, limit]``): a live
    decode batch is ragged, and ragged contexts cost more than their KV tokens alone (the
    backend pads each decode group to its longest context, see ``attention.decode_groups``)."""
    if batch == 1:
        return [context]
    return np.clip(np.rint(context * rng.uniform(0.5, 1.5, size=batch)), 2, limit).tolist()


def _powers(lo: int, hi: int) -> list[int]:
    """``lo, 2 lo, 4 lo, ...`` up to ``hi``, and ``hi`` itself."""
    out = []
    while lo < hi:
        out.append(lo)
        lo *= 2
    return out + [hi]


def default_grid(limits: Limits = Limits(), quick: bool = False, seed: int = 0) -> Grid:
    """Steps spanning ``limits``: prefills (one or several requests, with and without a cached
    prefix), decodes (batch x context, uniform and ragged contexts), mixed steps (prefill
    chunks riding with decodes) and block copies. ``quick`` thins it to a few seconds on a
    tiny model (tests, ``validate`` without ``--profile``)."""
    rng = np.random.default_rng(seed)
    seqs, budget, ctx = limits.max_num_seqs, limits.max_num_batched_tokens, limits.max_context
    pts = [Point("prefill", ((q, c),)) for q in _powers(8, min(budget, ctx))[::2 if quick else 1]
           for c in (0, ctx // 4, ctx // 2) if q + c <= ctx]
    pts += [Point("prefill", tuple((max(budget // (2 * k), 2), 32 * i) for i in range(k)))
            for k in (2, 4)]
    contexts = sorted({min(64, ctx), max(ctx // 8, 2), max(ctx // 2, 2), ctx})
    for b in _powers(1, seqs)[::2 if quick else 1]:
        pts += [Point("decode", _decode(_around(rng, c, b, ctx)))
                for c in contexts[::2 if quick else 1]]
        pts.append(Point("decode", _decode(rng.integers(16, ctx + 1, size=b))))
    powers = set(_powers(1, seqs))
    pts += [Point("decode", _decode(_around(rng, contexts[0], b, ctx)))   # other small batches
            for b in range(1, min(seqs, 16) + 1) if b not in powers and not quick]
    for q in (max(budget // 8, 2), max(budget // 2, 2)):
        for b in (max(seqs // 4, 1), max(seqs - 1, 1)):
            ragged = _decode(rng.integers(16, ctx // 2 + 2, size=b))
            pts.append(Point("mixed", ((q, 0),) + ragged))
            pts.append(Point("mixed", ((q // 2, ctx // 4), (q // 2, 0)) + ragged))
    for kind in (SWAP_OUT, COMPACT):
        pts += [Point("transfer", copy=(kind, n)) for n in (1, 8, 64) if not quick or n != 8]
    return Grid(pts, repeats=3 if quick else 5, warmup=1 if quick else 2,
                rounds=1 if quick else 3)


# --- timing --------------------------------------------------------------------------------

def _chunks(point: Point, block_size: int, vocab: int, rng) -> list[RequestChunk]:
    """Requests in consecutive, disjoint block ranges (from block 0)."""
    chunks, next_block = [], 0
    for q, c in point.batch:
        n = -(-(q + c) // block_size)
        tokens = rng.integers(0, vocab, size=q).tolist()
        chunks.append(RequestChunk(tokens, c, list(range(next_block, next_block + n))))
        next_block += n
    return chunks


def blocks_needed(grid: Grid, block_size: int) -> tuple[int, int]:
    """(device blocks, host blocks) the grid's steps touch."""
    dev = max((sum(-(-(q + c) // block_size) for q, c in p.batch) for p in grid.points), default=1)
    copies = [p.copy[1] for p in grid.points if p.copy]
    most = max(copies, default=0)
    return max(dev, 2 * most, 1), most


def point_call(runner: ModelRunner, point: Point, rng) -> Callable[[], object]:
    """A zero-argument call performing the grid point's step (forward + sampling, or a copy)."""
    if point.copy is not None:
        kind, n = point.copy
        pairs = [(i, n + i) if kind == COMPACT else (i, i) for i in range(n)]
        return lambda: runner.kv_store.copy_blocks(kind, pairs)
    chunks = _chunks(point, runner.kv_store.block_size, runner.model.cfg.vocab_size, rng)
    return lambda: runner.greedy(chunks)


def timed_call(call: Callable[[], object], device, now: Callable[[], float]) -> float:
    """Seconds of one call (CUDA-synchronised on a GPU)."""
    import torch
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    start = now()
    call()
    if cuda:
        torch.cuda.synchronize(device)
    return now() - start


# --- the whole job -------------------------------------------------------------------------

def quiet(message: str) -> None:
    """The default ``progress`` of :func:`run_profile` and ``validate``: says nothing."""


def measure_grid(runner: ModelRunner, grid: Grid, clock: str, seed: int = 0,
                 batch_rows: int = 0, progress: Callable[[str], None] = quiet,
                 ) -> tuple[list[float], list[float]]:
    """Median seconds of every grid point, in grid order, and of the LM head for 1 ..
    ``batch_rows`` rows (:func:`measure_batch_table`; empty when ``batch_rows`` is 0): the
    median over the passes of :func:`measure_rounds`."""
    rounds, tables = measure_rounds(runner, grid, clock, seed, batch_rows, progress)
    return [statistics.median(t) for t in zip(*rounds)], [statistics.median(t)
                                                          for t in zip(*tables)]


def measure_rounds(runner: ModelRunner, grid: Grid, clock: str, seed: int = 0,
                   batch_rows: int = 0, progress: Callable[[str], None] = quiet,
                   ) -> tuple[list[list[float]], list[list[float]]]:
    """Seconds of every grid point and of the LM head table, once per pass over the grid.

    Each point runs ``warmup`` times and then is timed ``repeats`` times back to back, like
    consecutive engine steps (a decode step follows a decode step of nearly the same batch,
    with its weights and KV still in the caches), each after the host work an engine does
    between steps (:func:`~.executor.interlude`). Measured on the CPU against ``kvsim
    validate``: timing the points interleaved instead (round-robin over the grid, caches holding
    other work) made decode steps ~20 % slower than the same steps in a replayed trace. The
    whole grid is measured ``rounds`` times: on a shared host the speed of one point drifts by
    10-25 % between passes seconds apart (:func:`round_spread` says by how much it did).
    ``progress`` is told when each pass ends.
    """
    rng = np.random.default_rng(seed)
    calls = [point_call(runner, p, rng) for p in grid.points]
    now = clock_fn(clock)
    rounds, tables = [], []
    passes = max(grid.rounds, 1)
    for i in range(passes):
        start = time.perf_counter()
        rounds.append([steady_median(call, runner.device, now, grid.warmup, grid.repeats)
                       for call in calls])
        if batch_rows:
            tables.append(measure_batch_table(runner, batch_rows, clock, grid.warmup,
                                              grid.repeats))
        progress(f"profile: pass {i + 1}/{passes} over {len(calls)} points in "
                 f"{time.perf_counter() - start:.1f}s")
    return rounds, tables


def round_spread(rounds: list[list[float]]) -> dict | None:
    """How much the passes over the grid disagreed: per point ``(max - min) / median`` over
    the passes, its median and p90 over the points, and the signed drift of the whole grid
    (last pass's total over the first's, less 1). None for a single pass (drift unseen)."""
    if len(rounds) < 2:
        return None
    t = np.asarray(rounds, dtype=float)
    spread = (t.max(axis=0) - t.min(axis=0)) / np.median(t, axis=0)
    return {"passes": len(rounds), "median": float(np.median(spread)),
            "p90": float(np.percentile(spread, 90)),
            "drift": float(t[-1].sum() / t[0].sum() - 1)}


def steady_median(call: Callable[[], object], device, now: Callable[[], float], warmup: int,
                  repeats: int) -> float:
    """Median seconds of ``repeats`` timed calls of ``call``, after ``warmup`` untimed ones,
    each timed call after the engine-like host work of :func:`interlude`: a grid item in the
    steady state an engine runs its steps in."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        interlude()
        times.append(timed_call(call, device, now))
    return statistics.median(times)


def measure_batch_table(runner: ModelRunner, max_rows: int, clock: str, warmup: int = 2,
                        repeats: int = 7) -> list[float]:
    """Seconds of the LM head (``model.logits``) over 1, 2, ..., ``max_rows`` rows: the
    fitted profile's ``per_batch_s``."""
    import torch
    out = []
    with torch.inference_mode():
        for x in head_inputs(runner, max_rows):
            out.append(steady_median(lambda: runner.model.logits(x), runner.device,
                                     clock_fn(clock), warmup, repeats))
    return out


def head_inputs(runner: ModelRunner, max_rows: int) -> list:
    """Random hidden states of 1, 2, ..., ``max_rows`` rows: the LM head table's inputs."""
    import torch
    cfg, dtype = runner.model.cfg, runner.model.lm_head.weight.dtype
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(rows, cfg.hidden_size, generator=gen).to(runner.device, dtype)
            for rows in range(1, max_rows + 1)]


def point_record(point: Point, measured: float, fitted: float) -> dict:
    """One grid point as written into the profile JSON."""
    what = {"copy": list(point.copy)} if point.copy else {"batch": [list(b) for b in point.batch]}
    return {"group": point.group, **what, "measured_s": measured, "fitted_s": fitted}


def run_profile(settings, limits: Limits = Limits(), quick: bool = False,
                progress: Callable[[str], None] = quiet, rounds: int | None = None) -> dict:
    """Profile ``settings.model`` on ``settings.device``; returns the fitted profile (a dict
    that ``CostModel(profile=...)`` and ``kvsim run --profile`` accept once written).
    ``progress`` receives a line after the model is built and after each pass of the grid;
    ``rounds`` overrides the grid's number of passes."""
    from kvsim.real_backend.session import build_runner, prepare_device, warm_up

    built = time.perf_counter()
    model = prepare_device(settings)
    grid = default_grid(limits, quick=quick, seed=settings.seed)
    if rounds is not None:
        grid.rounds = max(rounds, 1)
    dev_blocks, host_blocks = blocks_needed(grid, settings.block_size)
    runner = build_runner(settings, model, dev_blocks, host_blocks)
    start = time.perf_counter()
    warm_up(runner, limits.max_num_seqs)
    progress(f"profile: {settings.model} on {settings.device} built in {start - built:.1f} s, "
             f"warmed up in {time.perf_counter() - start:.1f} s")
    passes, tables = measure_rounds(runner, grid, settings.clock, settings.seed,
                                    min(limits.max_num_seqs, MAX_BATCH_TABLE), progress)
    return profile_record(settings, model, runner, limits, quick, grid, passes, tables,
                          time.perf_counter() - start)


def profile_record(settings, model, runner: ModelRunner, limits: Limits, quick: bool,
                   grid: Grid, passes: list[list[float]], tables: list[list[float]],
                   profiling_s: float) -> dict:
    """The fitted profile of ``passes`` over ``grid`` (and ``tables`` of the LM head): each
    point's median over the passes, the fit, its errors and where it was measured."""
    import torch

    from kvsim.sim.perf.profile import MODEL_SHAPE_KEYS

    from kvsim.real_backend.session import device_name

    times = [statistics.median(t) for t in zip(*passes)]
    table = [statistics.median(t) for t in zip(*tables)]
    bb = runner.kv_store.bytes_per_block
    coef = fit_profile(grid.points, times, bb, table)
    head = runner.model.cpu_head().layouts() if runner.device.type == "cpu" else {}
    return {
        "kind": "fitted", "device": settings.device, "device_name": device_name(settings.device),
        "model": settings.model, "sim_model": model.sim_model,
        "model_shape": {k: getattr(model.spec, k) for k in MODEL_SHAPE_KEYS},
        "settings": settings.to_dict(), "limits": vars(limits) | {"quick": quick},
        "grid": {"points": len(grid.points), "rounds": len(passes), "repeats": grid.repeats,
                 "warmup": grid.warmup}, "round_spread": round_spread(passes),
        "torch": torch.__version__, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "profiling_s": profiling_s,
        "fitted": coef, "fit_error": fit_errors(grid.points, times, coef, bb),
        "points": [point_record(p, t, predict(p, coef, bb)) for p, t in zip(grid.points, times)],
        "cpu_head_layouts": {str(k): v for k, v in sorted(head.items())},
    }


def render_fit(profile: dict) -> str:
    """The fit's error per operation group, as a small table."""
    lines = [f"profile of {profile['model']} on {profile['device']} "
             f"({profile['device_name']}), {len(profile['points'])} points in "
             f"{profile['profiling_s']:.1f}s",
             f"{'group':<10}{'points':>7}{'median |err|':>14}{'max |err|':>11}"]
    for group, e in profile["fit_error"].items():
        lines.append(f"{group:<10}{e['points']:>7}{e['median_abs_rel_error']:>13.1%}"
                     f"{e['max_abs_rel_error']:>11.1%}")
    return "\n".join(lines)


def profile_job(settings, limits: Limits, out: str, quick: bool = False,
                progress: Callable[[str], None] = quiet) -> dict:
    """``kvsim profile``: profile, write the JSON atomically to ``out``, return the profile."""
    from kvsim.output_file import check_output_file
    from kvsim.reports.io import write_json_atomic
    check_output_file(out)          # (before minutes of profiling)
    profile = run_profile(settings, limits, quick, progress)
    profile["path"] = str(write_json_atomic(out, profile))
    return profile
