"""Eviction policies: which free cached block a pool gives up, and the chain property."""

import random

import pytest

from kvsim.cache import BlockPool, KVCacheManager
from kvsim.cache.scored_pool import ScoredBlockPool
from kvsim.cache.eviction import make_policy, make_pool
from kvsim.cache.policies import POLICY_NAMES, BeladyOracle


class Prompt:
    """Tokens known by block hashes, with a priority (as a scheduler's Sequence)."""

    def __init__(self, hashes, num_tokens, priority=0):
        self.hashes, self.n, self.priority = list(hashes), num_tokens, priority

    def __len__(self):
        return self.n

    def block_hashes(self, start, end):
        return self.hashes[start:end]


def serve(m: KVCacheManager, rid, hashes, priority=0):
    """Look up, allocate (one extra token: the last block stays unhashed-free), free."""
    prompt = Prompt(hashes, len(hashes) * 4 + 1, priority)
    hit = m.lookup(prompt)
    assert m.allocate(rid, prompt, len(prompt) - hit.num_tokens, hit) is not None
    m.free(rid)
    return hit.num_tokens // 4


def manager(policy, num_blocks=4, oracle=None):
    return KVCacheManager(num_blocks, 4, policy=make_policy(policy, oracle))


# --- the lru policy is vLLM's code path -----------------------------------------------------

def test_lru_is_the_plain_pool_and_others_are_scored():
    assert type(make_pool(4, policy=make_policy("lru"))) is BlockPool
    assert type(BlockPool(4)) is BlockPool
    assert type(make_pool(4, policy=make_policy("lfu"))) is ScoredBlockPool


class ReferenceQueue:
    """vLLM's free queue as a plain list (docs/vllm-semantics.md 3.3-3.5)."""

    def __init__(self, n):
        self.queue, self.refs, self.hashed = list(range(n)), [0] * n, [False] * n

    def take(self, k):
        taken, self.queue = self.queue[:k], self.queue[k:]
        for b in taken:
            self.refs[b], self.hashed[b] = 1, False
        return taken

    def touch(self, blocks):
        for b in blocks:
            if self.refs[b] == 0:
                self.queue.remove(b)
            self.refs[b] += 1

    def free(self, blocks):
        first, last = [], []
        for b in blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                (last if self.hashed[b] else first).append(b)
        self.queue = first + self.queue + last


def test_lru_policy_pool_keeps_vllms_free_queue_order_exactly():
    rng = random.Random(7)
    pool, ref = make_pool(12, policy=make_policy("lru")), ReferenceQueue(12)
    held: list[list[int]] = []
    for step in range(3000):
        op = rng.random()
        if op < 0.4 and pool.num_free_blocks:
            k = rng.randint(1, pool.num_free_blocks)
            blocks = pool.get_new_blocks(k)
            assert blocks == ref.take(k)
            hashed = blocks[:rng.randint(0, k)]
            pool.cache_blocks(hashed, [rng.randrange(30) for _ in hashed])
            for b in hashed:
                ref.hashed[b] = True
            held.append(blocks)
        elif op < 0.6 and pool.num_cached_free_blocks:
            cached = [b for b in pool.free_queue() if pool.is_cached(b)]
            pick = rng.sample(cached, rng.randint(1, len(cached)))
            pool.touch(pick)
            ref.touch(pick)
            held.append(pick)
        elif held:
            blocks = held.pop(rng.randrange(len(held)))
            pool.free_blocks(reversed(blocks))
            ref.free(list(reversed(blocks)))
        assert pool.free_queue() == ref.queue, step


# --- each policy's victim, as a story ---------------------------------------------------------

def test_every_policy_reuses_unhashed_free_blocks_before_cached_ones():
    for name in ("lfu", "priority", "hybrid"):
        m = manager(name, num_blocks=6)
        serve(m, "a", [1, 2])              # blocks 0, 1 cached, 2 unhashed free
        serve(m, "b", [3])                 # takes 2 (unhashed), then 3 for its last token
        assert m.lookup(Prompt([1, 2], 9)).num_tokens == 8, name


def test_lfu_keeps_the_block_with_more_hits():
    m = manager("lfu", num_blocks=3)       # one block for content, one for the partial tail
    serve(m, "a", [1])
    assert serve(m, "b", [1]) == 1          # block of 1 now has one hit
    serve(m, "c", [2])                      # 2 needs a block: the unhashed tail is used
    serve(m, "d", [3])                      # evicts 2 (0 hits), not 1 (1 hit, older)
    assert serve(m, "e", [1]) == 1


def test_lru_would_evict_the_older_block_in_the_same_story():
    m = manager("lru", num_blocks=3)
    for rid, h in (("a", [1]), ("b", [1]), ("c", [2]), ("d", [3])):
        serve(m, rid, h)
    assert serve(m, "e", [1]) == 0


def test_priority_evicts_the_worst_priority_first_even_if_more_recent():
    m = manager("priority", num_blocks=3)
    serve(m, "a", [1], priority=0)
    serve(m, "b", [2], priority=1)          # more recent, but priority 1
    serve(m, "c", [3], priority=1)          # evicts 2
    assert serve(m, "d", [1]) == 1
    assert serve(m, "e", [2]) == 0


def test_priority_of_a_block_is_the_best_of_its_users():
    m = manager("priority", num_blocks=3)
    serve(m, "a", [1], priority=5)
    serve(m, "b", [1], priority=0)          # a hit by a priority-0 request: block is class 0
    serve(m, "c", [2], priority=1)
    serve(m, "d", [3], priority=1)          # evicts 2 (class 1), keeps 1 (class 0)
    assert serve(m, "e", [1]) == 1


def test_hybrid_does_not_pin_the_deep_tail_of_a_one_off_prompt():
    m = manager("hybrid", num_blocks=5)     # 3 + 1 content blocks and one for the tails
    serve(m, "a", [1, 2, 3])                # leaf 3 at depth 2, same worth as leaf 4
    serve(m, "b", [4])
    serve(m, "c", [5])                      # evicts 3 (released first), as LRU does
    assert serve(m, "d", [4]) == 1
    assert serve(m, "e", [1, 2, 3]) == 2


def test_hybrid_keeps_a_continued_chain_over_a_newer_one_off_prompt():
    m = manager("hybrid", num_blocks=6)
    serve(m, "a", [1, 2])
    assert serve(m, "b", [1, 2, 3]) == 2    # continues a's prompt: the chain is reused
    serve(m, "c", [7])
    serve(m, "d", [8])                      # evicts 7 (LRU would evict the leaf 3)
    assert serve(m, "e", [1, 2, 3]) == 3


def test_hybrid_key_is_the_release_clock_plus_lifetimes_of_worth():
    pool = make_pool(8, policy=make_policy("hybrid"))
    pool.begin("r", priority=1)
    blocks = pool.get_new_blocks(2)
    pool.cache_blocks(blocks, [11, 12])
    pool.free_blocks([blocks[1], blocks[0]])
    assert pool.key_of(blocks[1]) == (1 - 8, 1) and pool.key_of(blocks[0]) == (2 - 8, 2)
    pool.begin("s", priority=-1)
    pool.touch(blocks)                      # a 2-block hit: the chain is reused
    pool.free_blocks([blocks[1], blocks[0]])
    assert pool.key_of(blocks[1]) == (3 + 8 // 2 + 8 * 1, 3)   # reused, and priority -1 now
    assert pool.key_of(blocks[0]) == (4 + 8 * 1, 4)         # the shared first block: not reused


def test_belady_evicts_the_block_used_farthest_in_the_future():
    trace = [[1], [2], [3], [1], [2]]       # at request 2, 1 is next used at 3, 2 at 4
    oracle = BeladyOracle.from_hashes(trace, [1] * 5, range(5))
    m = manager("belady", num_blocks=3, oracle=oracle)
    hits = [serve(m, i, h) for i, h in enumerate(trace)]
    assert hits == [0, 0, 0, 1, 0]


def test_belady_needs_an_oracle_and_unknown_names_are_refused():
    with pytest.raises(ValueError, match="oracle"):
        make_policy("belady")
    with pytest.raises(ValueError, match="unknown eviction policy"):
        make_policy("fifo")


# --- chain property and bookkeeping, for every policy, over random operations ----------------

def random_chains(rng, n_requests):
    """Prompts cut from a few chained 'documents', so prefixes are shared."""
    docs = [[(d, i) for i in range(12)] for d in range(4)]
    parent = {}
    prompts = []
    for _ in range(n_requests):
        doc = rng.choice(docs)
        shared = doc[:rng.randint(0, len(doc))]
        own = [(id(object()), rng.random(), i) for i in range(rng.randint(0, 4))]
        chain = [hash(x) for x in shared + own] or [hash(rng.random())]
        for a, b in zip([None] + chain, chain):
            parent[b] = a
        prompts.append(chain)
    return prompts, parent




def check_invariants(m: KVCacheManager, parent):
    pool = m.pool
    for block_hash in pool.index._map:
        assert (parent[block_hash] is None or parent[block_hash] in pool.index._map
                or m.pool.policy.name in ("arc", "s3fifo"))
    free = [b for b in range(pool.num_blocks) if pool.ref_counts[b] == 0]
    assert pool.num_free_blocks == len(free) == len(pool.free_queue())
    assert sorted(pool.free_queue()) == free
    assert pool.num_cached_free_blocks == sum(1 for b in free if pool.is_cached(b))
    assert pool.index.num_shared_hashes == sum(
        not isinstance(v, int) for v in pool.index._map.values())


@pytest.mark.parametrize("name", POLICY_NAMES)
@pytest.mark.parametrize("seed", range(6))
def test_chain_property_holds_under_random_operations(name, seed):
    rng = random.Random(seed)
    prompts, parent = random_chains(rng, 120)
    oracle = BeladyOracle.from_hashes(prompts, [len(p) for p in prompts], range(len(prompts)))
    m = manager(name, num_blocks=rng.randint(20, 40), oracle=oracle)
    running = []
    for rid, chain in enumerate(prompts):
        prompt = Prompt(chain, len(chain) * 4 + rng.choice([0, 1, 3]), rng.randint(0, 2))
        hit = m.lookup(prompt)
        while m.allocate(rid, prompt, len(prompt) - hit.num_tokens, hit) is None:
            m.free(running.pop(rng.randrange(len(running))))
            hit = m.lookup(prompt)
        running.append(rid)
        while running and rng.random() < 0.5:
            m.free(running.pop(rng.randrange(len(running))))
        check_invariants(m, parent)
    for rid in running:
        m.free(rid)
    check_invariants(m, parent)
    assert m.reset_prefix_cache() and m.num_free_blocks == m.num_blocks
