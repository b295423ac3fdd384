"""The request record every workload produces and every engine consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from kvsim.workloads.identity import block_ids


@dataclass(slots=True)
class Request:
    """One inference request of a trace.

    Prefix identity comes from at most one of ``prompt_token_ids`` (hashed per block) or
    ``prefix_hashes`` (prefix ids per ``hash_block_size`` tokens, as Mooncake's ``hash_ids``).
    With neither, the request shares nothing with any other. ``continues``: the earlier request
    whose whole sequence (prompt and generated tokens) this prompt starts with (multi-turn
    without token ids). ``output_token_ids``: the tokens it generates, when recorded. Per-token
    lists are never built for traces that do not carry them. Block ids: :mod:`kvsim.workloads.identity`.
    ``may_be_continued``: False when no later request can continue this one (a CSV row; a JSONL
    line without a ``request_id``), so nothing can reach its private blocks once it finished.
    ``trace_line``: the line of the trace file it was read from (1 = the first; 0: not read
    from a file), so that results join back to the trace whatever was kept or sorted.
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prompt_token_ids: np.ndarray | None = None
    prefix_hashes: np.ndarray | None = None
    hash_block_size: int = 0
    priority: int = 0
    session_id: str | None = None
    template_id: str | None = None
    output_token_ids: np.ndarray | None = None
    continues: "Request | None" = None
    may_be_continued: bool = field(default=True, compare=False, repr=False)
    trace_line: int = field(default=0, compare=False, repr=False)

    def __repr__(self) -> str:
        """The numbers, the optional fields that are set, arrays by their size and the
        request it continues by its id (a chat turn would print its whole conversation)."""
        parts = [f"request_id={self.request_id}", f"arrival_s={self.arrival_s!r}",
                 f"prompt_tokens={self.prompt_tokens}", f"output_tokens={self.output_tokens}"]
        if self.priority:
            parts.append(f"priority={self.priority}")
        for name in ("session_id", "template_id"):
            if getattr(self, name) is not None:
                parts.append(f"{name}={getattr(self, name)!r}")
        for name, what in (("prompt_token_ids", "token ids"), ("output_token_ids", "token ids"),
                           ("prefix_hashes", f"ids per {self.hash_block_size} tokens")):
            if getattr(self, name) is not None:
                parts.append(f"{name}=<{len(getattr(self, name))} {what}>")
        if self.continues is not None:
            parts.append(f"continues=<request {self.continues.request_id}>")
        return f"Request({', '.join(parts)})"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def names_content(self) -> bool:
        """Whether the request says what its prompt holds (token ids, prefix ids, or the
        request it continues): without, no other request can share its prompt's blocks."""
        return not (self.prompt_token_ids is None and self.prefix_hashes is None
                    and self.continues is None)

    def block_hashes(self, block_size: int, num_tokens: int | None = None,
                     greedy: bool = False) -> np.ndarray:
        """Prefix ids of the full ``block_size`` blocks within the first ``num_tokens`` tokens
        of the sequence (prompt, then generated tokens); ``num_tokens`` defaults to the prompt.
        ``greedy``: the sampling mode of generated tokens with no recorded ids (see
        :func:`kvsim.workloads.identity.block_ids`)."""
        return block_ids(self, block_size, num_tokens, greedy)


#: Why a trace row holds no request to run (a key of a run summary's ``trace_rows_left_out``),
#: and how a report says it.
LEFT_OUT_REASONS = {
    "failed": "failed (BurstGPT Response tokens 0)",
    "no_output": "no output (Azure GeneratedTokens 0)",
    "empty_prompt": "no prompt (0 prompt tokens)",
    "other_model": "another model (--trace-model)",
}


@dataclass(slots=True)
class LeftOutRow:
    """A trace row that holds no request to run: a failed one, an empty one, another model's
    (``reason``: a key of :data:`LEFT_OUT_REASONS`). The loader counts those inside the time
    window read and yields no request for them."""

    arrival_s: float
    reason: str


def rows_text(n: int, word: str = "row") -> str:
    """``1 row``, ``2,048 rows`` (``word``: ``trace row``, ...)."""
    return f"{n:,} {word}{'s' * (n != 1)}"


def left_out_text(left_out: Mapping[str, int]) -> str:
    """The rows left out by reason, in words: ``failed (BurstGPT Response tokens 0): 2, ...``."""
    return ", ".join(f"{LEFT_OUT_REASONS[reason]}: {left_out[reason]:,}"
                     for reason in LEFT_OUT_REASONS if left_out.get(reason))


def trace_name(trace) -> str:
    """A trace as a reader knows it: ``<stdin>`` for ``-`` (as errors call it)."""
    return "<stdin>" if str(trace) == "-" else str(trace)
