"""Run a command when the host is quiet, and report how much CPU other processes used meanwhile.

CPU timings of the real backend (``kvsim profile`` / ``kvsim validate`` on a small host) are
only comparable when nothing else runs: a second process on the other core slows a memory-bound
step by 20-40 % even under ``--clock cpu`` (shared caches and memory bandwidth). This waits
until other processes have used less than ``--idle`` of one CPU for ``--settle`` seconds, runs
the command, and prints (to stderr) the CPU other processes used during it, in CPUs::

    python bench/quiet.py -- kvsim validate chat.jsonl --profile profile.json --clock cpu ...

Exit status: the command's. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def busy_ticks() -> int:
    """Non-idle CPU ticks of the whole host since boot."""
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields[:8]) - idle


def tree_ticks(root: int) -> int:
    """CPU ticks of ``root`` and its descendants (live ones, plus reaped children's)."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(name)
        stats[pid] = fields
        children.setdefault(int(fields[1]), []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            f = stats[pid]
            total += sum(int(v) for v in f[11:15])   # utime stime cutime cstime
        todo += children.get(pid, [])
    return total


def others_share(seconds: float) -> float:
    """CPUs used by processes other than this one over ``seconds``."""
    me = os.getpid()
    b0, m0, t0 = busy_ticks(), tree_ticks(me), time.monotonic()
    time.sleep(seconds)
    b1, m1, t1 = busy_ticks(), tree_ticks(me), time.monotonic()
    return max((b1 - b0) - (m1 - m0), 0) / TICK / (t1 - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=float, default=0.05, help="CPUs others may use (default 0.05)")
    ap.add_argument("--settle", type=float, default=10.0, help="quiet seconds needed first")
    ap.add_argument("--max-wait", type=float, default=1800.0, help="give up waiting after this")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command")
    start = time.monotonic()
    while (share := others_share(args.settle)) > args.idle:
        if time.monotonic() - start > args.max_wait:
            print(f"quiet: still busy ({share:.2f} CPUs) after {args.max_wait:.0f}s; running anyway",
                  file=sys.stderr)
            break
    waited = time.monotonic() - start
    b0, t0 = busy_ticks(), time.monotonic()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    b1, t1 = busy_ticks(), time.monotonic()
    own = usage.ru_utime + usage.ru_stime
    others = max((b1 - b0) / TICK - own, 0) / (t1 - t0)
    print(f"quiet: waited {waited:.0f}s; the command ran {t1 - t0:.0f}s while other processes "
          f"used {others:.2f} CPUs (load {open('/proc/loadavg').read().split()[0]})",
          file=sys.stderr)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
