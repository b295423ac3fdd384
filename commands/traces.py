"""The commands that read or write traces without a timed simulation: ``kvsim trace-stats``,
``kvsim gen`` and ``kvsim hitrate`` (a cache-only replay). Wiring only."""

from __future__ import annotations

import math
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Literal, Optional

import typer

from kvsim.cache.hitrate import DEFAULT_LOOKAHEAD_S
from kvsim.cache.policies import POLICY_NAMES
from kvsim.commands.options import (JSON_OPTION, MODEL_OPTION, SEED_OPTION, TRACE_MODEL_OPTION,
                                    emit, given_path, opt, trace_options, trace_reading,
                                    with_groups)
from kvsim.sim.config import MAX_BLOCK_SIZE
from kvsim.workloads.generators.presets import PresetName


#: gen's settings (:class:`~kvsim.workloads.generators.GenConfig` fields) by their options.
GEN_OPTIONS = {"num_requests": "--num-requests", "arrival": "--arrival", "rate": "--rate",
               "cv": "--cv", "arrival_trace": "--arrival-trace", "preset": "PRESET",
               "high_priority_fraction": "--high-priority-fraction",
               "hash_block_size": "--hash-block-size"}


def _lengths(text: str, kind: str, option: str):
    """A length distribution from ``option``'s text, an error naming the option."""
    from kvsim.errors import ConfigError
    from kvsim.workloads.generators import parse_lengths
    try:
        return parse_lengths(text, kind)
    except ConfigError as e:
        raise ConfigError(e.message, location=e.location or "command line",
                          field=option) from None


@with_groups
def trace_stats_command(
    trace: str = typer.Argument(..., metavar="TRACE", help="Trace file (any supported "
                                "format), '-' for standard input, or sample:NAME."),
    block_size: int = typer.Option(16, "--block-size", min=1, max=MAX_BLOCK_SIZE,
                                   help="Block size (tokens) of the ideal prefix hit ratio."),
    reading: dict = trace_reading(seed=True, model=MODEL_OPTION),
    as_json: bool = JSON_OPTION,
) -> None:
    """Requests, time span, rate, length percentiles, burstiness, ideal prefix hit ratio."""
    from kvsim.workloads.sources import resolve_trace
    from kvsim.workloads.stats import render_stats, trace_file_stats
    path, label = resolve_trace(trace)
    emit({**trace_file_stats(path, trace_options(reading), block_size), "trace": label},
         as_json, lambda s: typer.echo(render_stats(s)))


def gen_command(
    preset: PresetName = typer.Argument(..., metavar="PRESET", help="Workload preset."),
    out: str = typer.Option(
        ..., "--out", metavar="FILE", callback=given_path, help="Native JSONL file to write "
        "('-': standard output)."),
    num_requests: int = typer.Option(1000, "--num-requests", "-n", min=1,
                                     help="Requests to generate."),
    seed: int = SEED_OPTION,
    arrival: Literal["poisson", "gamma", "trace"] = typer.Option(
        "poisson", "--arrival", help="Arrival process."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Arrivals per second "
                                         "(conversations, tasks or requests; preset default)."),
    cv: float = typer.Option(1.0, "--cv", help="Gamma arrivals: CV of the gaps (burstiness)."),
    arrival_trace: Optional[str] = typer.Option(None, "--arrival-trace", metavar="FILE",
                                                help="Trace whose timestamps to reuse."),
    high_priority: float = typer.Option(0.0, "--high-priority-fraction", help="Share of "
                                        "sessions at priority 0; the others get 1."),
    input_len: Optional[str] = typer.Option(None, "--input-len", metavar="SPEC", help="New "
                                            "input lengths: fixed:N, uniform:LO:HI, "
                                            "lognormal:MEAN:SIGMA or trace:FILE."),
    output_len: Optional[str] = typer.Option(None, "--output-len", metavar="SPEC",
                                             help="Output lengths (same forms)."),
    hash_block_size: int = typer.Option(16, "--hash-block-size", min=1, help="Tokens per "
                                        "block_hashes id written (prefix identity)."),
    with_token_ids: bool = typer.Option(False, "--token-ids", help="Write prompt_token_ids "
                                        "(for vllm-oracle; small workloads)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Generate a synthetic workload as native JSONL (same seed, same file)."""
    from kvsim.errors import ConfigError
    from kvsim.workloads.generators import GenConfig, write_workload
    if out == "-" and as_json:
        raise ConfigError("--json prints the summary on standard output, where --out - "
                          "writes the trace; give --out a file", location="command line",
                          field="--json")
    config = GenConfig(
        num_requests=num_requests, seed=seed, arrival=arrival, rate=rate, cv=cv,
        arrival_trace=arrival_trace, high_priority_fraction=high_priority,
        input_tokens=input_len and _lengths(input_len, "prompt", "--input-len"),
        output_tokens=output_len and _lengths(output_len, "output", "--output-len"),
        hash_block_size=hash_block_size, token_ids=with_token_ids)
    from kvsim.reports.terminal import ProgressLines
    try:
        with ProgressLines("gen") as lines:     # (a line every 10 s: a big one takes minutes)
            written = write_workload(preset, out, config,
                                     lambda n: lines.update_count(n, num_requests))
    except ConfigError as e:
        if e.location is not None or e.field not in GEN_OPTIONS:
            raise
        raise ConfigError(e.message, location="command line",     # a setting: name its option
                          field=GEN_OPTIONS[e.field]) from None
    emit(written, as_json, lambda r: typer.echo(
        f"wrote {r['num_requests']} {r['preset']} requests to "
        + ("standard output" if out == "-" else r['path']), err=out == "-"))


@with_groups
def hitrate_command(
    trace: str = typer.Argument(..., metavar="TRACE", help="Trace file, '-' for standard "
                                "input, or sample:NAME."),
    capacity: Optional[str] = opt("Cache capacities in blocks, comma-separated "
                                  "(e.g. 1000,5000,20000). This or --capacity-tokens is "
                                  "required.", "--capacity"),
    capacity_tokens: Optional[str] = opt("Cache capacities in tokens instead.",
                                         "--capacity-tokens"),
    block_size: int = typer.Option(16, "--block-size", min=1, max=MAX_BLOCK_SIZE,
                                   help="Tokens per block."),
    eviction: str = typer.Option(",".join(POLICY_NAMES), "--eviction",
                                 help="Policies to compare, comma-separated."),
    out: Optional[str] = opt("Directory for hitrate.json and hitrate.html.", "--out",
                             callback=given_path),
    lookahead_s: float = typer.Option(DEFAULT_LOOKAHEAD_S, "--lookahead-s",
                                      help="lookahead policy: requests arriving within this "
                                      "many seconds count as queued (a queueing delay)."),
    reading: dict = trace_reading(rate_scale=None, model=TRACE_MODEL_OPTION),
    html: Optional[bool] = typer.Option(None, "--html/--no-html", help="With --out: also "
                                        "write hitrate.html (the default)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No table."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Cache-only replay: prefix hit rate per eviction policy and capacity.

    No timing; LRU's whole curve comes from one stack-distance pass."""
    from kvsim.cache import hitrate
    from kvsim.workloads import load_trace
    from kvsim.workloads.sources import resolve_trace
    if not (math.isfinite(lookahead_s) and lookahead_s >= 0):
        from kvsim.errors import ConfigError
        raise ConfigError(f"must be a finite number of seconds >= 0, got {lookahead_s}",
                          location="command line", field="--lookahead-s")
    if html and out is None:
        from kvsim.errors import ConfigError
        raise ConfigError("writes hitrate.html into --out: give --out DIR", location="command line",
                          field="--html")
    html = html is not False
    caps = hitrate.parse_capacities(capacity, capacity_tokens, block_size)
    policies = hitrate.parse_policies(eviction)
    if out is not None:
        from kvsim.reports.outdir import check_writable_dir
        check_writable_dir(Path(out))
    path, label = resolve_trace(trace)
    from kvsim.reports.terminal import ProgressLines
    left_out = Counter()
    requests = load_trace(path, trace_options(reading, seed=0), left_out)
    with ProgressLines("hitrate") as lines:     # (a line every 10 s: a replay takes minutes)
        result = {**hitrate.hitrate_curves(requests, caps, policies, block_size, lookahead_s,
                                           None if quiet else lines.update_count),
                  "trace": label, "trace_rows_left_out": dict(left_out)}
    if out is not None:
        from kvsim.reports.html import write_hitrate_outputs
        write_hitrate_outputs(result, Path(out), html)
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    emit(result, as_json, None if quiet else lambda r: typer.echo(
        hitrate.render_hitrate_table(r, width) + ("" if out is None else
                                                  f"\nwrote {Path(out) / 'hitrate.json'}"
                                                  + ", hitrate.html" * html)))

