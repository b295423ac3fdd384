"""The planner's early stop: a simulation ends once it certainly misses an SLO target, and a
run that is not stopped is the very same run."""

from types import SimpleNamespace

import numpy as np
import pytest

from kvsim.sim.config import RunConfig
from kvsim.sim.plan.stop import SloStop, late_allowance
from kvsim.sim.plan.spec import slo_targets
from kvsim.sim.serving.recorder import RequestLog
from kvsim.sim.serving.results import requests_frame
from kvsim.sim.serving.runner import simulate
from kvsim.workloads import TraceOptions, load_trace, sample_path
from kvsim.workloads.request import Request


@pytest.mark.parametrize("pct", [50, 90, 99, 99.9])
@pytest.mark.parametrize("n", [1, 2, 3, 10, 99, 100, 101, 250])
def test_late_allowance_is_where_numpy_s_percentile_must_cross_the_target(n, pct):
    """``late_allowance`` values barely above a 1 s target put numpy's linear percentile above
    it wherever the others lie; one fewer leaves it at or below the target when the others
    are fast (the interpolation weight stays below 1)."""
    k = late_allowance(n, pct)
    late = np.full(k, 1.0 + 1e-9)
    for others in (0.0, 1.0):
        assert np.percentile(np.concatenate([np.full(n - k, others), late]), pct) > 1.0
    assert np.percentile(np.concatenate([np.zeros(n - k + 1), late[1:]]), pct) <= 1.0


def test_late_allowance_of_the_issue_trace():
    """19,366 requests, p99: floor(19,365 x 0.99) = 19,171, so 195 late requests settle it."""
    assert late_allowance(19366, 99) == 195
    assert late_allowance(10, 90) == 2 and late_allowance(10, 50) == 6


class Story:
    """A request log with an SloStop watching it, fed by hand."""

    def __init__(self, slo: dict, n: int):
        self.stop = SloStop(slo_targets(slo), n)
        self.log = RequestLog(self.stop)

    def arrive(self, i: int, at: float, output_tokens: int = 8):
        self.log.on_arrival(Request(i, at, 100, output_tokens), -1)

    def first_token(self, i: int, now: float):
        self.log.on_first_token(SimpleNamespace(request_id=i), now)

    def finish(self, i: int, now: float, generated: int = 8):
        self.log.on_finish(SimpleNamespace(request_id=i, num_cached_tokens=0,
                                           num_preemptions=0, num_output_tokens=generated,
                                           max_tokens=generated), now)


def test_the_second_late_first_token_of_ten_stops_a_p90_ttft_target():
    """p90 of 10 TTFTs is above 1 s once two are: the second request whose first second
    passes without a token stops the run, at the arrival that shows it."""
    s = Story({"ttft_p90_s": 1.0}, 10)
    s.arrive(0, 0.0)
    s.arrive(1, 0.5)
    s.first_token(0, 0.9)                       # 0.9 s: on time
    s.arrive(2, 1.2)                            # request 1 still waits, 0.7 s: undecided
    s.arrive(3, 1.6)                            # request 1 waited 1.1 s: late (1 of 2)
    assert not s.stop.stopped and s.stop._deadline[0].num_late == 1
    s.first_token(2, 2.1)                       # request 2: 0.9 s, on time
    s.first_token(1, 2.3)
    assert not s.stop.stopped
    s.arrive(4, 2.7)                            # request 3 waited 1.1 s: late (2 of 2)
    assert s.stop.stopped
    assert "TTFT p90 above 1.00 s for certain at t=2.7 s: 2 of 10 requests late" \
        in s.stop.reason


def test_a_first_token_exactly_at_the_target_is_on_time():
    s = Story({"ttft_p50_s": 1.0}, 2)           # allowance 2 - floor(0.5) = 2
    s.arrive(0, 0.25)
    s.first_token(0, 1.25)                      # TTFT exactly 1.0 s
    s.arrive(1, 1.25 + 1e-9)
    s.arrive(2, 5.0)
    assert s.stop._deadline[0].num_late == 1    # request 1 only: 3.75 s without a token
    assert not s.stop.stopped


def test_tpot_counts_at_finish_and_one_token_requests_do_not_count():
    s = Story({"tpot_p50_s": 0.125}, 4)         # allowance 4 - floor(1.5) = 3
    for i in range(4):
        s.arrive(i, 0.0)
        s.first_token(i, 0.5)
    s.finish(0, 0.5 + 7 * 0.25)                 # 0.25 s per token: late
    s.finish(1, 0.5, generated=1)               # no TPOT
    s.finish(2, 0.5 + 7 * 0.25)                 # late
    s.finish(3, 0.5 + 7 * 0.125)                # exactly 0.125 s: on time
    assert not s.stop.stopped and s.stop._tpot[0].num_late == 2


def test_a_rejected_request_stops_at_once():
    s = Story({"e2e_p99_s": 100.0}, 5)
    s.arrive(0, 0.0)
    s.log.on_rejected(0)
    assert s.stop.stopped and "rejected" in s.stop.reason


CONFIG = RunConfig(model="llama-3.1-8b", gpu="a100-80gb")


def azure(limit, rate_scale):
    return load_trace(sample_path("azure-conv"), TraceOptions(limit=limit, rate_scale=rate_scale))


def test_an_overloaded_run_stops_early_with_the_verdict_of_the_full_run():
    """200 Azure requests at 16x on one A100: the full run's p99 TTFT is far above 1 s; the
    watched run stops once 3 requests (200 - floor(199 x 0.99)) are certainly late."""
    full = simulate(azure(200, 16.0), CONFIG)
    assert np.percentile(requests_frame(full)["ttft_s"], 99) > 1.0
    stop = SloStop(slo_targets({"ttft_p99_s": 1.0}), 200)
    cut = simulate(azure(200, 16.0), CONFIG, stop=stop)
    assert stop.stopped and "of 200 requests late (p99 is above the target from 3)" \
        in stop.reason
    df = requests_frame(cut)
    assert df["completed"].sum() < 200 and len(cut.steps) < len(full.steps) / 2
    waited = cut.duration_s - df["arrival_s"]
    late = (df["first_token_s"].isna() & (waited > 1.0)) | (df["ttft_s"] > 1.0)
    assert late.sum() == stop._deadline[0].num_late >= 3


def test_a_run_that_meets_the_target_is_not_stopped_and_unchanged():
    """The same trace at 1x meets a 5 s p99: the watched run is the unwatched run, row for
    row and step for step."""
    plain = simulate(azure(120, 1.0), CONFIG, keep_steps=True)
    stop = SloStop(slo_targets({"ttft_p99_s": 5.0, "tpot_p99_s": 1.0}), 120)
    watched = simulate(azure(120, 1.0), CONFIG, stop=stop, keep_steps=True)
    assert not stop.stopped and stop.reason is None
    assert requests_frame(watched).equals(requests_frame(plain))
    assert all(np.array_equal(watched.steps.columns[k], plain.steps.columns[k])
               for k in plain.steps.columns)


def test_one_late_request_short_of_the_allowance_does_not_stop_even_if_the_p99_fails():
    """p99 of 100 values interpolates 1 % of the way from the 99th smallest to the largest:
    one very late request can lift it above a target just above the 99th, but two are needed
    to make that certain before the end, so the run goes to the end (where the planner reads
    the exact percentile)."""
    ttft = np.sort(requests_frame(simulate(azure(100, 1.0), CONFIG))["ttft_s"].to_numpy())
    target = ttft[-2] + 0.005 * (ttft[-1] - ttft[-2])     # only the slowest is above it
    assert ttft[-1] > target > ttft[-2] and np.percentile(ttft, 99) > target
    stop = SloStop(slo_targets({"ttft_p99_s": target}), 100)
    simulate(azure(100, 1.0), CONFIG, stop=stop)
    assert not stop.stopped and stop._deadline[0].num_late == 1
