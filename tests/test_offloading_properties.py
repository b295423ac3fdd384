"""Random operation sequences on vLLM-style offloading, checked against the data copies move.

The memory model of :mod:`test_tiering_properties` follows every step (copies applied in
order, then the forward pass writes what the allocations asked for). After every step:

- every block of a request holds that request's prefix (a CPU hit's blocks once loaded);
- every GPU block the prefix index names holds its hash's content, and so does every *ready*
  CPU block (a store is never loadable before its copy ran);
- CPU blocks are conserved (free + held = all, each id held once) and no load pins a block
  past the step after it;
- a CPU hit is never run in the step that loads it;
- a request whose prompt blocks the CPU had no room for is the one known to offer them again.
"""

from hypothesis import given, settings
from hypothesis import strategies as st
from test_tiering_properties import BS, PREFIXES, Memory

from kvsim.cache.offload_managers import make_offloading_manager
from kvsim.cache.offloading import OffloadingKVCacheManager
from kvsim.cache.eviction import make_policy


class World:
    def __init__(self, gpu, cpu, policy, cpu_policy, threshold):
        self.m = OffloadingKVCacheManager(
            gpu, BS, policy=make_policy(policy),
            offload=make_offloading_manager(cpu, cpu_policy, threshold))
        self.mem = Memory(gpu, cpu)
        self.tokens: dict[int, list[int]] = {}
        self.computed: dict[int, int] = {}
        self.prompt_blocks: dict[int, int] = {}
        self.loading: set[int] = set()
        self.next_id, self.next_token = 0, 10 ** 6

    def step(self, action, data) -> None:
        self.m.begin_step()
        self.loading.clear()
        written = getattr(self, action)(data)
        self.m.end_schedule([rid for rid, _ in written])
        self.mem.apply(self.m.take_transfers())
        for rid, start in written:
            assert rid not in self.loading
            self.mem.forward(self.m.block_ids_ref(rid), self.tokens[rid], start,
                             self.computed[rid])
        self.check()

    def admit(self, data):
        prefix = PREFIXES[data.draw(st.integers(0, 2))]
        tail = [self._token() for _ in range(data.draw(st.integers(1, 9)))]
        tokens = prefix[:data.draw(st.sampled_from([0, 4, 8]))] + tail
        hit = self.m.lookup(tokens)
        if hit.deferred:        # (a block it would hit is being stored or loaded)
            return []
        rid = self.next_id
        self.next_id += 1
        n = 0 if hit.load_async else len(tokens) - hit.num_tokens
        if self.m.allocate(rid, tokens, n, hit) is None:
            return []
        self.mem.learn(tokens)
        self.tokens[rid], self.computed[rid] = tokens, hit.num_tokens + n
        self.prompt_blocks[rid] = len(tokens) // BS
        if hit.load_async:
            self.computed[rid] = min(hit.num_tokens, len(tokens) - 1)
            self.loading.add(rid)
            return []
        return [(rid, hit.num_tokens)]

    def advance(self, data):
        """The rest of a loaded prompt, or one decode token."""
        rid = self._pick(data)
        if rid is None:
            return []
        tokens, start = self.tokens[rid], self.computed[rid]
        decode = start == len(tokens)
        if decode:
            tokens.append(self._token())
        if self.m.allocate(rid, tokens, len(tokens) - start,
                           num_computed_tokens=start) is None:
            if decode:
                tokens.pop()
            return []
        self.mem.learn(tokens)
        self.computed[rid] = len(tokens)
        return [(rid, start)]

    def finish(self, data):
        rid = self._pick(data)
        if rid is not None:
            self.m.free(rid)
            del self.tokens[rid], self.computed[rid]
            self.loading.discard(rid)
        return []

    def _pick(self, data):
        ids = sorted(r for r in self.tokens if r not in self.loading)
        return data.draw(st.sampled_from(ids)) if ids else None

    def _token(self) -> int:
        self.next_token += 1
        return self.next_token

    def check(self) -> None:
        m, mem = self.m, self.mem
        uses = [0] * m.num_blocks
        for rid, tokens in self.tokens.items():
            for i, b in enumerate(m.block_ids(rid)):
                uses[b] += 1
                assert mem.gpu[b] == tuple(tokens[:min((i + 1) * BS, self.computed[rid])])
        assert uses == list(m.pool.ref_counts)
        entries, state = m._requests, m._state      # prompt blocks the CPU had no room for
        assert m._unoffered == {
            rid for rid in self.tokens if rid in entries and rid not in self.loading
            and min(entries[rid].num_slots // BS, self.prompt_blocks[rid])
            > state[rid].next_stored}
        for b, h in enumerate(m.pool.block_hashes):
            if h is not None:
                assert mem.gpu[b] == mem.content_of[h], f"GPU block {b} is stale"
        cpu = m.offload
        held = [cpu.get(h).block_id for h in list(_hashes(cpu))]
        assert len(set(held)) == len(held) == cpu.num_cached_blocks
        for h in _hashes(cpu):
            block = cpu.get(h)
            assert block.ref_cnt <= (1 if self.loading else 0)
            if block.is_ready:
                assert mem.host[block.block_id] == mem.content_of[h], "stale CPU block"


def _hashes(cpu):
    return list(cpu.t1) + list(cpu.t2) if hasattr(cpu, "t1") else list(cpu.blocks)


ACTIONS = ["admit", "admit", "advance", "advance", "finish"]


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(4, 12), st.integers(1, 10),
       st.sampled_from(["lru", "lfu", "arc", "s3fifo"]), st.sampled_from(["lru", "arc"]),
       st.sampled_from([0, 2]))
def test_every_lookup_and_copy_sees_the_right_data(data, gpu, cpu, policy, cpu_policy,
                                                   threshold):
    world = World(gpu, cpu, policy, cpu_policy, threshold)
    for _ in range(data.draw(st.integers(5, 40))):
        world.step(data.draw(st.sampled_from(ACTIONS)), data)
