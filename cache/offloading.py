"""vLLM's native KV offloading (``--kv-offloading-size``): the GPU pool plus a CPU tier that
each request's prompt blocks are written to, as vLLM 0.32's ``OffloadingConnector`` does it.

:class:`OffloadingKVCacheManager` is the vLLM-exact :class:`~kvsim.cache.KVCacheManager`;
what the connector adds (``vllm/distributed/kv_transfer/kv_connector/v1/offloading/
scheduler.py``, ``OffloadingConnectorScheduler``), kept as vLLM orders it:

- *store* (``OFFLOAD``, device -> host): once a step is planned (:meth:`end_schedule`, vLLM's
  ``build_connector_meta``), each request it scheduled offers the CPU manager the prompt
  blocks full after the step (``offload_prompt_only``: never a block decoding fills), from
  its first block not offered yet: from 0 for a new request, so GPU prefix hits are offered
  too, or after its CPU hit. Then each request that finished in the last step offers what it
  has left, and the manager hears that it finished (its blocks' recency). An offer the
  manager takes is a *job*: the hashes get host blocks at once (evicting others), are copied
  in the next step (here: first in its plan) and become loadable when that step ends. An
  offer the CPU has no room for is made again at the request's next step;
- *lookup*: after the GPU prefix hit, the CPU manager's ``lookup`` continues with the next
  blocks, up to the last full block of the prompt. The request waits (is skipped this step,
  :attr:`~kvsim.cache.prefix_hit.CacheHit.deferred`) while one of those blocks is still being
  stored, while another request loads one of its hit blocks, and while its own jobs run;
- *load* (``PROMOTE``, host -> device): a CPU hit is loaded asynchronously; the request is
  admitted with its blocks allocated but runs no tokens in the step that loads them
  (vLLM's ``WAITING_FOR_REMOTE_KVS``), and from the next step computes the rest (the last
  prompt token at least). The host blocks stay pinned until the load is done.

Pure bookkeeping: the copies are pairs the step plan carries, charged by the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, compress
from typing import Iterable, Sequence

import numpy as np

from kvsim.cache.kv_cache_manager import KVCacheManager, _hashes
from kvsim.cache.prefix_hit import CacheHit
from kvsim.cache.request_state import RequestStatus
from kvsim.cache.step_plan import OFFLOAD, PROMOTE, TRANSFER_KINDS, BlockTransfer
from kvsim.cache.tiered import TieredKVCacheManager


@dataclass(slots=True)
class _Offloads:
    """One request's offloading state (vLLM's ``RequestOffloadState``)."""

    tokens: object
    num_prompt_blocks: int       # full prompt blocks: the most it offers
    next_stored: int = 0         # first block not offered yet
    num_jobs: int = 0            # its stores and loads not done


class OffloadingKVCacheManager(KVCacheManager):
    """A :class:`KVCacheManager` with vLLM's CPU offloading behind it.

    >>> from kvsim.cache.cpu_offload import LRUOffloadingManager
    >>> m = OffloadingKVCacheManager(4, 4, offload=LRUOffloadingManager(8))
    >>> m.allocate("a", list(range(8)), 8)          # fills two prompt blocks
    [0, 1]
    >>> m.end_schedule(["a"]); m.take_transfers()   # offered once the step is planned ...
    []
    >>> m.begin_step(); [(t.kind, t.pairs) for t in m.take_transfers()]    # ... copied next
    [('offload', [(0, 0), (1, 1)])]
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 max_model_len: int | None = None, policy=None, *, offload,
                 defer_private_blocks: bool = False):
        super().__init__(num_blocks, block_size, enable_prefix_caching, max_model_len, policy,
                         defer_private_blocks)
        self.offload = offload
        self.host = offload                  # what the run's host-usage statistics read
        self.num_transferred_blocks = dict.fromkeys(TRANSFER_KINDS, 0)
        self._transfers: list[BlockTransfer] = []
        self._written: set[int] = set()
        self._state: dict[object, _Offloads] = {}
        self._allocated: list = []        # requests given slots this step, in order
        self._unoffered: set = set()      # requests whose offer the CPU had no room for
        self._finished: list = []         # requests finished since the last step was planned
        # jobs: (request, [(GPU block, host block)], host blocks) offered when the last step
        # was planned (copied in this one), and those copied in the last step (done now)
        self._offered: list[tuple[object, list[tuple[int, int]], list[int]]] = []
        self._copying: list[tuple[object, list[int]]] = []
        # a finished request's last offer reads blocks the step may give to others: copied
        # in the step that makes it (vLLM flushes such a job before the blocks are reused)
        self._flushed: list[tuple[object, list[int]]] = []
        self._loading: list[tuple[object, list[int]]] = []     # loads of the last step
        self._being_loaded: set[int] = set()
        self._loading_id = None       # the request whose CPU hit allocate is loading

    def acts_without_new_blocks(self, sequences) -> bool:
        """An offer the CPU had no room for is made again at every step its request is
        scheduled, until it is taken: while one waits, every step counts."""
        waiting = self._unoffered
        return bool(waiting) and any(s.request_id in waiting for s in sequences)

    @property
    def decodes_quietly(self) -> bool:
        """Whether decode-only steps would ask for nothing now but :meth:`end_schedule`
        once: no offer to copy, load to finish, or finished request with blocks to offer (a
        store still copying completes at the next step planned one by one: nothing asks for
        it before)."""
        return not (self._offered or self._flushed or self._loading or self._allocated) \
            and all(last is None for _, last in self._finished)

    def finishes_quietly(self, sequences) -> bool:
        """Whether these requests, decoding, would offer nothing when they finish (their
        prompt blocks all offered): a quiet decode run goes on through their finishes, whose
        recency :meth:`end_schedule` hears when the next step is planned, as one by one."""
        if not self.enable_prefix_caching:
            return True
        state = self._state
        for seq in sequences:
            offloads = state.get(seq.request_id)
            if offloads is not None and offloads.next_stored < offloads.num_prompt_blocks:
                return False
        return True

    @property
    def allocates_every_step(self) -> bool:
        """Whether every scheduled request must be told its step (an offer waits)."""
        return bool(self._unoffered)

    # --- lookup --------------------------------------------------------------------------

    def lookup(self, tokens) -> CacheHit:
        """The GPU prefix hit, continued by the CPU blocks that follow it up to the last full
        block (side-effect free); ``deferred`` when the request must wait."""
        state = self._state.get(getattr(tokens, "request_id", None))
        if state is not None and state.num_jobs:
            return CacheHit(deferred=True)
        hashes = self._lookup_hashes(tokens, whole=True)
        gpu = self.pool.index.find_prefix(hashes[:(len(tokens) - 1) // self.block_size])
        n = len(gpu)
        hits = self.offload.lookup(hashes[n:]) if n < len(hashes) else 0
        if hits is None:
            return CacheHit(gpu, n * self.block_size, deferred=True)
        if not hits:
            return CacheHit(gpu, n * self.block_size)
        loaded = hashes[n:n + hits]
        if self._being_loaded and not self._being_loaded.isdisjoint(loaded):
            return CacheHit(gpu, n * self.block_size, deferred=True)
        host = self.offload.block_ids(loaded)
        return CacheHit(gpu, (n + hits) * self.block_size, host, load_async=True)

    def record_query(self, num_tokens: int, hit: CacheHit) -> None:
        super().record_query(num_tokens, hit)
        self.prefix_stats.num_host_hit_tokens += len(hit.host_block_ids) * self.block_size

    # --- allocation ----------------------------------------------------------------------

    def allocate(self, request_id, tokens, num_new_tokens: int, hit: CacheHit | None = None,
                 num_computed_tokens: int | None = None) -> list[int] | None:
        """As :meth:`KVCacheManager.allocate`; the CPU blocks of ``hit`` are loaded into the
        first new blocks, and a request given slots is noted for the step's offers."""
        loads = hit is not None and bool(hit.host_block_ids)
        self._loading_id = request_id if loads else None
        try:
            new_blocks = super().allocate(request_id, tokens, num_new_tokens, hit,
                                          num_computed_tokens)
        finally:
            self._loading_id = None
        if new_blocks is None:
            return None
        state = self._state.get(request_id)
        if state is None:
            n = getattr(tokens, "num_prompt_tokens", None)
            state = self._state[request_id] = _Offloads(
                tokens, (len(tokens) if n is None else n) // self.block_size)
        if loads:
            self._load(request_id, state, hit, new_blocks)
        elif state.next_stored < state.num_prompt_blocks and self.enable_prefix_caching:
            self._allocated.append(request_id)
        return new_blocks

    def free(self, request_id) -> None:
        """Free the GPU blocks. A request preempted keeps its offloading state (an offer it
        waits to make, it makes when admitted again); one finished makes its last offer when
        the next step is planned."""
        state = self._state.get(request_id)
        if state is not None:
            self._unoffered.discard(request_id)
            if getattr(state.tokens, "status", RequestStatus.FINISHED) is not \
                    RequestStatus.RUNNING:
                self._finished.append((request_id, self._last_offer(request_id, state)))
                del self._state[request_id]
        super().free(request_id)

    # --- the step's copies ---------------------------------------------------------------

    def begin_step(self) -> None:
        """A new step: last step's loads and the stores copied in it are done; the offers
        taken when the last step was planned are copied now."""
        self._complete_jobs()
        self._copying = [(request_id, hosts) for request_id, _, hosts in self._offered]
        if self._flushed:
            self._copying += self._flushed
            self._flushed = []
        if self._offered:
            offered, self._offered = self._offered, []
            if len(offered) == 1:
                self._record(OFFLOAD, offered[0][1], offered[0][2])
            else:
                self._record(OFFLOAD, [*chain.from_iterable(o[1] for o in offered)],
                             [*chain.from_iterable(o[2] for o in offered)])

    def _complete_jobs(self) -> None:
        """Last step's loads (their blocks registered on the GPU now) and the stores copied
        in it are done."""
        offload = self.offload
        for request_id, hashes in self._loading:
            offload.complete_load(hashes)
            self._being_loaded.difference_update(hashes)
            self._job_done(request_id)
            self._register_loaded(request_id)
        self._loading.clear()
        if self._copying:
            hosts = [*chain.from_iterable(h for _, h in self._copying)]
            offload.complete_store_blocks(np.array(hosts, dtype=np.int64))
            for request_id, _ in self._copying:
                self._job_done(request_id)

    def end_schedule(self, scheduled: Iterable = ()) -> None:
        """The step is planned (``scheduled``: the ids of the requests it runs, in order):
        the offers of the requests it gave slots (or of every one it runs while an offer
        waits), then the last offers of the requests finished since the last step and
        their recency (vLLM's ``build_connector_meta``)."""
        if self._unoffered:
            noted = set(self._allocated)
            order = [r for r in scheduled if r in noted or r in self._unoffered]
        else:
            order = self._allocated
        for request_id in order:
            state = self._state.get(request_id)
            if state is not None:
                self._offer(request_id, state)
        self._allocated = []
        if self._finished:
            finished, self._finished = self._finished, []
            for request_id, last in finished:
                if last is not None:
                    self._store(request_id, None, *last)
            for request_id, _ in finished:
                self.offload.request_finished(request_id)

    def take_transfers(self) -> list[BlockTransfer]:
        """The copies recorded since the last call, in the order they must run (the end of
        planning a step)."""
        transfers, self._transfers = self._transfers, []
        return transfers

    _record = TieredKVCacheManager._record

    # --- internals -----------------------------------------------------------------------

    def _cache_full_blocks(self, entry, tokens, num_tokens: int) -> None:
        """As the base, except for the blocks a CPU hit loads: registered once the load is
        done (vLLM caches them when the request leaves ``WAITING_FOR_REMOTE_KVS``)."""
        if self._loading_id is None or self._requests.get(self._loading_id) is not entry:
            super()._cache_full_blocks(entry, tokens, num_tokens)

    def _register_loaded(self, request_id) -> None:
        entry, state = self._requests.get(request_id), self._state.get(request_id)
        if entry is not None and state is not None and entry.deferred is None:
            n = len(state.tokens)
            self._cache_full_blocks(entry, state.tokens,
                                    entry.num_slots if entry.num_slots < n else n)

    def _load(self, request_id, state: _Offloads, hit: CacheHit, new_blocks: list[int]) -> None:
        start, end = len(hit.block_ids), hit.num_tokens // self.block_size
        hashes = list(_hashes(state.tokens, self.block_size, start, end))
        host_ids = self.offload.prepare_load(hashes, request_id, start)
        self._record(PROMOTE, list(zip(host_ids, new_blocks[:len(host_ids)])))
        self._loading.append((request_id, hashes))
        self._being_loaded.update(hashes)
        state.num_jobs += 1
        state.next_stored = end

    def _offer(self, request_id, state: _Offloads) -> None:
        """Offer the request's prompt blocks full since its last offer."""
        entry = self._requests.get(request_id)
        start = state.next_stored
        end = self._offer_end(entry, state) if entry is not None else start
        if end <= start:
            self._unoffered.discard(request_id)
            return
        hashes = _hashes(state.tokens, self.block_size, start, end)
        self._store(request_id, state, start, entry.block_ids[start:end], hashes)

    def _offer_end(self, entry, state: _Offloads) -> int:
        """The end of the request's offer: its prompt blocks full within its slots."""
        return min(entry.num_slots // self.block_size, state.num_prompt_blocks,
                   len(entry.block_ids))

    def _last_offer(self, request_id, state: _Offloads):
        """What a finished request offers when the next step is planned: (first position,
        GPU blocks, hashes) of the prompt blocks it has not offered yet, or None."""
        entry = self._requests.get(request_id)
        if entry is None or not self.enable_prefix_caching:
            return None
        end = self._offer_end(entry, state)
        if end <= state.next_stored:
            return None
        start = state.next_stored
        return start, entry.block_ids[start:end], list(_hashes(state.tokens, self.block_size,
                                                                start, end))

    def _store(self, request_id, state: _Offloads | None, start: int, gpu_blocks: list[int],
               hashes: Sequence[int]) -> None:
        """Offer the request's blocks from ``start`` (``state`` None: its last offer, once
        finished); a job for the hashes the CPU takes."""
        result = self.offload.prepare_store(hashes, request_id, start)
        if result is None:
            if state is not None:
                self._unoffered.add(request_id)
            return
        if state is not None:
            state.next_stored = start + len(hashes)
            self._unoffered.discard(request_id)
        if not result.block_ids:
            return
        pairs, hosts = _copy_pairs(gpu_blocks, hashes, result)
        if state is None:       # (first in the step: before its blocks are written again)
            self._transfers.insert(0, BlockTransfer(OFFLOAD, pairs))
            self.num_transferred_blocks[OFFLOAD] += len(pairs)
            self._flushed.append((request_id, hosts))
        else:
            self._offered.append((request_id, pairs, hosts))
            state.num_jobs += 1

    def _job_done(self, request_id) -> None:
        state = self._state.get(request_id)
        if state is not None:
            state.num_jobs -= 1


def _copy_pairs(gpu_blocks: list[int], hashes: Sequence[int], result):
    """(GPU block, host block) of each hash a store took, and the host blocks, in order."""
    hosts = result.block_ids
    if len(hosts) == len(gpu_blocks):      # every block's hash new (and in order)
        return list(zip(gpu_blocks, hosts)), hosts
    if result.stored_mask is not None:     # (the hashes not held, in order)
        return list(zip(compress(gpu_blocks, result.stored_mask), hosts)), hosts
    host_of = dict(zip(result.hashes, hosts))
    pairs = [(b, host_of[h]) for b, h in zip(gpu_blocks, hashes) if h in host_of]
    return pairs, [host for _, host in pairs]
