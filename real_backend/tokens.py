"""Prompt token ids for trace requests, derived from their block hashes.

Traces such as Mooncake's carry prefix ids per block, never tokens. The real backend needs
tokens, and requests that share a prefix (the same chained block ids) must share those tokens,
or a prefix-cache hit would reuse KV computed from different text. So the tokens of a full block
are drawn from a generator seeded by the block's id (chained: it identifies the whole prefix),
and the tail beyond the last full block from one seeded by the request id (no other request
shares it, exactly as the cache engine assumes).
"""

from __future__ import annotations

import numpy as np

_MASK = (1 << 64) - 1
_TAIL_SALT = 0x5EED7A11


def _block_tokens(seed: int, count: int, vocab_size: int) -> np.ndarray:
    rng = np.random.default_rng(seed & _MASK)
    return rng.integers(0, vocab_size, size=count, dtype=np.int64)


def token_ids_for(request, block_size: int, vocab_size: int) -> np.ndarray:
    """The prompt's ``request.prompt_tokens`` token ids (int64, in ``[0, vocab_size)``).

    A request that carries ``prompt_token_ids`` gets those (modulo ``vocab_size``). Otherwise
    full block ``k`` gets ``block_size`` tokens seeded by ``request.block_hashes(block_size)[k]``
    and the partial last block tokens seeded by the request id, so two requests get equal
    tokens over exactly the blocks whose ids are equal.
    """
    if request.prompt_token_ids is not None:
        return np.asarray(request.prompt_token_ids, dtype=np.int64) % vocab_size
    hashes = request.block_hashes(block_size)
    parts = [_block_tokens(int(h), block_size, vocab_size) for h in hashes.tolist()]
    tail = request.prompt_tokens - len(parts) * block_size
    if tail:
        seed = hash((_TAIL_SALT, int(request.request_id)))
        parts.append(_block_tokens(seed, tail, vocab_size))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(parts)
