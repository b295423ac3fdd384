"""Turning a preset and a :class:`GenConfig` into requests and native JSONL files."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import os
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from kvsim.errors import ConfigError
from kvsim.output_file import refuse_overwriting
from kvsim.workloads.fields import MAX_SECONDS, MAX_TOKENS
from kvsim.workloads.request import Request
from kvsim.workloads.writer import write_lines
from kvsim.workloads.generators.arrivals import Arrivals
from kvsim.workloads.generators.lengths import Lengths
from kvsim.workloads.generators.presets import PRESETS, Draft
from kvsim.workloads.generators.prompts import TOKEN_BASE, FirstSeenNames, Keys, prefix_ids, token_ids

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

    def input_files(self) -> list[str]:
        """The traces these settings read: timestamps, or lengths to resample."""
        lengths = (self.input_tokens, self.output_tokens)
        return [p for p in (self.arrival_trace, *(getattr(x, "path", None) for x in lengths))
                if p is not None]

    def checked(self) -> "GenConfig":
        """These settings, or a :class:`ConfigError` naming the first bad one."""
        _positive_int(self.num_requests, "num_requests")     # (endless, as a stream: fine)
        _positive_int(self.hash_block_size, "hash_block_size", MAX_TOKENS)  # (what reads back)
        span = self.num_requests / self.rate if self.rate else 0.0   # (at most: sessions)
        if span > MAX_SECONDS:
            raise ConfigError(f"{self.num_requests:,} requests at {self.rate:g} a second span "
                              f"up to {span:.3g} s, more than a trace may ({MAX_SECONDS:g} s); "
                              "raise it", field="rate")
        if not isinstance(self.vocab_size, int) or self.vocab_size <= TOKEN_BASE:
            raise ConfigError(f"must be an integer > {TOKEN_BASE}, got {self.vocab_size!r}",
                              field="vocab_size")
        if not 0.0 <= self.high_priority_fraction <= 1.0:
            raise ConfigError(f"must be between 0 and 1, got {self.high_priority_fraction}",
                              field="high_priority_fraction")
        if self.arrival_trace is not None and self.arrival != "trace":
            raise ConfigError("reuses a trace's timestamps with --arrival trace only (the "
                              f"arrivals are {self.arrival})", field="arrival_trace")
        if self.cv != 1.0 and self.arrival != "gamma":
            raise ConfigError(f"shapes gamma arrivals only (--arrival gamma; the arrivals are "
                              f"{self.arrival})", field="cv")
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
    return list(iter_requests(preset, config))


def iter_requests(preset, config: GenConfig | None = None) -> Iterator[Request]:
    """:func:`generate` as a stream: memory grows with the sessions under way, not with
    ``num_requests``."""
    return (request for request, _ in _stream(preset, config))


def write_workload(preset, path: str | os.PathLike, config: GenConfig | None = None,
                   progress=None) -> dict:
    """Generate ``preset`` and write it to ``path`` as native JSONL (whole or not at all), one
    line at a time; ``progress(n)`` is told of every 1,000th. Returns a summary: ``preset``,
    ``path``, ``num_requests``, ``seed``."""
    config = (config or GenConfig()).checked()
    if path != "-":
        refuse_overwriting(Path(path), config.input_files())
    count = write_lines(_stream(preset, config), path, progress)
    name = preset if isinstance(preset, str) else preset.name
    return {"preset": name, "path": str(path), "num_requests": count, "seed": config.seed}


def _stream(preset, config: GenConfig | None) -> Iterator[tuple[Request, bool]]:
    """``(request, continued)`` in arrival order: ``continued`` when a later request of the
    workload continues it (its line then names its ``request_id``)."""
    config = (config or GenConfig()).checked()
    preset = _with_overrides(preset_named(preset) if isinstance(preset, str) else preset, config)
    seeds = np.random.SeedSequence(config.seed).spawn(3)
    rng_arrivals, rng_content, rng_priority = (np.random.Generator(np.random.PCG64(s))
                                               for s in seeds)
    times = _arrivals(preset, config).times(rng_arrivals)
    sessions = preset.sessions(times, rng_content, Keys())
    drafts = _first_drafts(sessions, config.num_requests, rng_priority,
                           config.high_priority_fraction)
    return _requests(drafts, preset.shares_prefixes, config)


def _with_overrides(preset, config: GenConfig):
    changes = {k: v for k, v in (("input_tokens", config.input_tokens),
                                 ("output_tokens", config.output_tokens)) if v is not None}
    return dataclasses.replace(preset, **changes) if changes else preset


def _arrivals(preset, config: GenConfig) -> Arrivals:
    rate = preset.rate if config.rate is None else config.rate
    return Arrivals(config.arrival, rate, config.cv, config.arrival_trace).checked()


def _first_drafts(sessions, n: int, rng, high_fraction: float) -> Iterator[tuple[Draft, int]]:
    """The ``n`` earliest drafts in arrival order (ties in session order), each with its
    number of children (the drafts that continue it). Sessions come in start order, so a
    pending draft that arrives no later than the next session's start comes before all of
    that session's drafts and all later ones."""
    pending: list[tuple[float, int, Draft, int]] = []      # heap by (arrival, draft order)
    order, emitted, empty = itertools.count(), 0, 0
    for session in sessions:
        empty = 0 if session else empty + 1
        if empty >= MAX_EMPTY_SESSIONS:
            raise ConfigError("the preset makes no requests: its first prompts pass the "
                              "context it keeps a conversation within (max_context_tokens); "
                              "shorter input lengths (--input-len) would do", field="preset")
        if not session:
            continue
        while pending and pending[0][0] <= session[0].arrival_s:
            yield heapq.heappop(pending)[2:]
            emitted += 1
            if emitted == n:
                return
        _push_session(pending, order, session, _priority(rng, high_fraction))
    while pending and emitted < n:
        yield heapq.heappop(pending)[2:]
        emitted += 1


def _push_session(pending: list, order, session: list[Draft], priority: int) -> None:
    children = Counter(id(d.continues) for d in session if d.continues is not None)
    for draft in session:
        draft.priority = priority
        heapq.heappush(pending, (draft.arrival_s, next(order), draft, children[id(draft)]))


def _priority(rng, high_fraction: float) -> int:
    if high_fraction <= 0:
        return 0
    return HIGH_PRIORITY if rng.random() < high_fraction else NORMAL_PRIORITY


def _requests(drafts, shares_prefixes: bool, config: GenConfig) -> Iterator[tuple[Request, bool]]:
    """Number, time and hash the drafts; each request goes out once it is known whether a
    later one continues it (at its first child, or when the drafts end)."""
    names, block = FirstSeenNames(), config.hash_block_size
    queue: deque[list] = deque()        # [request, continued or None], in arrival order
    parents: dict[int, list] = {}       # id(draft) -> [its queue entry, children to come]
    origin = None
    for i, (d, num_children) in enumerate(drafts):
        origin = d.arrival_s if origin is None else origin
        request = Request(i, round(d.arrival_s - origin, 6), d.prompt_tokens, d.output_tokens,
                          priority=d.priority, session_id=d.session_id,
                          template_id=d.template_id)
        entry = [request, False if config.token_ids or not num_children else None]
        if config.token_ids:
            request.prompt_token_ids = token_ids(d.segments, config.vocab_size)
        else:
            _link(request, d, parents, entry, num_children)
            if shares_prefixes:
                request.prefix_hashes = _named_prefix_ids(names, d.segments, block,
                                                          request.continues)
                request.hash_block_size = block
        queue.append(entry)
        while queue and queue[0][1] is not None:
            yield tuple(queue.popleft())
    for request, continued in queue:
        yield request, bool(continued)


def _named_prefix_ids(names: FirstSeenNames, segments, block: int,
                      parent: Request | None) -> np.ndarray:
    """The renamed prefix ids of a prompt. A continuation starts with its parent's prompt,
    so its blocks wholly inside that prompt keep the parent's names (seen already: renaming
    them again would give the same); only the rest is hashed and renamed."""
    kept = 0
    if parent is not None and parent.prefix_hashes is not None and parent.hash_block_size == block:
        kept = parent.prompt_tokens // block
    tail = names.rename(prefix_ids(segments, block, kept))
    return np.concatenate([parent.prefix_hashes[:kept], tail]) if kept else tail


def _link(request: Request, draft: Draft, parents: dict, entry: list,
          num_children: int) -> None:
    """Tie ``request`` to the request of the draft it continues, and register its own."""
    parent = parents.get(id(draft.continues)) if draft.continues is not None else None
    if parent is not None:
        request.continues = parent[0][0]
        parent[0][1] = True
        parent[1] -= 1
        if not parent[1]:
            del parents[id(draft.continues)]
    if num_children:
        parents[id(draft)] = [entry, num_children]


def _positive_int(value, name: str, most: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"must be a positive integer, got {value!r}", field=name)
    if most is not None and value > most:
        raise ConfigError(f"{value:,} is more than kvsim reads ({most:,})", field=name)


