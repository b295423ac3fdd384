"""Routers choose a replica for each arriving request."""

from __future__ import annotations

from kvsim.cache.request_state import RequestState


class RoundRobinRouter:
    """Replicas in turn."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, replicas, seq: RequestState) -> int:
        index = self._next % len(replicas)
        self._next += 1
        return index


class LeastOutstandingRouter:
    """The replica with the fewest tokens still to compute (lowest index on ties)."""

    name = "least-outstanding-tokens"

    def choose(self, replicas, seq: RequestState) -> int:
        return min(range(len(replicas)), key=lambda i: replicas[i].outstanding_tokens)


class PrefixAffinityRouter:
    """The replica whose cache holds the longest prefix of the request; ties (including no
    hit anywhere) go to the least outstanding tokens."""

    name = "prefix-affinity"

    def choose(self, replicas, seq: RequestState) -> int:
        def score(i: int):
            hit = replicas[i].kv.lookup(seq)
            return (-hit.num_tokens, replicas[i].outstanding_tokens, i)

        return min(range(len(replicas)), key=score)


class CacheAwareRouter:
    """SGLang's router's ``cache_aware`` policy (sgl-router / SGLang Model Gateway), with its
    defaults. While the replicas' loads (requests running or waiting) are imbalanced, the
    busiest holding more than ``balance_abs`` requests more than the idlest and more than
    ``balance_rel`` times as many, the least loaded replica; otherwise the replica holding the
    longest cached prefix of the prompt when that covers more than ``cache_threshold`` of
    it, else the one caching least (most room: SGLang's smallest tree). Ties: the lower load,
    then the lower index. Where kvsim differs: it reads each replica's own cache, where
    SGLang's router keeps an approximate tree of the text it routed (an exact mirror, as
    its gateway's docs call the ideal)."""

    name = "cache-aware"

    def __init__(self, cache_threshold: float = 0.3, balance_abs: int = 64,
                 balance_rel: float = 1.5) -> None:
        self.cache_threshold, self.balance_abs, self.balance_rel = (
            cache_threshold, balance_abs, balance_rel)

    def choose(self, replicas, seq: RequestState) -> int:
        loads = [r.scheduler.num_running + r.scheduler.num_waiting for r in replicas]
        order = range(len(replicas))
        busiest, idlest = max(loads), min(loads)
        if busiest - idlest > self.balance_abs and busiest > idlest * self.balance_rel:
            return min(order, key=lambda i: (loads[i], i))
        hits = [r.kv.lookup(seq).num_tokens for r in replicas]
        best = min(order, key=lambda i: (-hits[i], loads[i], i))
        if hits[best] > self.cache_threshold * seq.num_prompt_tokens:
            return best
        return min(order, key=lambda i: (_cached_blocks(replicas[i]), loads[i], i))


def _cached_blocks(replica) -> int:
    """Blocks holding KV content on ``replica``'s GPU: held, or cached and idle."""
    pool = getattr(replica.kv, "pool", None)
    return 0 if pool is None else pool.num_used_blocks + pool.num_cached_free_blocks


ROUTERS = {cls.name: cls for cls in (RoundRobinRouter, LeastOutstandingRouter,
                                     PrefixAffinityRouter, CacheAwareRouter)}


def make_router(name: str):
    try:
        return ROUTERS[name]()
    except KeyError:
        known = ", ".join(sorted(ROUTERS))
        raise ValueError(f"unknown router {name!r}: expected one of {known}") from None
