"""Cache-only replay of a trace: the prefix hit rate of each eviction policy at each capacity.

No timing, no batching: requests are served one at a time, in arrival order. Each request

1. looks up its prompt's leading cached blocks, as vLLM does: at most
   ``(prompt_tokens - 1) // block_size`` blocks (the last token is always recomputed);
2. uses its full prompt blocks (the partial last block is never cached): the leading cached
   ones are touched, the others allocated, evicting per the policy; a request with more blocks
   than the capacity uses only its first ``capacity`` blocks;
3. releases them, tail first (they stay cached, evictable).

The hit rate is hit tokens / prompt tokens over all requests. For ``lru`` the curve over every
capacity comes from one pass (:func:`lru_hits`, Mattson's stack algorithm); the other policies
replay once per capacity through a :class:`~kvsim.cache.block_pool.BlockPool`
(:func:`policy_hits`), ``belady`` with an oracle built from the same replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from kvsim.errors import ConfigError

from kvsim.cache.eviction import make_policy, make_pool
from kvsim.cache.block_pool import MAX_POOL_BLOCKS
from kvsim.cache.policies import POLICY_NAMES, BeladyOracle
from kvsim.workloads.request import left_out_text, rows_text

# the replay's stand-in for the waiting queue of a busy server: requests that arrive within
# this many seconds after the one being served (see docs/eviction.md)
DEFAULT_LOOKAHEAD_S = 30.0


@dataclass(slots=True)
class ReplayRequest:
    """What the replay needs of a request: its full prompt blocks' hashes, how many of them a
    lookup may cover, its prompt length and priority."""

    hashes: np.ndarray
    lookup_blocks: int
    prompt_tokens: int
    priority: int = 0
    arrival_s: float = 0.0
    names_content: bool = True      # (one that does not name its prompt shares nothing)


def replay_requests(requests: Iterable, block_size: int) -> list[ReplayRequest]:
    """:class:`~kvsim.workloads.Request` objects (arrival order) as replay requests."""
    return [ReplayRequest(np.asarray(r.block_hashes(block_size), dtype=np.int64),
                          max(r.prompt_tokens - 1, 0) // block_size, r.prompt_tokens,
                          r.priority, r.arrival_s, r.names_content) for r in requests]


# --- LRU: one pass for every capacity ------------------------------------------------------

class _Fenwick:
    """Counts over time stamps ``1..n`` with vectorised point updates and prefix sums."""

    def __init__(self, n: int):
        self.tree = np.zeros(n + 1, dtype=np.int64)

    def add(self, idx: np.ndarray, delta: int) -> None:
        idx = idx.copy()
        while idx.size:
            np.add.at(self.tree, idx, delta)
            idx = idx + (idx & -idx)
            idx = idx[idx < len(self.tree)]

    def prefix(self, idx: np.ndarray) -> np.ndarray:
        total, idx = np.zeros(len(idx), dtype=np.int64), idx.copy()
        while (idx > 0).any():
            total += self.tree[idx]
            idx = idx - (idx & -idx)
        return total


def lru_hits(reqs: Sequence[ReplayRequest], capacities: Sequence[int]) -> np.ndarray:
    """Hit blocks at each capacity under LRU, in one pass over the trace (stack distances).

    A request's blocks are accessed tail first, so after it its first block is the most
    recently used (as vLLM's tail-first release). A block's stack distance is 1 + the number of
    distinct blocks used since its last use; an LRU cache of ``C`` blocks holds exactly those
    at distance ``<= C`` (inclusion property; it holds with whole requests pinned, because a
    request's hits are touched before anything is evicted). The prefix hit of a request at
    ``C`` is the number of leading lookup blocks whose running-maximum distance is ``<= C``.
    """
    caps = np.asarray(capacities, dtype=np.int64)
    flat = np.concatenate([r.hashes for r in reqs]) if reqs else np.zeros(0, np.int64)
    uniq, dense = np.unique(flat, return_inverse=True)
    dense = dense.reshape(-1)
    last = np.zeros(len(uniq), dtype=np.int64)       # last time stamp, 0 = never
    tree, clock, alive, hits, offset = _Fenwick(len(flat)), 0, 0, np.zeros(len(caps)), 0
    for r in reqs:
        ids = _first_occurrences(dense[offset:offset + len(r.hashes)])
        offset += len(r.hashes)
        hits += _leading_hits(ids[:r.lookup_blocks], last, tree, alive, caps)
        seen = ids[last[ids] > 0]
        tree.add(last[seen], -1)
        stamps = clock + len(ids) - np.arange(len(ids))     # first block: newest
        tree.add(stamps, 1)
        last[ids], clock, alive = stamps, clock + len(ids), alive - len(seen) + len(ids)
    return hits


def _first_occurrences(ids: np.ndarray) -> np.ndarray:
    """``ids`` without repeats, first occurrence kept (a chained trace never repeats)."""
    _, first = np.unique(ids, return_index=True)
    return ids if len(first) == len(ids) else ids[np.sort(first)]


def _leading_hits(ids, last, tree: _Fenwick, alive: int, caps: np.ndarray) -> np.ndarray:
    stamps = last[ids]
    unseen = np.flatnonzero(stamps == 0)
    if len(unseen):
        stamps = stamps[:unseen[0]]
    if not len(stamps):
        return np.zeros(len(caps))
    distance = alive - tree.prefix(stamps) + 1
    return np.searchsorted(np.maximum.accumulate(distance), caps, side="right")


# --- any policy: a direct replay through a block pool ----------------------------------------

def policy_hits(reqs: Sequence[ReplayRequest], policy_name: str, capacity: int,
                oracle: BeladyOracle | None = None, lookahead_s: float = 0.0) -> int:
    """Hit blocks of one replay through a ``capacity``-block pool evicting by ``policy_name``.

    A policy that reads the waiting queue (``lookahead``) sees as queued the requests that
    arrive within ``lookahead_s`` seconds after the one being served (a queueing delay: the
    replay itself has no queue)."""
    pool = make_pool(capacity, policy=make_policy(policy_name, oracle))
    queue = _Window(reqs, lookahead_s, pool.policy) if hasattr(pool.policy, "enqueue") else None
    hits = 0
    for position, r in enumerate(reqs):
        if queue is not None:
            queue.advance(position)
        hashes = r.hashes[:capacity].tolist()
        held = pool.index.find_prefix(hashes)
        hits += min(len(held), r.lookup_blocks)
        pool.begin(position, r.priority)
        pool.touch(held)
        new = pool.get_new_blocks(len(hashes) - len(held))
        pool.cache_blocks(new, hashes[len(held):], len(held), held[-1] if held else None)
        held += new
        pool.free_blocks(reversed(held))
    return hits


class _Window:
    """The replay's stand-in for a waiting queue: requests that arrived within ``seconds``
    after the one being served, with their lookups."""

    def __init__(self, reqs: Sequence[ReplayRequest], seconds: float, policy):
        self.reqs, self.seconds, self.policy = reqs, seconds, policy
        self.next = 0                   # first request not yet queued

    def lookup(self, position: int) -> list[int]:
        r = self.reqs[position]
        return r.hashes[:r.lookup_blocks].tolist()

    def advance(self, position: int) -> None:
        """Request ``position`` is admitted; later ones inside the window join the queue."""
        reqs, horizon = self.reqs, self.reqs[position].arrival_s + self.seconds
        if position < self.next:
            self.policy.dequeue(position)
        else:
            self.next = position + 1
        while self.next < len(reqs) and reqs[self.next].arrival_s <= horizon:
            self.policy.enqueue(self.next, self.lookup(self.next))
            self.next += 1


def replay_oracle(reqs: Sequence[ReplayRequest]) -> BeladyOracle:
    """The future of a replay, for ``belady`` (positions are indices into ``reqs``)."""
    return BeladyOracle.from_hashes([r.hashes for r in reqs], [r.lookup_blocks for r in reqs])


# --- the command's result -----------------------------------------------------------------

def parse_capacities(blocks: str | None, tokens: str | None, block_size: int,
                     names: tuple[str, str] = ("--capacity", "--capacity-tokens")) -> list[int]:
    """Capacities in blocks from ``--capacity`` (blocks) or ``--capacity-tokens`` (tokens,
    rounded down to whole blocks), comma-separated; ascending, without repeats. ``names``:
    the two as the caller calls them (the API's keywords)."""
    if (blocks is None) == (tokens is None):
        raise ConfigError(f"give exactly one of {names[0]} (blocks) and {names[1]}",
                          field="capacity")
    text, per, field = ((blocks, 1, "capacity") if blocks is not None
                        else (tokens, block_size, "capacity_tokens"))
    items = _items(text, field)
    try:
        values = [int(v.strip().replace("_", "")) // per for v in items]
    except ValueError:
        raise ConfigError(f"expected integers, got {text!r}", field=field) from None
    if min(values) < 1 or max(values) > MAX_POOL_BLOCKS:
        unit = "" if per == 1 else f" of {per} tokens (--block-size)"
        raise ConfigError(f"capacities must be from one block{unit} to {MAX_POOL_BLOCKS:,} "
                          f"blocks, got {text!r}", field=field)
    return sorted(set(values))


def _items(text: str, field: str) -> list[str]:
    """The items of a comma-separated list, none of them empty."""
    items = text.split(",")
    if not all(item.strip() for item in items):
        raise ConfigError(f"empty item in {text!r}", field=field)
    return items


def parse_policies(text: str) -> list[str]:
    """Policy names from a comma-separated list, checked."""
    names = [n.strip() for n in _items(text, "eviction")]
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown or not names:
        raise ConfigError(f"unknown eviction policy {', '.join(unknown) or text!r}; expected "
                          f"some of {', '.join(POLICY_NAMES)}", field="eviction")
    return list(dict.fromkeys(names))


def hitrate_curves(requests: Iterable, capacities: Sequence[int], policies: Sequence[str],
                   block_size: int, lookahead_s: float = DEFAULT_LOOKAHEAD_S,
                   progress=None) -> dict:
    """The replay's result: ``rows`` (policy, capacity_blocks, capacity_tokens, hit_tokens,
    hit_rate), the request and prompt-token counts and the settings. ``progress(done,
    total)`` is told of each (policy, capacity) replayed."""
    reqs = replay_requests(requests, block_size)
    queries = sum(r.prompt_tokens for r in reqs)
    rows, total = [], len(policies) * len(capacities)
    for name in policies:
        hits = _hits(reqs, name, capacities, lookahead_s)
        for capacity, hit_blocks in zip(capacities, hits):
            if progress is not None:
                progress(len(rows) + 1, total)
            hit_tokens = int(hit_blocks) * block_size
            rows.append(dict(policy=name, capacity_blocks=int(capacity),
                             capacity_tokens=int(capacity) * block_size, hit_tokens=hit_tokens,
                             hit_rate=hit_tokens / queries if queries else 0.0))
    add_belady_share(rows)
    return dict(num_requests=len(reqs), prompt_tokens=queries, block_size=block_size,
                policies=list(policies), capacities_blocks=[int(c) for c in capacities],
                lookahead_s=lookahead_s, rows=rows,
                num_requests_naming_content=sum(r.names_content for r in reqs))


def add_belady_share(rows: list[dict]) -> None:
    """Each row's ``belady_share``: its share of Belady's gain over LRU at its capacity,
    ``(hits - lru) / (belady - lru)`` (1 = optimal, 0 = LRU, negative = worse than LRU); None
    where lru or belady was not replayed or Belady gains nothing."""
    hits = {(r["policy"], r["capacity_blocks"]): r["hit_tokens"] for r in rows}
    for r in rows:
        lru = hits.get(("lru", r["capacity_blocks"]))
        best = hits.get(("belady", r["capacity_blocks"]))
        gain = None if lru is None or best is None else best - lru
        r["belady_share"] = (r["hit_tokens"] - lru) / gain if gain else None


def _hits(reqs, name: str, capacities: Sequence[int], lookahead_s: float):
    """Hit blocks at each capacity, as each is replayed (LRU's all from one pass)."""
    if name == "lru":
        return iter([int(h) for h in lru_hits(reqs, capacities)])
    oracle = replay_oracle(reqs) if name == "belady" else None
    return (policy_hits(reqs, name, c, oracle, lookahead_s) for c in capacities)


def render_hitrate_table(result: dict, width: int | None = None) -> str:
    """The rows as a text table: one line per capacity, one column per policy (hit rate %);
    with a ``width`` (a terminal's), the policies in blocks of columns that fit it."""
    policies = result["policies"]
    trace = f"{result['trace']}: " if result.get("trace") else ""
    lines = [f"prefix hit rate of {trace}{result['num_requests']:,} requests, "
             f"{result['prompt_tokens']:,} prompt tokens, block size {result['block_size']}"]
    left_out = result.get("trace_rows_left_out")
    if left_out:
        total = sum(left_out.values())
        lines.append(f"left out {rows_text(total, 'trace row')} without a request to run: "
                     f"{left_out_text(left_out)}")
    if result["num_requests"] and result.get("num_requests_naming_content") == 0:
        lines.append("no request says what its prompt holds (token ids, prefix hash ids or a "
                     "request it continues): nothing can hit, every rate is 0 by construction")
    per_block = len(policies) if width is None else max(1, (width - 24) // 10)
    for first in range(0, len(policies), per_block):
        lines += _policy_block(result, policies[first:first + per_block])
    if "lookahead" in policies:
        lines.append(f"lookahead sees as queued the requests arriving within "
                     f"{result.get('lookahead_s', DEFAULT_LOOKAHEAD_S):g} s after each one")
    return "\n".join(lines)


def _policy_block(result: dict, policies: list[str]) -> list[str]:
    """The table's lines for ``policies``: hit rates, then shares of Belady's gain if any."""
    caps, size = result["capacities_blocks"], result["block_size"]
    rate = {(r["policy"], r["capacity_blocks"]): r["hit_rate"] for r in result["rows"]}
    share = {(r["policy"], r["capacity_blocks"]): r.get("belady_share") for r in result["rows"]}
    lines = [f"{'blocks':>10} {'tokens':>12} " + " ".join(f"{p:>9}" for p in policies)]
    lines += [f"{c:>10,} {c * size:>12,} "
              + " ".join(f"{100 * rate[p, c]:>8.2f}%" for p in policies) for c in caps]
    if any(share[p, c] is not None for p in policies for c in caps):
        lines.append("share of Belady's gain over LRU (0 = LRU, 1 = Belady)")
        lines += [f"{c:>10,} {c * size:>12,} "
                  + " ".join(f"{_share(share[p, c]):>9}" for p in policies) for c in caps]
    return lines


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
