"""Simulator speed and memory, old commit against this checkout, side by side in one run.

    python bench/sim_speed.py                       # every case, old = b45c6b7
    python bench/sim_speed.py --only vidur mooncake --repeat 3
    python bench/sim_speed.py --old HEAD~5 --shared ../shared

Each case runs ``kvsim`` as a user would, in a fresh process per version (the old commit from a
git worktree it creates under ``--work``), alternating old and new so that a host slowing down
hurts both alike. Per case and version it records wall seconds, CPU seconds (user + system of
that process and its workers) and peak RSS (its own ``wait4`` rusage), and checks that both
versions simulated the same thing (completed requests and output throughput from
``summary.json``; a plan's recommended deployment). The table's ratios are old / new from this
one run: they hold on another machine as long as nothing else runs during the measurement
(the line under the table says how much CPU other processes took meanwhile). Both versions'
bytecode is compiled before the first run, so that no timed run compiles modules (with
``PYTHONDONTWRITEBYTECODE`` set, or a fresh worktree, every run would, and unevenly: ~0.1 s).

Cases (the targets of issue 15):

- ``vidur``: Vidur's own 19,366 requests with the settings of ``traces/vidur/README.md``
  (target: new >= 5x faster than b45c6b7);
- ``mooncake``: the whole Mooncake conversation trace, Llama-3-70B on 4xH100 (target <= 8 s);
- ``mooncake-lru``: LRU against LRU, the same pairs as the variants: the spread of its pair
  ratios is the noise floor of theirs;
- ``mooncake-<policy>``, ``mooncake-offload`` and ``mooncake-host``: the same with another
  eviction policy, vLLM's native CPU tier (256 GiB), or kvsim's write-back host tier of the
  same size (the host tier of b45c6b7, which issue 15 measured at 1.9x) (target: <= 1.5x the
  new LRU time; the ratio column for these is the median over
  the repeats of the variant's time over an LRU run made just before it, each pair listed
  under the table; with ``--side-by-side``, of the variant's CPU seconds over those of an LRU
  run made at the same time on the other core);
- ``million``: a generated 1,000,000-request trace, ``kvsim gen`` and ``kvsim run`` peak RSS
  (target <= 1 GB; new version only unless ``--old-million``);
- ``plan70b``: the cheapest Llama-2-70B deployment meeting TTFT p99 <= 2 s and TPOT p99 <= 0.2 s
  on the Azure conversation trace (target <= 5 minutes wall on 2 cores, <= 1 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
VIDUR = ["--model", "llama-2-7b", "--gpu", "a100-80gb", "--tp", "1", "--max-num-seqs", "128",
         "--max-num-batched-tokens", "4096", "--max-model-len", "4096", "--block-size", "16",
         "--num-gpu-blocks", "7424"]
MOONCAKE = ["--model", "llama-3-70b", "--gpu", "h100-80gb", "--tp", "4", "--max-model-len",
            "131072"]
PLAN = ["--model", "llama-2-70b", "--gpu", "a100-80gb,h100-80gb", "--tp", "2,4,8",
        "--slo-ttft-p99", "2", "--slo-tpot-p99", "0.2", "--max-model-len", "4096",
        "--long-prompt", "truncate"]
POLICIES = ("lfu", "priority", "hybrid", "arc", "s3fifo", "lookahead")


@dataclass
class Case:
    """One measurement: ``kvsim`` arguments per version (``None``: that version cannot run it)."""

    name: str
    new: list[str] | None
    old: list[str] | None
    baseline: str = ""          # ratio against this case's new time instead of against old
    target: str = ""
    setup: list[list[str]] = field(default_factory=list)  # commands run first, untimed
    inputs: list[str] = field(default_factory=list)        # the trace files it reads
    env: dict = field(default_factory=dict)   # set for the new version's run of this case


def cases(shared: Path, work: Path, old_million: bool) -> list[Case]:
    vidur = str(shared / "traces/vidur/vidur_conv_19366.jsonl")
    mooncake = str(shared / "traces/mooncake/conversation_trace.jsonl")
    azure = str(shared / "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
    million = str(work / "million.jsonl")
    run = ["run", "--quiet"]  # report.html too: b45c6b7 always wrote it
    found = [
        Case("vidur", [*run, vidur, *VIDUR], [*run, vidur, *VIDUR], target=">= 5x",
             inputs=[vidur]),
        Case("mooncake", [*run, mooncake, *MOONCAKE], [*run, mooncake, *MOONCAKE],
             target="<= 8 s"),
    ]
    for policy in POLICIES:
        args = [*run, mooncake, *MOONCAKE, "--eviction", policy]
        found.append(Case(f"mooncake-{policy}", args, None, baseline="mooncake",
                          target="<= 1.5x lru"))
    found.append(Case("mooncake-lru", [*run, mooncake, *MOONCAKE, "--eviction", "lru"], None,
                      baseline="mooncake", target="noise: 1.00"))
    found.append(Case("mooncake-pure", [*run, mooncake, *MOONCAKE], None, baseline="mooncake",
                      target="dicts / compiled", env={"KVSIM_PURE_PYTHON": "1"}))
    found.append(Case("mooncake-offload", [*run, mooncake, *MOONCAKE,
                                           "--kv-offloading-size", "256"],
                      [*run, mooncake, *MOONCAKE, "--cpu-offload-gb", "64"],
                      baseline="mooncake", target="<= 1.5x lru"))
    found.append(Case("mooncake-host", [*run, mooncake, *MOONCAKE, "--kv-offloading-size",
                                        "256", "--offload-write", "back"],
                      [*run, mooncake, *MOONCAKE, "--num-cpu-blocks", "52428"],
                      baseline="mooncake", target="<= 1.5x lru"))
    gen = [["gen", "chat", "-n", "1000000", "--seed", "0", "--out", million]]
    found.append(Case("million-gen", gen[0], gen[0] if old_million else None,
                      target="<= 1 GB"))
    found.append(Case("million", [*run, million], [*run, million] if old_million else None,
                      target="<= 1 GB", setup=gen))
    plan = ["plan", azure, *PLAN, "--quiet", "--json"]
    found.append(Case("plan70b", plan, plan, target="<= 300 s, <= 1 GB", inputs=[azure]))
    for case in found:
        if case.name.startswith("mooncake"):
            case.inputs.append(mooncake)
    return found


def check_cases(found: list[Case], only: list[str] | None) -> list[Case]:
    """The cases ``--only`` names (all by default); exits (status 2) with one line when a
    name is unknown or a trace they read is missing."""
    names = [case.name for case in found]
    unknown = [name for name in only or () if name not in names]
    if unknown:
        _refuse(f"no case {unknown[0]!r} (cases: {', '.join(names)})")
    chosen = [case for case in found if not only or case.name in only]
    missing = [p for case in chosen for p in case.inputs if not Path(p).is_file()]
    if missing:
        _refuse(f"no trace {missing[0]}: --shared DIR must hold the public traces "
                "(docs/performance.md, 'Measuring', says which)")
    return chosen


def _refuse(message: str) -> None:
    print(f"sim_speed.py: {message}", file=sys.stderr)
    sys.exit(2)


@dataclass
class Measure:
    wall_s: float
    cpu_s: float
    rss_mb: float
    check: str
    error: str = ""


def kvsim_argv(pythonpath: Path | None) -> tuple[list[str], dict]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    code = "import sys; from kvsim.cli import main; sys.argv[0] = 'kvsim'; main()"
    return [sys.executable, "-c", code], env


def measure(argv: list[str], env: dict, out: Path) -> Measure:
    """Run one command; its own wall, CPU (with its children) and peak RSS."""
    return finish(*start(argv, env, out))


def measure_pair(first: list[str], second: list[str], env: dict, out_first: Path,
                 out_second: Path, second_env: dict | None = None) -> tuple[Measure, Measure]:
    """Run two commands at the same time (one core each on a 2-core host), so that both see
    the host at the same speed; each one's own measure (``second_env``: the second's
    environment, when not ``env``)."""
    a, b = start(first, env, out_first), start(second, second_env or env, out_second)
    return finish(*a), finish(*b)


def start(argv: list[str], env: dict, out: Path) -> tuple:
    if "run" in argv:
        argv = [*argv, "--out", str(out)]
    with open(out.with_suffix(".stdout"), "w") as stdout, open(out.with_suffix(".stderr"),
                                                               "w") as stderr:
        return subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr), \
            time.perf_counter(), out


def finish(proc: subprocess.Popen, started: float, out: Path) -> Measure:
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        tail = out.with_suffix(".stderr").read_text().strip().splitlines()[-1:]
        return Measure(wall, 0, 0, "", error=f"exit {proc.returncode}: {' '.join(tail)}")
    cpu = usage.ru_utime + usage.ru_stime
    return Measure(wall, cpu, usage.ru_maxrss / 1024, result_check(out))


def result_check(out: Path) -> str:
    """What must agree between versions: a run's completed requests and output throughput, a
    plan's recommended deployment."""
    summary = out / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        return (f"{s.get('num_completed')} done, "
                f"{s.get('throughput_output_tokens_per_s') or 0:.6g} tok/s")
    text = out.with_suffix(".stdout").read_text()
    try:
        rec = json.loads(text).get("recommended") or {}
    except ValueError:
        return ""
    return " ".join(f"{k}={rec.get(k)}" for k in ("gpu", "tp", "replicas") if k in rec)


def old_checkout(rev: str, work: Path) -> Path:
    """A git worktree of ``rev`` importable as ``kvsim`` (returns the PYTHONPATH entry)."""
    tree = work / f"old-{rev}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", str(tree), rev],
                       check=True, capture_output=True)
    compile_ahead(tree)
    path = work / f"pp-{rev}"
    path.mkdir(exist_ok=True)
    link = path / "kvsim"
    if not link.exists():
        link.symlink_to(tree)
    return path


def compile_ahead(tree: Path) -> None:
    """Write the bytecode of ``tree``'s modules now (``compileall`` writes it whatever
    ``PYTHONDONTWRITEBYTECODE`` says), so that the timed runs only load it."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-x", r"[/\\]\.git[/\\]",
                    str(tree)], check=True, capture_output=True)


def other_cpu_s() -> float:
    """CPU seconds used so far by every process on the host (from /proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = sum(int(v) for i, v in enumerate(fields) if i not in (3, 4))  # minus idle, iowait
    return ticks / os.sysconf("SC_CLK_TCK")


def fmt(m: Measure | None, key: str, spec: str) -> str:
    if m is None:
        return "-"
    return m.error[:12] if m.error else format(getattr(m, key), spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", type=Path, default=HERE.parent / "shared")
    parser.add_argument("--old", default="b45c6b7", help="commit to compare with")
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case and version; "
                        "the table shows the fastest, the lines under it every pair's ratio "
                        "and every new time, the JSON every run")
    parser.add_argument("--old-million", action="store_true",
                        help="also run the million-request cases on the old commit")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "kvsim-bench")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    parser.add_argument("--side-by-side", action="store_true",
                        help="run each variant at the same time as its baseline, one per core, "
                        "and take the ratio of their CPU seconds (on a host whose speed swings "
                        "within a minute, runs made one after the other do not see it alike)")
    args = parser.parse_args()
    found = cases(args.shared, args.work, args.old_million)
    chosen = check_cases(found, args.only)
    args.work.mkdir(parents=True, exist_ok=True)
    versions = {"old": kvsim_argv(old_checkout(args.old, args.work)), "new": kvsim_argv(None)}
    compile_ahead(HERE)
    rows, own_cpu, host0 = [], 0.0, other_cpu_s()
    new_args = {c.name: c.new for c in found}
    for case in chosen:
        for command in case.setup:
            subprocess.run(versions["new"][0] + command, env=versions["new"][1], check=True,
                           capture_output=True)
        best, pairs, cpu, walls = measure_case(case, versions, new_args.get(case.baseline),
                                               args.repeat, args.work, args.side_by_side)
        own_cpu += cpu
        rows.append((case, best, pairs, walls))
    others = max(0.0, other_cpu_s() - host0 - own_cpu)
    print_table(rows, args.old, args.side_by_side)
    print(f"other processes used {others:.0f} CPU-s during the measurement (0 on a quiet host)")
    if args.json:
        args.json.write_text(json.dumps([{"case": c.name, "target": c.target, **{
            v: (m.__dict__ if m else None) for v, m in best.items()}, "pair_ratios": pairs,
            "new_wall_s": walls} for c, best, pairs, walls in rows], indent=1))


def measure_case(case: Case, versions: dict, baseline: list[str] | None, repeat: int,
                 work: Path, side_by_side: bool = False
                 ) -> tuple[dict, list[float], float, list[float]]:
    """Run ``case`` ``repeat`` times per version, old and new alternating. A variant (a case
    with a baseline) runs right after its own run of the baseline, so that each ratio compares
    two adjacent runs: on a host whose speed drifts by tens of percent over minutes, a ratio
    against a baseline measured earlier says more about the drift than about the code. With
    ``side_by_side`` the two run at the same time and the ratio is of their CPU seconds.
    Returns the fastest run per version, the ratio of each pair (variant / baseline, or old /
    new wall seconds of a case both versions run), the CPU seconds used and the new side's
    wall seconds in every repeat."""
    if side_by_side and baseline is not None:
        return measure_side_by_side(case, versions["new"], baseline, repeat, work)
    best: dict[str, Measure | None] = {"old": None, "new": None}
    pairs, cpu, walls = [], 0.0, []
    for i in range(repeat):
        base = None
        runs: dict[str, Measure] = {}
        if baseline is not None:
            prefix, env = versions["new"]
            base = measure(prefix + baseline, env, work / f"{case.name}-baseline-{i}")
            cpu += base.cpu_s
            print(f"# {case.name} baseline {case.baseline}: {base}", file=sys.stderr)
        for version in ("old", "new"):
            argv = getattr(case, version)
            if argv is None:
                continue
            prefix, env = versions[version]
            if version == "new":
                env = {**env, **case.env}
            m = runs[version] = measure(prefix + argv, env, work / f"{case.name}-{version}-{i}")
            cpu += m.cpu_s
            if best[version] is None or (not m.error and m.wall_s < best[version].wall_s):
                best[version] = m
            print(f"# {case.name} {version}: {m}", file=sys.stderr)
            if version == "new" and not m.error:
                walls.append(round(m.wall_s, 2))
            if version == "new" and base is not None and not (base.error or m.error):
                pairs.append(round(m.wall_s / base.wall_s, 3))
        old, new = runs.get("old"), runs.get("new")
        if base is None and old and new and not (old.error or new.error):
            pairs.append(round(old.wall_s / new.wall_s, 3))
    return best, pairs, cpu, walls


def measure_side_by_side(case: Case, version: tuple, baseline: list[str], repeat: int,
                         work: Path) -> tuple[dict, list[float], float, list[float]]:
    """:func:`measure_case` for a variant run at the same time as its baseline."""
    best: dict[str, Measure | None] = {"old": None, "new": None}
    pairs, cpu, walls = [], 0.0, []
    prefix, env = version
    for i in range(repeat):
        base, m = measure_pair(prefix + baseline, prefix + case.new, env,
                               work / f"{case.name}-baseline-{i}", work / f"{case.name}-new-{i}",
                               {**env, **case.env})
        cpu += base.cpu_s + m.cpu_s
        print(f"# {case.name} baseline {case.baseline} beside it: {base}", file=sys.stderr)
        print(f"# {case.name} new: {m}", file=sys.stderr)
        if not (base.error or m.error):
            pairs.append(round(m.cpu_s / base.cpu_s, 3))
            walls.append(round(m.wall_s, 2))
            if best["new"] is None or m.wall_s < best["new"].wall_s:
                best["new"] = m
    return best, pairs, cpu, walls


def maps_in_use() -> str:
    """Which maps of block hashes this checkout's runs use (kvsim.cache.intmap)."""
    code = "from kvsim.cache import intmap; print(intmap.COMPILED)"
    compiled = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout.strip() == "True"
    return ("the compiled IntMap" if compiled else
            "Python dicts (cache/_intmap.c not built, or KVSIM_PURE_PYTHON set): slower")


def print_table(rows, old: str, side_by_side: bool = False) -> None:
    head = (f"{'case':<18}{'old s':>9}{'new s':>9}{'ratio':>8}{'old CPU':>9}{'new CPU':>9}"
            f"{'old RSS':>9}{'new RSS':>9}  {'target':<18}same result")
    pairing = ("CPU s of new / the LRU run beside it" if side_by_side
               else "new / the LRU run just before it")
    print(f"old = {old}, new = this checkout; seconds are wall, RSS in MB; ratio = old / new "
          f"(for variants: the median of {pairing})")
    print(f"new's maps of block hashes: {maps_in_use()}")
    print(head)
    for case, best, pairs, _ in rows:
        o, n = best["old"], best["new"]
        ratio = "-"
        if case.baseline:
            ratio = f"{statistics.median(pairs):.2f}" if pairs else "-"
        elif o and n and not o.error and not n.error:
            ratio = f"{o.wall_s / n.wall_s:.2f}x"
        same = "-" if not (o and n) else ("yes" if o.check == n.check else
                                          f"NO: {o.check} vs {n.check}")
        print(f"{case.name:<18}{fmt(o, 'wall_s', '.1f'):>9}{fmt(n, 'wall_s', '.1f'):>9}"
              f"{ratio:>8}{fmt(o, 'cpu_s', '.1f'):>9}{fmt(n, 'cpu_s', '.1f'):>9}"
              f"{fmt(o, 'rss_mb', '.0f'):>9}{fmt(n, 'rss_mb', '.0f'):>9}  {case.target:<18}"
              f"{same if o else (n.check if n else '')}")
    for case, _, pairs, walls in rows:
        if len(pairs) > 1:
            print(f"{case.name}: each pair {' '.join(f'{r:.2f}' for r in pairs)}; new s "
                  f"{' '.join(f'{w:.2f}' for w in walls)}")


if __name__ == "__main__":
    main()
