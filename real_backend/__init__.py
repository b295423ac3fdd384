"""The real torch backend: the same cache engine and scheduler driving real tensors.

Modules (torch is the ``real`` extra; nothing outside this package imports torch):

- :mod:`.model` — ``LlamaConfig`` and a random-weight Llama decoder over a packed token stream;
- :mod:`.kv_store` — ``PagedKVStore``: device KV blocks plus a host tier, block copies for the
  transfer kinds of ``kvsim.cache.step_plan``;
- :mod:`.attention` — paged prefill/decode attention through block tables, and a dense reference;
- :mod:`.runner` — ``ModelRunner.forward(batch of RequestChunk)`` -> last-token logits;
- :mod:`.bench` — quick timing of a prefill and a decode step.

This ``__init__`` imports nothing, so ``import kvsim.real_backend`` works without torch.
"""
