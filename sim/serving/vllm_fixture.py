"""The vllm-oracle fixtures (``tests/fixtures/vllm/``): token-id traces recorded through real
vLLM, replayed through kvsim's scheduler with the oracle's settings and arrival clock.

A fixture is ``NAME.jsonl`` (one request per line: ``prompt_token_ids``, ``output_tokens``,
optional ``arrival_step``, ``priority`` and ``output_token_ids``, the tokens vLLM generated)
beside ``NAME.vllm.json`` (vLLM's record; its ``summary.settings`` are the engine settings, and
``summary.model``, where present, names the tiny config ``models/MODEL/config.json`` it ran: its
KV layer groups decide kvsim's cache manager). The
oracle decodes greedily, so generated blocks are identified as ``--sampling greedy`` does. Used by the parity test and by
``kvsim.real_backend.vllm_reference``; nothing here needs torch or vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from kvsim.cache import KVCacheManager
from kvsim.cache.multi_group import MultiGroupKVManager
from kvsim.cache.offload_managers import make_offloading_manager
from kvsim.cache.offloading import OffloadingKVCacheManager
from kvsim.cache.scheduler import Scheduler, SchedulerConfig
from kvsim.cache.request_state import RequestState
from kvsim.sim.perf.kv_layout import KvLayout, kv_layout
from kvsim.sim.perf.models import resolve_model
from kvsim.workloads import Request


def load_fixture(path: Path) -> tuple[list[tuple[int, Request]], dict]:
    """``[(arrival_step, request)]`` in file order, and the oracle's record."""
    reqs = []
    for i, line in enumerate(x for x in path.read_text().splitlines() if x.strip()):
        r = json.loads(line)
        ids = np.array(r["prompt_token_ids"], dtype=np.int64)
        request = Request(i, 0.0, len(ids), r["output_tokens"], prompt_token_ids=ids,
                          priority=r.get("priority", 0))
        if r.get("output_token_ids") is not None:
            request.output_token_ids = np.array(r["output_token_ids"], dtype=np.int64)
        reqs.append((r.get("arrival_step", 0), request))
    oracle = json.loads(path.with_name(path.name[:-len(".jsonl")] + ".vllm.json").read_text())
    return reqs, oracle


MODELS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "vllm" / "models"
"""Where the fixtures' tiny model configs live (``models/NAME/config.json``)."""


def fixture_layout(model: str | None, block_size: int) -> KvLayout | None:
    """The KV layout of fixture model ``model`` (a folder name under :data:`MODELS`, as the
    oracle's ``summary.model`` records it), or None for the default tiny Llama."""
    if not model or model == "tiny-llama":
        return None
    return kv_layout(resolve_model(MODELS / model / "config.json"), block_size=block_size)


def make_scheduler(s: dict, model: str | None = None) -> Scheduler:
    """The oracle's settings: ``num_blocks - 1`` usable blocks (block 0 is vLLM's null block);
    every scheduler option kvsim has, where the record names it (else vLLM's default). A
    ``model`` with sliding-window (or chunked-local) layers gets vLLM's hybrid manager, one
    block table per KV layer group, as ``kvsim run`` gives it; ``cpu_chunks`` (a record of
    vLLM's CPU offloading) a native CPU tier of that many blocks."""
    layout = fixture_layout(model, s["block_size"])
    if s.get("cpu_chunks") and layout is not None and layout.is_hybrid:
        raise ValueError("no CPU tier recording of a hybrid model: kvsim replays none")
    if s.get("cpu_chunks"):     # (vLLM's OffloadingConnector: that many CPU blocks)
        kv = OffloadingKVCacheManager(s["num_blocks"] - 1, s["block_size"],
                                      not s["no_prefix_caching"], s["max_model_len"],
                                      offload=make_offloading_manager(s["cpu_chunks"]))
    elif layout is not None and layout.is_hybrid:
        kv = MultiGroupKVManager(s["num_blocks"] - 1, s["block_size"], layout.groups,
                                 not s["no_prefix_caching"], s["max_model_len"],
                                 s["max_num_batched_tokens"])
    else:
        kv = KVCacheManager(s["num_blocks"] - 1, s["block_size"],
                            enable_prefix_caching=not s["no_prefix_caching"],
                            max_model_len=s["max_model_len"])
    return Scheduler(kv, SchedulerConfig(
        max_num_seqs=s["max_num_seqs"], max_num_batched_tokens=s["max_num_batched_tokens"],
        max_model_len=s["max_model_len"], policy="priority" if s["priority"] else "fcfs",
        long_prefill_token_threshold=s.get("long_prefill_token_threshold", 0),
        enable_chunked_prefill=not s.get("no_enable_chunked_prefill", False),
        reserve_full_sequence=not s.get("no_scheduler_reserve_full_isl", False)))


def replay_fixture(requests: list[tuple[int, Request]], settings: dict,
                   step: Callable[[Scheduler], None],
                   model: str | None = None) -> dict[int, RequestState]:
    """Run a scheduler with the oracle's ``settings`` until every request finished: requests
    join at their arrival step (an idle engine jumps to the next arrival), and ``step(sched)``
    performs one engine step (``schedule``, whatever executes it, ``update_from_output``).
    Returns the sequences by request id."""
    sched = make_scheduler(settings, model)
    pending, clock, seqs = list(requests), 0, {}
    while pending or sched.has_unfinished():
        while pending and pending[0][0] <= clock:
            seq = RequestState(pending.pop(0)[1], settings["block_size"], greedy=True)
            seqs[seq.request_id] = seq
            sched.add(seq)
        if not sched.has_unfinished():
            clock = pending[0][0]
            continue
        step(sched)
        clock += 1
    return seqs
