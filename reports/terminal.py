"""Terminal output: a compact summary table and a progress bar for long runs (rich)."""

from __future__ import annotations

import time
from typing import Optional

from rich import box
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn,
                           TextColumn, TimeElapsedColumn)
from rich.table import Table

from kvsim.reports.run_texts import cache_text, deployment_text, trace_text
from kvsim.reports.style import (FRAG_KEYS, fmt_num, fmt_pct, fmt_seconds, fmt_seconds_alike,
                                 get, is_number, left_out_summary_text, no_lookup_text,
                                 parse_slo, preemption_text,
                                 rejected_text, slo_met, stopped_text, tier_text,
                                 truncated_text)


def _latency_row(summary: dict, metric: str) -> str:
    return " / ".join(fmt_seconds_alike([get(summary, metric, p) for p in ("p50", "p90", "p99")]))


_SHORT_FRAG = {"token_states": "tokens", "reservation": "reserved", "internal": "internal",
               "external": "external", "free": "free"}


def _frag_text(frag: dict) -> str:
    if not frag:
        return "—"
    return " · ".join(f"{_SHORT_FRAG[k]} {fmt_pct(frag.get(k))}" for k in FRAG_KEYS)


def _in_total(summary: dict) -> str:
    """``  (1,234 input, 5,678 total tok/s)`` where the summary has them (newer runs)."""
    inp, tot = (get(summary, k) for k in ("throughput_input_tokens_per_s",
                                          "throughput_total_tokens_per_s"))
    if not (is_number(inp) and is_number(tot)):
        return ""
    return f"  ({fmt_num(inp)} input, {fmt_num(tot)} total tok/s)"


def summary_table(summary: dict) -> Table:
    """A two-column rich table of a run's headline numbers (see :func:`print_summary`)."""
    table = Table(box=box.SIMPLE_HEAD, show_header=True, header_style="bold", pad_edge=False,
                  title="kvsim run summary", title_justify="left", title_style="bold")
    table.add_column("metric", style="dim", no_wrap=True)
    table.add_column("value", no_wrap=False)
    frag = get(summary, "fragmentation", default={}) or {}
    rows = [
        *run_rows(summary),
        ("throughput", f"{fmt_num(get(summary, 'throughput_output_tokens_per_s'))} output tok/s"
                       + _in_total(summary)),
        ("request throughput", f"{fmt_num(get(summary, 'request_throughput_per_s'), 2)} req/s  "
                         f"({fmt_num(get(summary, 'num_completed'))} of "
                         f"{fmt_num(get(summary, 'num_requests'))} completed)"),
        ("TTFT p50/p90/p99", _latency_row(summary, "ttft_s")),
        ("TPOT p50/p90/p99", _latency_row(summary, "tpot_s")),
        ("E2E p50/p90/p99", _latency_row(summary, "e2e_s")),
        ("prefix hit rate", _hit_text(summary)),
        ("preemptions", f"{fmt_num(get(summary, 'preemptions'))}  "
                        f"({preemption_text(summary)})"),
        ("KV usage mean/peak", f"{fmt_pct(get(summary, 'kv', 'mean_usage'))} / "
                               f"{fmt_pct(get(summary, 'kv', 'peak_usage'))} of "
                               f"{fmt_num(get(summary, 'kv', 'num_gpu_blocks'))} blocks"
                               f"{_per_replica(summary)}"),
        ("cached idle KV", _idle_text(summary)),
        ("KV pool shares", _frag_text(frag)),
        *_tiering_rows(summary),
        ("steps", fmt_num(get(summary, "num_steps"))),
        ("simulated time", fmt_seconds(get(summary, "duration_s"))),
        ("wall time", fmt_seconds(get(summary, "wall_time_s"))),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def run_rows(summary: dict) -> list[tuple[str, str]]:
    """What ran (trace, model, deployment) and which requests did not run as asked."""
    cfg = summary.get("config") or {}
    rows = [("trace", trace_text(cfg)),
            ("deployment", deployment_text(cfg, get(summary, "model", "weight_dtype"),
                                           get(summary, "model", "name"))),
            ("KV cache", cache_text(cfg))]
    if cfg.get("profile"):
        rows.append(("step times", f"from the profile {cfg['profile']}"))
    return rows + [(name, text) for name, text in (("left out", left_out_summary_text(summary)),
                                                     ("rejected", rejected_text(summary)),
                                                     ("truncated", truncated_text(summary)),
                                                     ("cut by length", stopped_text(summary)),
                                                     ("SLO", slo_verdicts(summary)))
                   if text]


def slo_verdicts(summary: dict) -> str:
    """``TTFT p99 <= 3.00 s: met (2.10 s) · ...`` for the run's SLO targets (``""``: none);
    requests that never completed count as misses (:func:`slo_met`)."""
    out = []
    for metric, pct, target in parse_slo(summary.get("slo")):
        value = get(summary, metric, f"p{pct:g}")
        out.append(f"{metric[:-2].upper()} p{pct:g} <= {fmt_seconds(target)}: "
                   + ("met" if slo_met(summary, metric, pct, target) else "missed")
                   + f" ({fmt_seconds(value)} of the completed)")
    return " · ".join(out)


def _per_replica(summary: dict) -> str:
    """`` per replica`` where the pool is one of several."""
    return " per replica" if get(summary, "config", "replicas", default=1) != 1 else ""


def _tiering_rows(summary: dict) -> list[tuple[str, str]]:
    """The host-tier line, when the run had one."""
    t = get(summary, "tiering", default={}) or {}
    if not t.get("num_cpu_blocks"):
        return []
    return [("host tier", f"{fmt_num(t['num_cpu_blocks'])} blocks, {tier_text(summary)}")]


def print_summary(summary: dict, console: Optional[Console] = None) -> None:
    """Print the compact summary table of a run to ``console`` (stdout by default)."""
    print_table(summary_table(summary), console or Console())


def print_table(table, console: Console) -> None:
    """Print a rich table; to a file or pipe without the spaces that pad its lines to the
    console's width (a terminal shows none of them anyway)."""
    if console.is_terminal:
        console.print(table)
        return
    with console.capture() as captured:
        console.print(table)
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


class RunProgress:
    """Progress bar for a simulation: requests done of the trace's, ETA, wall time and the
    simulated clock.

    ``with RunProgress(total_sim_s, total_requests, enabled) as p: p.update(sim_s, done)``.
    ``enabled``: ``None`` shows it only when the console is a terminal, ``True`` forces it,
    ``False`` (or ``quiet``) never shows it. Nothing appears before ``delay_s`` of wall time,
    so short runs print nothing. ``update`` is cheap enough to call every engine step: it
    redraws at most every ``refresh_s``.

    The bar counts finished requests (the simulated clock runs past the last arrival while
    the queue drains, so it cannot be a percentage; ``total_sim_s``, the trace's span, is
    only used when the request count is unknown). Fields come most useful first, so that a
    narrow terminal crops the simulated clock rather than the ETA; under 120 columns the
    layout is compact enough for 80.
    """

    def __init__(self, total_sim_s: float, total_requests: int, enabled: Optional[bool] = None,
                 *, quiet: bool = False, console: Optional[Console] = None,
                 delay_s: float = 1.0, refresh_s: float = 0.1,
                 description: str = "simulating") -> None:
        self.total_sim_s = max(float(total_sim_s or 0.0), 1e-9)
        self.total_requests = int(total_requests or 0)
        self.console = console or Console(stderr=False)
        self.active = (not quiet) and (enabled if enabled is not None
                                       else self.console.is_terminal)
        self.delay_s = delay_s
        self.refresh_s = refresh_s
        self.description = description
        self._progress: Optional[Progress] = None
        self._task = None
        self._wide = True        # the layout, chosen by the console's width when it opens
        self._start = 0.0
        self._next_draw = 0.0
        self.sim_time_s = 0.0
        self.requests_done = 0

    def __enter__(self) -> "RunProgress":
        self._start = time.monotonic()
        self._next_draw = self._start + self.delay_s
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._progress is not None:
            if exc_type is None:
                self._draw()
            self._progress.stop()
            self._progress = None

    @property
    def shown(self) -> bool:
        """Whether the bar has been put on screen."""
        return self._progress is not None

    def update(self, sim_time_s: float, requests_done: int) -> None:
        """Record progress; draws only when enabled, past the delay, and not too often."""
        self.sim_time_s = float(sim_time_s)
        self.requests_done = int(requests_done)
        if not self.active:
            return
        now = time.monotonic()
        if now < self._next_draw:
            return
        self._next_draw = now + self.refresh_s
        if self._progress is None:
            self._open()
        else:
            self._draw()

    def _open(self) -> None:
        wide = self.console.width >= 120
        fields = ("{task.fields[reqs]} requests · ETA {task.fields[eta]} · elapsed "
                  "{task.fields[elapsed]} · sim clock {task.fields[sim]}" if wide else
                  "{task.fields[reqs]} req · ETA {task.fields[eta]} · sim {task.fields[sim]}")
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=30 if wide else 10),
            TaskProgressColumn(), TextColumn(fields), console=self.console, transient=False,
            refresh_per_second=10)
        total, done = self._measure()
        self._wide = wide
        self._task = self._progress.add_task(self.description, total=total, completed=done,
                                             **self._fields())
        self._progress.start()        # after the task has its progress: no 0% first frame

    def _measure(self) -> tuple[float, float]:
        if self.total_requests:
            return self.total_requests, min(self.requests_done, self.total_requests)
        return self.total_sim_s, min(self.sim_time_s, self.total_sim_s)

    def _draw(self) -> None:
        self._progress.update(self._task, completed=self._measure()[1], **self._fields())

    def _fields(self) -> dict:
        """Requests, the simulated clock, and wall time since the run began (the bar
        appears only after ``delay_s``); the ETA from the average rate so far."""
        total_req = fmt_num(self.total_requests) if self.total_requests else "?"
        sep = " / " if self._wide else "/"
        elapsed = time.monotonic() - self._start
        total, done = self._measure()
        eta = elapsed * (total - done) / done if done else None
        return {"sim": fmt_seconds(self.sim_time_s), "elapsed": _clock(elapsed),
                "eta": "-:--:--" if eta is None else _clock(eta),
                "reqs": f"{fmt_num(self.requests_done)}{sep}{total_req}"}


def _clock(seconds: float) -> str:
    """``H:MM:SS``, as the progress bar shows wall time."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class CountBar:
    """``with CountBar("planning", "candidates", console) as bar: bar.update(done, total)``: a
    bar of tasks done (configurations, candidates) with the time since it opened, on
    ``console`` when it is a terminal (nothing otherwise); shown from the start, its total
    unknown until the first update, or with ``lazy`` from the first update (a command that
    checks its input first then draws nothing before an error)."""

    def __init__(self, label: str, unit: str, console: Optional[Console],
                 lazy: bool = False) -> None:
        self.label, self.unit, self.console = label, unit, console     # (None: no bar)
        self.lazy = lazy
        self._progress: Optional[Progress] = None
        self._task = None

    def __enter__(self) -> "CountBar":
        if not self.lazy:
            self._start()
        return self

    def _start(self) -> None:
        if self.console is not None and self.console.is_terminal:
            self._progress = Progress(TextColumn(f"[bold]{self.label}"), BarColumn(),
                                      MofNCompleteColumn(), TextColumn(f"{self.unit} ·"),
                                      TimeElapsedColumn(), console=self.console)
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=None)  # (its clock starts)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, done: int, total: int) -> None:
        if self._progress is None and self.lazy:
            self.lazy = False
            self._start()
        if self._progress is not None:
            self._progress.update(self._task, total=total, completed=done, refresh=True)


class ProgressLines:
    """Progress for a log or a pipe: one short line on stderr at most every ``every_s`` of
    wall time (nothing for runs shorter than that), in place of a bar.

    ``with ProgressLines("simulating", total) as p: p.update(sim_s, done)``.
    """

    def __init__(self, what: str, total: int = 0, every_s: float = 10.0, file=None) -> None:
        self.what, self.total, self.every_s = what, total, every_s
        self.file = file
        self._start = self._next = 0.0

    def __enter__(self) -> "ProgressLines":
        self._start = time.monotonic()
        self._next = self._start + self.every_s
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        pass

    def update(self, sim_time_s: float, requests_done: int) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        total = f" of {fmt_num(self.total)}" if self.total else ""
        self.line(f"{fmt_num(requests_done)}{total} requests done, "
                  f"{fmt_seconds(sim_time_s)} simulated")

    def update_count(self, done: int, total: int) -> None:
        """Record ``done`` of ``total`` tasks (configurations, candidates) finished."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        self.line(f"{done:,} of {total:,} done")

    def line(self, text: str) -> None:
        """Print ``kvsim: WHAT: TEXT (N s elapsed)`` now."""
        import sys
        elapsed = time.monotonic() - self._start
        print(f"kvsim: {self.what}: {text} ({elapsed:.0f} s elapsed)",
              file=self.file or sys.stderr, flush=True)


def _hit_text(summary: dict) -> str:
    """``6.7%  (2,048 of 30,366 tokens)``, or ``—`` where nothing was looked up."""
    queries = get(summary, "prefix_cache", "queries_tokens")
    if queries == 0:
        return f"—  (no prefix lookups: {no_lookup_text(summary)})"
    return (f"{fmt_pct(get(summary, 'prefix_cache', 'hit_rate'))}  "
            f"({fmt_num(get(summary, 'prefix_cache', 'hit_tokens'))} of {fmt_num(queries)} "
            "tokens)")


def _idle_text(summary: dict) -> str:
    """Mean cached-but-idle blocks: the room eviction policies have (near 0: choice is moot)."""
    blocks = get(summary, "kv", "mean_cached_idle_blocks")
    if blocks is None:
        return "-"
    return (f"{fmt_num(round(blocks))} blocks on average "
            f"({fmt_pct(get(summary, 'kv', 'mean_cached_idle_fraction'))}, counted as free): "
            "what an eviction policy chooses among")
