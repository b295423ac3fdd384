"""Steps of the small pool stories the eviction tests tell, one request each."""


def put(pool, block_hash):
    """A request fills one new block with ``block_hash`` and releases it."""
    block_id = pool.get_new_blocks(1)[0]
    pool.cache_block(block_id, block_hash)
    pool.free_blocks([block_id])
    return block_id


def use(pool, block_hash):
    """A request hits the cached block holding ``block_hash`` and releases it."""
    block_id = pool.index.get(block_hash)
    pool.touch([block_id])
    pool.free_blocks([block_id])
    return block_id
