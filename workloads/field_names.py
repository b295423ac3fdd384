"""The keys of a JSON-lines trace: which ones a format reads, and the unknown ones that must
not be dropped silently.

Native and Mooncake lines may carry keys kvsim does not read (a dataset's own metadata); they
are ignored. But a key that is plainly one kvsim reads, misspelt (``arrivl_s``, ``Priority``)
or under another tool's name (``arrival_time``, ``input_tokens``, a native line's
``timestamp``), would lose what it says without a word: every request at time 0, priorities
gone. :class:`UnknownKeys` refuses such a key, naming the one meant, when the line lacks that
key and the value could be its value. An arrival time under another name is refused whatever
it holds, with the conversion its unit needs (``arrival_us``: divide by 10^6); ``request_id``,
which only names a line for ``continues``, is never the key meant (nothing is lost without it).
"""

from __future__ import annotations

from difflib import get_close_matches

from kvsim.workloads import fields as F

NATIVE_KEYS = frozenset({
    "arrival_s", "prompt_tokens", "output_tokens", "prompt_token_ids", "block_hashes",
    "hash_block_size", "priority", "session_id", "template_id", "output_token_ids",
    "request_id", "continues"})
MOONCAKE_KEYS = frozenset({"timestamp", "input_length", "output_length", "hash_ids",
                           "request_id", "continues"})

_NUMBER, _LIST, _LABEL = (int, float), (list,), (str, int)
#: What each key kvsim reads holds (a key meant for it must hold the same).
_KINDS = {"arrival_s": _NUMBER, "prompt_tokens": _NUMBER, "output_tokens": _NUMBER,
          "priority": _NUMBER, "hash_block_size": _NUMBER, "timestamp": _NUMBER,
          "input_length": _NUMBER, "output_length": _NUMBER, "prompt_token_ids": _LIST,
          "output_token_ids": _LIST, "block_hashes": _LIST, "hash_ids": _LIST,
          "session_id": _LABEL, "template_id": _LABEL, "request_id": _LABEL,
          "continues": _LABEL}
#: Other tools' names (and the other format's) for the keys each format reads: (key, note).
_OTHER_NAMES = {
    "native": {
        **dict.fromkeys(("arrival", "arrival_time", "time", "time_s", "t", "ts", "timestamp_s",
                         "start_time", "arrival_sec", "arrival_seconds", "send_time"),
                        ("arrival_s", " (seconds after the trace's start)")),
        "timestamp": ("arrival_s", " (in seconds; timestamp is Mooncake's, in milliseconds)"),
        **dict.fromkeys(("input_length", "input_tokens", "input_len", "prompt_len",
                         "prompt_length", "num_prompt_tokens"), ("prompt_tokens", "")),
        **dict.fromkeys(("output_length", "output_len", "num_output_tokens",
                         "completion_tokens", "generated_tokens"), ("output_tokens", "")),
        "hash_ids": ("block_hashes", " (with hash_block_size 512 for Mooncake's ids)"),
        "prio": ("priority", "")},
    "mooncake": {
        "arrival_s": ("timestamp", " (in milliseconds)"),
        **dict.fromkeys(("prompt_tokens", "input_tokens"), ("input_length", "")),
        "output_tokens": ("output_length", ""),
        "block_hashes": ("hash_ids", "")},
}
#: The keys a line may hold instead of each (the information is there already).
_INSTEAD = {"prompt_tokens": ("prompt_token_ids",), "block_hashes": ("prompt_token_ids",)}
#: Unit suffixes of arrival keys, and how to turn them into seconds.
_UNITS = {"_ms": "is in milliseconds: divide by 1000",
          "_us": "is in microseconds: divide by 10^6",
          "_ns": "is in nanoseconds: divide by 10^9", "_min": "is in minutes: multiply by 60",
          "_h": "is in hours: multiply by 3600", "_step": "counts engine steps, not time",
          "_steps": "counts engine steps, not time"}
#: Keys never taken for another (losing them loses nothing).
_NEVER_MEANT = frozenset({"request_id"})
#: Which arrival key each format reads.
_ARRIVAL = {"native": "arrival_s", "mooncake": "timestamp"}


class UnknownKeys:
    """Checks the keys of one file's lines in format ``fmt`` (``native`` or ``mooncake``):
    see the module doc. An unknown key that stands for none is judged once."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.known = NATIVE_KEYS if fmt == "native" else MOONCAKE_KEYS
        self.ignored: set[str] = set()
        self._meant: dict[str, tuple[str, str] | None] = {}

    def check(self, record: dict, loc: str) -> None:
        if record.keys() <= self.known:
            return
        for key in record:                   # (in the line's order: one error, always the same)
            if key in self.known or key in self.ignored:
                continue
            meant = self._meant.get(key, False)
            if meant is False:
                meant = self._meant[key] = self.meant(key)
            if meant is None:
                self.ignored.add(key)
            elif _stands_for(record, key, meant[0]):
                raise F.fail(loc, key, f"not a key of {self.fmt} trace lines: it would be "
                             f"ignored; write {meant[0]}{meant[1]}")

    def meant(self, key: str) -> tuple[str, str] | None:
        """(the key ``key`` most likely stands for, a note), or None: another tool's name, an
        arrival time in another unit, else the same in other capitals or misspelt."""
        name = key.lower()
        found = _OTHER_NAMES[self.fmt].get(name)
        unit = next((u for u in _UNITS if name.endswith(u)), None)
        if found is None and unit is not None:
            stem = name[:-len(unit)]
            if stem in ("arrival", "arrival_time", "time", "timestamp", "t", "ts", "start_time"):
                found = (_ARRIVAL[self.fmt], f" ({key} {_UNITS[unit]})")
        elif found is None:
            close = get_close_matches(name, self.known - _NEVER_MEANT, n=1, cutoff=0.85)
            found = (close[0], "") if close else None
        return found


def _stands_for(record: dict, key: str, meant: str) -> bool:
    """Whether ``record[key]`` would be the value of ``meant``: the line lacks ``meant`` (and
    what may stand instead) and the value is of its kind (an arrival time: any value)."""
    if meant in record or any(k in record for k in _INSTEAD.get(meant, ())):
        return False
    value = record[key]
    return meant in _ARRIVAL.values() or (isinstance(value, _KINDS[meant])
                                          and not isinstance(value, bool))
