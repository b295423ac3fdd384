"""The planner's searches and input checks, without simulations."""

import json
import math

import pytest

from kvsim.errors import ConfigError
from kvsim.reports.plan_figures import pareto_front
from kvsim.sim.plan.bounds import suggested_block_size
from kvsim.sim.plan.search import Boundary, fewest_passing, largest_passing
from kvsim.sim.plan.spec import build_slo, load_prices, parse_list


def counting(predicate):
    calls = []

    def ok(x):
        calls.append(x)
        return predicate(x)
    return ok, calls


@pytest.mark.parametrize("threshold", list(range(1, 41)))
def test_fewest_passing_finds_the_threshold_in_logarithmic_calls(threshold):
    ok, calls = counting(lambda n: n >= threshold)
    assert fewest_passing(ok, 40) == threshold
    assert len(calls) <= 2 * math.ceil(math.log2(40)) + 1
    assert len(set(calls)) == len(calls)


def test_fewest_passing_gives_none_when_the_limit_fails():
    ok, calls = counting(lambda n: False)
    assert fewest_passing(ok, 12) is None
    assert calls == [1, 2, 4, 8, 12]
    assert fewest_passing(lambda n: True, 1) == 1


@pytest.mark.parametrize("truth,start", [(3.7, 1.0), (0.013, 1.0), (5.0, 5.0), (1.0, 64.0)])
def test_largest_passing_brackets_the_boundary_to_the_stated_ratio(truth, start):
    b = largest_passing(lambda x: x <= truth, start, iterations=8)
    assert b.passing <= truth < b.failing
    assert b.failing / b.passing == pytest.approx(2 ** (2 ** -8))


def test_largest_passing_reports_one_sided_results():
    assert largest_passing(lambda x: False, 1.0, bracket_steps=3).passing is None
    always = largest_passing(lambda x: True, 1.0, bracket_steps=3)
    assert always.passing == 8.0 and always.failing is None


def test_largest_passing_never_asks_past_its_limit():
    asked = []

    def ok(x):
        asked.append(x)
        return x <= 2.5
    b = largest_passing(ok, 1.0, iterations=3, limit=3.0)
    assert asked[:3] == [1.0, 2.0, 3.0] and max(asked) == 3.0
    assert b.passing <= 2.5 < b.failing <= 3.0
    assert largest_passing(lambda x: True, 1.0, limit=3.0) == Boundary(3.0, None)
    assert largest_passing(lambda x: True, 3.0, limit=3.0) == Boundary(3.0, None)
    with pytest.raises(ValueError, match="0 < start <= limit"):
        largest_passing(lambda x: True, 4.0, limit=3.0)


def test_pareto_front_keeps_only_undominated_points_cheapest_first():
    points = [(3.0, 1.0), (1.0, 5.0), (2.0, 5.0), (2.0, 2.0), (4.0, 1.0), (1.0, 6.0)]
    assert pareto_front(points) == [1, 3, 0]


def test_suggested_block_size_is_the_design_articles_formula():
    # multi-head attention: a token's K and V of one layer are 2 x hidden_size x dtype
    s = suggested_block_size("llama-2-7b", "a100-80gb")
    assert s["tokens"] == 41943040 / (2 * 4096 * 2) == 2560
    assert s["power_of_two"] == 2048
    # grouped-query attention: 8 KV heads of 128, not hidden_size 4,096; split over tp
    assert suggested_block_size("llama-3.1-8b", "a100-80gb")["tokens"] == \
        41943040 / (2 * 8 * 128 * 2) == 10240
    assert suggested_block_size("llama-3.1-8b", "a100-80gb", tp=2)["tokens"] == 20480


def test_parse_list_and_slo_checks():
    assert parse_list("1, 2,4,2", "tp", int) == (1, 2, 4)
    with pytest.raises(ConfigError, match="tp"):
        parse_list("1,x", "tp", int)
    with pytest.raises(ConfigError, match="at least one SLO"):
        build_slo(ttft_p99_s=None)
    with pytest.raises(ConfigError, match="> 0"):
        build_slo(ttft_p99_s=-1.0)


def test_price_table_overrides_the_catalog_and_accepts_aliases(tmp_path):
    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"_doc": "mine", "prices": {"h100": 1.0, "l4": 0}}))
    prices = load_prices(str(table))
    assert prices["h100-80gb"] == 1.0 and prices["l4"] == 0.0
    assert prices["a100-80gb"] == load_prices()["a100-80gb"] > 0
    table.write_text(json.dumps({"h100": "cheap"}))
    with pytest.raises(ConfigError, match="price must be a number"):
        load_prices(str(table))
    table.write_text(json.dumps({"a100-80gbb": 1.0}))
    with pytest.raises(ConfigError, match="unknown GPU 'a100-80gbb'") as err:
        load_prices(str(table))
    assert (err.value.location, err.value.field) == (str(table), "a100-80gbb")


def test_dtype_and_host_tier_candidates_are_labelled_priced_and_replayable():
    from kvsim.sim.config import RunConfig
    from kvsim.sim.plan.spec import expand_candidates, gpu_hour_price
    from kvsim.sim.plan.planner import candidate_label
    base = RunConfig(model="llama-3-70b", gpu="h100-80gb", tp=4)
    dims = {"weight_dtype": ("bf16", "int4"), "kv_offloading_size": (0.0, 200.0)}
    configs = expand_candidates(base, dims)
    varying = ("weight_dtype", "kv_offloading_size")
    assert [candidate_label(c, varying) for c in configs] == [
        "h100-80gb TP4 · weights bf16 · CPU KV 0 GiB",
        "h100-80gb TP4 · weights bf16 · CPU KV 200 GiB",
        "h100-80gb TP4 · weights int4 · CPU KV 0 GiB",
        "h100-80gb TP4 · weights int4 · CPU KV 200 GiB"]
    prices = load_prices()
    # 200 GiB for the replica: a quarter of it per GPU of TP4
    assert gpu_hour_price(prices, configs[1]) == pytest.approx(2.99 + 50 * 0.0042)
    with pytest.raises(ConfigError, match="field 'weight_dtype': expected one of"):
        expand_candidates(base, {"weight_dtype": ("int2",)})


def test_a_swept_candidate_vllm_refuses_is_infeasible_unless_every_one_is():
    from kvsim.sim.config import RunConfig
    from kvsim.sim.plan.planner import evaluate_task
    from kvsim.sim.plan.spec import build_spec, expand_candidates
    from kvsim.workloads import TraceOptions
    from kvsim.workloads import sample_path
    base = RunConfig(max_num_batched_tokens=256)
    assert len(expand_candidates(base, {"max_num_seqs": (64, 512)})) == 2
    with pytest.raises(ConfigError, match="256 is below max_num_seqs") as err:
        expand_candidates(base, {"max_num_seqs": (512, 1024)})
    assert err.value.field == "max_num_batched_tokens"
    spec = build_spec(sample_path("mooncake"), "sample:mooncake", TraceOptions(limit=5), base,
                      {"ttft_p99_s": 100.0}, {"max_num_seqs": (64, 512)})
    row = evaluate_task((spec, 1))
    assert not row["feasible"] and row["label"].endswith("seqs 512")
    assert row["reason"].startswith("max_num_batched_tokens 256 is below max_num_seqs (512)")


def test_latencies_in_reasons_keep_their_digits_below_a_millisecond():
    from kvsim.sim.plan.bounds import fmt_latency
    assert [fmt_latency(s) for s in (1e-6, 0.00042, 0.0123, 4.5, None)] == \
        ["1 µs", "420 µs", "12.3 ms", "4.50 s", "n/a"]


def test_the_max_rate_cell_says_when_no_limit_was_found():
    from kvsim.reports.plan import table_rows
    rows = [{"rank": 1, "label": "a", "feasible": True, "max_rate": found, "replicas": 1,
             "gpus": 1, "cost_per_hour_usd": 1.0, "latency": {}, "min_headroom": 0.5,
             "hit_rate": 0.0}
            for found in ({"request_rate_per_s": 12.5, "failing_request_rate_per_s": 13.0},
                          {"request_rate_per_s": 1696.33, "failing_request_rate_per_s": None},
                          {"request_rate_per_s": None, "failing_request_rate_per_s": 0.5})]
    cells = [row["Max req/s (1 replica)"]
             for row in table_rows({"candidates": rows, "slo": {"ttft_p99_s": 1.0}})]
    assert cells == ["12.50", "≥ 1,696.33", "< 0.5"]
