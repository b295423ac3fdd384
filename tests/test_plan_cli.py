"""``kvsim plan`` through the real command line."""

import json
import shlex
import re

import pandas as pd
import pytest
from plotly.offline import get_plotlyjs
from clirun import kvsim

SWEEP = ["plan", "sample:azure-conv", "--limit", "40", "--rate-scale", "8", "--burst",
         "--gpu", "h100-80gb,l4", "--tp", "1", "--slo-ttft-p99", "0.5",
         "--slo-tpot-p99", "0.05"]


@pytest.fixture(scope="module")
def json_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    done = kvsim(*SWEEP, "--out", str(out), "--json", "--workers", "2")
    assert done.returncode == 0, done.stderr
    return out, done


def test_json_prints_only_the_plan_and_writes_the_files(json_run):
    out, done = json_run
    plan = json.loads(done.stdout)
    assert plan == json.loads((out / "plan.json").read_text())
    assert {p.name for p in out.iterdir()} == {"plan.json", "plan.csv", "report.html"}
    assert [r["label"] for r in plan["candidates"]] == ["h100-80gb TP1", "l4 TP1"]
    best = plan["recommended"]
    assert best["label"] == "h100-80gb TP1" and best["replicas"] >= 1
    assert best["cost_per_hour_usd"] == pytest.approx(best["gpus"] * 2.99)
    assert best["latency"]["ttft_p99_s"] <= 0.5 and best["min_headroom"] >= 0
    assert best["kvsim_run"].startswith("kvsim run sample:azure-conv --model llama-3.1-8b")
    assert "prefill alone" in plan["candidates"][1]["reason"]
    assert plan["block_size"][0]["tokens"] == 52428800 / (2 * 8 * 128 * 2)   # 8 KV heads
    assert "planning" not in done.stderr


def test_csv_and_report_hold_the_ranking(json_run):
    out, _ = json_run
    table = pd.read_csv(out / "plan.csv")
    assert list(table["label"]) == ["h100-80gb TP1", "l4 TP1"]
    assert list(table["feasible"]) == [True, False]
    plan = json.loads((out / "plan.json").read_text())
    rates = {c["label"]: c["max_rate"] or {} for c in plan["candidates"]}
    for _, row in table.iterrows():     # (the CSV keeps whether the rate is a bound)
        rate = rates[row["label"]]
        assert (None if pd.isna(row["failing_request_rate_per_s"]) else
                row["failing_request_rate_per_s"]) == rate.get("failing_request_rate_per_s")
        assert (None if pd.isna(row["max_request_rate_note"]) else
                row["max_request_rate_note"]) == rate.get("note")
    page = (out / "report.html").read_text().replace(get_plotlyjs(), "")
    assert 'id="fig-pareto"' in page and 'id="plan-table"' in page
    assert "Pareto front" in page
    assert not re.search(r"""<(script|link|img)[^>]+(src|href)\s*=\s*["']?(https?:)?//""",
                         page, re.I)


def test_people_get_a_table_progress_and_the_recommendation(tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text('{"h100": 10.0}')
    done = kvsim(*SWEEP, "--out", str(tmp_path / "o"), "--price-table", str(prices),
                 "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert "Recommended: h100-80gb TP1" in done.stdout and "$10.00" in done.stdout
    assert "[2] l4 TP1: TTFT p99 can never meet" in done.stdout
    assert "block size on h100-80gb: 16 tokens, the only size tried (--block-size 16,32 " \
        "compares sizes); the L2 rule of thumb (not simulated: the tokens whose K and V of one " \
        "layer fill the L2 cache at tp 1, 52,428,800 B / 4,096 B) allows up to 8,192 tokens, " \
        "so it does not bind" in done.stdout
    command = json.loads((tmp_path / "o" / "plan.json").read_text())["recommended"]["kvsim_run"]
    assert len(command) > 80 and f"  reproduce: {command}\n" in done.stdout   # one line: pastes
    assert done.stderr.startswith("kvsim: plan: [1/2] ")     # each candidate as it finishes
    assert "kvsim: plan: [2/2] l4 TP1: no (TTFT p99 can never meet" in done.stderr
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("kvsim: plan: [2/2]"))
    assert line.endswith("))") and "each request's prefill alone; the slowest, " in line
    # (one line each in a log: a pipe is not wrapped at 80 columns)


@pytest.mark.parametrize("args,message", [
    (["--tp", "1,x"], "--tp: expected integers separated by commas, got '1,x'"),
    (["--gpu", "b200"], "unknown GPU 'b200'"),
    (["--target-rate", "3"], "not both"),
    (["--max-replicas", "0"], "max-replicas"),
    (["--max-replicas", "5000"], "--max-replicas must be from 1 to 1024"),
    (["--rate-iterations", "-3"], "error: --rate-iterations must be 0 or more"),
    (["--slo-tpot-p99", "0"], "--slo-tpot-p99: must be a number of seconds > 0"),
    (["--router", "random"], "Invalid value for '--router': 'random' is not one of"),
])
def test_bad_input_is_one_line_and_exit_status_2(args, message, tmp_path):
    done = kvsim(*SWEEP, *args, "--out", str(tmp_path))
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""


def test_no_deployment_meeting_the_slos_is_exit_status_3_with_its_files(tmp_path):
    done = kvsim("plan", "sample:azure-conv", "--limit", "40", "--gpu", "a100-80gb",
                 "--slo-ttft-p99", "0.001", "--out", str(tmp_path / "p"), "--json")
    assert done.returncode == 3, done.stderr
    assert json.loads(done.stdout)["recommended"] is None
    assert done.stderr.splitlines()[-1] == (
        f"kvsim: plan: no candidate meets every SLO (the reasons are in {tmp_path}/p/plan.json)")
    assert {p.name for p in (tmp_path / "p").iterdir()} >= {"plan.json", "plan.csv"}
    done = kvsim("plan", "sample:azure-conv", "--limit", "40", "--gpu", "a100-80gb",
                 "--slo-ttft-p99", "0.001", "--out", str(tmp_path / "p"))
    assert done.returncode == 3 and "No candidate meets every SLO" in done.stdout
    assert "no candidate meets" not in done.stderr      # (the table said it)


def test_a_plan_needs_an_slo(tmp_path):
    done = kvsim("plan", "sample:azure-conv", "--out", str(tmp_path))
    assert done.returncode == 2 and "at least one SLO" in done.stderr


def test_host_tier_and_dtype_are_candidates_and_host_memory_is_priced(tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text('{"h100": 2.0, "host-memory-gib": 0.01}')
    done = kvsim("plan", "sample:azure-conv", "--limit", "40", "--burst", "--gpu", "h100-80gb",
                 "--dtype", "bf16,fp8", "--kv-offloading-size", "0,100", "--slo-ttft-p99", "5",
                 "--price-table", str(prices), "--out", str(tmp_path / "p"), "--json")
    assert done.returncode == 0, done.stderr
    rows = sorted(json.loads(done.stdout)["candidates"], key=lambda r: r["index"])
    assert [r["label"] for r in rows] == [
        "h100-80gb TP1 · bf16 · CPU KV 0 GiB", "h100-80gb TP1 · bf16 · CPU KV 100 GiB",
        "h100-80gb TP1 · fp8 · CPU KV 0 GiB", "h100-80gb TP1 · fp8 · CPU KV 100 GiB"]
    assert [r["price_per_gpu_hour_usd"] for r in rows] == [2.0, 3.0, 2.0, 3.0]
    best = json.loads(done.stdout)["recommended"]
    assert "CPU KV 0 GiB" in best["label"]       # a tier nobody needs only costs money
    hosted = [r for r in rows if r["feasible"] and "100 GiB" in r["label"]][0]
    assert "--kv-offloading-size 100.0" in hosted["kvsim_run"]


def test_the_reproduce_command_keeps_long_prompt_truncate(tmp_path):
    """The plan truncated 30 of 60 prompts; its command line must too (it rejected them)."""
    done = kvsim("plan", "sample:mooncake", "--limit", "60", "--max-model-len", "8192",
                 "--long-prompt", "truncate", "--gpu", "h100-80gb", "--slo-ttft-p99", "5",
                 "--burst", "--workers", "1", "--rate-iterations", "0", "--max-replicas", "2",
                 "--out", str(tmp_path / "p"), "--json")
    assert done.returncode == 0, done.stderr
    command = json.loads(done.stdout)["recommended"]["kvsim_run"]
    assert command.endswith("--max-model-len 8192 --long-prompt truncate")
    rerun = kvsim(*shlex.split(command)[1:], "--out", str(tmp_path / "r"), "-q")
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert (summary["num_truncated"], summary["num_rejected"]) == (30, 0)


def test_plan_refuses_cpu_offload_gb_with_a_pointer(tmp_path):
    done = kvsim("plan", "sample:azure-conv", "--cpu-offload-gb", "0,100", "--slo-ttft-p99",
                 "5", "--out", str(tmp_path / "p"))
    assert done.returncode == 2 and "--kv-offloading-size" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("width", [60, 78])
def test_a_terminal_too_narrow_for_the_table_gets_a_line_per_candidate(json_run, width):
    """The table would cut its cells there (the candidates' names first): each candidate is a
    line of its own instead, every number whole; at 80 columns the table fits."""
    import io
    from rich.console import Console
    from kvsim.reports.plan import print_plan
    plan = json.loads((json_run[0] / "plan.json").read_text())
    shown = {}
    for w in (width, 80):
        console = Console(file=io.StringIO(), width=w, force_terminal=True, color_system=None)
        print_plan(plan, console)
        shown[w] = console.file.getvalue()
    first = plan["candidates"][0]
    assert f"1. {first['label']}: Replicas {first['replicas']}, GPUs {first['gpus']}, " in \
        shown[width]
    assert "…" not in shown[width] and "Candidate" not in shown[width]
    assert "Candidate" in shown[80] and "…" not in shown[80]


def test_a_plan_says_which_rows_of_the_trace_it_left_out(tmp_path):
    trace = tmp_path / "burst.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "5,ChatGPT,472,18,490,Conversation log\n"
                     "45,ChatGPT,1087,0,1087,Conversation log\n"
                     "118,GPT-4,417,276,693,Conversation log\n")
    done = kvsim("plan", trace, "--slo-ttft-p99", "2", "--gpu", "a100-80gb", "--burst",
                 "--out", tmp_path / "p")
    assert done.returncode == 0, done.stderr
    assert ("2 requests at rate scale 1 (0.02 req/s) as one burst (1 trace row left out: "
            "failed (BurstGPT Response tokens 0): 1)") in done.stdout
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert plan["load"]["trace_rows_left_out"] == {"failed": 1}


def test_a_tpot_target_on_a_trace_that_never_decodes_is_refused_before_any_simulation(
        tmp_path):
    """Every request generates one token: no TPOT is measured, so no deployment could be
    judged against it (before: six simulations, then 'TPOT P99 n/a > 100.0 ms', exit 3)."""
    trace = tmp_path / "one_token.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,100,1\n2023-11-16 18:15:47.6805900,100,1\n")
    done = kvsim("plan", trace, "--slo-tpot-p99", "0.1", "--burst", "--out", tmp_path / "p")
    assert done.returncode == 2
    assert done.stderr == (f"kvsim: error: --slo-tpot-p99: no request of {trace} generates "
                           "more than one token, so no TPOT (time per output token after the "
                           "first) is measured to judge: drop the TPOT target\n")
    assert not (tmp_path / "p").exists()


def test_prompts_past_the_models_context_are_refused_before_any_simulation(tmp_path):
    """One Azure prompt is past Llama-2-70B's 4,096 tokens: every candidate would reject it,
    whatever its GPUs (before: each was listed infeasible, and the plan said 'No candidate
    meets every SLO' with exit 3, the status of a plan that ran)."""
    done = kvsim("plan", "sample:azure-conv", "--model", "llama-2-70b", "--gpu",
                 "a100-40gb,h100-80gb", "--tp", "1,4", "--slo-ttft-p99", "2", "--slo-tpot-p99",
                 "0.1", "--out", tmp_path / "p")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "kvsim: error: sample:azure-conv: 1 of 300 prompts are not shorter than max_model_len "
        "4,096 (llama-2-70b's context): every candidate would reject them; pass --long-prompt "
        "truncate (as Vidur), a larger --max-model-len, or a trace without them\n")
    assert not (tmp_path / "p").exists()
