"""Which blocks of a trace's requests no other request can ever hit: one pass over the trace.

A trace with per-chunk prefix hashes (Mooncake's ``hash_ids``) names each engine block by the
hash of the chunk holding its last token (:func:`kvsim.workloads.identity.expand_prefix_hashes`),
so two requests can share a block only where they carry the same chunk hash. A chunk hash that
one request alone carries, in the whole trace, names blocks that only this request can look
up (after a preemption), never another. :class:`SharedPrefixes` collects the hashes that two
or more requests carry; :meth:`SharedPrefixes.num_shared_blocks` gives, for one request, how
many leading blocks may be shared: every block from there on (the rest of the prompt and the
generated tokens) is private to it.

The KV manager registers a private block in the prefix index only if its request is preempted
(it may then hit its own blocks); a finished one's private blocks become cached content that no
lookup can reach (:meth:`~kvsim.cache.BlockPool.cache_unreachable`). Hits, the free queue's
order and the cached-block counts stay those of registering every block: only index work that
could never pay off is skipped (a third of a Mooncake run's block operations).
"""

from __future__ import annotations

from typing import Iterable

#: Most distinct chunk hashes a trace may hold for the pass (about 150 MB of sets at most).
MAX_HASHES = 2_000_000


class SharedPrefixes:
    """The chunk hashes two or more requests of a trace carry (see the module docstring)."""

    __slots__ = ("_shared",)

    def __init__(self, shared: set[int]):
        self._shared = shared

    @classmethod
    def scan(cls, requests: Iterable, max_hashes: int = MAX_HASHES) -> "SharedPrefixes | None":
        """Count every request's chunk hashes (each once per request); None when the trace
        holds more than ``max_hashes`` distinct ones (the sets would outgrow the run)."""
        seen: set[int] = set()
        shared: set[int] = set()
        for request in requests:
            if request.prefix_hashes is None:
                continue
            mine = set(request.prefix_hashes.tolist())
            shared |= mine & seen
            seen |= mine
            if len(seen) > max_hashes:
                return None
        return cls(shared)

    def num_shared_blocks(self, request, block_size: int, greedy: bool = False) -> int | None:
        """Leading ``block_size`` blocks of ``request``'s sequence that another request may
        hit; every later block is private to it. None: all may be shared (the request's ids
        do not come from chunk hashes alone, or it continues or may be continued by another)."""
        if not may_have_private_blocks(request):
            return None
        hashes, prompt_blocks = request.prefix_hashes.tolist(), request.prompt_tokens // block_size
        first = len(hashes)                  # the chunks from ``first`` on are carried by it alone
        while first and hashes[first - 1] not in self._shared:
            first -= 1
        start = prompt_blocks                # its last chunk is shared: so may its prompt be
        if first < len(hashes):              # the first block whose last token is in ``first``
            start = min(start, -(-(first * request.hash_block_size + 1) // block_size) - 1)
        if greedy and start >= prompt_blocks:
            return None     # greedy outputs are named by the prompt: another's may be the same
        return start


def may_have_private_blocks(request) -> bool:
    """Whether ``request``'s block ids come from its chunk hashes alone and nothing continues
    it (or is continued by it), so that some of its blocks may be private."""
    return (request.prefix_hashes is not None and request.prompt_token_ids is None
            and request.continues is None and not request.may_be_continued
            and getattr(request, "output_token_ids", None) is None)


#: Most requests :func:`read_scanned` keeps from the scan for the run (a few MB of requests).
KEEP_REQUESTS = 20_000


def scan_trace_sharing(read) -> SharedPrefixes | None:
    """:meth:`SharedPrefixes.scan` of the requests ``read()`` yields, when the first of them
    may have private blocks (None otherwise, without reading further: a trace of token ids,
    of sessions that continue each other, or without identity gains nothing from the pass)."""
    return read_scanned(read, keep=0)[1]


def read_scanned(read, keep: int = KEEP_REQUESTS) -> tuple[Iterable, SharedPrefixes | None]:
    """``(requests, sharing)``: :func:`scan_trace_sharing` and the requests to run. A trace of
    at most ``keep`` requests is read once (the scan's requests are the run's); a longer one
    is read again as the run goes (streamed: memory does not grow with the trace)."""
    first = next(iter(read()), None)
    if first is None or not may_have_private_blocks(first):
        return read(), None
    kept: list | None = []

    def keeping():
        nonlocal kept
        for request in read():
            if kept is not None and len(kept) == keep:
                kept = None                 # too long to keep: the run reads it again
            if kept is not None:
                kept.append(request)
            yield request

    sharing = SharedPrefixes.scan(keeping())
    if sharing is None or kept is None:     # (a scan given up part-way kept only a part)
        return read(), sharing
    return kept, sharing
