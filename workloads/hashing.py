"""Block identities live in :mod:`kvsim.identity` (shared with :mod:`kvsim.cache`); this name is
kept so older imports keep working."""

from kvsim.identity import (ROOT_HASH, block_ids, expand_prefix_hashes,  # noqa: F401
                            hash_token_blocks, mix, unique_block_ids)
