"""Fitting a request into ``max_model_len`` as Vidur does (``--long-prompt truncate``).

Vidur's trace length generator clips every request whose prompt plus output exceeds its token
limit by taking the excess from prompt and output in proportion to their lengths, rounding
each cut up. kvsim applies the same rule at arrival, keeping at least one prompt and one output
token; the prompt keeps its first tokens (and their prefix identity).
"""

from __future__ import annotations

import math

from kvsim.workloads.request import Request


def vidur_lengths(prompt: int, output: int, max_len: int) -> tuple[int, int]:
    """``(prompt, output)`` cut in proportion until ``prompt + output <= max_len``."""
    total = prompt + output
    excess = total - max_len
    if excess <= 0:
        return prompt, output
    new_prompt = max(1, prompt - math.ceil(excess * prompt / total))
    new_output = max(1, output - math.ceil(excess * output / total))
    if new_prompt + new_output > max_len:          # tiny max_len: the floors of 1 won
        new_prompt = max(1, max_len - new_output)
    return new_prompt, new_output


def truncate(request: Request, max_len: int) -> bool:
    """Cut ``request`` in place to fit ``max_len`` (see the module doc); True if it was cut."""
    prompt, output = vidur_lengths(request.prompt_tokens, request.output_tokens, max_len)
    if (prompt, output) == (request.prompt_tokens, request.output_tokens):
        return False
    request.prompt_tokens, request.output_tokens = prompt, output
    if request.prompt_token_ids is not None:
        request.prompt_token_ids = request.prompt_token_ids[:prompt]
    if request.output_token_ids is not None:
        request.output_token_ids = request.output_token_ids[:output]
    if request.prefix_hashes is not None:
        request.prefix_hashes = request.prefix_hashes[:-(-prompt // request.hash_block_size)]
    return True
