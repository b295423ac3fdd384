"""The prefix index: block hash -> the blocks holding that content (vLLM's
``BlockHashToBlockMap``), a map (:func:`kvsim.cache.intmap.hash_map`) kept as plain ints while
each hash has one holder."""

from __future__ import annotations

from functools import partial
from itertools import takewhile
from operator import is_not
from typing import Sequence

from kvsim.cache.bulk import delete_all
from kvsim.cache.intmap import COMPILED, add_new, hash_map

_is_held = partial(is_not, None)        # (a lookup's answer names a block)


class PrefixIndex:
    """Hash -> blocks holding that content. Identical blocks are not merged (block tables are
    append-only), so one hash may name several blocks; the oldest is returned first.
    ``num_shared_hashes``: hashes held by more than one block (while none is, a removal needs
    no check of who holds the hash)."""

    __slots__ = ("_map", "num_shared_hashes")

    def __init__(self) -> None:
        self._map: dict[int, int | dict[int, None]] = hash_map()
        self.num_shared_hashes = 0

    def __len__(self) -> int:
        return len(self._map)

    def get(self, block_hash: int) -> int | None:
        found = self._map.get(block_hash)
        if found is None or isinstance(found, int):
            return found
        return next(iter(found))

    def find_prefix(self, block_hashes) -> list[int]:
        """Blocks holding the leading run of ``block_hashes`` (stops at the first miss)."""
        found = (self._map.prefix(block_hashes) if COMPILED else
                 list(takewhile(_is_held, map(self._map.get, block_hashes))))   # (a C loop)
        if self.num_shared_hashes:
            return [b if b.__class__ is int else next(iter(b)) for b in found]
        return found

    def insert(self, block_hash: int, block_id: int) -> None:
        found = self._map.get(block_hash)
        if found is None:
            self._map[block_hash] = block_id
        elif isinstance(found, int):
            self._map[block_hash] = {found: None, block_id: None}
            self.num_shared_hashes += 1
        else:
            found[block_id] = None

    def insert_new(self, block_hashes: list, block_ids: list[int]) -> None:
        """``insert`` for each pair, where no hash is indexed yet and none is given twice."""
        if COMPILED:
            self._map.set_many(block_hashes, block_ids)
        else:
            self._map.update(zip(block_hashes, block_ids))

    def insert_many(self, block_hashes: list, block_ids: list[int]) -> None:
        """``insert`` for each pair, in one batch when every hash is new."""
        if not self.add_new(block_hashes, block_ids):
            for block_id, block_hash in zip(block_ids, block_hashes):
                self.insert(block_hash, block_id)

    def add_new(self, block_hashes: list, block_ids: list[int]) -> bool:
        """Index each pair at once when no hash is indexed yet nor given twice (True); else
        change nothing (False)."""
        return add_new(self._map, block_hashes, block_ids)

    def remove_many(self, block_hashes: Sequence[int], block_ids: list[int]) -> None:
        """``remove`` for each pair, in one pass of deletions when each hash has a single
        holder (then it is the block given)."""
        index = self._map
        if not self.num_shared_hashes or (
                index.ints_at(block_hashes) if COMPILED
                else set(map(type, map(index.__getitem__, block_hashes))) == {int}):
            delete_all(index, block_hashes)
            return
        for block_hash, block_id in zip(block_hashes, block_ids):
            self.remove(block_hash, block_id)

    def remove(self, block_hash: int, block_id: int) -> None:
        """Forget ``block_id`` as a holder of ``block_hash`` (a last copy left is stored
        alone again, as an int)."""
        found = self._map[block_hash]
        if isinstance(found, int):
            del self._map[block_hash]
            return
        del found[block_id]
        if len(found) == 1:
            self._map[block_hash] = next(iter(found))
            self.num_shared_hashes -= 1

    def clear(self) -> None:
        self._map.clear()
        self.num_shared_hashes = 0
