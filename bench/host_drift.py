"""How steady is this host? Time one fixed decode step of the real backend, over and over.

Prints, per window of ``--window`` seconds, the median step time, and at the end the spread of
those window medians (drift: the host's speed changing over seconds to minutes) and the median
deviation of single steps from their window's median (jitter). A validation's per-step error
cannot be expected below roughly the larger of the two::

    python bench/host_drift.py --seconds 120 --batch 1 --context 1023 --clock cpu

``kvsim validate`` measures the same thing on a whole trace (its noise floor: the real run's
steps replayed once more); ``bench/validate_protocol.py`` repeats that with fresh profiles.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=1023)
    ap.add_argument("--clock", default="cpu", choices=("cpu", "wall"))
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--breakdown", action="store_true", help="also time attention, MLP, LM "
                    "head and host work of each step, and say which of them drifts")
    ap.add_argument("--pin-cpu", type=int, default=None, help="bind to this CPU core")
    args = ap.parse_args()
    if args.pin_cpu is not None:
        import os
        os.sched_setaffinity(0, {args.pin_cpu})

    from kvsim.real_backend.breakdown import PARTS, StepBreakdown
    from kvsim.real_backend.torch_executor import clock_fn, interlude
    from kvsim.real_backend.model_runner import RequestChunk
    from kvsim.real_backend.session import BackendSettings, build_runner, prepare_device, warm_up

    settings = BackendSettings(model=args.model, clock=args.clock)
    model = prepare_device(settings)
    per_req = -(-(args.context + 1) // settings.block_size)
    runner = build_runner(settings, model, per_req * args.batch)
    warm_up(runner, args.batch)
    chunks = [RequestChunk([7], args.context, list(range(i * per_req, (i + 1) * per_req)))
              for i in range(args.batch)]
    now = clock_fn(args.clock)
    breakdown = StepBreakdown(now).attach(runner) if args.breakdown else None
    part_windows: dict[str, list[float]] = {p: [] for p in PARTS}
    windows, jitter = [], []
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        times, stop = [], time.perf_counter() + args.window
        while time.perf_counter() < stop:
            interlude()
            t0 = now()
            runner.greedy(chunks)
            times.append(now() - t0)
        med = statistics.median(times)
        windows.append(med)
        if breakdown is not None:
            for part in PARTS:
                part_windows[part].append(statistics.median(
                    r[part] for r in breakdown.records[-len(times):]))
        jitter += [abs(t / med - 1) for t in times]
        print(f"{len(windows) * args.window:6.0f}s  {med * 1e3:7.2f} ms  ({len(times)} steps)")
    w = np.array(windows)
    print(f"window medians: median {np.median(w) * 1e3:.2f} ms, p10-p90 "
          f"{np.percentile(w, 10) * 1e3:.2f}-{np.percentile(w, 90) * 1e3:.2f} ms "
          f"(max/min {w.max() / w.min():.2f}); median |window / overall - 1| "
          f"{np.median(np.abs(w / np.median(w) - 1)):.1%}; single-step jitter (median |step / "
          f"window median - 1|) {np.median(jitter):.1%}")
    if breakdown is not None:
        print_parts(part_windows, w)


def print_parts(part_windows: dict, total: np.ndarray) -> None:
    """Per part: its median share of the step, and how much its window medians drift
    (median |window / overall - 1|, and max/min)."""
    print(f"{'part':<10}{'ms':>8}{'share':>8}{'drift':>8}{'max/min':>9}")
    for part, values in part_windows.items():
        v = np.array(values)
        med = float(np.median(v))
        drift = float(np.median(np.abs(v / med - 1))) if med else 0.0
        ratio = v.max() / v.min() if v.min() > 0 else float("nan")
        print(f"{part:<10}{med * 1e3:8.3f}{med / np.median(total):8.1%}{drift:8.1%}"
              f"{ratio:9.2f}")


if __name__ == "__main__":
    main()
