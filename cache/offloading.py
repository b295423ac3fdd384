"""vLLM's native KV offloading (``--kv-offloading-size``): the GPU pool plus a CPU tier that
every computed block is written to, as vLLM v1's ``OffloadingConnector`` does it.

:class:`OffloadingKVCacheManager` is the vLLM-exact :class:`~kvsim.cache.KVCacheManager`;
what the connector adds (``vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py``,
``OffloadingConnectorScheduler``), kept as vLLM orders it:

- *store* (``OFFLOAD``, device -> host): each step, every block of a scheduled request that the
  step fills is offered to the CPU manager (``prepare_store``, in order from the request's
  first block not yet offered, GPU prefix hits included); the hashes it accepts get host blocks
  at once (evicting others) and are copied after the forward pass that fills them (here: first
  in the next step's plan). They become loadable only when the request is done and its copies
  have run (vLLM completes a request's stores in ``update_connector_output`` once it finished
  sending), so a running request's blocks serve no one from the CPU;
- *lookup*: after the GPU prefix hit, the CPU manager's ``lookup`` continues with the next
  blocks; at each admission attempt the request's block hashes are also *touched* (recency) and,
  with a reuse gate, *counted* (``store_threshold``);
- *load* (``PROMOTE``, host -> device): a CPU hit is loaded asynchronously; the request is
  admitted with its blocks allocated but runs no tokens in the step that loads them
  (``load_async``: vLLM's ``WAITING_FOR_REMOTE_KVS``), and from the next step computes the rest.
  The host blocks stay pinned until the load is done.

Pure bookkeeping: the copies are pairs the step plan carries, charged by the cost model.
"""

from __future__ import annotations

from itertools import chain
from typing import Sequence

import numpy as np

from kvsim.cache.kv_cache_manager import KVCacheManager, _hashes
from kvsim.cache.prefix_hit import CacheHit
from kvsim.cache.step_plan import OFFLOAD, PROMOTE, TRANSFER_KINDS, BlockTransfer
from kvsim.cache.tiered import TieredKVCacheManager


class OffloadingKVCacheManager(KVCacheManager):
    """A :class:`KVCacheManager` with vLLM's CPU offloading behind it.

    >>> from kvsim.cache.cpu_offload import LRUOffloadingManager
    >>> m = OffloadingKVCacheManager(4, 4, offload=LRUOffloadingManager(8))
    >>> m.allocate("a", list(range(8)), 8)          # fills two blocks: both offered
    [0, 1]
    >>> m.take_transfers()                            # copied after the step that fills them
    []
    >>> m.begin_step(); [(t.kind, t.pairs) for t in m.take_transfers()]
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
        self._next_stored: dict[object, int] = {}       # request -> first block not offered
        self._unoffered: set = set()    # requests whose full blocks the CPU had no room for
        self._being_stored: dict[object, list[int]] = {}    # request -> host blocks it stores
        # (request, [(GPU block, host block)], host blocks): copies to run after this step's
        # forward, one entry per offer
        self._copies: list[tuple[object, list[tuple[int, int]], Sequence[int]]] = []
        self._planning = False     # between begin_step and take_transfers
        self._loading: list[list[int]] = []             # hashes loaded in the last step
        self._finishing: list[int] = []     # host blocks of finished requests, copies run
        self._finished: list[int] = []      # ... whose copies run in the next step

    def acts_without_new_blocks(self, sequences) -> bool:
        """A block the CPU could not make room for is offered again at every step the
        request is scheduled, until it is taken: while one waits, every step counts."""
        waiting = self._unoffered
        return bool(waiting) and any(s.request_id in waiting for s in sequences)

    def registers_while_decoding(self, request_ids) -> list[bool]:
        """Every block a decode step fills is offered to the CPU (with prefix caching on),
        its registration deferred or not: each fill is a block event of a decode run."""
        return [self.enable_prefix_caching] * len(request_ids)

    # --- lookup --------------------------------------------------------------------------

    def lookup(self, tokens) -> CacheHit:
        """The GPU prefix hit, continued by the CPU blocks that follow it (side-effect free)."""
        hashes = self._lookup_hashes(tokens)
        gpu = self.pool.index.find_prefix(hashes)
        n = len(gpu)
        hits = self.offload.lookup(hashes[n:]) if n < len(hashes) else 0
        if not hits:
            return CacheHit(gpu, n * self.block_size)
        host = self.offload.block_ids(hashes[n:n + hits])
        return CacheHit(gpu, (n + hits) * self.block_size, host, load_async=True)

    def record_query(self, num_tokens: int, hit: CacheHit) -> None:
        super().record_query(num_tokens, hit)
        self.prefix_stats.num_host_hit_tokens += len(hit.host_block_ids) * self.block_size

    # --- allocation ----------------------------------------------------------------------

    def allocate(self, request_id, tokens, num_new_tokens: int, hit: CacheHit | None = None,
                 num_computed_tokens: int | None = None) -> list[int] | None:
        """As :meth:`KVCacheManager.allocate`. An admission attempt (``hit`` given) first
        touches (and counts, behind a reuse gate) the request's blocks on the CPU, as vLLM's
        ``get_num_new_matched_tokens`` does whether or not the allocation then succeeds; the
        CPU blocks of ``hit`` are loaded into the first new blocks; blocks filled are offered
        to the CPU."""
        if hit is not None:
            self._observe(tokens, len(hit.block_ids))
        new_blocks = super().allocate(request_id, tokens, num_new_tokens, hit,
                                      num_computed_tokens)
        if new_blocks is None:
            return None
        if hit is not None and hit.host_block_ids:
            self._load(request_id, tokens, hit, new_blocks)
        self._store_full_blocks(request_id, tokens)
        return new_blocks

    def free(self, request_id) -> None:
        """Free the GPU blocks; the request's stores become loadable once their copies have
        run: those already copied from the next step on, those still queued (blocks this step
        fills) one step later. A request preempted while the step is planned never computes
        the blocks this step fills: their stores are given up (vLLM stores for scheduled
        requests only)."""
        self.offload.forget_chain(request_id)      # (reads the request's blocks' hashes)
        super().free(request_id)
        self._next_stored.pop(request_id, None)
        self._unoffered.discard(request_id)
        stored = self._being_stored.pop(request_id, None)
        if not stored:
            return
        queued = [host for owner, _, hosts in self._copies if owner == request_id
                  for host in hosts]
        if queued and self._planning:
            self._copies = [c for c in self._copies if c[0] != request_id]
            self.offload.complete_store_blocks(np.array(queued, dtype=np.int64), success=False)
        elif queued:
            self._finished.extend(queued)   # copied in the next step, loadable after it
        if queued:
            queued = set(queued)
            stored = [b for b in stored if b not in queued]
        self._finishing.extend(stored)

    # --- the step's copies ---------------------------------------------------------------

    def begin_step(self) -> None:
        """A new step: last step's loads are done; stores of finished requests whose copies
        have run become loadable; copies of the blocks last step filled run now."""
        offload = self.offload
        for hashes in self._loading:
            offload.complete_load(hashes)
        self._loading.clear()
        if self._finishing:
            offload.complete_store_blocks(np.array(self._finishing, dtype=np.int64))
        self._finishing, self._finished = self._finished, []
        if self._copies:
            copies, self._copies = self._copies, []
            if len(copies) == 1:
                self._record(OFFLOAD, copies[0][1], copies[0][2])
            else:
                self._record(OFFLOAD, [*chain.from_iterable(c[1] for c in copies)],
                             [*chain.from_iterable(c[2] for c in copies)])
        self._planning = True

    def take_transfers(self) -> list[BlockTransfer]:
        """The copies recorded since the last call, in the order they must run (the end of
        planning a step)."""
        self._planning = False
        transfers, self._transfers = self._transfers, []
        return transfers

    _record = TieredKVCacheManager._record

    # --- internals -----------------------------------------------------------------------

    def _observe(self, tokens, num_gpu_blocks: int) -> None:
        """vLLM touches every full block of the request, counts those after the GPU hit."""
        if not self.enable_prefix_caching:
            return
        n = len(tokens) // self.block_size
        count = getattr(self.offload, "count", None)
        if count is None:
            n = _num_maybe_stored(tokens, n)
        hashes = list(_hashes(tokens, self.block_size, 0, n))
        if count is not None:
            count(hashes[num_gpu_blocks:])
            hashes = hashes[:_num_maybe_stored(tokens, n)]
        self.offload.touch(hashes)

    def _load(self, request_id, tokens, hit: CacheHit, new_blocks: list[int]) -> None:
        start, end = len(hit.block_ids), hit.num_tokens // self.block_size
        hashes = list(_hashes(tokens, self.block_size, start, end))
        host_ids = self.offload.prepare_load(hashes)
        self._record(PROMOTE, list(zip(host_ids, new_blocks[:len(host_ids)])))
        self._loading.append(hashes)
        if self._next_stored.get(request_id, 0) < end:
            self._next_stored[request_id] = end

    def _num_full(self, entry, tokens) -> int:
        """The request's full blocks, the ones vLLM offers to the CPU: those registered, or,
        while its private blocks skip the prefix index (``defer_private_blocks``), those its
        slots fill (registering them would have counted the same)."""
        if entry.deferred is None and entry.private is None:
            return entry.num_cached
        n = len(tokens)
        return (entry.num_slots if entry.num_slots < n else n) // self.block_size

    def _store_full_blocks(self, request_id, tokens) -> None:
        """Offer the blocks full since the last offer (vLLM's ``_get_reqs_to_store``); when
        the CPU cannot make room, they are offered again at the next one. Their hashes are
        the request's (registered or not)."""
        entry = self._requests.get(request_id)
        start = self._next_stored.get(request_id, 0)
        if entry is None:
            return
        end = self._num_full(entry, tokens)
        if end <= start:
            if self._unoffered:
                self._unoffered.discard(request_id)
            return
        ids = entry.block_ids[start:end]
        hashes_at = _hashes_at(tokens, entry.block_ids, self.pool.block_hashes)
        hashes = hashes_at(range(start, end))
        result = self.offload.prepare_store(hashes)
        if result is None:
            self._unoffered.add(request_id)
            return
        self._next_stored[request_id] = end
        if self._unoffered:
            self._unoffered.discard(request_id)
        hosts = result.block_ids
        if not hosts:
            return
        stored = None
        if len(hosts) == len(ids):      # every block's hash new (and in order)
            self._copies.append((request_id, list(zip(ids, hosts)), hosts))
            stored = (start, hosts)
        else:
            host_of = dict(zip(result.hashes, hosts))
            pairs = [(b, host_of[h]) for b, h in zip(ids, hashes) if h in host_of]
            self._copies.append((request_id, pairs, [host for _, host in pairs]))
        self._being_stored.setdefault(request_id, []).extend(hosts)
        self.offload.touch_chain(request_id, end, hashes_at, stored)


def _hashes_at(tokens, table: list[int], block_hashes: list):
    """``hashes_at(positions)``: the hashes of the blocks at these (ascending) positions of a
    request's table, from its sequence when it knows them (a ``RequestState``: registered or
    not), else from the blocks (token ids: every full block is registered)."""
    if not hasattr(tokens, "block_hashes"):
        return lambda positions: [block_hashes[table[p]] for p in positions]
    sequence_hashes = tokens.block_hashes

    def at(positions):
        if not len(positions):
            return []
        low, high = positions[0], positions[-1] + 1
        known = sequence_hashes(low, high)
        if high - low == len(positions):        # (a run of positions: all of them)
            return known
        return [known[p - low] for p in positions]
    return at


def _num_maybe_stored(tokens, n: int) -> int:
    """How many of the first ``n`` blocks of ``tokens`` the CPU may hold: a sequence never
    preempted has stored none of its private blocks (see :mod:`kvsim.workloads.sharing`), and
    no other request has them. A length-only request that another may continue is not private
    that way: its continuation holds its ids, and may run first (priority scheduling)."""
    if getattr(tokens, "num_preemptions", 1):
        return n
    if getattr(tokens, "has_private_blocks", False):
        return 0 if getattr(tokens, "unreachable_when_finished", False) else n
    shared = getattr(tokens, "num_shared_blocks", None)
    return n if shared is None or shared > n else shared
