"""Behaviour snapshot: run a fixed matrix of ``kvsim run`` settings on the bundled samples and
generated presets, and keep each ``summary.json`` (without ``wall_time_s``).

    python bench/snapshot.py --out /tmp/snap-before          # on the old commit
    python bench/snapshot.py --out /tmp/snap-after --compare /tmp/snap-before

``--compare`` prints one line per case (identical, within --rel of each float, or differing,
with the first keys that differ) and exits 1 when any case differs. Refactors promise identical
summaries; this is how that promise is checked. Runs ``kvsim`` as a user would (a subprocess
per case), so it checks whatever ``kvsim`` is on PATH.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent.parent / "workloads" / "samples"
MOONCAKE = str(SAMPLES / "mooncake_conversation_300.jsonl")
AZURE = str(SAMPLES / "azure_conv_300.csv")
SMALL_POOL = ["--num-gpu-blocks", "600"]

#: name -> (trace or "gen:PRESET", extra ``kvsim run`` arguments)
CASES: dict[str, tuple[str, list[str]]] = {
    "default-sample": ("", []),
    "mooncake": (MOONCAKE, []),
    "mooncake-no-skip": (MOONCAKE, ["--no-skip-ahead"]),
    "azure": (AZURE, []),
    "azure-tp2-2rep": (AZURE, ["--tp", "2", "--replicas", "2", "--router",
                               "least-outstanding-tokens"]),
    "mooncake-prefix-affinity": (MOONCAKE, ["--replicas", "2", "--router", "prefix-affinity"]),
    "azure-no-prefix": (AZURE, ["--no-enable-prefix-caching"]),
    "azure-no-chunked": (AZURE, ["--no-enable-chunked-prefill", "--max-model-len", "8192"]),
    "azure-priority": (AZURE, ["--scheduling-policy", "priority"]),
    "azure-threshold": (AZURE, ["--long-prefill-token-threshold", "256"]),
    "azure-greedy": (AZURE, ["--sampling", "greedy"]),
    "chat-small-pool": ("gen:chat", SMALL_POOL),
    "agent-small-pool": ("gen:agent", SMALL_POOL),
    "rag": ("gen:rag", []),
    "customer-service": ("gen:customer-service", []),
    "sharegpt-like": ("gen:sharegpt-like", []),
    "long-doc": ("gen:long-doc", []),
    "contiguous-max": ("gen:sharegpt-like", ["--layout", "contiguous", "--reserve", "max"]),
    "contiguous-pow2-buddy": ("gen:sharegpt-like", ["--layout", "contiguous", "--reserve",
                                                    "pow2", "--allocator", "buddy"]),
    "contiguous-oracle": ("gen:sharegpt-like", ["--layout", "contiguous", "--reserve",
                                                "oracle"]),
    "hybrid-layout": ("gen:chat", ["--layout", "hybrid"] + SMALL_POOL),
    "swap-preemption": ("gen:chat", ["--preemption-mode", "swap", "--num-cpu-blocks", "2000",
                                     "--offload-write", "back"] + SMALL_POOL),
    "chat-host-native": ("gen:chat", ["--num-cpu-blocks", "3000"] + SMALL_POOL),
}
for _policy in ("lfu", "priority", "hybrid", "arc", "s3fifo", "lookahead", "belady"):
    CASES[f"chat-{_policy}"] = ("gen:chat", ["--eviction", _policy] + SMALL_POOL)
for _write in ("back", "through"):
    CASES[f"chat-host-{_write}"] = ("gen:chat", ["--num-cpu-blocks", "3000", "--offload-write",
                                                 _write] + SMALL_POOL)


def generated(preset: str, work: Path) -> str:
    path = work / f"{preset}.jsonl"
    if not path.exists():
        subprocess.run(["kvsim", "gen", preset, "--out", str(path), "-n", "300", "--seed", "1"],
                       check=True, capture_output=True)
    return str(path)


def run_case(name: str, trace: str, extra: list[str], work: Path) -> dict:
    if trace.startswith("gen:"):
        trace = generated(trace[4:], work)
    out = work / name
    cmd = ["kvsim", "run", *([trace] if trace else []), *extra, "--out", str(out), "--quiet",
           "--no-html"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1:], "exit": done.returncode}
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("wall_time_s", None)
    for holder in (summary, summary.get("config", {})):
        if isinstance(holder.get("trace"), str):  # temporary directories differ between runs
            holder["trace"] = Path(holder["trace"]).name
    return summary


def differences(a, b, rel: float, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        found = [f"{path}.{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            found += differences(a[k], b[k], rel, f"{path}.{k}")
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, rel,
                                                                             f"{path}[{i}]")]
    if (isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool)
            and math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)):
        return []
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compare", type=Path)
    parser.add_argument("--rel", type=float, default=0.0, help="relative float tolerance")
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (trace, extra) in CASES.items():
            if args.only and name not in args.only:
                continue
            summary = run_case(name, trace, extra, Path(tmp))
            (args.out / f"{name}.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
            if args.compare is None:
                print(f"{name}: {'error ' + str(summary['error']) if 'error' in summary else 'ok'}")
                continue
            before = args.compare / f"{name}.json"
            if not before.exists():
                print(f"{name}: no snapshot to compare with")
                continue
            diff = differences(json.loads(before.read_text()), summary, args.rel)
            failed += bool(diff)
            print(f"{name}: " + ("identical" if not diff else
                                 f"DIFFERS ({len(diff)}): " + "; ".join(diff[:4])))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
