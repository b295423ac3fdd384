"""The request record every workload produces and every engine consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hashing import expand_prefix_hashes, hash_token_blocks, unique_block_ids


@dataclass(slots=True)
class Request:
    """One inference request of a trace.

    Prefix identity comes from at most one of ``prompt_token_ids`` (hashed per block) or
    ``prefix_hashes`` (prefix ids per ``hash_block_size`` tokens, as Mooncake's ``hash_ids``).
    With neither, the request shares nothing with any other. Per-token lists are never built for
    traces that do not carry them.
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

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    def block_hashes(self, block_size: int, num_tokens: int | None = None) -> np.ndarray:
        """Prefix ids of the full ``block_size`` blocks within the first ``num_tokens`` tokens.

        ``num_tokens`` defaults to the prompt. Blocks reaching past the prompt hold generated
        tokens, which no trace names, so they get ids unique to this request.
        """
        n = self.prompt_tokens if num_tokens is None else num_tokens
        prompt_blocks = self.prompt_tokens // block_size
        if self.prompt_token_ids is not None:
            known = hash_token_blocks(self.prompt_token_ids, block_size)
        elif self.prefix_hashes is not None:
            known = expand_prefix_hashes(self.prefix_hashes, self.hash_block_size,
                                         self.prompt_tokens, block_size)
        else:
            known = unique_block_ids(self.request_id, 0, prompt_blocks)
        wanted = n // block_size
        if wanted <= prompt_blocks:
            return known[:wanted]
        extra = unique_block_ids(self.request_id, prompt_blocks, wanted)
        return np.concatenate([known, extra])
