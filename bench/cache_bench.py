"""Block operations per second of the KV cache manager, for a small and a huge pool.

A block op is one block allocated, freed, touched (a prefix hit) or hashed (registered in the
prefix index). The workload is the same request stream for every run: prompts of 64..2048
tokens at block size 16, most of them starting with a shared prefix, each admitted with lookup +
allocate, then grown one decode token per step (``allocate`` called when a token opens or fills
a block, as kvsim's scheduler calls it), then freed. Requests are admitted while fewer than
``budget`` blocks are in use; a request whose decode block cannot be had is preempted (freed,
requeued), as vLLM does. Prompts are given as precomputed per-block hashes (a
``BlockHashSource``), as traces provide them.

Three runs:
- 1k blocks, budget 80%: ~12 requests running;
- 1M blocks, budget 80%: ~12k requests running, the pool cycles through eviction;
- 1M blocks, budget 800 blocks: the 1k run's concurrency on the 1M pool, which isolates what the
  pool size alone costs (the 80% run also pays for a 1000x larger working set of requests).

    python bench/cache_bench.py                 # ~8M block ops per run, ~30 s
    python bench/cache_bench.py --profile 1000  # cProfile one run
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import deque

from kvsim.cache import KVCacheManager

BLOCK_SIZE = 16


class Prompt:
    """A request's tokens known only by precomputed block hashes; ``n`` grows while decoding."""

    __slots__ = ("rid", "hashes", "prompt_len", "total_len", "n")

    def __init__(self, rid: int, hashes: list[int], prompt_len: int, total_len: int):
        self.rid, self.hashes = rid, hashes
        self.prompt_len, self.total_len, self.n = prompt_len, total_len, prompt_len

    def __len__(self) -> int:
        return self.n

    def block_hashes(self, start: int, end: int):
        return self.hashes[start:end]


def make_workload(num_requests: int, seed: int = 0) -> list[Prompt]:
    """Requests of 64..2048 prompt tokens and 16..256 output tokens; 80% start with a prefix
    (a whole-block cut of one of 200 shared 'documents' of up to 1536 tokens, a few of them
    hot); all other blocks are unique."""
    rng = random.Random(seed)
    docs = [[rng.getrandbits(62) | 1 << 62 for _ in range(96)] for _ in range(200)]
    unique = iter(range(1 << 62))
    out = []
    for rid in range(num_requests):
        prompt_len = rng.randint(64, 2048)
        total_len = prompt_len + rng.randint(16, 256)
        n_blocks = total_len // BLOCK_SIZE
        shared = []
        if rng.random() < 0.8:
            doc = docs[int(rng.paretovariate(1.2)) % len(docs)]     # a few hot documents
            shared = doc[:min(rng.randint(1, len(doc)), prompt_len // BLOCK_SIZE)]
        hashes = shared + [next(unique) for _ in range(n_blocks - len(shared))]
        out.append(Prompt(rid, hashes, prompt_len, total_len))
    return out


def run(num_blocks: int, requests: list[Prompt], budget: int | None = None) -> dict:
    """Drive one manager through the whole request stream, admitting while fewer than
    ``budget`` blocks (default 80% of the pool) are in use; return op counts and seconds."""
    for r in requests:
        r.n = r.prompt_len
    m = KVCacheManager(num_blocks=num_blocks, block_size=BLOCK_SIZE)
    bs = BLOCK_SIZE
    limit = int(num_blocks * 0.8) if budget is None else budget
    waiting = deque(requests)
    running: list[Prompt] = []
    alloc = touched = hashed = freed = preempted = steps = concurrency = 0
    lookup, allocate, free = m.lookup, m.allocate, m.free
    pool = m.pool

    c0, t0 = time.process_time(), time.perf_counter()
    while waiting or running:
        # admit while the pool is under `fill` used
        while waiting and pool.num_blocks - pool.num_free_blocks < limit:
            r = waiting[0]
            hit = lookup(r)
            new = allocate(r.rid, r, r.n - hit.num_tokens, hit)
            if new is None:
                break
            waiting.popleft()
            running.append(r)
            alloc += len(new)
            touched += len(hit.block_ids)
            hashed += r.n // bs - len(hit.block_ids)
        if not running:
            raise RuntimeError(f"request {waiting[0].rid} does not fit {num_blocks} blocks")
        # one decode step: every running request gets one more token
        steps += 1
        concurrency += len(running)
        still = []
        for r in running:
            r.n += 1
            if (r.n - 1) % bs and r.n % bs and r.n < r.total_len:
                # inside a block: nothing to allocate or register, and kvsim's scheduler
                # makes no call either (it passes num_computed_tokens on the next one)
                still.append(r)
                continue
            new = allocate(r.rid, r, 1, num_computed_tokens=r.n - 1)
            if new is None:                     # preempt: free, recompute later
                freed += -(-(r.n - 1) // bs)
                free(r.rid)
                r.n = r.prompt_len
                waiting.appendleft(r)
                preempted += 1
                continue
            if new:
                alloc += 1
            if r.n % bs == 0:
                hashed += 1
            if r.n >= r.total_len:
                freed += -(-r.n // bs)
                free(r.rid)
            else:
                still.append(r)
        running = still
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0

    assert pool.num_free_blocks == num_blocks
    ops = alloc + touched + hashed + freed
    return dict(blocks=num_blocks, budget=limit, ops=ops, alloc=alloc, touched=touched,
                hashed=hashed, freed=freed, preempted=preempted, steps=steps,
                running=concurrency / steps, seconds=seconds, cpu=cpu, ops_per_s=ops / seconds,
                ops_per_cpu_s=ops / cpu, evictions=pool.num_evictions)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=40_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=int, metavar="BLOCKS",
                   help="cProfile one run on a pool of BLOCKS blocks (80%% budget) instead")
    args = p.parse_args(argv)

    requests = make_workload(args.requests, args.seed)
    if args.profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.runcall(run, args.profile, requests)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return 0

    small = run(1_000, requests)
    big = run(1_000_000, requests)
    big_same = run(1_000_000, requests, budget=small["budget"])
    print(f"{'blocks':>9} {'budget':>7} {'running':>7} {'block ops':>10} {'alloc':>9} "
          f"{'hit':>9} {'hashed':>9} {'freed':>9} {'evicted':>9} {'preempt':>7} "
          f"{'wall s':>6} {'cpu s':>6} {'ops/s':>10} {'ops/cpu-s':>10}")
    for r in (small, big, big_same):
        print(f"{r['blocks']:>9,} {r['budget']:>7,} {r['running']:>7,.0f} {r['ops']:>10,} "
              f"{r['alloc']:>9,} {r['touched']:>9,} {r['hashed']:>9,} {r['freed']:>9,} "
              f"{r['evictions']:>9,} {r['preempted']:>7,} {r['seconds']:>6.2f} {r['cpu']:>6.2f} "
              f"{r['ops_per_s']:>10,.0f} {r['ops_per_cpu_s']:>10,.0f}")
    for label, other in (("1M @ 80% full", big), ("1M @ 1k's concurrency", big_same)):
        print(f"ratio 1k / {label}: {small['ops_per_s'] / other['ops_per_s']:.2f}x wall, "
              f"{small['ops_per_cpu_s'] / other['ops_per_cpu_s']:.2f}x cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
