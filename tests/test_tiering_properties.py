"""Random operation sequences on a tiered cache, checked against the data the copies move.

A model of memory follows every step: the copies of ``take_transfers`` are applied in order
(each one reads all its sources before writing), then the forward pass writes the tokens each
allocation asked for. A block's content is the token prefix its KV depends on. After every step:

- every block of a running request holds that request's prefix;
- every block the GPU prefix index names, and every block the host index names, holds exactly
  the content of its hash (no lookup can ever return stale data);
- a swapped-out request's host blocks hold its computed tokens;
- reference counts equal the block tables' uses, and the pools conserve their blocks.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.cache.host_tier import HostTier
from kvsim.cache.eviction import make_policy
from kvsim.cache.step_plan import HOST_TO_DEVICE, OFFLOAD, PROMOTE, SWAP_IN, SWAP_OUT
from kvsim.cache.tiered import TieredKVCacheManager
from kvsim.workloads.identity import ROOT_HASH, hash_token_blocks

BS = 4
PREFIXES = [list(range(1000 * p, 1000 * p + 8)) for p in range(3)]


class Memory:
    """What each GPU and host block really holds, and what each hash must hold."""

    def __init__(self, gpu: int, host: int):
        self.gpu, self.host = [None] * gpu, [None] * host
        self.content_of: dict[int, tuple] = {}

    def learn(self, tokens: list[int]) -> None:
        for i, h in enumerate(hash_token_blocks(tokens, BS, ROOT_HASH).tolist()):
            self.content_of[h] = tuple(tokens[:(i + 1) * BS])

    def apply(self, transfers) -> None:
        for t in transfers:
            src, dst = ((self.host, self.gpu) if t.kind in HOST_TO_DEVICE
                        else (self.gpu, self.host))
            assert t.kind in (OFFLOAD, PROMOTE, SWAP_IN, SWAP_OUT)
            assert len({d for _, d in t.pairs}) == len(t.pairs)
            values = [src[s] for s, _ in t.pairs]
            for (_, d), v in zip(t.pairs, values):
                dst[d] = v

    def forward(self, block_ids, tokens, start: int, end: int) -> None:
        """Write tokens ``start..end-1`` into the request's blocks."""
        for i in range(start // BS, (end - 1) // BS + 1):
            self.gpu[block_ids[i]] = tuple(tokens[:min((i + 1) * BS, end)])


class World:
    def __init__(self, gpu, host, policy, write):
        self.m = TieredKVCacheManager(gpu, BS, host=HostTier(host, make_policy(policy)),
                                      policy=make_policy(policy), write=write)
        self.mem = Memory(gpu, host)
        self.tokens: dict[int, list[int]] = {}     # running or swapped requests
        self.computed: dict[int, int] = {}
        self.next_id, self.next_token = 0, 10 ** 6

    def step(self, action, data) -> None:
        self.m.begin_step()
        written = getattr(self, action)(data)
        self.mem.apply(self.m.take_transfers())
        for rid, start in written:
            self.mem.forward(self.m.block_ids_ref(rid), self.tokens[rid], start,
                             self.computed[rid])
        self.check()

    # --- actions: each returns the (request, first new token) the forward pass writes --------

    def admit(self, data):
        prefix = PREFIXES[data.draw(st.integers(0, 2))]
        tail = [self._token() for _ in range(data.draw(st.integers(1, 9)))]
        tokens = prefix[:data.draw(st.sampled_from([0, 4, 8]))] + tail
        hit = self.m.lookup(tokens)
        rid = self.next_id
        self.next_id += 1
        if self.m.allocate(rid, tokens, len(tokens) - hit.num_tokens, hit) is None:
            return []
        self.mem.learn(tokens)
        self.tokens[rid], self.computed[rid] = tokens, len(tokens)
        return [(rid, hit.num_tokens)]

    def decode(self, data):
        rid = self._pick(data, swapped=False)
        if rid is None:
            return []
        self.tokens[rid].append(self._token())
        if self.m.allocate(rid, self.tokens[rid], 1) is None:
            self.tokens[rid].pop()
            return []
        self.mem.learn(self.tokens[rid])
        self.computed[rid] += 1
        return [(rid, self.computed[rid] - 1)]

    def finish(self, data):
        rid = self._pick(data, swapped=False)
        if rid is not None:
            self.m.free(rid)
            del self.tokens[rid], self.computed[rid]
        return []

    def swap_out(self, data):
        rid = self._pick(data, swapped=False)
        if rid is not None and self.m.can_swap_out(rid, self.computed[rid]):
            self.m.swap_out(rid, self.computed[rid])
        return []

    def swap_in(self, data):
        rid = self._pick(data, swapped=True)
        if rid is None:
            return []
        tokens = self.tokens[rid]
        tokens.append(self._token())
        hit = self.m.swapped_hit(tokens, rid)
        if self.m.allocate(rid, tokens, 1, hit) is None:
            tokens.pop()
            return []
        self.mem.learn(tokens)
        self.computed[rid] += 1
        return [(rid, self.computed[rid] - 1)]

    def _pick(self, data, swapped: bool):
        ids = sorted(r for r in self.tokens if self.m.is_swapped(r) == swapped)
        return data.draw(st.sampled_from(ids)) if ids else None

    def _token(self) -> int:
        self.next_token += 1
        return self.next_token

    # --- invariants ----------------------------------------------------------------------

    def check(self) -> None:
        m, mem = self.m, self.mem
        uses = [0] * m.num_blocks
        for rid, tokens in self.tokens.items():
            if m.is_swapped(rid):
                host_ids, n = m._swapped[rid]
                for i, h in enumerate(host_ids):
                    assert mem.host[h] == tuple(tokens[:min((i + 1) * BS, n)])
                continue
            blocks = m.block_ids(rid)
            for i, b in enumerate(blocks):
                uses[b] += 1
                assert mem.gpu[b] == tuple(tokens[:min((i + 1) * BS, self.computed[rid])])
        assert uses == list(m.pool.ref_counts)
        assert m.num_free_blocks == uses.count(0)
        for b, h in enumerate(m.pool.block_hashes):
            if h is not None:
                assert mem.gpu[b] == mem.content_of[h], f"GPU block {b} is stale"
        host = m.host.pool
        for b, h in enumerate(host.block_hashes):
            if h is not None:
                assert mem.host[b] == mem.content_of[h], f"host block {b} is stale"
        pinned = sum(len(m._swapped[r][0]) for r in self.tokens if m.is_swapped(r))
        assert m.host.num_pinned_blocks == pinned
        assert host.num_free_blocks + pinned == m.host.num_blocks


ACTIONS = ["admit", "admit", "decode", "decode", "finish", "swap_out", "swap_in"]


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(4, 12), st.integers(1, 10),
       st.sampled_from(["lru", "lfu", "priority", "hybrid", "arc", "s3fifo", "lookahead"]),
       st.sampled_from(["back", "through"]))
def test_every_lookup_and_copy_sees_the_right_data(data, gpu, host, policy, write):
    world = World(gpu, host, policy, write)
    for _ in range(data.draw(st.integers(5, 40))):
        world.step(data.draw(st.sampled_from(ACTIONS)), data)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.lists(st.tuples(st.sampled_from(["store", "hold", "release",
                                                                  "pin"]),
                                             st.integers(0, 12)), max_size=60))
def test_the_fast_lru_host_path_equals_the_generic_one(num_blocks, ops):
    """``BlockPool.put_cached``/``refresh`` (one step each) against the generic take, cache,
    release sequence of a scored pool given vLLM's LRU order explicitly."""
    from kvsim.cache.scored_pool import ScoredBlockPool
    from kvsim.cache.policies import LRUPolicy
    fast, slow = HostTier(num_blocks), HostTier(num_blocks)
    slow.pool = ScoredBlockPool(num_blocks, policy=LRUPolicy())
    held: list[list[int]] = []
    for op, x in ops:
        if op == "store":
            assert fast.store(x) == slow.store(x)
        elif op == "hold" and fast.can_hold(x % 3 + 1):
            assert fast.can_hold(x % 3 + 1) == slow.can_hold(x % 3 + 1)
            got = fast.hold(x % 3 + 1)
            assert got == slow.hold(x % 3 + 1)
            held.append(got)
        elif op == "release" and held:
            blocks = held.pop(x % len(held))
            fast.release(blocks)
            slow.release(blocks)
        elif op == "pin" and fast.find(x) is not None:
            fast.pin([fast.find(x)])
            slow.pin([slow.find(x)])
            fast.unpin([fast.find(x)])
            slow.unpin([slow.find(x)])
        assert fast.pool.free_queue() == slow.pool.free_queue()
        assert fast.pool.block_hashes == slow.pool.block_hashes
    assert fast.num_dropped_blocks == slow.num_dropped_blocks


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 8), st.sampled_from(["lru", "lfu", "arc"]),
       st.lists(st.tuples(st.sampled_from(["store", "hold", "release", "pin", "unpin"]),
                          st.lists(st.integers(0, 12), min_size=1, max_size=20)),
                max_size=30))
def test_storing_many_hashes_equals_storing_them_one_at_a_time(num_blocks, policy, ops):
    """``HostTier.store_many`` (runs of held hashes refreshed, runs of new ones put in one
    call) against ``store`` of each hash in turn, with swap space and pinned blocks taking
    host blocks from the free queue meanwhile."""
    many, one = (HostTier(num_blocks, make_policy(policy)) for _ in range(2))
    held, pinned = [], []
    for op, xs in ops:
        if op == "store":
            assert many.store_many(xs) == [one.store(x) for x in xs]
        elif op == "hold" and many.can_hold(len(xs) % 3 + 1):
            held.append(many.hold(len(xs) % 3 + 1))
            assert one.hold(len(xs) % 3 + 1) == held[-1]
        elif op == "release" and held:
            blocks = held.pop(xs[0] % len(held))
            many.release(blocks)
            one.release(blocks)
        elif op == "pin" and many.find(xs[0]) is not None:
            pinned.append([many.find(xs[0])])
            many.pin(pinned[-1])
            one.pin(pinned[-1])
        elif op == "unpin" and pinned:
            blocks = pinned.pop(xs[0] % len(pinned))
            many.unpin(blocks)
            one.unpin(blocks)
        assert many.pool.free_queue() == one.pool.free_queue()
        assert many.pool.block_hashes == one.pool.block_hashes
        assert many.pool.num_evictions == one.pool.num_evictions
    assert (many.num_stored_blocks, many.num_dropped_blocks) == \
        (one.num_stored_blocks, one.num_dropped_blocks)
