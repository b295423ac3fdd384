"""Terminal output (kvsim.reports.terminal): the summary table and the progress bar."""

from __future__ import annotations

import io
import time

from rich.console import Console

from kvsim.reports import RunProgress, print_summary
from synthetic_runs import empty_run, synthetic_run


def _console(terminal: bool, width: int = 120) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=width, color_system=None), buf


def _frames(text: str) -> list[str]:
    """The bar's frames as drawn (cursor codes dropped)."""
    text = text.replace("\x1b[?25l", "").replace("\x1b[?25h", "")
    parts = text.replace("\r", "\n").replace("\x1b[2K", "\n").split("\n")
    return [p.rstrip() for p in parts if p.strip() and "\x1b[1A" not in p]


def test_print_summary_shows_the_headline_numbers():
    summary, _, _ = synthetic_run(num_requests=100, timeline_rows=50)
    console, buf = _console(False)
    print_summary(summary, console=console)
    text = buf.getvalue()
    for label in ("throughput", "request throughput", "TTFT p50/p90/p99", "TPOT p50/p90/p99",
                  "E2E p50/p90/p99", "prefix hit rate", "preemptions", "KV usage mean/peak",
                  "KV pool shares", "steps", "simulated time", "wall time"):
        assert label in text, label
    assert "output tok/s" in text and "tokens 4" in text and "external 0.0%" in text
    assert f"{summary['num_completed']} of {summary['num_requests']} completed" in text


def test_print_summary_of_an_empty_run_uses_dashes():
    console, buf = _console(False)
    print_summary(empty_run()[0], console=console)
    assert "— / — / —" in buf.getvalue()
    console, buf = _console(False)
    print_summary({}, console=console)  # a summary missing everything still prints
    assert "throughput" in buf.getvalue()


def test_progress_hidden_for_short_runs_and_when_disabled():
    console, buf = _console(True)
    with RunProgress(10.0, 5, True, console=console, delay_s=60) as p:
        p.update(5.0, 2)
    assert buf.getvalue() == "" and not p.shown
    for kwargs in ({"enabled": False}, {"enabled": True, "quiet": True}):
        console, buf = _console(True)
        with RunProgress(10.0, 5, console=console, delay_s=0, **kwargs) as p:
            p.update(5.0, 2)
        assert buf.getvalue() == "" and not p.shown


def test_progress_auto_mode_needs_a_terminal():
    console, buf = _console(False)
    with RunProgress(10.0, 5, None, console=console, delay_s=0) as p:
        p.update(5.0, 2)
    assert not p.shown and buf.getvalue() == ""


def test_progress_shows_requests_eta_elapsed_and_the_simulated_clock():
    console, buf = _console(True)
    with RunProgress(100.0, 40, True, console=console, delay_s=0, refresh_s=0) as p:
        for i in range(1, 11):
            p.update(i * 10.0, i * 4)
            time.sleep(0.002)
    assert p.shown is False  # stopped on exit
    last = _frames(buf.getvalue())[-1]
    assert last.startswith("simulating ") and " 100% 40 / 40 requests · ETA " in last
    assert " · elapsed 0:00:0" in last and last.endswith(" · sim clock 100.00 s")


def test_progress_counts_requests_while_the_clock_runs_past_the_last_arrival():
    console, buf = _console(True)
    with RunProgress(100.0, 40, True, console=console, delay_s=0, refresh_s=0) as p:
        p.update(50.0, 30)            # the first frame already shows where the run is
        p.update(150.0, 39)           # draining the queue after the trace's span
    frames = _frames(buf.getvalue())
    assert " 75% 30 / 40 requests" in frames[0] and " 0% " not in frames[0]
    assert " 98% 39 / 40 requests" in frames[-1] and frames[-1].endswith("sim clock 2.5 min")


def test_progress_fits_an_80_column_terminal():
    console, buf = _console(True, width=80)
    with RunProgress(1440.0, 120_000, True, console=console, delay_s=0, refresh_s=0) as p:
        p.update(700.0, 60_000)
        time.sleep(0.01)
        p.update(1000.0, 90_000)
    for frame in _frames(buf.getvalue()):
        assert len(frame) <= 80 and "…" not in frame
        assert "req · ETA " in frame and " · sim " in frame
    assert "75% 90,000/120,000 req · ETA " in frame and frame.endswith(" · sim 16.7 min")


def test_progress_lines_for_a_pipe_are_throttled_and_say_what_is_done():
    import io
    from kvsim.reports.terminal import ProgressLines
    out = io.StringIO()
    with ProgressLines("simulating", 300, every_s=3600, file=out) as p:
        p.update(12.0, 10)                       # within the first interval: silent
    assert out.getvalue() == ""
    with ProgressLines("simulating", 300, every_s=0, file=out) as p:
        p.update(90.0, 150)
        p.update_count(3, 8)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("kvsim: simulating: 150 of 300 requests done, 90.00 s "
                               "simulated (") and lines[0].endswith(" s elapsed)")
    assert lines[1].startswith("kvsim: simulating: 3 of 8 done (")


def test_the_deployment_line_names_weights_stored_otherwise_than_the_kv_cache():
    from kvsim.reports.run_texts import deployment_text
    config = {"model": "llama-3.1-8b", "replicas": 1, "gpu": "l4", "tp": 1, "dtype": "bf16"}
    assert deployment_text(config) == "llama-3.1-8b on 1 x l4 (tp 1), bf16"
    assert deployment_text({**config, "replicas": 2, "tp": 4}) == \
        "llama-3.1-8b on 8 x l4 (2 replicas of tp 4), bf16"
    assert deployment_text({**config, "replicas": 2, "router": "cache-aware"}) == \
        "llama-3.1-8b on 2 x l4 (2 replicas of tp 1, cache-aware router), bf16"
    assert deployment_text({**config, "weight_dtype": "int4"}) == \
        "llama-3.1-8b on 1 x l4 (tp 1), KV bf16, int4 weights"
    assert deployment_text({**config, "weight_dtype": "bf16"}) == \
        "llama-3.1-8b on 1 x l4 (tp 1), bf16"
    gpt_oss = {**config, "model": "gpt-oss-120b"}    # (its checkpoint's MXFP4, priced as int4)
    assert deployment_text(gpt_oss, "int4") == \
        "gpt-oss-120b on 1 x l4 (tp 1), KV bf16, 4-bit quantized weights"


def test_the_kv_cache_line_says_how_the_cache_ran():
    from kvsim.reports.run_texts import cache_text
    config = {"layout": "paged", "block_size": 16, "enable_prefix_caching": True,
              "eviction": "lru", "preemption_mode": "recompute", "scheduling_policy": "fcfs",
              "reserve": "max", "allocator": "first-fit", "hybrid_threshold": 256,
              "compaction_threshold": None}
    assert cache_text(config) == "paged, 16-token blocks, prefix caching with lru eviction"
    assert cache_text({**config, "eviction": "belady", "preemption_mode": "swap",
                       "scheduling_policy": "priority"}) == (
        "paged, 16-token blocks, prefix caching with belady eviction, swap preemption, "
        "priority scheduling")
    assert cache_text({**config, "layout": "contiguous", "reserve": "pow2-output",
                       "allocator": "buddy", "compaction_threshold": 0.25,
                       "enable_prefix_caching": False}) == (
        "contiguous, 16-token blocks, pow2-output reserve, buddy allocator, compaction past "
        "25.0% unusable free slots, no prefix sharing")
    assert cache_text({**config, "layout": "contiguous"}).endswith(", no prefix sharing")
    assert cache_text({**config, "layout": "hybrid"}) == (
        "hybrid, 16-token blocks, max reserve, first-fit allocator, paged past 256 tokens, "
        "prefix caching with lru eviction for the paged requests")


def test_rejections_are_explained_by_what_limits_max_model_len():
    from kvsim.reports.style import rejected_text
    summary = {"num_rejected": 9, "num_requests": 100, "config": {"num_gpu_blocks": None},
               "kv": {"max_model_len": 34880, "num_gpu_blocks": 2180, "block_size": 16}}
    assert rejected_text(summary) == (
        "9 of 100 requests: prompt of max_model_len 34,880 tokens or more (the KV pool holds "
        "no longer request: give the KV cache more memory: a larger --gpu, more --tp or a "
        "higher --gpu-memory-utilization, or pass --long-prompt truncate)")
    summary["config"]["num_gpu_blocks"] = 2180
    assert "(the KV pool holds no longer request: raise --num-gpu-blocks, or pass" in \
        rejected_text(summary)
    summary["kv"]["max_model_len"] = 8000          # (below the pool: a limit of its own)
    assert rejected_text(summary).endswith(
        "8,000 tokens or more (raise --max-model-len, or pass --long-prompt truncate)")
    assert rejected_text({"num_rejected": 0}) == ""


def test_rejections_follow_what_the_summary_says_set_max_model_len():
    """A hybrid model's pool holds fewer tokens than blocks x block size: the summary's
    ``kv.max_model_len_limit`` says the pool set the limit, whatever the arithmetic."""
    from kvsim.reports.style import rejected_text
    summary = {"num_rejected": 9, "num_requests": 50, "config": {"num_gpu_blocks": None},
               "kv": {"max_model_len": 18816, "num_gpu_blocks": 1697, "block_size": 16,
                      "max_model_len_limit": "kv_pool"}, "model": {"max_model_len": 131072}}
    assert "(the KV pool holds no longer request: give the KV cache more memory" in \
        rejected_text(summary)
    summary["kv"]["max_model_len_limit"] = "model"
    assert "(that is the model's own context: pass --long-prompt truncate" in \
        rejected_text(summary)
    summary["kv"]["max_model_len_limit"] = "model+kv_pool"
    assert "(that is both the model's own context and the longest request the KV pool holds" \
        in rejected_text(summary)
    summary["kv"]["max_model_len_limit"] = "given"
    assert rejected_text(summary).endswith("(raise --max-model-len, or pass --long-prompt "
                                           "truncate)")


def test_slo_verdicts_count_requests_that_never_completed_as_misses():
    from kvsim.reports.terminal import slo_verdicts
    summary = {"num_requests": 100, "num_completed": 100, "slo": {"ttft_p99_s": 3.0},
               "ttft_s": {"p99": 2.5}}
    assert slo_verdicts(summary) == "TTFT p99 <= 3.00 s: met (2.50 s of the completed)"
    rejected = {**summary, "num_completed": 98}        # (2 of 100 > the 1 a p99 allows)
    assert slo_verdicts(rejected) == "TTFT p99 <= 3.00 s: missed (2.50 s of the completed)"
    one = {**summary, "num_completed": 99}     # (one of 100 missing reaches the p99)
    assert slo_verdicts(one) == "TTFT p99 <= 3.00 s: missed (2.50 s of the completed)"
    median = {"num_requests": 100, "num_completed": 69, "slo": {"ttft_p50_s": 0.0325},
              "ttft_s": {"p50": 0.0323, "p90": 0.2}}    # (31 missing: 72.5% of the rest)
    assert slo_verdicts(median) == "TTFT p50 <= 32.5 ms: missed (32.3 ms of the completed)"
    assert slo_verdicts({**median, "ttft_s": {"p50": 0.01, "p90": 0.03}}).endswith(": met "
                                                                                "(10.0 ms of "
                                                                                "the completed)")
    assert slo_verdicts({**summary, "slo": None}) == ""


def test_requests_cut_by_max_model_len_are_a_row_of_their_own():
    from kvsim.reports.style import stopped_text
    assert stopped_text({"num_stopped_by_length": 3}) == (
        "3 requests ended at max_model_len before their requested output (finish_reason "
        "length in requests.csv)")
    assert stopped_text({"num_stopped_by_length": 0}) == ""


def test_the_deployment_line_names_the_model_a_given_name_resolved_to():
    """``--model llama3-8b`` is Llama 3 (8k context), not 3.1: the line says which it ran."""
    from kvsim.reports.run_texts import deployment_text
    config = {"model": "llama3-8b", "replicas": 1, "gpu": "l4", "tp": 1, "dtype": "bf16"}
    assert deployment_text(config, None, "llama-3-8b") == \
        "llama-3-8b (given as llama3-8b) on 1 x l4 (tp 1), bf16"
    assert deployment_text({**config, "model": "llama-3-8b"}, None, "llama-3-8b") == \
        "llama-3-8b on 1 x l4 (tp 1), bf16"


def test_times_shown_together_share_one_unit():
    """A row read '618.6 ms / 1.71 s / 2.44 s' or '119.53 s / 3.1 min': one unit now, the
    largest's, a value below 1 in it with three significant digits."""
    from kvsim.reports.style import fmt_seconds_alike
    assert fmt_seconds_alike([0.6186, 1.71, 2.44]) == ["0.619 s", "1.71 s", "2.44 s"]
    assert fmt_seconds_alike([119.53, 186, 198]) == ["2.0 min", "3.1 min", "3.3 min"]
    assert fmt_seconds_alike([0.0158, 0.0173]) == ["15.8 ms", "17.3 ms"]
    assert fmt_seconds_alike([None, 19.83, 120.0]) == ["—", "0.330 min", "2.0 min"]
    assert fmt_seconds_alike([0.0, 0.0]) == ["0.0 ms", "0.0 ms"]
    assert fmt_seconds_alike([0.0227, 426.0, 744.0]) == ["22.7 ms", "7.1 min", "12.4 min"]
    assert fmt_seconds_alike([0.9996, 1.71]) == ["1.00 s", "1.71 s"]
    assert fmt_seconds_alike([0.0, 2.5]) == ["0.00 s", "2.50 s"]


def test_a_run_without_prefix_lookups_says_why():
    """Caching off, a contiguous layout, or nothing admitted (every prompt too long: it read
    'caching off, or a contiguous layout' while caching was on and the layout paged)."""
    from kvsim.reports.style import no_lookup_text
    paged = {"config": {"enable_prefix_caching": True, "layout": "paged"},
             "num_requests": 2, "num_rejected": 2,
             "prefix_cache": {"queries_tokens": 0, "hit_tokens": 0, "hit_rate": 0.0}}
    assert no_lookup_text(paged) == "every request was rejected"
    console, buf = _console(False)
    print_summary(paged, console=console)
    assert "—  (no prefix lookups: every request was rejected)" in buf.getvalue()
    assert no_lookup_text({**paged, "config": {"enable_prefix_caching": False}}) == \
        "prefix caching off"
    assert no_lookup_text({**paged, "config": {"layout": "contiguous"}}) == \
        "a contiguous layout looks nothing up"
    assert no_lookup_text({**paged, "num_rejected": 0}) == "no request was admitted"
