"""What a decode run (:mod:`kvsim.cache.decode_run`) asks of the paged KV manager.

A run commits many decode-only steps at once. :class:`DecodeRunBlocks`, a base of
:class:`~kvsim.cache.kv_cache_manager.KVCacheManager`, answers for it: whether a step that adds no
block may be skipped, which requests register the blocks they fill, whether the run's new blocks
may be taken in one call and registered afterwards with the same result as block by block, and
taking them. The manager's state (``pool``, its per-request entries, the deferred ones) is its
own; these methods read it, and :meth:`KVCacheManager.grow_slots` brings the slots forward.
"""

from __future__ import annotations

from typing import Iterable, Sequence


class DecodeRunBlocks:
    """The decode-run queries and bulk block opening of a paged manager."""

    #: Whether the scheduler may commit decode-only steps lazily (only at the steps where a
    #: request opens or fills a block): true when an ``allocate`` that adds no block has no
    #: effect.
    supports_decode_runs = True

    def acts_without_new_blocks(self, sequences: Sequence) -> bool:
        """Whether an ``allocate`` that adds no block would still act for one of these
        requests (then every step must be planned: no decode run). Never here."""
        return False

    def registers_while_decoding(self, request_ids: Sequence) -> list[bool]:
        """For each request, whether its decode steps register the blocks they fill (prefix
        caching on, and its registration not deferred)."""
        if not self.enable_prefix_caching:
            return [False] * len(request_ids)
        deferred = self._deferred
        return [request_id not in deferred for request_id in request_ids]

    @property
    def always_opens_blocks_in_bulk(self) -> bool:
        """:meth:`opens_blocks_in_bulk` is True whatever the sequences (LRU's plain pool)."""
        return self.pool.opens_in_bulk == "always"

    def opens_blocks_in_bulk(self, sequences: Iterable, num_tokens: Sequence[int]) -> bool:
        """Whether decode steps taking ``sequences`` to ``num_tokens`` computed tokens each may
        take their new blocks in one :meth:`open_blocks` and register the blocks they fill
        afterwards, with the result of one :meth:`allocate` per block: always with LRU's plain
        pool (registering a held block moves nothing in its free queue); with a scored or lane
        pool when no block they fill has cached content already and every request's chain goes
        on from the holder of its last registered block (so no free block changes eligibility);
        with a queue pool whose policy can hear of the fills late (ARC's, S3-FIFO's) when the
        hashes they fill are all new and distinct and the policy allows it (no ghost list
        holds them; S3-FIFO: its probation queue stays under its share and its main queue
        gives every victim); never with another queue pool (``BlockPool.opens_in_bulk``)."""
        pool = self.pool
        if pool.opens_in_bulk == "new_fills":
            return self._fills_are_new(sequences, num_tokens)
        if pool.opens_in_bulk != "new_chains":
            return pool.opens_in_bulk == "always"
        index, hashes, bs = pool.index._map, pool.block_hashes, self.block_size
        for seq, n in zip(sequences, num_tokens):
            entry = self._requests[seq.request_id]
            start, end = entry.num_cached, n // bs
            if entry.private is not None:       # (its private blocks are not registered)
                end = min(end, self._registration_cap(entry, seq))
            if not self.enable_prefix_caching or entry.deferred is not None or end <= start:
                continue
            last = entry.block_ids[start - 1] if start else None
            if (last is not None and index.get(hashes[last]) != last) or any(
                    h in index for h in seq.block_hashes(start, end)):
                return False
        return True

    def _fills_are_new(self, sequences: Iterable, num_tokens: Sequence[int]) -> bool:
        """Whether the blocks these decode steps fill hold hashes no block holds and no two
        of them share, and the queue policy allows them reported late (so taking them late
        changes nothing)."""
        if not self.enable_prefix_caching:
            return True
        found, num_new, num_private, bs, entries = [], 0, 0, self.block_size, self._requests
        for seq, n in zip(sequences, num_tokens):
            entry = entries[seq.request_id]
            new, end = -(-n // bs) - len(entry.block_ids), n // bs
            if new > 0:
                num_new += new
            if entry.at_cap and entry.private is not None:   # (it fills private blocks only:
                if end > entry.num_filled:                  # new, no hash asked)
                    num_private += end - entry.num_filled
                continue
            if entry.private is not None:
                cap = self._registration_cap(entry, seq)
                num_private += max(0, end - max(cap, entry.num_filled))
                end = min(end, cap)
            if end > entry.num_cached:
                found += seq.block_hashes(entry.num_cached, end)
        return len(set(found)) == len(found) and self.pool.takes_new_fills(found, num_new,
                                                                           num_private)

    def open_blocks(self, sequences: Sequence, fills_before: list[int] | None = None
                    ) -> list[int]:
        """Give each of ``sequences`` (in this order; one may come again) its next block, as
        its decode step crossing a block boundary would by :meth:`allocate`. Blocks filled
        meanwhile are registered by the request's next :meth:`allocate` (see
        :meth:`opens_blocks_in_bulk`); ``fills_before``: for a pool that counts them, how
        many were filled before each new block and are not registered yet. Returns the
        blocks in that order."""
        pool, entries = self.pool, self._requests
        if self._scored:
            for seq in dict.fromkeys(sequences):
                pool.begin(seq.request_id, getattr(seq, "priority", 0))
        blocks = (pool.get_new_blocks(len(sequences)) if fills_before is None
                  else pool.get_new_blocks(len(sequences), fills_before))
        for seq, block_id in zip(sequences, blocks):
            entries[seq.request_id].block_ids.append(block_id)
        prio = getattr(pool, "prio", None) if self._scored else None
        if prio is not None:    # a new block takes the priority of the request it went to
            for seq, block_id in zip(sequences, blocks):
                prio[block_id] = getattr(seq, "priority", 0)
        return blocks
