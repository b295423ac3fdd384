"""The keys of a JSON-lines trace: which ones a format reads, and the unknown ones that must
not be dropped silently.

Native and Mooncake lines may carry keys kvsim does not read (a dataset's own metadata); they
are ignored. But a key that is a misspelling of one kvsim reads (``arrival``), another
tool's name for it (``input_tokens``, ``arrival_time``) or the other format's (``timestamp``
in a native line) would lose what it says without a word: every request at time 0, priorities
gone. :class:`UnknownKeys` refuses such a key, naming the one meant.
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

#: Other names of the keys each format reads (other tools', the other format's, short ones).
_MEANT = {
    "native": {
        **dict.fromkeys(("arrival", "arrival_time", "arrival_ts", "time", "time_s", "ts", "t",
                         "start_time", "timestamp_s"), "arrival_s"),
        "timestamp": "arrival_s (in seconds; timestamp is Mooncake's, in milliseconds)",
        **dict.fromkeys(("input_length", "input_tokens", "input_len", "prompt_len",
                         "prompt_length", "num_prompt_tokens", "context_tokens"),
                        "prompt_tokens"),
        **dict.fromkeys(("output_length", "output_len", "num_output_tokens", "max_tokens",
                         "completion_tokens", "generated_tokens", "response_tokens"),
                        "output_tokens"),
        "hash_ids": "block_hashes (with hash_block_size 512 for Mooncake's ids)",
        "prio": "priority", "session": "session_id", "template": "template_id"},
    "mooncake": {
        "arrival_s": "timestamp (in milliseconds)",
        **dict.fromkeys(("prompt_tokens", "input_tokens"), "input_length"),
        **dict.fromkeys(("output_tokens", "max_tokens"), "output_length"),
        "block_hashes": "hash_ids"},
}


class UnknownKeys:
    """Checks the keys of one file's lines in format ``fmt`` (``native`` or ``mooncake``):
    see the module doc. Each unknown key is judged once."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.known = NATIVE_KEYS if fmt == "native" else MOONCAKE_KEYS
        self.ignored: set[str] = set()

    def check(self, record: dict, loc: str) -> None:
        keys = record.keys()
        if keys <= self.known:
            return
        for key in keys - self.known - self.ignored:
            meant = self.meant(key)
            if meant is None or meant.split(" ")[0] in record:    # (the user's own key)
                self.ignored.add(key)
                continue
            raise F.fail(loc, key, f"not a key of {self.fmt} trace lines: it would be ignored; "
                         f"write {meant}")

    def meant(self, key: str) -> str | None:
        """The key that ``key`` most likely stands for (with a note), or None."""
        found = _MEANT[self.fmt].get(key.lower())
        if found is None:
            close = get_close_matches(key, self.known, n=1, cutoff=0.8)
            found = close[0] if close else None
        return found
