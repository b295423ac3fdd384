"""Simulator speed on whole real traces: requests and tokens per wall-second, peak RSS.

    python bench/sim_speed.py [--shared DIR] [--only azure|mooncake] [--no-skip-ahead]

Reference: Vidur simulates ~100 requests per wall-second on the Azure conversation lengths; the
target is >= 2,000 (20x) on Azure / Llama-2-7B / one A100-80GB and the whole Mooncake
conversation trace on Llama-3-70B / 4xH100 in <= 30 s, prefix caching on.
Each case runs in a fresh process so its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "azure": dict(trace="traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
                  model="llama-2-7b", gpu="a100-80gb", tp=1),
    "mooncake": dict(trace="traces/mooncake/conversation_trace.jsonl", model="llama-3-70b",
                     gpu="h100-80gb", tp=4, max_model_len=131072),
    # the same with a 64 GiB-per-GPU host tier (demotions, promotions, fewer skip-aheads)
    "mooncake-tier": dict(trace="traces/mooncake/conversation_trace.jsonl",
                          model="llama-3-70b", gpu="h100-80gb", tp=4, max_model_len=131072,
                          cpu_offload_gb=64),
}


def run_case(name: str, shared: Path, skip_ahead: bool) -> dict:
    from kvsim.sim.config import RunConfig
    from kvsim.sim.runner import simulate
    from kvsim.workloads import load_trace
    case = dict(CASES[name])
    path = shared / case.pop("trace")
    config = RunConfig(trace=str(path), skip_ahead=skip_ahead, **case)
    start = time.perf_counter()
    result = simulate(load_trace(path), config)
    wall = time.perf_counter() - start
    cols = result.requests.columns
    tokens = sum(p + o for p, o, c in zip(cols["prompt_tokens"], cols["output_tokens"],
                                          cols["completed"]) if c)
    return dict(case=name, requests=len(result.requests), completed=int(sum(cols["completed"])),
                steps=len(result.steps), wall_s=wall, requests_per_s=len(result.requests) / wall,
                tokens_per_s=tokens / wall, sim_s=result.duration_s,
                skipped_steps=sum(r.num_skipped_steps for r in result.replicas),
                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared")
    parser.add_argument("--only", choices=sorted(CASES))
    parser.add_argument("--no-skip-ahead", action="store_true")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.shared, not args.no_skip_ahead)))
        return
    rows = []
    for name in [args.only] if args.only else sorted(CASES):
        cmd = [sys.executable, __file__, "--case", name, "--shared", str(args.shared)]
        cmd += ["--no-skip-ahead"] if args.no_skip_ahead else []
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                              text=True).stdout))
    print(f"{'case':<14}{'requests':>10}{'done':>8}{'steps':>10}{'skipped':>10}{'wall s':>9}"
          f"{'req/s':>9}{'tok/s':>12}{'peak RSS MB':>13}")
    for r in rows:
        print(f"{r['case']:<14}{r['requests']:>10,}{r['completed']:>8,}{r['steps']:>10,}{r['skipped_steps']:>10,}"
              f"{r['wall_s']:>9.1f}{r['requests_per_s']:>9,.0f}{r['tokens_per_s']:>12,.0f}"
              f"{r['peak_rss_mb']:>13,.0f}")
    print("reference: Vidur ~100 req/s on Azure conversation lengths; target >= 2,000 req/s, "
          "Mooncake <= 30 s")


if __name__ == "__main__":
    main()
