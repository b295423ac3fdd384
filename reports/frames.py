"""The output contract of a run: its files, the columns of its two frames, and the summary
keys a report reads.

The one definition of what ``kvsim run --out DIR`` writes (``docs/frames.md`` is tested against
it): the simulator builds its frames to these columns (:mod:`kvsim.sim.serving.results`, and
the request log of :mod:`kvsim.sim.serving.recorder` is derived from them),
:mod:`kvsim.reports` writes and reads them back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:         # (the contract itself needs no pandas: the settings read it too)
    import pandas as pd

SUMMARY_FILE = "summary.json"
REQUESTS_FILE = "requests.csv"
TIMELINE_FILE = "timeline.csv"
REPORT_FILE = "report.html"
BENCH_FILE = "bench.json"
#: ``--output-format``: how the two frames are stored (same columns either way).
OUTPUT_FORMATS = ("csv", "parquet")
#: The files a run's result may consist of (``kvsim run --out DIR``): a new run removes them.
RUN_FILES = (SUMMARY_FILE, REQUESTS_FILE, TIMELINE_FILE, REPORT_FILE, "requests.parquet",
             "timeline.parquet", BENCH_FILE)


def run_files(output_format: str = "csv", html: bool = True, bench: bool = False) -> tuple:
    """The files a run writes into its ``--out`` (of :data:`RUN_FILES`)."""
    frames = (REQUESTS_FILE, TIMELINE_FILE) if output_format == "csv" else (
        "requests.parquet", "timeline.parquet")
    return (SUMMARY_FILE, *frames) + (REPORT_FILE,) * html + (BENCH_FILE,) * bench


COMPARE_FILE = "compare.json"
#: The files of a comparison directory besides its run directories (``compare.json``'s
#: ``runs[].dir``): ``report.html`` and the run pages under it share one ``plotly.min.js``.
COMPARE_FILES = (COMPARE_FILE, REPORT_FILE, "plotly.min.js")
PLAN_FILE, PLAN_CSV = "plan.json", "plan.csv"
#: The files of ``kvsim plan --out DIR``.
PLAN_FILES = (PLAN_FILE, PLAN_CSV, REPORT_FILE)
HITRATE_FILE, HITRATE_REPORT = "hitrate.json", "hitrate.html"
#: The files of ``kvsim hitrate --out DIR``.
HITRATE_FILES = (HITRATE_FILE, HITRATE_REPORT)
VALIDATION_FILE, VALIDATION_REPORT = "validation.json", "validation.html"
#: The files of ``kvsim validate --out DIR``.
VALIDATION_FILES = (VALIDATION_FILE, VALIDATION_REPORT)
#: Every file name a kvsim result may leave in an ``--out`` directory: a command that succeeds
#: there leaves its own result only.
RESULT_FILES = tuple(dict.fromkeys(RUN_FILES + COMPARE_FILES + PLAN_FILES + HITRATE_FILES
                                   + VALIDATION_FILES))
#: Each command's files by the file it writes last (a result is complete once that one is
#: there): a file of an earlier result is kvsim's only when its command's last file is there.
RESULT_GROUPS = ((SUMMARY_FILE, RUN_FILES), (COMPARE_FILE, COMPARE_FILES),
                 (PLAN_FILE, PLAN_FILES), (HITRATE_FILE, HITRATE_FILES),
                 (VALIDATION_FILE, VALIDATION_FILES))

#: Columns of requests.csv, in order (docs/frames.md; the simulator writes exactly these).
REQUEST_COLUMNS = (
    "request_id", "trace_line", "arrival_s", "prompt_tokens", "output_tokens", "generated_tokens",
    "finish_reason", "priority", "replica", "first_scheduled_s", "first_token_s", "finish_s",
    "ttft_s", "tpot_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "cached_tokens",
    "num_preemptions", "completed", "rejected", "truncated",
)
#: A request's time split into vLLM's three phases (its ``request_queue_time_seconds``,
#: ``request_prefill_time_seconds`` and ``request_decode_time_seconds``; Vidur's scheduling
#: delay, prefill time and decode time): column -> (from, to). They sum to ``e2e_s``.
PHASE_COLUMNS = {
    "queue_s": ("arrival_s", "first_scheduled_s"),
    "prefill_s": ("first_scheduled_s", "first_token_s"),
    "decode_s": ("first_token_s", "finish_s"),
}
#: Columns of timeline.csv (docs/frames.md).
TIMELINE_COLUMNS = (
    "time_s", "interval_s", "num_steps", "num_running", "num_waiting", "batch_size",
    "output_tokens", "throughput_tokens_per_s", "kv_used_blocks", "kv_cached_idle_blocks",
    "kv_free_blocks", "kv_usage", "host_used_blocks", "frag_token_states", "frag_reservation",
    "frag_internal", "frag_external", "frag_free", "prefix_queries_tokens", "prefix_hit_tokens",
    "prefix_hit_rate", "preemptions", "swap_out_blocks", "swap_in_blocks", "offload_blocks",
    "promote_blocks", "compact_blocks", "transfer_s",
)
#: Timeline columns that count events within an interval: downsampling sums them.
TIMELINE_SUM_COLUMNS = frozenset({
    "interval_s", "num_steps", "output_tokens", "prefix_queries_tokens", "prefix_hit_tokens",
    "preemptions", "swap_out_blocks", "swap_in_blocks", "offload_blocks", "promote_blocks",
    "compact_blocks", "transfer_s",
})

#: requests.csv columns computed from others when the frame is built (the simulator logs the
#: rest): the latencies and the phases.
DERIVED_REQUEST_COLUMNS = ("ttft_s", "tpot_s", "e2e_s", *PHASE_COLUMNS)
#: requests.csv columns the simulator logs per request, in the frame's order.
LOGGED_REQUEST_COLUMNS = tuple(c for c in REQUEST_COLUMNS if c not in DERIVED_REQUEST_COLUMNS)

#: The one column of text in the two frames (requests' ``finish_reason``): every other column
#: of :data:`REQUEST_COLUMNS` and :data:`TIMELINE_COLUMNS` holds numbers.
TEXT_COLUMNS = frozenset({"finish_reason"})
NUMBER_COLUMNS = frozenset(REQUEST_COLUMNS + TIMELINE_COLUMNS) - TEXT_COLUMNS

#: The kinds of value :data:`SUMMARY_SHAPE` names (the words of an error).
INTEGER, NUMBER, TEXT, OBJECT = "an integer", "a number or null", "a string", "an object"
#: The percentiles of each latency in a run's summary (``ttft_s.p50``, ...).
SUMMARY_PERCENTILES = (50, 90, 99)
_LATENCY = dict.fromkeys(("mean", *(f"p{p}" for p in SUMMARY_PERCENTILES)), NUMBER)
#: What the run report reads from summary.json (docs/frames.md), key by key: a kind, or a
#: dict, an object of the keys it lists (others are not looked at). Every key is required but
#: those of :data:`SUMMARY_OPTIONAL`.
SUMMARY_SHAPE = {
    "num_requests": INTEGER, "num_completed": INTEGER, "num_steps": INTEGER,
    "num_rejected": INTEGER, "num_truncated": INTEGER, "duration_s": NUMBER,
    "throughput_output_tokens_per_s": NUMBER, "request_throughput_per_s": NUMBER,
    "throughput_input_tokens_per_s": NUMBER, "throughput_total_tokens_per_s": NUMBER,
    "ttft_s": _LATENCY, "tpot_s": _LATENCY, "e2e_s": _LATENCY,
    "prefix_cache": {"queries_tokens": INTEGER, "hit_tokens": INTEGER, "hit_rate": NUMBER,
                     "host_hit_tokens": INTEGER},
    "preemptions": INTEGER, "swapped_out_blocks": INTEGER, "swapped_in_blocks": INTEGER,
    "kv": {"num_gpu_blocks": INTEGER, "block_size": INTEGER, "mean_usage": NUMBER,
           "peak_usage": NUMBER, "mean_cached_idle_fraction": NUMBER, "max_model_len": INTEGER},
    "fragmentation": {c[len("frag_"):]: NUMBER for c in TIMELINE_COLUMNS if c.startswith("frag_")},
    "tiering": {"num_cpu_blocks": INTEGER, "peak_host_usage": NUMBER, "bytes_to_host": NUMBER,
                "bytes_to_device": NUMBER, "transfer_time_s": NUMBER},
    "config": {"trace": TEXT, "model": TEXT, "gpu": TEXT, "tp": INTEGER, "replicas": INTEGER,
               "block_size": INTEGER, "eviction": TEXT, "layout": TEXT},
    "slo": OBJECT, "trace_rows_left_out": OBJECT,
}
#: ``config.trace_options`` of a run's summary: how the trace was read, key -> (the
#: :class:`~kvsim.workloads.TraceOptions` attribute, the command-line option).
TRACE_OPTIONS = {"format": ("format_name", "--format"), "limit": ("limit", "--limit"),
                 "start_s": ("start_s", "--start"), "end_s": ("end_s", "--end"),
                 "rate_scale": ("rate_scale", "--rate-scale"), "sort": ("sort", "--sort"),
                 "trace_model": ("model_filter", "--trace-model")}


def recorded_trace_options(options) -> dict:
    """``config.trace_options`` of a trace read with ``options`` (a ``TraceOptions``)."""
    return {key: getattr(options, attribute) for key, (attribute, _) in TRACE_OPTIONS.items()}


#: Keys (``section.key``) a summary may lack, or hold null in: added after the first release
#: (a summary written before renders without them), or written only by some runs (``slo``).
SUMMARY_OPTIONAL = frozenset({
    "num_rejected", "num_truncated", "throughput_input_tokens_per_s",
    "throughput_total_tokens_per_s", "prefix_cache.host_hit_tokens",
    "kv.mean_cached_idle_fraction", "kv.max_model_len", "tiering", "config.tp",
    "config.replicas", "config.block_size", "config.eviction", "config.layout", "slo",
    "trace_rows_left_out",
})


def phase_columns(requests) -> dict:
    """The :data:`PHASE_COLUMNS` of a requests frame (a DataFrame, :class:`Columns`, or a
    dict of its columns) from its timestamps (NaN until the phase has ended)."""
    return {column: requests[end] - requests[start]
            for column, (start, end) in PHASE_COLUMNS.items()}


def add_phase_columns(requests: pd.DataFrame) -> pd.DataFrame:
    """Set the :data:`PHASE_COLUMNS` of a requests frame; returns the frame."""
    for column, values in phase_columns(requests).items():
        requests[column] = values
    return requests
