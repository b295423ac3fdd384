"""Quick timing of :meth:`ModelRunner.forward` for a prefill and a decode batch.

    python -m kvsim.real_backend.bench [config.json] --threads 2 --block-size 32

Prints the median and minimum wall time (ms) of (a) one prefill of ``--prefill`` tokens and
(b) one decode step of ``--decode-batch`` requests with ``--context`` tokens each. The
TorchExecutor's profiler will time a whole grid the same way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch

from kvsim.real_backend.backend_model import LlamaConfig
from kvsim.sim.perf.models import BUNDLED_CONFIGS
from kvsim.real_backend.model_runner import ModelRunner, RequestChunk

TINY_LLAMA = LlamaConfig.from_json(BUNDLED_CONFIGS["tiny-llama"])


def time_call(fn: Callable[[], object], device: torch.device,
              repeats: int) -> tuple[list[float], list[float]]:
    """Wall and process-CPU seconds of each of ``repeats`` calls after two warm-up calls.

    CPU time (summed over threads) is the steadier number on a shared, oversubscribed host.
    """
    for _ in range(2):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def prefill_batch(num_tokens: int, block_size: int, vocab: int) -> list[RequestChunk]:
    """One fresh prompt of ``num_tokens`` in consecutive blocks from 0."""
    table = list(range(-(-num_tokens // block_size)))
    tokens = torch.randint(0, vocab, (num_tokens,)).tolist()
    return [RequestChunk(tokens, 0, table)]


def decode_batch(num_seqs: int, context: int, block_size: int, vocab: int) -> list[RequestChunk]:
    """``num_seqs`` requests each computing token ``context - 1`` in its own blocks."""
    per_seq = -(-context // block_size)
    return [RequestChunk([int(torch.randint(0, vocab, ()))], context - 1,
                         list(range(i * per_seq, (i + 1) * per_seq))) for i in range(num_seqs)]


def summarize(times: tuple[list[float], list[float]]) -> dict[str, float]:
    wall, cpu = times
    return {"median_ms": round(1e3 * statistics.median(wall), 2),
            "min_ms": round(1e3 * min(wall), 2),
            "median_cpu_ms": round(1e3 * statistics.median(cpu), 2)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", help="HF config.json (default: tiny-llama)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--decode-batch", type=int, default=32)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=20)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Time the two shapes and print one JSON line."""
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = LlamaConfig.from_json(a.config) if a.config else TINY_LLAMA
    blocks = max(-(-a.prefill // a.block_size), a.decode_batch * -(-a.context // a.block_size))
    runner = ModelRunner.create(cfg, num_blocks=blocks, block_size=a.block_size,
                                dtype=a.dtype, device=a.device)
    pre = prefill_batch(a.prefill, a.block_size, cfg.vocab_size)
    dec = decode_batch(a.decode_batch, a.context, a.block_size, cfg.vocab_size)
    result = {
        "prefill": summarize(time_call(lambda: runner.forward(pre), runner.device, a.repeats)),
        "decode": summarize(time_call(lambda: runner.forward(dec), runner.device, a.repeats)),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
