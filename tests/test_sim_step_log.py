"""The step log keeps running totals and a bounded timeline: the same numbers a full per-step
log gives, in memory that does not grow with the steps."""

import numpy as np
import pandas as pd
import pytest

from kvsim.sim.serving import results
from kvsim.sim.config import RunConfig
from kvsim.sim.serving.recorder import STEP_COLUMNS, StepLog, StepRecord
from kvsim.sim.serving.runner import simulate
from kvsim.sim.serving.step_totals import STATE_COLUMNS, StepTotals, Timeline
from kvsim.workloads import read_trace, sample_path


def record(t, d, replica=0, running=0, waiting=0, used=0, out=0, batch=0, **rest):
    values = dict.fromkeys(STEP_COLUMNS, 0)
    values.update(t_start=t, duration=d, replica=replica, num_running=running,
                  num_waiting=waiting, kv_used_blocks=used, output_tokens=out, batch_size=batch,
                  **rest)
    return StepRecord(**values)


@pytest.fixture(scope="module")
def run():
    """Two replicas (their steps interleave) on a small pool, with every step kept."""
    reqs = read_trace(sample_path("azure-conv"))[:60]
    return simulate(reqs, RunConfig(model="llama-2-7b", num_gpu_blocks=400, replicas=2,
                                    router="round-robin", max_num_seqs=16), keep_steps=True)


def test_totals_equal_a_full_per_step_computation(run):
    steps, totals = results.steps_frame(run), run.steps.totals
    w = steps["duration"].to_numpy()
    assert totals.num_steps == len(steps) == len(run.steps) > 100
    for col in ("preemptions", "output_tokens", "batch_size", "prefix_hit_tokens"):
        assert totals.sum(col) == steps[col].sum()
        assert totals.max(col) == steps[col].max()
    for col in ("kv_used_blocks", "token_slots", "internal_slots", "kv_cached_idle_blocks"):
        assert totals.time_average(col) == pytest.approx(np.average(steps[col], weights=w),
                                                         rel=1e-12)
    assert totals.mean("batch_size") == steps["batch_size"].mean()
    assert totals.sum("duration") == pytest.approx(w.sum(), rel=1e-12)


def test_under_load_totals_cover_the_steps_that_left_a_request_waiting(run):
    steps, loaded = results.steps_frame(run), run.steps.totals.under_load
    busy = steps[steps["num_waiting"] > 0]
    assert 0 < loaded.num_steps == len(busy) < len(steps)
    assert loaded.time_average("token_slots") == pytest.approx(
        np.average(busy["token_slots"], weights=busy["duration"]), rel=1e-12)


def test_under_load_totals_are_bit_for_bit_those_of_the_waiting_steps_folded_alone():
    rng = np.random.default_rng(3)
    block = rng.random((5000, len(STEP_COLUMNS)))
    waiting = STEP_COLUMNS.index("num_waiting")
    block[:, waiting] = rng.random(5000) < 0.4
    totals, alone = StepTotals(), StepTotals(with_under_load=False)
    totals.add(block)
    alone.add(block[block[:, waiting] > 0])
    for col in STEP_COLUMNS:
        assert totals.under_load.sum(col) == alone.sum(col)
        assert totals.under_load.weighted_sum(col) == alone.weighted_sum(col)
        assert totals.under_load.max(col) == alone.max(col)


def test_summary_is_the_same_with_or_without_the_kept_steps(run):
    again = simulate(read_trace(sample_path("azure-conv"))[:60], run.config)
    ours, kept = (results.build_summary(r, results.requests_frame(r)) for r in (again, run))
    ours.pop("wall_time_s"), kept.pop("wall_time_s")
    assert ours == kept
    with pytest.raises(ValueError, match="keep_steps=True"):
        results.steps_frame(again)


def reference_timeline(steps: pd.DataFrame, duration: float, width: float, rows: int):
    """Each state held from its step's start to its replica's next step (the last to the end of
    the run), integrated over bins of ``width`` by brute force."""
    edges = np.minimum(np.arange(rows + 1) * width, duration)
    states = np.zeros((rows, len(STATE_COLUMNS)))
    for _, s in steps.groupby("replica"):
        t = s["t_start"].to_numpy()
        ends = np.append(t[1:], duration)
        for i, (a, b) in enumerate(zip(t, ends)):
            overlap = np.clip(np.minimum(b, edges[1:]) - np.maximum(a, edges[:-1]), 0, None)
            states += overlap[:, None] * s[list(STATE_COLUMNS)].to_numpy()[i]
    return states / np.diff(edges)[:, None]


def test_timeline_states_are_exact_time_averages_and_counts_fall_where_steps_end(run):
    steps, tl = results.steps_frame(run), run.steps.timeline
    frame = pd.DataFrame(tl.rows())
    assert len(frame) == tl.num_rows <= min(2000, len(steps))
    expected = reference_timeline(steps, run.duration_s, tl.width_s, tl.num_rows)
    np.testing.assert_allclose(frame[list(STATE_COLUMNS)].to_numpy(), expected,
                               rtol=1e-9, atol=1e-9)
    ends = steps["t_start"] + steps["duration"]
    bins = np.minimum((ends / tl.width_s).astype(int), tl.num_rows - 1)
    np.testing.assert_array_equal(frame["num_steps"], np.bincount(bins, minlength=len(frame)))
    np.testing.assert_array_equal(frame["output_tokens"],
                                  np.bincount(bins, weights=steps["output_tokens"],
                                              minlength=len(frame)))
    assert frame["interval_s"].sum() == pytest.approx(run.duration_s)


def test_bins_merge_pairwise_when_the_run_outgrows_the_grid():
    """Four one-second bins; a step at 5 s doubles the width to 2 s, merging neighbours (and
    a closed timeline has no more rows than steps)."""
    log = StepLog(timeline=Timeline(max_rows=4, first_width_s=1.0))
    log.append(record(0.0, 0.5, running=2, out=2, batch=2))
    log.append(record(1.0, 0.5, running=4, out=4, batch=4))
    log.flush()
    assert log.timeline.width_s == 1.0
    log.append(record(5.0, 1.0, running=1, out=1, batch=1))
    log.append(record(6.0, 0.5, running=1, out=1, batch=1))
    log.finish(7.0)
    tl = log.timeline
    assert tl.width_s == 2.0 and tl.num_rows == 4
    rows = tl.rows()
    np.testing.assert_array_equal(rows["time_s"], [0, 2, 4, 6])
    np.testing.assert_array_equal(rows["interval_s"], [2, 2, 2, 1])
    # running: 2 over [0,1), 4 over [1,5), 1 over [5,7); steps end at 0.5, 1.5, 6 and 6.5
    np.testing.assert_array_equal(rows["num_running"], [3.0, 4.0, 2.5, 1.0])
    np.testing.assert_array_equal(rows["num_steps"], [2, 0, 0, 2])
    np.testing.assert_array_equal(rows["output_tokens"], [6, 0, 0, 2])
    np.testing.assert_array_equal(rows["batch_size"], [3.0, 0.0, 0.0, 1.0])


def test_a_long_run_keeps_at_most_max_rows_and_loses_no_totals():
    n = 100_000
    t = np.arange(n) * 0.01
    columns = {name: np.zeros(n) for name in STEP_COLUMNS}
    columns.update(t_start=t, duration=np.full(n, 0.01), num_running=np.arange(n) % 7,
                   output_tokens=np.full(n, 3.0), batch_size=np.full(n, 3.0))
    log = StepLog(timeline=Timeline(max_rows=64))
    log.extend(columns)
    log.finish(n * 0.01)
    rows, totals = log.timeline.rows(), log.totals
    assert len(rows["time_s"]) <= 64 and len(log) == totals.num_steps == n
    assert rows["num_steps"].sum() == n and rows["output_tokens"].sum() == 3 * n
    held = (rows["num_running"] * rows["interval_s"]).sum()
    assert held == pytest.approx((columns["num_running"] * 0.01).sum(), rel=1e-12)
    assert totals.time_average("num_running") == pytest.approx(3.0, rel=1e-4)


def test_extend_and_append_log_the_same_steps_alike():
    records = [record(0.1 * i, 0.1, replica=i % 2, running=i % 5, used=i, out=1, batch=1)
               for i in range(10_000)]
    one, bulk = StepLog(keep_steps=True), StepLog(keep_steps=True)
    for r in records:
        one.append(r)
    bulk.extend({name: np.array([getattr(r, name) for r in records]) for name in STEP_COLUMNS})
    for log in (one, bulk):
        log.finish(1000.0)
    for name in STEP_COLUMNS:
        np.testing.assert_array_equal(one.columns[name], bulk.columns[name])
    for name in ("kv_used_blocks", "num_running", "output_tokens"):
        assert one.totals.time_average(name) == pytest.approx(bulk.totals.time_average(name),
                                                              rel=1e-13)
        np.testing.assert_allclose(one.timeline.rows()[name], bulk.timeline.rows()[name],
                                   rtol=1e-12)


def test_the_fold_is_the_same_to_the_bit_whatever_blocks_the_steps_come_in():
    """10,000 steps of random durations, logged one by one, in uneven blocks (as decode runs
    of different lengths log them) and all at once: the log folds the same chunks, so the
    totals and the timeline agree to the last bit (not just to rounding)."""
    rng = np.random.default_rng(7)
    durations = rng.uniform(0.001, 0.05, 10_000) * np.where(rng.random(10_000) < 0.01, 400, 1)
    starts = np.concatenate(([0.0], np.add.accumulate(durations)[:-1]))  # (some span bins)
    rows = np.array([record(t, d, running=int(rng.integers(1, 64)), used=int(rng.integers(900)),
                            waiting=int(rng.integers(0, 2)), out=3, batch=3,
                            transfer_s=float(rng.uniform(0, 0.01)))
                     for t, d in zip(starts, durations)], dtype=np.float64)
    logs = [StepLog() for _ in range(3)]
    for row in rows:
        logs[0].append(StepRecord(*row.tolist()))
    at = 0
    for size in rng.integers(1, 700, 100):
        logs[1].extend_rows(rows[at:at + size])
        at += int(size)
    logs[1].extend_rows(rows[at:])
    logs[2].extend_rows(rows)
    for log in logs:
        log.finish(float(starts[-1] + durations[-1]))
    for log in logs[1:]:
        for name in ("kv_used_blocks", "num_running", "duration"):
            assert log.totals.time_average(name) == logs[0].totals.time_average(name)
            assert log.totals.under_load.sum(name) == logs[0].totals.under_load.sum(name)
        for name, column in log.timeline.rows().items():
            np.testing.assert_array_equal(column, logs[0].timeline.rows()[name])


def test_a_finished_run_holds_no_request_or_sequence_objects():
    """Requests stream in and leave nothing behind once done: the logs are columnar."""
    import gc

    from kvsim.cache.request_state import RequestState
    from kvsim.workloads import Request
    from kvsim.workloads.generators import GenConfig, iter_requests

    result = simulate(iter_requests("chat", GenConfig(num_requests=120, seed=2)),
                      RunConfig(model="llama-2-7b", num_gpu_blocks=2000))
    gc.collect()
    # by type: isinstance() on every object would reach torch's deprecated names (a warning)
    alive = [o for o in gc.get_objects() if type(o) in (Request, RequestState)]
    assert len(result.requests) == 120 and alive == []
