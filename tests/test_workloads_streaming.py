"""Generated workloads stream: requests come out in arrival order as they are made, and the
file is written as it goes, with the same bytes as writing the whole list."""

import itertools

import numpy as np
import pytest

from kvsim.workloads.generators import GenConfig, generate, iter_requests, write_workload
from kvsim.workloads.generators.prompts import FirstSeenNames
from kvsim.workloads.writer import write_native


def fields(r):
    hashes = None if r.prefix_hashes is None else r.prefix_hashes.tolist()
    return (r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.priority,
            r.session_id, hashes, None if r.continues is None else r.continues.request_id)


@pytest.mark.parametrize("preset", ["chat", "agent", "customer-service"])
def test_the_first_requests_of_an_endless_workload_come_at_once(preset):
    endless = iter_requests(preset, GenConfig(num_requests=10**12, seed=4))
    first = list(itertools.islice(endless, 80))
    assert [fields(r) for r in first] == \
        [fields(r) for r in generate(preset, GenConfig(num_requests=80, seed=4))]


@pytest.mark.parametrize("preset, continues", [("chat", True), ("agent", True), ("rag", False),
                                               ("long-doc", False)])
def test_the_streamed_file_equals_the_file_of_the_whole_list(preset, continues, tmp_path):
    config = GenConfig(num_requests=400, seed=9, high_priority_fraction=0.2)
    write_workload(preset, tmp_path / "streamed.jsonl", config)
    write_native(generate(preset, config), tmp_path / "whole.jsonl")
    streamed = (tmp_path / "streamed.jsonl").read_bytes()
    assert streamed == (tmp_path / "whole.jsonl").read_bytes()
    assert (b'"request_id"' in streamed) == continues


@pytest.mark.parametrize("max_narrow", [None, 5000])
def test_first_seen_names_count_up_in_order_across_merges(monkeypatch, max_narrow):
    """Also with names widened to int64 part-way (past 5,000 names instead of 2**31)."""
    if max_narrow is not None:
        import kvsim.workloads.generators.prompts as prompts
        monkeypatch.setattr(prompts, "MAX_NARROW_NAME", max_narrow)
    rng = np.random.default_rng(0)
    lists = [rng.integers(-2**62, 2**62, size=40) for _ in range(400)]
    lists += [lists[i][:25] for i in range(0, 400, 3)]          # prefixes seen before
    names, reference = FirstSeenNames(), {}
    for ids in lists:
        expected = [reference.setdefault(int(k), len(reference)) for k in ids]
        assert names.rename(ids).tolist() == expected
    assert names.num_names == len(reference) == 16000
    assert names._names.dtype == (np.int32 if max_narrow is None else np.int64)
