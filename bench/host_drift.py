"""How steady is this host? Time one fixed decode step of the real backend, over and over.

Prints, per window of ``--window`` seconds, the median step time, and at the end the spread of
those window medians (drift: the host's speed changing over seconds to minutes) and the median
deviation of single steps from their window's median (jitter). A validation's per-step error
cannot be expected below roughly the larger of the two::

    python bench/host_drift.py --seconds 120 --batch 1 --context 1023 --clock cpu

``kvsim validate --noise-floor`` measures the same thing on a whole trace (two real runs).
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
    args = ap.parse_args()

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
        jitter += [abs(t / med - 1) for t in times]
        print(f"{len(windows) * args.window:6.0f}s  {med * 1e3:7.2f} ms  ({len(times)} steps)")
    w = np.array(windows)
    print(f"window medians: median {np.median(w) * 1e3:.2f} ms, p10-p90 "
          f"{np.percentile(w, 10) * 1e3:.2f}-{np.percentile(w, 90) * 1e3:.2f} ms "
          f"(max/min {w.max() / w.min():.2f}); median |window / overall - 1| "
          f"{np.median(np.abs(w / np.median(w) - 1)):.1%}; single-step jitter (median |step / "
          f"window median - 1|) {np.median(jitter):.1%}")


if __name__ == "__main__":
    main()
