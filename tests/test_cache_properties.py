"""Stateful property test: random admit (lookup + allocate) / grow / free / lookup / reset sequences
on small pools, checked after every step against the manager's own invariants and against a
plain-list reference model of vLLM v1's block pool (free order, reference counts, what is cached
and which copy a lookup finds).

Token ids come from a two-letter vocabulary and new prompts often extend earlier ones, so prefixes
collide, blocks are shared, evicted and re-hashed all the time.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from kvsim.cache import KVCacheManager

VOCAB = st.integers(0, 1)


class Model:
    """vLLM v1's block pool with lists and dicts, no cleverness: the oracle."""

    def __init__(self, n: int, bs: int, caching: bool, max_len: int | None):
        self.n, self.bs, self.caching, self.max_len = n, bs, caching, max_len
        self.queue = list(range(n))                  # head first
        self.refs = [0] * n
        self.content: dict[int, tuple] = {}          # cached block -> the prefix it ends
        self.copies: dict[tuple, list[int]] = {}     # prefix -> cached blocks, oldest first
        self.tables: dict[int, list[int]] = {}
        self.slots: dict[int, int] = {}

    def lookup(self, prompt) -> list[int]:
        if not self.caching:
            return []
        found = []
        for i in range((len(prompt) - 1) // self.bs):
            blocks = self.copies.get(tuple(prompt[:(i + 1) * self.bs]))
            if not blocks:
                break
            found.append(blocks[0])
        return found

    def _uncache(self, b: int) -> None:
        prefix = self.content.pop(b)
        self.copies[prefix].remove(b)
        if not self.copies[prefix]:
            del self.copies[prefix]

    def allocate(self, rid, tokens, num_new: int, hit: list[int]):
        table = self.tables.get(rid, [])
        slots = self.slots.get(rid, 0) + len(hit) * self.bs + num_new
        if self.max_len is not None:
            slots = min(slots, self.max_len)
        num_new_blocks = max(-(-slots // self.bs) - len(table) - len(hit), 0)
        if num_new_blocks + sum(self.refs[b] == 0 for b in hit) > len(self.queue):
            return None
        for b in hit:
            if self.refs[b] == 0:
                self.queue.remove(b)
            self.refs[b] += 1
        new = self.queue[:num_new_blocks]
        del self.queue[:num_new_blocks]
        for b in new:
            if b in self.content:
                self._uncache(b)
            self.refs[b] = 1
        table = table + hit + new
        self.tables[rid], self.slots[rid] = table, slots
        if self.caching:
            for j in range(min(slots, len(tokens)) // self.bs):
                b = table[j]
                if b not in self.content:
                    prefix = tuple(tokens[:(j + 1) * self.bs])
                    self.content[b] = prefix
                    self.copies.setdefault(prefix, []).append(b)
        return new

    def free(self, rid) -> None:
        first, last = [], []
        for b in reversed(self.tables.pop(rid)):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                (last if b in self.content else first).append(b)
        self.slots.pop(rid)
        self.queue = first + self.queue + last

    def reset(self) -> bool:
        if any(self.refs):
            return False
        self.content.clear()
        self.copies.clear()
        return True


class CacheMachine(RuleBasedStateMachine):

    @initialize(n=st.integers(1, 16), bs=st.integers(1, 4),
                caching=st.sampled_from([True, True, True, False]),
                max_len=st.none() | st.integers(1, 24))
    def setup(self, n, bs, caching, max_len):
        self.m = KVCacheManager(num_blocks=n, block_size=bs, enable_prefix_caching=caching,
                                max_model_len=max_len)
        self.model = Model(n, bs, caching, max_len)
        self.tokens: dict[int, list[int]] = {}       # running request -> its tokens so far
        self.seen: list[list[int]] = [[]]            # prompts to extend, for prefix collisions
        self.next_id = 0

    # --- helpers -------------------------------------------------------------------------

    def snapshot(self):
        m = self.m
        return (m.free_queue(), m.num_free_blocks,
                [m.ref_count(b) for b in range(m.num_blocks)],
                [m.is_cached(b) for b in range(m.num_blocks)],
                {r: (m.block_ids(r), m.num_slots(r)) for r in self.tokens},
                m.pool.num_cached_free_blocks, len(m.pool.index))

    def check_hit(self, prompt, hit):
        bs = self.model.bs
        assert len(hit.block_ids) <= (len(prompt) - 1) // bs if prompt else not hit.block_ids
        assert hit.num_tokens == len(hit.block_ids) * bs
        for i, b in enumerate(hit.block_ids):
            # never a block whose content was evicted: it must end exactly this prefix
            assert self.model.content.get(b) == tuple(prompt[:(i + 1) * bs])
            assert self.m.is_cached(b)
        assert hit.block_ids == self.model.lookup(prompt)

    def pick(self, i: int) -> int:
        return sorted(self.tokens)[i % len(self.tokens)]

    def allocate(self, rid, tokens, num_new, hit, **kw):
        before = self.snapshot()
        got = self.m.allocate(rid, tokens, num_new, hit, **kw)
        want = self.model.allocate(rid, tokens, num_new, hit.block_ids if hit else [])
        assert got == want
        if got is None:
            assert self.snapshot() == before
        return got

    # --- rules ---------------------------------------------------------------------------

    @rule(base=st.integers(0, 10**6), cut=st.integers(0, 64),
          tail=st.lists(VOCAB, max_size=10), chunk=st.integers(0, 64), record=st.booleans())
    def admit(self, base, cut, tail, chunk, record):
        prefix = self.seen[base % len(self.seen)]
        prompt = prefix[:cut] + tail
        if not prompt:
            return
        before = self.snapshot()
        hit = self.m.lookup(prompt)
        assert self.snapshot() == before                  # lookup has no side effects
        self.check_hit(prompt, hit)
        if record:
            self.m.record_query(len(prompt), hit)
        remaining = len(prompt) - hit.num_tokens
        num_new = remaining if chunk == 0 else min(chunk, remaining)   # sometimes chunked
        rid = self.next_id
        self.next_id += 1
        if self.allocate(rid, prompt, num_new, hit) is not None:
            self.tokens[rid] = list(prompt)
            self.seen.append(list(prompt))
        else:
            assert not self.m.has_request(rid)

    @precondition(lambda self: self.tokens)
    @rule(i=st.integers(0, 100), more=st.lists(VOCAB, max_size=5), step=st.integers(1, 8),
          explicit=st.booleans())
    def grow(self, i, more, step, explicit):
        """A running request gains tokens (decode, or the next prefill chunk) and slots."""
        rid = self.pick(i)
        tokens = self.tokens[rid]
        tokens.extend(more)
        pending = len(tokens) - self.m.num_slots(rid)
        if pending <= 0:
            return
        # the computed-token count may be passed explicitly (as vLLM's num_computed_tokens)
        kw = {"num_computed_tokens": self.m.num_slots(rid)} if explicit else {}
        got = self.allocate(rid, tokens, min(step, pending), None, **kw)
        if got is not None:
            self.seen.append(list(tokens))
        self.seen = self.seen[-32:]

    @precondition(lambda self: self.tokens)
    @rule(i=st.integers(0, 100))
    def free(self, i):
        rid = self.pick(i)
        self.m.free(rid)
        self.model.free(rid)
        del self.tokens[rid]
        assert not self.m.has_request(rid)

    @rule(base=st.integers(0, 10**6), tail=st.lists(VOCAB, max_size=6))
    def lookup(self, base, tail):
        prompt = self.seen[base % len(self.seen)] + tail
        before = self.snapshot()
        self.check_hit(prompt, self.m.lookup(prompt))
        assert self.snapshot() == before

    @rule()
    def reset(self):
        assert self.m.reset_prefix_cache() == self.model.reset()

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def every_block_is_free_or_held_never_both(self):
        m = self.m
        queue = m.free_queue()
        assert len(queue) == len(set(queue)) == m.num_free_blocks
        held = {b for b in range(m.num_blocks) if m.ref_count(b) > 0}
        assert held.isdisjoint(queue)
        assert held | set(queue) == set(range(m.num_blocks))

    @invariant()
    def ref_counts_equal_holders(self):
        m = self.m
        holders = [0] * m.num_blocks
        for rid in self.tokens:
            table = m.block_ids(rid)
            assert len(table) == len(set(table))
            for b in table:
                holders[b] += 1
        assert [m.ref_count(b) for b in range(m.num_blocks)] == holders

    @invariant()
    def index_matches_cached_blocks(self):
        pool = self.m.pool
        hashed = [b for b in range(pool.num_blocks) if pool.is_cached(b)]
        entries = sum(1 if isinstance(v, int) else len(v) for v in pool.index._map.values())
        assert entries == len(hashed)
        assert pool.index.num_shared_hashes == sum(
            not isinstance(v, int) for v in pool.index._map.values())
        assert len(pool.index) == len({pool.block_hashes[b] for b in hashed})
        for b in hashed:
            assert pool.cached_block(pool.block_hashes[b]) is not None
        free_cached = sum(1 for b in pool.free_queue() if pool.is_cached(b))
        assert pool.num_cached_free_blocks == free_cached
        if not self.m.enable_prefix_caching:
            assert hashed == []

    @invariant()
    def empty_free_blocks_come_first_while_the_pool_counts_on_it(self):
        pool = self.m.pool
        if pool._empty_first:
            cached = [pool.is_cached(b) for b in pool.free_queue()]
            assert cached == sorted(cached)     # (False, the empty ones, first)

    @invariant()
    def matches_the_reference_model(self):
        m, model = self.m, self.model
        assert m.free_queue() == model.queue
        assert [m.ref_count(b) for b in range(m.num_blocks)] == model.refs
        assert {b for b in range(m.num_blocks) if m.is_cached(b)} == set(model.content)
        for rid in self.tokens:
            assert m.block_ids(rid) == model.tables[rid]
            assert m.num_slots(rid) == model.slots[rid]


CacheMachine.TestCase.settings = settings(
    max_examples=250, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_cache_machine = CacheMachine.TestCase
