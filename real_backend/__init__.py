"""The real torch backend: the same cache engine and scheduler driving real tensors.

Modules (torch is the ``real`` extra; nothing outside this package imports torch):

- :mod:`.llama` — a random-weight Llama decoder (torch) over a packed token stream;
- :mod:`.kv_store` — ``PagedKVStore``: device KV blocks plus a host tier, block copies for the
  transfer kinds of ``kvsim.cache.step_plan``;
- :mod:`.attention` — paged prefill/decode attention through block tables, and a dense reference;
- :mod:`.model_runner` — ``ModelRunner.forward(batch of RequestChunk)`` -> last-token logits;
- :mod:`.bench` — quick timing of a prefill and a decode step;
- :mod:`.cpu_head` — the LM head on the CPU (faster GEMM layout per row count);
- :mod:`.backend_model` — ``--model`` (``tiny-llama``, catalog name, ``config.json``) ->
  ``LlamaConfig`` (the simulator's ``ModelSpec`` plus RoPE theta and norm eps);
- :mod:`.tokens` — ``token_ids_for(request, block_size, vocab_size)`` from block hashes;
- :mod:`.torch_executor` — ``TorchExecutor``: a ``StepPlan`` performed for real, its time measured;
- :mod:`.session` — backend settings, threads, runner construction and warm-up;
- :mod:`.profiling` — ``kvsim profile``: grid timing and the fitted cost-model profile;
- :mod:`.profile_fit` — the fit itself: non-negative least squares, per-batch-size table;
- :mod:`.validate`, :mod:`.validate_report` — ``kvsim validate``: real vs simulated run;
- :mod:`.vllm_reference` — step times next to the vllm-oracle fixtures' vLLM step times.

This ``__init__`` imports nothing, so ``import kvsim.real_backend`` works without torch.
"""
