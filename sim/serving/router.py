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


ROUTERS = {cls.name: cls for cls in (RoundRobinRouter, LeastOutstandingRouter,
                                     PrefixAffinityRouter)}


def make_router(name: str):
    try:
        return ROUTERS[name]()
    except KeyError:
        known = ", ".join(sorted(ROUTERS))
        raise ValueError(f"unknown router {name!r}: expected one of {known}") from None
