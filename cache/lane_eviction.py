"""Evicting from the FIFO lanes of a :class:`~kvsim.cache.lane_pool.LanePool`.

:class:`LaneEviction`, a base of the lane pool, takes the next victims: the older of the two
lanes' heads (the credited lane's clocks counting its offset more), runs of blocks past their
chain's second block taken as one slice, a chain's first block deferred while its content has
cached children (:meth:`LanePool._defers`) and taken as soon as the last of them goes; with
more lanes (priorities), the smallest head by offset. The lanes, the chain rule's state and
the hooks a subclass may change (:meth:`LaneEviction._second_lanes`,
:meth:`LaneEviction._defers_head`, :meth:`LaneEviction._next_after_lanes`: lookahead's
protected blocks) belong to the pool; this is the hottest loop of these policies.
"""

from __future__ import annotations

from kvsim.cache.bulk import set_all
from kvsim.cache.lane import Lane
from kvsim.cache.policy_pool import UNREACHABLE

__all__ = ["LaneEviction"]

_NO_LANE = Lane()      # always empty: the credited lane of a pool without credit


class LaneEviction:
    """The eviction of a lane pool (see the module docstring)."""

    def _evict_many(self, n: int) -> list[int]:
        """The next ``n`` victims, uncached and taken: the older of the two lanes' heads (the
        credited lane's clocks counting its offset more) while either has one, then in the
        same way from :meth:`_second_lanes` while they can go so, then
        :meth:`_next_after_lanes`; a first block with cached children is deferred, and taken
        next when the last of them goes. With other lanes (priorities): :meth:`_next_by_offset`
        picks each."""
        self.num_cached_free_blocks -= n
        self.num_evictions += n
        if not self._two_lanes:
            return [self._uncache(self._next_by_offset()) for _ in range(n)]
        plain, credited, credit = self._plain, self._credited, self.credit
        if credited is plain:
            credited = _NO_LANE
        hashes, index, refs, was_hit = (self.block_hashes, self.index._map, self.ref_counts,
                                        self.was_hit)
        depth, evicted = self._depth, self.evicted
        head_plain, head_credited = plain.popleft(), credited.popleft()
        victims, left, woken, second = [], n, None, False
        while left:
            if woken is not None:
                block_id, woken = woken, None
                del self._deferred[block_id]
            elif head_plain is not None and (head_credited is None
                                             or head_plain[1] < head_credited[1] + credit):
                block_id, clock = head_plain
                if depth[block_id] == 2 and left > 1:       # a run of such blocks at once
                    left -= self._evict_run(plain, block_id, left, victims, False,
                                            head_credited and head_credited[1] + credit)
                    head_plain = plain.popleft()
                    continue
                head_plain = plain.popleft()
                if not depth[block_id] and self._defers_head(block_id, second, 0, clock):
                    continue
            elif head_credited is not None:
                block_id, clock = head_credited
                if depth[block_id] == 2 and left > 1:
                    left -= self._evict_run(credited, block_id, left, victims, True,
                                            head_plain and head_plain[1] - credit)
                    head_credited = credited.popleft()
                    continue
                head_credited = credited.popleft()
                if not depth[block_id] and self._defers_head(block_id, second, credit, clock):
                    continue
            elif not second and (lanes := self._second_lanes()) is not None:
                second, (plain, credited) = True, lanes
                head_plain, head_credited = plain.popleft(), credited.popleft()
                continue
            else:
                block_id = self._next_after_lanes()
            # uncache (as _uncache, inlined: the hottest loop of these policies)
            block_hash = hashes[block_id]
            if block_hash is not UNREACHABLE:
                if evicted is not None:
                    evicted.append((block_id, block_hash))
                if index[block_hash].__class__ is int:
                    del index[block_hash]
                else:
                    self.index.remove(block_hash, block_id)
            hashes[block_id] = None
            refs[block_id] = 1
            was_hit[block_id] = 0
            victims.append(block_id)
            left -= 1
            if depth[block_id] != 2:
                if depth[block_id] == 1:
                    woken = self._child_gone(self.first_hashes[block_id])
                    if second and woken is None and self._second_lanes() is None:
                        self._put_back((plain, head_plain), (credited, head_credited))
                        head_plain = head_credited = None   # (the rest: _next_after_lanes)
                depth[block_id] = 2
        self._put_back((plain, head_plain), (credited, head_credited))
        if woken is not None:
            self._wake(woken)
        return victims

    def _evict_run(self, lane: Lane, first: int, left: int, victims: list[int],
                   inclusive: bool, bound: int | None) -> int:
        """Evict ``first`` (the head just popped off ``lane``, a block past its chain's
        second) and the lane's next blocks that would be the next victims one by one, in
        order; returns how many. Those are the blocks past their chain's second block too
        (their eviction wakes nobody) keyed before the other lane's head (their clocks below
        ``bound``, or at most ``bound`` if ``inclusive``; None when that lane is empty): at
        most ``left`` in all."""
        run = [first]
        run += lane.take_run(left - 1, bound, inclusive, self._depth)
        self._uncache_many(run)
        set_all(self.was_hit, run, 0)
        victims.extend(run)
        return len(run)

    @staticmethod
    def _put_back(*lanes_and_heads) -> None:
        """Heads popped but not taken go back to the front of their lanes."""
        for lane, head in lanes_and_heads:
            if head is not None:
                lane.appendleft(*head)

    def _second_lanes(self) -> tuple | None:
        """A second pair of lanes (plain, credited) to evict from as from the first once those
        are empty, or None (with them, :meth:`_next_after_lanes`). Lookahead gives its
        protected blocks' lanes while it has no protected block outside them."""
        return None

    def _defers_head(self, block_id: int, second: bool, offset: int, clock: int) -> bool:
        """:meth:`_defers` for a lane's head (of a :meth:`_second_lanes` lane if ``second``)."""
        return self._defers(block_id, offset, clock)

    def _uncache(self, block_id: int) -> int:
        """Evict free cached ``block_id`` (uncached and taken); returns it."""
        block_hash = self.block_hashes[block_id]
        if block_hash is not UNREACHABLE:
            if self.evicted is not None:
                self.evicted.append((block_id, block_hash))
            self.index.remove(block_hash, block_id)
        self.block_hashes[block_id] = None
        self.ref_counts[block_id] = 1
        self.was_hit[block_id] = 0
        if self._depth[block_id] == 1:
            woken = self._child_gone(self.first_hashes[block_id])
            if woken is not None:
                self._wake(woken)
        self._depth[block_id] = 2
        return block_id

    def _next_by_offset(self) -> int:
        """The smallest eligible lane head by ``(clock + offset, -offset)``, taken out of its
        lane; then :meth:`_next_after_lanes`."""
        while True:
            heads = [(lane.head(), offset) for offset, lane in self._lanes.items() if lane]
            if not heads:
                return self._next_after_lanes()
            (block_id, clock), offset = min(heads, key=lambda h: (h[0][1] + h[1], -h[1]))
            self._lanes[offset].popleft()
            if self._depth[block_id] or not self._defers(block_id, offset, clock):
                return block_id

    def _next_after_lanes(self) -> int:
        """With every lane empty: the smallest deferred first block goes anyway (hashes that
        are not chained), its children still counted by hash."""
        block_id = min(self._deferred, key=lambda b: (self.key_of(b), b))
        del self._deferred[block_id]
        return block_id
