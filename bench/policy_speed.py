"""CPU seconds of every eviction policy (and the CPU offloading tier) on one trace, back to back
in one process, as ratios to LRU (kvsim issue 17, point 7: each at most 1.5x LRU).

    PYTHONPATH=... python3 bench/policy_speed.py [--mode hitrate|run|both] [--trace PATH]
        [--limit N] [--capacity BLOCKS] [--block-size 512]

``hitrate``: ``kvsim hitrate``'s replay at one capacity (LRU is its analytic path, as the
command runs it). ``run``: ``kvsim run`` on Llama-3-70B, 4 x H100, ``--max-model-len 131072``;
the rows ``host-native`` and ``host-back`` add a CPU tier (``--kv-offloading-size 256``) to LRU.
Times are user CPU seconds (``resource.getrusage``), so other load on the machine counts less;
LRU runs first and again last, and the ratios divide by the mean of its two times.
"""

from __future__ import annotations

import argparse
import resource
import sys

TRACE = "/work/shared/traces/mooncake/conversation_trace.jsonl"
POLICIES = ("lru", "lfu", "priority", "hybrid", "arc", "s3fifo", "lookahead")


def user_seconds() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def timed(fn):
    start = user_seconds()
    value = fn()
    return user_seconds() - start, value


def hitrate_rows(requests, capacity: int, block_size: int, names=None) -> list[tuple]:
    from kvsim.cache.hitrate import hitrate_curves
    rows = []
    for name in names or POLICIES:
        cpu, result = timed(lambda: hitrate_curves(requests, [capacity], [name], block_size))
        rows.append((name, cpu, result["rows"][0]["hit_rate"]))
    return rows


def run_rows(requests, names=None) -> list[tuple]:
    from kvsim.sim.config import RunConfig
    from kvsim.sim.serving.runner import simulate
    base = dict(model="llama-3-70b", gpu="h100-80gb", tp=4, max_model_len=131072)
    cases = [(name, dict(eviction=name)) for name in POLICIES]
    cases += [("host-native", dict(kv_offloading_size=256.0)),
              ("host-back", dict(kv_offloading_size=256.0, offload_write="back"))]
    cases = [c for c in cases if names is None or c[0] in names]
    rows = []
    for name, extra in cases:
        config = RunConfig(**base, **extra)
        cpu, result = timed(lambda: simulate(requests, config))
        stats = [r.kv.prefix_stats for r in result.replicas]
        queries = sum(s.num_queries_tokens for s in stats)
        rows.append((name, cpu, sum(s.num_hit_tokens for s in stats) / max(queries, 1)))
    return rows


def alternating(rows_of, reference: str = "lru") -> list[tuple]:
    """``rows_of(names)`` for every variant, LRU measured first and again last: the ratios use
    the mean of the two LRU times, so a load that changes during the run biases them less."""
    rows = rows_of(None)
    again = rows_of((reference,))[0]
    first = rows[0]
    rows[0] = (reference, (first[1] + again[1]) / 2, first[2])
    return rows


def render(title: str, rows: list[tuple]) -> str:
    lru = rows[0][1]
    lines = [title, f"{'policy':<12} {'CPU s':>8} {'x LRU':>6} {'hit rate':>9}"]
    lines += [f"{n:<12} {s:8.2f} {s / lru:6.2f} {h:9.4f}" for n, s, h in rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("hitrate", "run", "both"), default="both")
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--capacity", type=int, default=5859)
    ap.add_argument("--block-size", type=int, default=512)
    args = ap.parse_args(argv)
    from kvsim.workloads import TraceOptions, load_trace
    requests = list(load_trace(args.trace, TraceOptions(limit=args.limit)))
    if args.mode in ("hitrate", "both"):
        print(render(f"kvsim hitrate, {len(requests)} requests, {args.capacity} x "
                     f"{args.block_size}-token blocks", alternating(
                         lambda names: hitrate_rows(requests, args.capacity, args.block_size,
                                                    names))), flush=True)
    if args.mode in ("run", "both"):
        print(render(f"kvsim run, {len(requests)} requests, llama-3-70b 4 x h100-80gb",
                     alternating(lambda names: run_rows(requests, names))), flush=True)


if __name__ == "__main__":
    sys.exit(main())
