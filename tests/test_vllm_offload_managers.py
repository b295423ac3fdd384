"""kvsim's CPU offloading managers against vLLM 0.32's own (``CPUOffloadingManager`` with its
LRU and ARC policies, with and without the reuse gate), call for call: 200 random sequences
of stores, completions (some failed), lookups, loads and request finishes recorded from vLLM
by ``tests/fixtures/vllm_offload/record_managers.py``. Every store stores, evicts (in order)
and places in host blocks what vLLM's does, every lookup finds as many blocks (or waits for
one being stored), and after every call the same hashes are held in the same order (LRU's
recency; ARC's T1, then T2)."""

import json
from pathlib import Path

import pytest

from kvsim.cache.offload_managers import make_offloading_manager

RECORD = Path(__file__).parent / "fixtures" / "vllm_offload" / "managers.vllm.json"
SEQUENCES = json.loads(RECORD.read_text())["sequences"]


def replay(calls, manager):
    """kvsim's answer to each call, as the record writes vLLM's."""
    for name, *args, _held in calls:
        if name == "store":
            request, hashes, first, _ = args
            out = manager.prepare_store(hashes, request, first)
            answer = None if out is None else [out.hashes, out.evicted, out.block_ids]
            yield [name, request, hashes, first, answer, manager.blocks]
            continue
        if name == "complete_store":
            manager.complete_store(*args)
        elif name == "lookup":
            args = [args[0], manager.lookup(args[0])]
        elif name == "load":
            manager.prepare_load(args[1], args[0], 0)
        elif name == "complete_load":
            manager.complete_load(args[0])
        else:
            manager.request_finished(args[0])
        yield [name, *args, manager.blocks]


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("threshold", [0, 2])
def test_kvsims_managers_answer_every_call_as_vllms(policy, threshold):
    sequences = [s for s in SEQUENCES
                 if (s["policy"], s["store_threshold"]) == (policy, threshold)]
    assert len(sequences) == 50
    for s in sequences:
        manager = make_offloading_manager(s["num_blocks"], policy, threshold)
        for i, (want, got) in enumerate(zip(s["calls"], replay(s["calls"], manager))):
            assert got == want, f"seed {s['seed']}, call {i}"


def test_the_record_has_evictions_waits_and_refusals():
    """(So that the comparison above can fail.)"""
    stores = [c for s in SEQUENCES for c in s["calls"] if c[0] == "store"]
    assert sum(1 for c in stores if c[4] is None) > 100                 # no room
    assert sum(1 for c in stores if c[4] and c[4][1]) > 500             # evictions
    assert sum(1 for s in SEQUENCES for c in s["calls"]
               if c[0] == "lookup" and c[2] is None) > 50               # being stored
    assert sum(1 for s in SEQUENCES for c in s["calls"]
               if c[0] == "complete_store" and not c[2]) > 20           # failed stores
