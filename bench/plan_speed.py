"""Planner speed: the issue-15 capacity question, old commit(s) beside this tree.

    python bench/plan_speed.py [--old 435a660] [--old b45c6b7] [--limit N] [--workers 2]
                               [--no-prune] [--json-dir DIR] [--shared DIR]

The question (issue #15 point 6): the cheapest Llama-2-70B deployment meeting TTFT p99 <= 2 s
and TPOT p99 <= 0.2 s on the Azure conversation trace, prompts clipped to 4,096 tokens
(``--max-model-len 4096 --long-prompt truncate``), GPUs a100-80gb/h100-80gb, TP 2/4/8.

Each side runs ``kvsim plan ... --json`` in a fresh process (an old commit from ``git archive``
into a temporary directory, imported through its own ``PYTHONPATH``), so its CPU seconds (the
process and its worker processes) and peak RSS (the largest of them) are its own. Every
``simulate`` call the planner makes, in any worker, appends its engine-step count to a file, so
the table counts simulations and simulated engine steps whatever the commit reports itself.
On a shared machine compare CPU seconds and counts, not wall seconds. ``--no-prune`` adds this
tree with ``PlanSpec.prune`` off (the search and full runs of before issue 15, but this tree's
simulator). ``b45c6b7``, the commit the issue measured, has no ``--max-model-len`` or
``--long-prompt`` on ``kvsim plan``, so it cannot run the question as asked: compare with
``435a660`` (this branch's start).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS_ENV = "KVSIM_PLAN_SPEED_STEPS"
TRACE = "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
QUESTION = ["--model", "llama-2-70b", "--gpu", "a100-80gb,h100-80gb", "--tp", "2,4,8",
            "--slo-ttft-p99", "2", "--slo-tpot-p99", "0.2", "--max-model-len", "4096",
            "--long-prompt", "truncate"]


def _count_steps() -> None:
    """Wrap the planner's ``simulate`` so that every call appends its step count to the file
    named by :data:`STEPS_ENV` (runs in the child and, re-imported by ``spawn``, its workers)."""
    from kvsim.sim.plan import planner
    simulate, path = planner.simulate, os.environ[STEPS_ENV]

    def counting(requests, config, *args, **kwargs):
        cpu = time.process_time()
        result = simulate(requests, config, *args, **kwargs)
        with open(path, "a") as f:    # steps first; the rest for a look at where time goes
            f.write(f"{len(result.steps)} {time.process_time() - cpu:.2f} {config.gpu} "
                    f"TP{config.tp} x{config.replicas} {result.duration_s:.0f}\n")
        return result
    planner.simulate = counting


if os.environ.get(STEPS_ENV):
    _count_steps()


def _child(argv: list[str]) -> None:
    """Run ``kvsim plan argv`` in this process (the cli's own entry point); ``--no-prune``
    in ``argv``: with the spec's pruning off (no early stop, the search from one replica)."""
    if "--no-prune" in argv:
        argv = [a for a in argv if a != "--no-prune"]
        from dataclasses import replace
        from kvsim.sim.plan import planner
        plan = planner.plan
        planner.plan = lambda spec, *args, **kw: plan(replace(spec, prune=False), *args, **kw)
    sys.argv = ["kvsim", "plan", *argv]
    from kvsim.cli import main
    main()


def _side_path(rev: str | None, tmp: Path) -> str:
    """A PYTHONPATH under which ``import kvsim`` gives ``rev`` (None: this tree's)."""
    if rev is None:
        return os.environ.get("PYTHONPATH", "")
    tree = tmp / rev / "kvsim"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return str(tree.parent)


def run_side(name: str, pythonpath: str, plan_args: list[str], tmp: Path) -> dict:
    """One ``kvsim plan`` in a fresh process: its counts, CPU seconds, wall, peak RSS, answer."""
    steps_file = tmp / f"{name}.steps"
    steps_file.write_text("")
    env = {**os.environ, "PYTHONPATH": pythonpath, STEPS_ENV: str(steps_file)}
    out = tmp / f"{name}.out"
    args = [*plan_args, "--out", str(tmp / f"{name}-plan"), "--no-html", "--json"]
    start = time.perf_counter()
    with open(out, "w") as stdout:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", *args], env=env,
                                stdout=stdout, cwd=tmp)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{name}: kvsim plan failed ({os.waitstatus_to_exitcode(status)})")
    plan = json.loads(out.read_text())
    sims = steps_file.read_text().splitlines()
    steps = [int(line.split()[0]) for line in sims]
    return {"side": name, "plan": plan, "simulations": len(steps), "steps": sum(steps),
            "per_simulation": sims,
            "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall,
            "peak_rss_mb": usage.ru_maxrss / 1024}


def answer(plan: dict) -> str:
    """The recommended deployment and every candidate's replica count (or infeasible)."""
    best = plan["recommended"]
    head = f"{best['label']} x{best['replicas']}" if best else "none"
    counts = ",".join(str(r["replicas"]) if r["feasible"] else "-"
                      for r in sorted(plan["candidates"], key=lambda r: r["index"]))
    return f"{head} [{counts}]"


def table(rows: list[dict]) -> str:
    base = rows[0]
    lines = [f"{'side':<12} {'sims':>5} {'steps':>10} {'CPU s':>8} {'wall s':>8} "
             f"{'RSS MB':>7} {'CPU ratio':>9}  recommended [replicas per candidate]"]
    for r in rows:
        ratio = base["cpu_s"] / r["cpu_s"] if r["cpu_s"] else float("nan")
        lines.append(f"{r['side']:<12} {r['simulations']:>5} {r['steps']:>10,} "
                     f"{r['cpu_s']:>8.1f} {r['wall_s']:>8.1f} {r['peak_rss_mb']:>7.0f} "
                     f"{ratio:>8.2f}x  {answer(r['plan'])}")
    same = len({answer(r["plan"]) for r in rows}) == 1
    lines.append("same answer on every side" if same else "ANSWERS DIFFER")
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        return _child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", action="append", default=[],
                        help="a commit to run beside this tree (repeatable)")
    parser.add_argument("--no-new", action="store_true", help="run only the --old commits")
    parser.add_argument("--limit", type=int, help="keep the trace's first N requests")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-prune", action="store_true",
                        help="also run this tree with the planner's pruning off")
    parser.add_argument("--json-dir", type=Path, help="keep each side's plan JSON here")
    parser.add_argument("--shared", type=Path, default=ROOT.parents[0] / "shared")
    args = parser.parse_args()
    plan_args = [str(args.shared / TRACE), *QUESTION, "--workers", str(args.workers)]
    plan_args += ["--limit", str(args.limit)] if args.limit else []
    sides = [(rev, rev) for rev in args.old] + ([] if args.no_new else [("new", None)])
    rows = []
    with tempfile.TemporaryDirectory(prefix="plan-speed-") as tmp:
        for name, rev in sides:
            rows.append(run_side(name, _side_path(rev, Path(tmp)), plan_args, Path(tmp)))
            print(f"{name}: done in {rows[-1]['wall_s']:.0f} s", file=sys.stderr, flush=True)
        if args.no_prune and not args.no_new:
            rows.append(run_side("new-noprune", _side_path(None, Path(tmp)),
                                 [*plan_args, "--no-prune"], Path(tmp)))
    if args.json_dir:
        args.json_dir.mkdir(parents=True, exist_ok=True)
        for r in rows:
            (args.json_dir / f"{r['side']}.json").write_text(json.dumps(r, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
