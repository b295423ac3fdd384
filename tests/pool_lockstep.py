"""A pool run in lockstep with a reference pool: every call that changes a pool is made on both,
and every allocation must give the same blocks (tests compare a policy's fast pool with the
scored pool, the definition of its victims, over a whole simulation)."""


def lockstep_pool(pool_class, reference, shared=("prio",)):
    """A subclass of ``pool_class`` whose instances build ``reference(num_blocks, caching)``
    beside themselves and repeat every change on it, checking each allocation; ``shared``: the
    per-block lists the reference reads from this pool (the priority marks a decode run's new
    blocks get directly, the reuse marks of the lanes)."""

    class Lockstep(pool_class):
        def __init__(self, num_blocks, enable_caching=True, policy=None):
            super().__init__(num_blocks, enable_caching, policy)
            self.reference = reference(num_blocks, enable_caching)
            for name in shared:
                setattr(self.reference, name, getattr(self, name))
            self.num_checked = self.num_copies = 0

        def get_new_blocks(self, n, *more):
            got = super().get_new_blocks(n, *more)
            expected = self.reference.get_new_blocks(n)
            assert got == expected, f"allocation {self.num_checked}: {got} != {expected}"
            self.num_checked += 1
            return got

        def touch(self, block_ids):
            block_ids = list(block_ids)
            super().touch(block_ids)
            self.reference.touch(block_ids)

        def free_blocks(self, block_ids):
            block_ids = list(block_ids)
            super().free_blocks(block_ids)
            self.reference.free_blocks(block_ids)

        def cache_blocks(self, block_ids, block_hashes, depth=0, parent=None, **mark):
            block_ids, block_hashes = list(block_ids), list(block_hashes)
            self.num_copies += sum(h in self.index._map for h in block_hashes)
            super().cache_blocks(block_ids, block_hashes, depth, parent, **mark)
            self.reference.cache_blocks(block_ids, block_hashes, depth, parent)

        def cache_unreachable(self, block_ids, parent=None, chain_mark=None):
            block_ids = list(block_ids)
            super().cache_unreachable(block_ids, parent, chain_mark)
            self.reference.cache_unreachable(block_ids, parent)

        def begin(self, request_id, priority=0):
            super().begin(request_id, priority)
            self.reference.begin(request_id, priority)

    return Lockstep
