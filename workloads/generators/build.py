"""Turning a preset and a :class:`GenConfig` into requests and native JSONL files."""

from __future__ import annotations

import dataclasses
import heapq
import os
from dataclasses import dataclass

import numpy as np

from kvsim.errors import ConfigError
from kvsim.workloads.request import Request
from kvsim.workloads.writer import write_native
from kvsim.workloads.generators.arrivals import Arrivals
from kvsim.workloads.generators.lengths import Lengths
from kvsim.workloads.generators.presets import PRESETS, Draft
from kvsim.workloads.generators.prompts import TOKEN_BASE, Keys, prefix_ids, rename_first_seen, token_ids

HIGH_PRIORITY, NORMAL_PRIORITY = 0, 1
MAX_EMPTY_SESSIONS = 1000


@dataclass(frozen=True)
class GenConfig:
    """Settings every preset takes.

    - ``num_requests``: requests in the workload (the first ones by arrival time);
    - ``seed``: seed of every random draw;
    - ``arrival``: ``poisson``, ``gamma`` (with ``cv``) or ``trace`` (``arrival_trace``'s
      timestamps); ``rate``: arrivals per second of the preset's unit (conversations, tasks or
      requests), ``None`` for the preset's default;
    - ``high_priority_fraction``: share of sessions marked priority 0 (high); the others get 1.
      With 0 every request has priority 0 and none is written;
    - ``input_tokens`` / ``output_tokens``: override the preset's new-input / output lengths;
    - ``hash_block_size``: tokens per written prefix id (``block_hashes``); engine block sizes
      that are multiples of it are exact;
    - ``token_ids``: write ``prompt_token_ids`` instead (from ``vocab_size`` ids), e.g. for
      ``../shared/tools/vllm-oracle``; meant for small workloads.
    """

    num_requests: int = 1000
    seed: int = 0
    arrival: str = "poisson"
    rate: float | None = None
    cv: float = 1.0
    arrival_trace: str | None = None
    high_priority_fraction: float = 0.0
    input_tokens: Lengths | None = None
    output_tokens: Lengths | None = None
    hash_block_size: int = 16
    token_ids: bool = False
    vocab_size: int = 32000

    def checked(self) -> "GenConfig":
        """These settings, or a :class:`ConfigError` naming the first bad one."""
        _positive_int(self.num_requests, "num_requests")
        _positive_int(self.hash_block_size, "hash_block_size")
        if not isinstance(self.vocab_size, int) or self.vocab_size <= TOKEN_BASE:
            raise ConfigError(f"must be an integer > {TOKEN_BASE}, got {self.vocab_size!r}",
                              field="vocab_size")
        if not 0.0 <= self.high_priority_fraction <= 1.0:
            raise ConfigError(f"must be between 0 and 1, got {self.high_priority_fraction}",
                              field="high_priority_fraction")
        return self


def preset_named(name: str):
    """The preset called ``name`` (see :data:`PRESETS`)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}",
                          field="preset") from None


def generate(preset, config: GenConfig | None = None) -> list[Request]:
    """The requests of ``preset`` (a name or a preset object) under ``config``, in arrival
    order, ids ``0..n-1``, the first arrival at 0."""
    config = (config or GenConfig()).checked()
    preset = _with_overrides(preset_named(preset) if isinstance(preset, str) else preset, config)
    seeds = np.random.SeedSequence(config.seed).spawn(3)
    rng_arrivals, rng_content, rng_priority = (np.random.Generator(np.random.PCG64(s))
                                               for s in seeds)
    times = _arrivals(preset, config).times(rng_arrivals)
    sessions = preset.sessions(times, rng_content, Keys())
    drafts = _first_drafts(sessions, config.num_requests, rng_priority,
                           config.high_priority_fraction)
    return _finish(drafts, preset.shares_prefixes, config)


def write_workload(preset, path: str | os.PathLike, config: GenConfig | None = None) -> dict:
    """Generate ``preset`` and write it to ``path`` as native JSONL (whole or not at all).
    Returns a summary: ``preset``, ``path``, ``num_requests``, ``seed``."""
    config = (config or GenConfig()).checked()
    requests = generate(preset, config)
    count = write_native(requests, path)
    name = preset if isinstance(preset, str) else preset.name
    return {"preset": name, "path": str(path), "num_requests": count, "seed": config.seed}


def _with_overrides(preset, config: GenConfig):
    changes = {k: v for k, v in (("input_tokens", config.input_tokens),
                                 ("output_tokens", config.output_tokens)) if v is not None}
    return dataclasses.replace(preset, **changes) if changes else preset


def _arrivals(preset, config: GenConfig) -> Arrivals:
    rate = preset.rate if config.rate is None else config.rate
    return Arrivals(config.arrival, rate, config.cv, config.arrival_trace).checked()


def _first_drafts(sessions, n: int, rng, high_fraction: float) -> list[Draft]:
    """The ``n`` earliest drafts. Sessions come in start order, so once a session starts after
    the ``n``-th earliest arrival seen so far, no later session can change the answer."""
    drafts: list[Draft] = []
    latest_kept: list[float] = []          # max-heap (negated) of the n earliest arrivals
    empty = 0
    for session in sessions:
        empty = 0 if session else empty + 1
        if empty >= MAX_EMPTY_SESSIONS:
            raise ConfigError("the preset makes no requests (does the first prompt exceed "
                              "max_context_tokens?)", field="preset")
        if not session:
            continue
        if len(latest_kept) >= n and session[0].arrival_s > -latest_kept[0]:
            break
        priority = _priority(rng, high_fraction)
        for draft in session:
            draft.priority = priority
            drafts.append(draft)
            heapq.heappush(latest_kept, -draft.arrival_s)
            if len(latest_kept) > n:
                heapq.heappop(latest_kept)
    drafts.sort(key=lambda d: d.arrival_s)
    return drafts[:n]


def _priority(rng, high_fraction: float) -> int:
    if high_fraction <= 0:
        return 0
    return HIGH_PRIORITY if rng.random() < high_fraction else NORMAL_PRIORITY


def _finish(drafts: list[Draft], shares_prefixes: bool, config: GenConfig) -> list[Request]:
    origin = drafts[0].arrival_s
    requests = [Request(i, round(d.arrival_s - origin, 6), d.prompt_tokens, d.output_tokens,
                        priority=d.priority, session_id=d.session_id, template_id=d.template_id)
                for i, d in enumerate(drafts)]
    if config.token_ids:
        for request, d in zip(requests, drafts):
            request.prompt_token_ids = token_ids(d.segments, config.vocab_size)
        return requests
    by_draft = {id(d): r for d, r in zip(drafts, requests)}
    for request, d in zip(requests, drafts):
        request.continues = by_draft.get(id(d.continues))
    if shares_prefixes:
        block = config.hash_block_size
        named = rename_first_seen([prefix_ids(d.segments, block) for d in drafts])
        for request, ids in zip(requests, named):
            request.prefix_hashes, request.hash_block_size = ids, block
    return requests


def _positive_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"must be a positive integer, got {value!r}", field=name)


