"""Validation that reproduces: profile and validate back to back, N times; median and spread.

Each repeat runs the trace on the real backend while it profiles it between the steps (full
grid, as long again as the run; ``--profile-timing before`` profiles first, ``--profile`` names
a file), replays the real steps once more (the noise floor) and runs the simulator
(``kvsim.real_backend.protocol``). Prints one column per repeat, the median and the
spread, every error against its own noise floor, and the CPU other processes used meanwhile;
writes ``protocol.json`` into ``--out``. Run it under ``bench/quiet.py`` for numbers to
publish, and as is on a busy host to see how far a validation there can be trusted::

    python3 bench/quiet.py --max-wait 3600 -- python3 bench/validate_protocol.py \\
        reports/validation/cpu-tiny-llama-capped/chat.jsonl --repeats 3 --offline \\
        --out reports/validation/protocol/quiet

Experiments (what moves the result): ``--breakdown`` (time attention, MLP, LM head and host
work per step), ``--pin-cpu N`` (bind the process to one core), ``--warmup-s S`` (decode steps
for S seconds before each real run), ``--profile-rounds R`` (passes over the profile grid).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="write protocol.json here")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--clock", default="cpu", choices=("cpu", "wall"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--offline", action="store_true", help="every request arrives at t=0")
    ap.add_argument("--num-gpu-blocks", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--profile", default=None, help="a profile file (no profiling per repeat)")
    ap.add_argument("--quick-profile", action="store_true", help="quick grid per repeat")
    ap.add_argument("--profile-rounds", type=int, default=None)
    from kvsim.real_backend.validate_profile import PROFILE_TIMINGS
    ap.add_argument("--profile-timing", default=PROFILE_TIMINGS[0], choices=PROFILE_TIMINGS,
                    help="profile between the real run's steps, or before each real run")
    ap.add_argument("--profile-share", type=float, default=1.0,
                    help="interleaved: seconds of profiling per second of real run")
    ap.add_argument("--step-repeats", type=int, default=1, help="forward passes per step")
    ap.add_argument("--warmup-s", type=float, default=0.0)
    ap.add_argument("--pin-cpu", type=int, default=None, help="bind to this CPU core")
    ap.add_argument("--breakdown", action="store_true")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from kvsim.pipeline import resolve_trace
    from kvsim.real_backend.protocol import render_protocol, run_protocol
    from kvsim.real_backend.session import BackendSettings
    from kvsim.real_backend.validate import ValidateJob
    from kvsim.reports.io import write_json_atomic
    from kvsim.workloads import load_trace

    if args.pin_cpu is not None:
        os.sched_setaffinity(0, {args.pin_cpu})
    path, label = resolve_trace(args.trace)
    settings = BackendSettings(model=args.model, clock=args.clock, threads=args.threads)
    engine = {"num_gpu_blocks": args.num_gpu_blocks, "max_num_seqs": args.max_num_seqs,
              "max_num_batched_tokens": args.max_num_batched_tokens}
    job = ValidateJob(settings, engine, args.profile, args.step_repeats, args.offline, label,
                      noise_floor=True, profile_grid="quick" if args.quick_profile else "full",
                      profile_rounds=args.profile_rounds, breakdown=args.breakdown,
                      warmup_s=args.warmup_s, profile_timing=args.profile_timing,
                      profile_share=args.profile_share)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    summary = run_protocol(load_trace(path), job, args.repeats,
                           lambda line: print(line, file=sys.stderr, flush=True))
    summary.update(trace=label, started=started, argv=sys.argv[1:],
                   pinned_cpu=args.pin_cpu, warmup_s=args.warmup_s,
                   profile_timing=args.profile_timing, profile_share=args.profile_share)
    print(render_protocol(summary))
    if args.out:
        print(f"wrote {write_json_atomic(Path(args.out) / 'protocol.json', summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
