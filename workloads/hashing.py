"""Block identities: 64-bit ids that name a block of KV by everything before and in it.

A block's id is a *prefix identity*: two requests hold equal ids at block ``i`` exactly when their
first ``(i + 1) * block_size`` tokens are equal (up to 64-bit collisions). Ids are derived from
whatever a trace carries, at any engine block size:

- token ids: each full block is hashed, chained to its parent's id (:func:`hash_token_blocks`);
- per-block prefix hashes at another granularity, as Mooncake's 512-token ``hash_ids``
  (:func:`expand_prefix_hashes`);
- nothing: ids unique to the request (:func:`unique_block_ids`).

All functions are pure and vectorised with numpy; ids are ``numpy.int64``.
"""

from __future__ import annotations

import numpy as np

ROOT_HASH = np.int64(0x2545F4914F6CDD1D)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_DOMAIN_TOKENS = np.uint64(0x1F3D5B79)
_DOMAIN_PREFIX = np.uint64(0x2A4C6E80)
_DOMAIN_UNIQUE = np.uint64(0x3B5D7F91)


def _finalize(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective, well-mixed map of uint64 values."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def mix(a, b) -> np.ndarray:
    """Combine two (arrays of) 64-bit values into one well-mixed id (order matters)."""
    with np.errstate(over="ignore"):
        ua = np.asarray(a).astype(np.uint64)
        ub = np.asarray(b).astype(np.uint64)
        return _finalize(_finalize(ua + _GOLDEN) ^ (ub * _GOLDEN + _M2)).view(np.int64)


def hash_token_blocks(token_ids, block_size: int, parent=ROOT_HASH, start_block: int = 0):
    """Chained ids of the full blocks of ``token_ids`` from ``start_block`` on.

    ``parent`` is the id of block ``start_block - 1`` (or the root), so a growing sequence can be
    hashed incrementally with the same result as hashing it whole.
    """
    tokens = np.asarray(token_ids, dtype=np.int64)
    n_full = len(tokens) // block_size
    if n_full <= start_block:
        return np.empty(0, dtype=np.int64)
    blocks = tokens[start_block * block_size:n_full * block_size].reshape(-1, block_size)
    with np.errstate(over="ignore"):
        per_token = _finalize(blocks.astype(np.uint64) + _DOMAIN_TOKENS)
        weights = _finalize(np.arange(1, block_size + 1, dtype=np.uint64))
        content = (per_token * weights).sum(axis=1, dtype=np.uint64)
    out = np.empty(len(content), dtype=np.int64)
    h = np.int64(parent)
    for i, c in enumerate(content):
        h = mix(h, c)[()]
        out[i] = h
    return out


def expand_prefix_hashes(hash_ids, hash_block_size: int, num_tokens: int, block_size: int):
    """Engine-block ids from prefix hashes given per ``hash_block_size`` tokens.

    Engine block ``i`` ends at token ``e = (i + 1) * block_size``; the prefix up to ``e`` is named
    by the hash of the block holding token ``e - 1`` and the offset of ``e`` within it. With
    Mooncake's 512-token ids and block size 16 each id expands into 32 chained sub-block ids.
    Only full engine blocks within ``num_tokens`` get an id.
    """
    n_full = num_tokens // block_size
    hashes = np.asarray(hash_ids, dtype=np.int64)
    last_token = np.arange(1, n_full + 1, dtype=np.int64) * block_size - 1
    idx = last_token // hash_block_size
    if n_full and idx[-1] >= len(hashes):
        raise ValueError(
            f"{len(hashes)} prefix hashes of {hash_block_size} tokens cannot cover "
            f"{num_tokens} tokens")
    with np.errstate(over="ignore"):
        salted = hashes[idx].astype(np.uint64) ^ _DOMAIN_PREFIX
    return mix(salted, last_token % hash_block_size)


def unique_block_ids(key: int, start_block: int, end_block: int):
    """Ids of blocks ``start_block..end_block-1`` that no other ``key`` will ever produce."""
    with np.errstate(over="ignore"):
        salted = np.uint64(key & 0xFFFFFFFFFFFFFFFF) ^ _DOMAIN_UNIQUE
    return mix(salted, np.arange(start_block, end_block, dtype=np.int64))
