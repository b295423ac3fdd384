"""Peak memory of ``kvsim gen`` and ``kvsim run`` as the trace grows (issue #15 point 3:
memory grows with the requests in flight, not with the steps or the trace length).

    python bench/memory.py                                  # 10k, 100k and 1M requests
    python bench/memory.py --sizes 10000 100000 --work /tmp/kvsim-memory

For each size it generates a ``sharegpt-like`` trace (``--rate`` requests/s, ``--output-len``
lengths: short outputs keep a million requests to minutes of simulation), then runs it with
``--no-html`` on the default deployment. At the defaults (50 requests/s, outputs of 8-64
tokens) the deployment sustains the rate (completed requests/s equal the arrival rate, TTFT p99
about 0.3 s at every size), so the requests in flight stay bounded: what grows with the trace
is the per-request log and the output frame. Each command is a child process whose peak
resident set is read with ``os.wait4`` (``ru_maxrss``). Runs ``kvsim`` as a user would, so it
measures whatever ``kvsim`` is on PATH. Wall times are printed too, but on a shared machine only the memory is meaningful.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = (10_000, 100_000, 1_000_000)


def peak_rss(cmd: list[str]) -> tuple[float, float]:
    """(peak RSS in MiB, wall seconds) of ``cmd`` run as a child; exits on failure."""
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"failed: {' '.join(cmd)}\n{child.stderr.read().decode()[-2000:]}")
    child.stderr.close()
    return usage.ru_maxrss / 1024, wall       # Linux reports kilobytes


def measure(n: int, args, work: Path) -> dict:
    trace, out = work / f"trace-{n}.jsonl", work / f"run-{n}"
    gen_mib, gen_s = peak_rss(["kvsim", "gen", args.preset, "--out", str(trace), "-n", str(n),
                               "--seed", "1", "--rate", str(args.rate),
                               *(["--output-len", args.output_len] if args.output_len else [])])
    run_mib, run_s = peak_rss(["kvsim", "run", str(trace), "--out", str(out), "--quiet",
                               "--no-html"])
    summary = json.loads((out / "summary.json").read_text())
    row = {"requests": n, "gen_mib": gen_mib, "gen_s": gen_s, "run_mib": run_mib,
           "run_s": run_s, "num_steps": summary["num_steps"],
           "num_completed": summary["num_completed"], "duration_s": summary["duration_s"],
           "ttft_p99_s": summary["ttft_s"]["p99"],
           "request_throughput_per_s": summary["request_throughput_per_s"],
           "trace_mib": trace.stat().st_size / 2**20}
    if not args.keep:
        trace.unlink()
        shutil.rmtree(out)
    return row


def table(rows: list[dict]) -> str:
    lines = [f"{'requests':>9} {'gen MiB':>8} {'run MiB':>8} {'run B/req*':>10} {'steps':>9} "
             f"{'done':>9} {'sim s':>9} {'req/s':>7} {'TTFT p99':>9} {'gen s':>7} {'run s':>7}"]
    for i, r in enumerate(rows):
        growth = "" if not i else "{:10.0f}".format(
            (r["run_mib"] - rows[i - 1]["run_mib"]) * 2**20
            / (r["requests"] - rows[i - 1]["requests"]))
        lines.append(f"{r['requests']:>9,} {r['gen_mib']:>8.0f} {r['run_mib']:>8.0f} "
                     f"{growth:>10} {r['num_steps']:>9,} {r['num_completed']:>9,} "
                     f"{r['duration_s']:>9.0f} {r['request_throughput_per_s']:>7.1f} "
                     f"{r['ttft_p99_s']:>9.3f} {r['gen_s']:>7.0f} {r['run_s']:>7.0f}")
    lines.append("* run B/req: growth of kvsim run's peak RSS per added request since the "
                 "previous size")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--preset", default="sharegpt-like")
    parser.add_argument("--rate", type=float, default=50.0,
                        help="requests/s (50: sustained by the default deployment with "
                             "--output-len uniform:8:64)")
    parser.add_argument("--output-len", default="uniform:8:64",
                        help="kvsim gen --output-len ('' for the preset's lengths)")
    parser.add_argument("--work", type=Path, help="where traces and runs go (default: a "
                        "temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep traces and run outputs")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="kvsim-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in sorted(args.sizes):
        rows.append(measure(n, args, work))
        print(table(rows).splitlines()[-2], flush=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if not args.work and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
