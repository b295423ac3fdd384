"""Reading traces: every format, the shared transforms, streaming and speed."""

import inspect
import json
import time
from collections import Counter
from pathlib import Path

import pytest

from kvsim.workloads import TraceOptions, load_trace, read_trace, sample_path

SHARED = Path(__file__).resolve().parents[2] / "shared"
MOONCAKE = SHARED / "traces" / "mooncake" / "conversation_trace.jsonl"


def write(tmp_path, name, text, encoding="utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return path


def jsonl(*records):
    return "".join(json.dumps(r) + "\n" for r in records)


def test_mooncake_lines_become_requests_with_512_token_prefix_hashes(tmp_path):
    path = write(tmp_path, "m.jsonl", jsonl(
        {"timestamp": 1000, "input_length": 600, "output_length": 7, "hash_ids": [4, 9]},
        {"timestamp": 1500, "input_length": 512, "output_length": 3, "hash_ids": [4]}))
    first, second = read_trace(path)
    assert (first.request_id, first.arrival_s, first.prompt_tokens, first.output_tokens) == \
        (0, 0.0, 600, 7)
    assert first.prefix_hashes.tolist() == [4, 9] and first.hash_block_size == 512
    assert (second.request_id, second.arrival_s) == (1, 0.5)
    # at block size 16 both share the first 512 tokens: 32 equal block ids
    a, b = first.block_hashes(16), second.block_hashes(16)
    assert len(a) == 37 and len(b) == 32 and (a[:32] == b).all()


def test_native_lines_with_block_hashes_share_prefixes_like_mooncake(tmp_path):
    path = write(tmp_path, "n.jsonl", jsonl(
        {"arrival_s": 2.0, "prompt_tokens": 40, "output_tokens": 5,
         "block_hashes": [1, 2, 3], "hash_block_size": 16, "priority": 1,
         "session_id": "s1", "template_id": 7},
        {"arrival_s": 2.5, "prompt_tokens": 20, "output_tokens": 5,
         "block_hashes": [1, 8], "hash_block_size": 16}))
    first, second = read_trace(path)
    assert (first.arrival_s, first.priority, first.session_id, first.template_id) == \
        (0.0, 1, "s1", "7")
    assert second.arrival_s == 0.5 and second.priority == 0 and second.session_id is None
    assert first.block_hashes(16)[0] == second.block_hashes(16)[0]
    assert first.block_hashes(16)[1] != second.block_hashes(8)[1]


def test_vllm_oracle_lines_load_with_prompt_tokens_taken_from_the_ids(tmp_path):
    path = write(tmp_path, "o.jsonl", jsonl(
        {"prompt_token_ids": [5, 6, 7, 8], "output_tokens": 3},
        {"prompt_token_ids": [5, 6, 7, 8, 9], "output_tokens": 2, "arrival_s": 0.25,
         "priority": 2}))
    first, second = read_trace(path)
    assert first.prompt_tokens == 4 and first.prompt_token_ids.tolist() == [5, 6, 7, 8]
    assert (second.prompt_tokens, second.arrival_s, second.priority) == (5, 0.25, 2)
    assert (first.block_hashes(2) == second.block_hashes(2)).all()


def test_native_lines_without_prefix_information_share_nothing(tmp_path):
    path = write(tmp_path, "u.jsonl", jsonl(
        {"arrival_s": 0, "prompt_tokens": 32, "output_tokens": 1},
        {"arrival_s": 0, "prompt_tokens": 32, "output_tokens": 1}))
    first, second = read_trace(path)
    assert first.prefix_hashes is None and first.prompt_token_ids is None
    assert not set(first.block_hashes(16)) & set(second.block_hashes(16))


def test_azure_csv_wallclock_times_become_seconds_from_the_first_row(tmp_path):
    path = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                 "2023-11-16 23:59:59.5000000,374,44\r\n"
                 "2023-11-17 00:00:01.2500000,396,109\r\n")
    first, second = read_trace(path)
    assert (first.prompt_tokens, first.output_tokens, first.arrival_s) == (374, 44, 0.0)
    assert second.arrival_s == pytest.approx(1.75, abs=1e-9)
    assert second.prefix_hashes is None


def test_burstgpt_leaves_out_failed_rows_and_filters_by_model(tmp_path):
    header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    path = write(tmp_path, "b.csv", header + "5,ChatGPT,100,20,120,Conversation log\n"
                 "6,GPT-4,50,0,50,Conversation log\n"          # failed: left out
                 "7.5,GPT-4,30,10,40,API log\n"
                 "9,ChatGPT,80,8,88,API log\n")
    left_out = Counter()
    assert [(r.arrival_s, r.prompt_tokens) for r in load_trace(path, left_out=left_out)] == \
        [(0.0, 100), (2.5, 30), (4.0, 80)]
    assert left_out == {"failed": 1}
    gpt4 = list(load_trace(path, TraceOptions(model_filter="gpt-4"), left_out))
    assert [(r.request_id, r.arrival_s, r.output_tokens) for r in gpt4] == [(0, 0.0, 10)]
    assert left_out == {"other_model": 2, "failed": 1}


def test_csv_rows_without_prompt_or_output_are_left_out_and_counted_inside_the_window(
        tmp_path):
    """Public traces carry such rows: they are counted by reason, those inside the time
    window read only (timed from the first request, as the window is), and no request is
    made of them; a window or limit that stops early does not read the rest."""
    burst = write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,"
                  "Total tokens,Log Type\n"
                  "2,ChatGPT,0,20,20,API log\n"              # before the first request
                  "5,ChatGPT,100,20,120,Conversation log\n"
                  "6,ChatGPT,0,20,20,API log\n"
                  "7,ChatGPT,0,0,0,API log\n"                # both: failed
                  "8,ChatGPT,80,8,88,API log\n"
                  "30,ChatGPT,0,9,9,API log\n"
                  "31,ChatGPT,70,7,77,API log\n")
    left_out = Counter()
    kept = [(r.request_id, r.arrival_s) for r in load_trace(burst, left_out=left_out)]
    assert kept == [(0, 0.0), (1, 3.0), (2, 26.0)]
    assert left_out == {"empty_prompt": 3, "failed": 1}
    assert [r.request_id for r in load_trace(burst, TraceOptions(end_s=10), left_out)] == [0, 1]
    assert left_out == {"empty_prompt": 2, "failed": 1}
    assert len(list(load_trace(burst, TraceOptions(start_s=4), left_out))) == 1
    assert left_out == {"empty_prompt": 1}
    assert len(list(load_trace(burst, TraceOptions(limit=1), left_out))) == 1
    assert left_out == {"empty_prompt": 1}
    azure = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:15:46.0,374,44\n2023-11-16 18:15:47.0,0,44\n"
                  "2023-11-16 18:15:48.0,374,0\n2023-11-16 18:15:49.0,0,0\n"
                  "2023-11-16 18:15:50.0,12,3\n")
    assert [r.arrival_s for r in load_trace(azure, left_out=left_out)] == [0.0, 4.0]
    assert left_out == {"empty_prompt": 2, "no_output": 1}


def test_rows_left_out_are_not_held_to_the_time_order_nor_counted_before_a_start(tmp_path):
    """A failed row, or another model's under --trace-model, may carry any time (BurstGPT's
    failed rows are not in order); rows before the first request count only when the window
    starts with the trace (no --start)."""
    path = write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,"
                 "Total tokens,Log Type\n0,GPT-4,100,10,1,x\n5,ChatGPT,300,0,1,x\n"
                 "3,ChatGPT,200,50,1,x\n6,ChatGPT,120,20,1,x\n")
    left_out = Counter()
    chat = list(load_trace(path, TraceOptions(model_filter="chatgpt"), left_out))
    assert [r.arrival_s for r in chat] == [0.0, 3.0]
    assert left_out == {"other_model": 1, "failed": 1}
    list(load_trace(path, TraceOptions(model_filter="chatgpt", start_s=0), left_out))
    assert left_out == {}       # (both come before the first ChatGPT request in the file)
    assert [r.arrival_s for r in load_trace(path, left_out=left_out)] == [0.0, 3.0, 6.0]
    assert left_out == {"failed": 1}       # (3 s follows 0 s: the failed row at 5 s between
                                           # them is not held to the order)


def test_a_trace_of_rows_left_out_only_says_why(tmp_path):
    from kvsim.errors import TraceError
    path = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:47.0,0,44\n2023-11-16 18:15:48.0,374,0\n")
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert err.value.message == ("no requests: every row was left out (no output (Azure "
                                 "GeneratedTokens 0): 1, no prompt (0 prompt tokens): 1)")


def test_a_burstgpt_file_of_failed_rows_only_says_so(tmp_path):
    from kvsim.errors import TraceError
    header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    path = write(tmp_path, "b.csv", header + "5,ChatGPT,100,0,100,Conversation log\n"
                 "6,GPT-4,50,0,50,Conversation log\n")
    with pytest.raises(TraceError) as err:
        read_trace(path)          # (it said "the trace has no data lines")
    assert err.value.message == ("no requests: every row was left out (failed (BurstGPT "
                                 "Response tokens 0): 2)")


def test_bom_crlf_and_blank_lines_are_accepted(tmp_path):
    text = '\n\r\n{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\r\n' \
           '   \r\n{"timestamp": 4, "input_length": 10, "output_length": 1, "hash_ids": [0]}\r\n'
    path = write(tmp_path, "bom.jsonl", b"\xef\xbb\xbf" + text.encode())
    assert [r.arrival_s for r in read_trace(path)] == [0.0, 0.004]


def test_a_gzip_trace_reads_as_its_text_and_a_cut_one_names_its_line(tmp_path):
    import gzip
    from kvsim.errors import TraceError
    text = sample_path("mooncake").read_bytes()
    packed = tmp_path / "mooncake.jsonl.gz"
    packed.write_bytes(gzip.compress(text))
    requests, expected = read_trace(packed), read_trace(sample_path("mooncake"))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests] == [
        (r.arrival_s, r.prompt_tokens, r.output_tokens) for r in expected]
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(text)[:2000])
    with pytest.raises(TraceError, match=r"cut.gz:\d+: read error: Compressed file ended"):
        read_trace(cut)


def test_format_can_be_forced(tmp_path):
    path = write(tmp_path, "f.jsonl", jsonl(
        {"timestamp": 0, "prompt_tokens": 3, "output_tokens": 1, "arrival_s": 1}))
    assert read_trace(path)[0].prompt_tokens == 3                       # detected as native
    assert read_trace(path, TraceOptions(fmt="kvsim"))[0].prompt_tokens == 3


def arrivals_file(tmp_path, times):
    return write(tmp_path, "t.jsonl", jsonl(*(
        {"arrival_s": t, "prompt_tokens": 10 + i, "output_tokens": 1} for i, t in enumerate(times))))


def test_window_keeps_start_inclusive_end_exclusive_relative_to_the_first_request(tmp_path):
    path = arrivals_file(tmp_path, [100, 101, 102, 103, 104])
    kept = read_trace(path, TraceOptions(start_s=1, end_s=3))
    assert [(r.request_id, r.arrival_s, r.prompt_tokens) for r in kept] == \
        [(0, 0.0, 11), (1, 1.0, 12)]


def test_limit_and_rate_scale(tmp_path):
    path = arrivals_file(tmp_path, [0, 1, 3, 6])
    assert [r.arrival_s for r in read_trace(path, TraceOptions(rate_scale=2))] == \
        [0.0, 0.5, 1.5, 3.0]
    assert [r.arrival_s for r in read_trace(path, TraceOptions(rate_scale=0.5, limit=2))] == \
        [0.0, 2.0]


def test_sort_orders_an_unsorted_trace_stably(tmp_path):
    path = arrivals_file(tmp_path, [5, 3, 5, 4])
    kept = read_trace(path, TraceOptions(sort=True))
    assert [(r.arrival_s, r.prompt_tokens) for r in kept] == \
        [(0.0, 11), (1.0, 13), (2.0, 10), (2.0, 12)]


def test_load_trace_is_a_lazy_stream_that_stops_at_the_limit(tmp_path):
    good = jsonl({"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1})
    path = write(tmp_path, "lazy.jsonl", good * 3 + "not json\n")
    stream = load_trace(path, TraceOptions(limit=3))
    assert inspect.isgenerator(stream)
    assert len(list(stream)) == 3          # the bad 4th line is never read


def test_bundled_samples_load():
    mooncake = read_trace(sample_path("mooncake"))
    azure = read_trace(sample_path("azure-conv"))
    assert len(mooncake) == 300 and len(azure) == 300
    assert mooncake[-1].arrival_s == 102.0
    assert azure[0].prompt_tokens == 374 and azure[0].output_tokens == 44


@pytest.mark.skipif(not MOONCAKE.exists(), reason="../shared traces not present")
def test_full_mooncake_trace_loads_in_well_under_a_few_seconds():
    start = time.perf_counter()
    count = prompt = 0
    for request in load_trace(MOONCAKE):
        count += 1
        prompt += request.prompt_tokens
    assert time.perf_counter() - start < 2.0
    assert count == 12031 and prompt / count == pytest.approx(12035.1, abs=0.05)



def test_each_request_knows_the_trace_line_it_came_from(tmp_path):
    """Kept, re-numbered and sorted requests keep their file's line (a CSV's header is line
    1; a blank line and a row left out count as lines): results join back to the trace."""
    path = write(tmp_path, "n.jsonl", jsonl(
        {"arrival_s": 5, "prompt_tokens": 3, "output_tokens": 1},
        {"arrival_s": 1, "prompt_tokens": 4, "output_tokens": 1})
        + "\n" + jsonl({"arrival_s": 9, "prompt_tokens": 5, "output_tokens": 1}))
    sorted_ = read_trace(path, TraceOptions(sort=True))
    assert [(r.request_id, r.trace_line, r.prompt_tokens) for r in sorted_] == [
        (0, 2, 4), (1, 1, 3), (2, 4, 5)]
    azure = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:15:46.6805900,100,0\n2023-11-16 18:15:47.6805900,200,5\n"
                  "2023-11-16 18:15:48.6805900,300,5\n")
    assert [r.trace_line for r in read_trace(azure, TraceOptions(start_s=0.5))] == [4]
    assert [r.trace_line for r in read_trace(azure)] == [3, 4]
