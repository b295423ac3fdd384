"""Synthetic workloads: arrival processes, length distributions and presets.

::

    from kvsim.workloads.generators import GenConfig, generate, write_workload
    requests = generate("customer-service", GenConfig(num_requests=500, seed=1))
    write_workload("chat", "chat.jsonl", GenConfig(num_requests=1000))   # kvsim gen chat

The same preset, parameters and seed give the same requests and the same file, byte for byte
(random numbers come from ``numpy.random.Generator(PCG64(...))`` streams spawned from ``seed``).
"""

from __future__ import annotations

from kvsim.workloads.generators.arrivals import Arrivals
from kvsim.workloads.generators.build import GenConfig, generate, iter_requests, preset_named, write_workload
from kvsim.workloads.generators.lengths import Lengths, fixed, lognormal, parse_lengths, resampled, uniform
from kvsim.workloads.generators.presets import PRESETS, Agent, Chat, CustomerService, Rag, ShareGptLike

__all__ = ["Agent", "Arrivals", "Chat", "CustomerService", "GenConfig", "Lengths", "PRESETS",
           "Rag", "ShareGptLike", "fixed", "generate", "iter_requests", "lognormal",
           "parse_lengths", "preset_named", "resampled", "uniform", "write_workload"]
