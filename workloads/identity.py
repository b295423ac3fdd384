"""Block identity: the one scheme that names every KV block, prompt or generated.

A block's id is a *prefix identity*: two sequences hold equal ids at block ``i`` exactly when
their first ``(i + 1) * block_size`` tokens are equal (up to 64-bit collisions), as vLLM's
chained block hashes are. A request's sequence is its prompt, then its generated tokens; ids are
derived from whatever the trace says about them, at any engine block size:

- prompt token ids: each full block hashed, chained to its parent's id (:func:`hash_token_blocks`);
- per-block prefix hashes at another granularity, as Mooncake's 512-token ``hash_ids``
  (:func:`expand_prefix_hashes`);
- nothing: ids unique to the request (:func:`unique_block_ids`);
- a continued request (``request.continues``): the blocks wholly inside the earlier request's
  sequence (its prompt and its generated tokens) are that request's blocks;
- generated tokens: recorded ``output_token_ids`` are hashed like prompt tokens (so a later
  prompt that resends them hits); without them, greedy sampling makes them a function of the
  whole prompt (identical prompts generate identical blocks) and random sampling keeps them
  unique to the request.

Imported by both :mod:`kvsim.workloads` (requests, trace statistics) and :mod:`kvsim.cache`
(sequences); it knows no file format. All functions are pure, ids are ``numpy.int64``;
:class:`NamedSequences` is a run's memo that spares a continuation naming its earlier turns again.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

ROOT_HASH = np.int64(0x2545F4914F6CDD1D)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_DOMAIN_TOKENS = np.uint64(0x1F3D5B79)
_DOMAIN_PREFIX = np.uint64(0x2A4C6E80)
_DOMAIN_UNIQUE = np.uint64(0x3B5D7F91)
_DOMAIN_PROMPT = np.uint64(0x4C6E8FA2)
_DOMAIN_GREEDY = np.uint64(0x5D7F91B3)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

SAMPLING_MODES = ("random", "greedy")
"""How generated tokens without recorded ids are identified: ``random`` (unique to the
request) or ``greedy`` (a function of the prompt, as vLLM's temperature-0 decoding)."""


def _finalize(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective, well-mixed map of uint64 values."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _finalize_in_place(x: np.ndarray) -> np.ndarray:
    """:func:`_finalize` of a uint64 array, written over it (one scratch array instead of a
    new one per operation); returns ``x``."""
    shifted = x >> _S30
    x ^= shifted
    x *= _M1
    np.right_shift(x, _S27, out=shifted)
    x ^= shifted
    x *= _M2
    np.right_shift(x, _S31, out=shifted)
    x ^= shifted
    return x


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
    num_chunks = -(-n_full * block_size // hash_block_size)    # those holding a block's end
    if num_chunks > len(hashes):
        raise ValueError(
            f"{len(hashes)} prefix hashes of {hash_block_size} tokens cannot cover "
            f"{num_tokens} tokens")
    if not n_full:
        return np.empty(0, dtype=np.int64)
    with np.errstate(over="ignore"):     # mix(salted ids, offsets), each chunk's half once
        chunk_half = hashes[:num_chunks].astype(np.uint64)
        chunk_half ^= _DOMAIN_PREFIX
        chunk_half += _GOLDEN
        _finalize_in_place(chunk_half)
        if hash_block_size % block_size:     # chunks end inside engine blocks
            last_token = np.arange(1, n_full + 1, dtype=np.int64) * block_size - 1
            offsets = (last_token % hash_block_size).astype(np.uint64)
            mixed = chunk_half[last_token // hash_block_size] ^ (offsets * _GOLDEN + _M2)
        else:       # each chunk holds the same offsets: a chunks x offsets grid
            mixed = np.bitwise_xor(chunk_half[:, None], _offset_halves(
                hash_block_size, block_size)).ravel()[:n_full]
        return _finalize_in_place(mixed).view(np.int64)


@lru_cache(maxsize=64)
def _offset_halves(hash_block_size: int, block_size: int) -> np.ndarray:
    """The offsets' half of :func:`mix` for the engine blocks ending in one chunk, when
    ``block_size`` divides ``hash_block_size`` (read only)."""
    last_token = np.arange(1, hash_block_size // block_size + 1, dtype=np.uint64) * np.uint64(
        block_size) - np.uint64(1)
    with np.errstate(over="ignore"):
        halves = last_token * _GOLDEN + _M2
    halves.flags.writeable = False
    return halves


def unique_block_ids(key: int, start_block: int, end_block: int):
    """Ids of blocks ``start_block..end_block-1`` that no other ``key`` will ever produce."""
    with np.errstate(over="ignore"):
        salted = np.uint64(key & 0xFFFFFFFFFFFFFFFF) ^ _DOMAIN_UNIQUE
    return mix(salted, np.arange(start_block, end_block, dtype=np.int64))


# --- a request's whole sequence ------------------------------------------------------------

def block_ids(request, block_size: int, num_tokens: int | None = None,
              greedy: bool = False, named: "NamedSequences | None" = None) -> np.ndarray:
    """Ids of the full ``block_size`` blocks within the first ``num_tokens`` tokens (default:
    the prompt) of ``request``'s sequence: its prompt, then its generated tokens.

    ``request`` is a :class:`~kvsim.workloads.Request` (any object with its fields);
    ``greedy`` picks the sampling mode for generated tokens that carry no recorded ids;
    ``named``: a run's memo of the requests named so far (a continuation then starts from
    its parent's ids instead of naming every earlier turn again).
    """
    n = request.prompt_tokens if num_tokens is None else num_tokens
    chain, ids = [request], _NO_IDS
    while chain[-1].continues is not None:
        parent = chain[-1].continues
        known = named.get(parent, block_size, greedy) if named is not None else None
        if known is not None:
            ids = known              # where this loop stands after the parent
            break
        chain.append(parent)
    for r in reversed(chain):
        end = n if r is request else r.prompt_tokens + r.output_tokens
        own = _own_ids(r, block_size, len(ids), end // block_size, greedy)
        ids = np.concatenate([ids, own]) if len(ids) else own
    if named is not None and len(ids) == n // block_size == (
            request.prompt_tokens + request.output_tokens) // block_size:
        named.add(request, block_size, greedy, ids)
    return ids[:n // block_size]


class NamedSequences:
    """One run's memo of the ids of whole sequences (prompt and output) of the requests named
    so far that a later request may continue, the most recent ``capacity`` of them. A chat
    session of ``k`` turns then names ``k`` turns' blocks instead of ``k^2 / 2``; the ids are
    the same either way. (A run's memo: the requests must not change while it is used.)"""

    __slots__ = ("_ids", "capacity")

    def __init__(self, capacity: int = 4096):
        self._ids: dict[tuple[int, int, bool], tuple[object, np.ndarray]] = {}
        self.capacity = capacity

    def get(self, request, block_size: int, greedy: bool) -> np.ndarray | None:
        found = self._ids.get((id(request), block_size, greedy))
        return found[1] if found is not None and found[0] is request else None

    def add(self, request, block_size: int, greedy: bool, ids: np.ndarray) -> None:
        if not getattr(request, "may_be_continued", True):
            return
        if len(self._ids) >= self.capacity:
            del self._ids[next(iter(self._ids))]            # the oldest
        kept = ids.copy()
        kept.flags.writeable = False
        self._ids[id(request), block_size, greedy] = (request, kept)


_NO_IDS = np.empty(0, dtype=np.int64)


def _own_ids(r, block_size: int, start: int, end: int, greedy: bool) -> np.ndarray:
    """Ids of blocks ``start..end-1`` of ``r``'s sequence from what ``r`` itself carries."""
    prompt_blocks = r.prompt_tokens // block_size
    parts = []
    if start < min(end, prompt_blocks):
        parts.append(_prompt_ids(r, block_size, start, min(end, prompt_blocks)))
    if end > prompt_blocks:
        parts.append(_generated_ids(r, block_size, max(start, prompt_blocks), end, greedy))
    if not parts:
        return np.empty(0, dtype=np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _prompt_ids(r, block_size: int, start: int, end: int) -> np.ndarray:
    if r.prompt_token_ids is not None:
        return hash_token_blocks(r.prompt_token_ids[:end * block_size], block_size)[start:]
    if r.prefix_hashes is not None:
        return expand_prefix_hashes(r.prefix_hashes, r.hash_block_size, r.prompt_tokens,
                                    block_size)[start:end]
    return unique_block_ids(r.request_id, start, end)


def _generated_ids(r, block_size: int, start: int, end: int, greedy: bool) -> np.ndarray:
    """Blocks ``start..end-1``, each reaching past the prompt into generated tokens."""
    outputs = getattr(r, "output_token_ids", None)
    if outputs is not None:
        done = (end * block_size) - r.prompt_tokens
        if r.prompt_token_ids is not None:
            tokens = np.concatenate([r.prompt_token_ids, outputs[:done]])
            return hash_token_blocks(tokens, block_size)[start:]
        # the prompt tail's tokens are unknown: the prompt's id stands for them
        first = r.prompt_tokens // block_size
        tail = r.prompt_tokens - first * block_size
        tokens = np.concatenate([np.zeros(tail, dtype=np.int64), outputs[:done]])
        return hash_token_blocks(tokens, block_size, prompt_id(r))[start - first:]
    if greedy:
        with np.errstate(over="ignore"):
            anchor = prompt_id(r).astype(np.uint64) ^ _DOMAIN_GREEDY
        return mix(anchor, np.arange(start, end, dtype=np.int64))
    return unique_block_ids(r.request_id, start, end)


def prompt_id(r) -> np.int64:
    """One id naming ``r``'s whole prompt (its content where the trace says it, else unique)."""
    n = r.prompt_tokens
    if r.prompt_token_ids is not None:
        whole = hash_token_blocks(r.prompt_token_ids, n)[0]
    elif r.prefix_hashes is not None:
        whole = expand_prefix_hashes(r.prefix_hashes, r.hash_block_size, n, n)[0]
    else:
        whole = unique_block_ids(r.request_id, -1, 0)[0]
    with np.errstate(over="ignore"):
        return mix(np.int64(whole).astype(np.uint64) ^ _DOMAIN_PROMPT, n)[()]
