"""Bad traces: each problem is one TraceError naming file, line and field."""

import json

import pytest

from kvsim.errors import TraceError
from kvsim.workloads import TraceOptions, read_trace

MOON = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
NATIVE = {"arrival_s": 0, "prompt_tokens": 20, "output_tokens": 5}
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROW = "2023-11-16 18:15:46.6805900,374,44\n"


def trace_error(tmp_path, content, opts=None, name="t.jsonl") -> TraceError:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(TraceError) as info:
        read_trace(path, opts)
    err = info.value
    assert "\n" not in str(err)
    return err


def lines(*records):
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def second_line_error(tmp_path, base, **changes):
    bad = {**base, **changes}
    for key in [k for k, v in changes.items() if v is ...]:
        del bad[key]
    return trace_error(tmp_path, lines(base, bad))


def test_empty_file(tmp_path):
    err = trace_error(tmp_path, "")
    assert err.location.endswith("t.jsonl") and "empty" in err.message


def test_file_of_blank_lines_is_empty(tmp_path):
    assert "empty" in trace_error(tmp_path, "\n \r\n\n").message


def test_header_only_csv_has_no_requests(tmp_path):
    err = trace_error(tmp_path, AZURE_HEADER, name="a.csv")
    assert "no requests" in err.message


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "nope.jsonl")


def test_truncated_line(tmp_path):
    err = trace_error(tmp_path, lines(MOON) + '{"timestamp": 5, "input_len')
    assert err.location.endswith("t.jsonl:2") and "truncated" in err.message


def test_non_json_line(tmp_path):
    err = trace_error(tmp_path, lines(MOON, "hello"))
    assert err.location.endswith(":2") and "not valid JSON" in err.message


def test_json_line_that_is_not_an_object(tmp_path):
    err = trace_error(tmp_path, lines(MOON, "[1, 2]"))
    assert err.location.endswith(":2") and "JSON object" in err.message


def test_undecodable_bytes(tmp_path):
    err = trace_error(tmp_path, lines(MOON).encode() + b'{"timestamp": 1\xff}\n')
    assert err.location.endswith(":2") and "UTF-8" in err.message and "0xff" in err.message


@pytest.mark.parametrize("field, value, words", [
    ("input_length", "600", "expected an integer"),
    ("input_length", 600.5, "expected an integer"),
    ("input_length", True, "expected an integer"),
    ("output_length", None, "missing"),
    ("timestamp", "soon", "expected a number"),
    ("hash_ids", "1,2", "expected a list"),
    ("hash_ids", [1, "2"], "64-bit integers"),
    ("hash_ids", [1, 2.5], "64-bit integers"),
])
def test_wrong_types_in_mooncake_lines(tmp_path, field, value, words):
    err = second_line_error(tmp_path, MOON, **{field: value})
    assert (err.location.split(":")[-1], err.field) == ("2", field)
    assert words in err.message


@pytest.mark.parametrize("field", ["timestamp", "input_length", "output_length", "hash_ids"])
def test_missing_mooncake_fields(tmp_path, field):
    err = second_line_error(tmp_path, MOON, **{field: ...})
    assert (err.field, err.message) == (field, "missing required field")


@pytest.mark.parametrize("field", ["prompt_tokens", "output_tokens"])
def test_missing_native_fields(tmp_path, field):
    err = second_line_error(tmp_path, NATIVE, **{field: ...})
    assert (err.field, err.message) == (field, "missing required field")


@pytest.mark.parametrize("base, key, replaces, meant", [
    (NATIVE, "arrival", "arrival_s", "write arrival_s (seconds after the trace's start)"),
    (NATIVE, "ARRIVAL_S", "arrival_s", "write arrival_s"),       # other capitals
    (NATIVE, "prio", None, "write priority"),
    (NATIVE, "Priority", None, "write priority"),
    (NATIVE, "sesion_id", None, "write session_id"),             # misspelt
    (NATIVE, "t", "arrival_s", "write arrival_s (seconds after the trace's start)"),
    (NATIVE, "arrival_ms", "arrival_s", "write arrival_s (arrival_ms is in milliseconds: "
                                        "divide by 1000)"),
    (NATIVE, "arrival_us", "arrival_s", "write arrival_s (arrival_us is in microseconds: "
                                        "divide by 10^6)"),
    (NATIVE, "arrival_step", "arrival_s", "write arrival_s (arrival_step counts engine steps, "
                                          "not time)"),
    (NATIVE, "continued", None, "write continues"),
    (NATIVE, "timestamp", "arrival_s", "write arrival_s (in seconds; timestamp is "
                                       "Mooncake's, in milliseconds)"),
    (MOON, "arrival_s", "timestamp", "write timestamp (in milliseconds)")])
def test_a_key_that_stands_for_one_kvsim_reads_is_refused_not_dropped(
        tmp_path, base, key, replaces, meant):
    bad = {**{k: v for k, v in base.items() if k != replaces}, key: 3}
    err = trace_error(tmp_path, lines(base, bad))
    assert (err.field, err.location) == (key, f"{tmp_path / 't.jsonl'}:2")
    assert err.message == f"not a key of {'native' if base is NATIVE else 'mooncake'} trace " \
                          f"lines: it would be ignored; {meant}"


def test_a_key_is_judged_on_every_line_that_lacks_the_one_it_stands_for(tmp_path):
    beside = {**NATIVE, "arrival": 1}        # (its own key beside arrival_s: ignored there)
    alone = {"arrival": 5, "prompt_tokens": 20, "output_tokens": 5}
    err = trace_error(tmp_path, lines(beside, alone))
    assert (err.field, err.location) == ("arrival", f"{tmp_path / 't.jsonl'}:2")
    err = trace_error(tmp_path, lines({**NATIVE, "arrival_time": "1.5"}, {       # any value
        "arrival_time": "2024-01-01T10:00:00", "prompt_tokens": 20, "output_tokens": 5}))
    assert (err.field, err.location) == ("arrival_time", f"{tmp_path / 't.jsonl'}:2")


def test_keys_of_the_users_own_are_ignored(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(lines(
        {**NATIVE, "dataset": "chat", "input_length": 3},        # it has prompt_tokens
        {"arrival_s": 0, "prompt_token_ids": [1, 2, 3], "output_tokens": 2, "prompt_len": 3},
        {**NATIVE, "template": "chat", "session": "x", "request": {"a": 1}, "block_size": 16},
        {**NATIVE, "time": "2024-01-01T10:00:00"},               # (beside arrival_s)
        {**NATIVE, "requestId": "a", "Priority": "high"},       # (no id lost; not a number)
        {"arrival_s": 0, "prompt_token_ids": [1, 2, 3], "output_tokens": 2, "hash_ids": [7]},
    ))
    assert [r.prompt_tokens for r in read_trace(path)] == [20, 3, 20, 20, 20, 3]
    path.write_text(lines({**MOON, "conversation": 4, "arrival_s": 1.0, "prompt_tokens": 600}))
    assert [r.prompt_tokens for r in read_trace(path)] == [600]     # (Mooncake's two lengths)
    assert [r.prompt_tokens for r in read_trace(path, TraceOptions(fmt="mooncake"))] == [600]
    path.write_text(lines({**NATIVE, "input_length": 9, "output_length": 9}))   # (arrival_s:
    assert [r.prompt_tokens for r in read_trace(path)] == [20]                 # native)


def test_a_format_given_that_is_not_the_files_says_so(tmp_path):
    err = trace_error(tmp_path, AZURE_HEADER + AZURE_ROW, TraceOptions(fmt="mooncake"))
    assert (err.field, err.message) == ("format", "the mooncake format reads JSON lines of "
                                        "its own, and the first line is no JSON line ('TIME"
                                        "STAMP,ContextTokens,GeneratedTokens'): leave the "
                                        "format out to detect the file's")
    err = trace_error(tmp_path, lines(NATIVE), TraceOptions(fmt="mooncake"))
    assert err.message == ("the mooncake format reads JSON lines of its own, and the first "
                           "line is a native line: leave the format out to detect the file's")
    err = trace_error(tmp_path, lines({**NATIVE, "block_hashes": list(range(200))}),
                      TraceOptions(fmt="azure"))
    assert err.message == ("the first line is JSON, not a CSV header with TIMESTAMP, "
                           "ContextTokens, GeneratedTokens (the format given is not the file's)")


def test_csv_headers_and_rows_must_agree(tmp_path):
    err = trace_error(tmp_path, "TIMESTAMP,ContextTokens\n" + AZURE_ROW, name="t.csv")
    assert (err.field, err.message) == ("GeneratedTokens", "missing column in header "
                                        "'TIMESTAMP,ContextTokens'")
    err = trace_error(tmp_path, AZURE_HEADER + AZURE_ROW.strip() + ",99,100\n", name="t.csv")
    assert err.message == "row has 5 columns, the header 3: a comma too many, or rows of " \
                          "another file?"


def test_a_csv_written_with_trailing_commas_reads_but_a_shifted_row_does_not(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(AZURE_HEADER.strip() + ",\n" + AZURE_ROW.strip() + ",\n")  # (all lines)
    assert [r.prompt_tokens for r in read_trace(path)] == [374]
    err = trace_error(tmp_path, AZURE_HEADER + "2023-11-16 18:15:50.99,1,396,\n",
                      name="t.csv")                     # (a thousands comma: 1,396)
    assert err.message.startswith("row has 4 columns, the header 3")


def test_a_key_given_twice_is_refused_not_overwritten(tmp_path):
    err = trace_error(tmp_path, '{"arrival_s": 0, "prompt_tokens": -5, "prompt_tokens": 5, '
                                '"output_tokens": 4}\n')
    assert (err.field, err.message) == ("prompt_tokens", "key given twice in one object (JSON "
                                        "would keep the last)")
    err = trace_error(tmp_path, '{"arrival_s" : 0, "prompt_tokens" : 5, "prompt_tokens" : 6, '
                                '"output_tokens" : 2}\n')           # (spaced as JSON allows)
    assert err.field == "prompt_tokens"
    # '":' inside a string is no second key; a key twice in ignored metadata is left alone
    path = tmp_path / "ok.jsonl"
    path.write_text('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 4, '
                    '"session_id": "a\\":b", "meta": {"a": 1, "a": 2}}\n')
    assert read_trace(path)[0].session_id == 'a":b'


@pytest.mark.parametrize("value, words", [
    (-3, "positive"), (0, "positive"), (float("nan"), "expected an integer"),
    (10_000_001, "absurd"),
])
def test_bad_lengths(tmp_path, value, words):
    err = second_line_error(tmp_path, NATIVE, output_tokens=value)
    assert err.field == "output_tokens" and words in err.message


def test_nan_timestamp(tmp_path):
    err = second_line_error(tmp_path, NATIVE, arrival_s=float("nan"))
    assert err.field == "arrival_s" and "finite" in err.message


def test_hash_ids_count_must_be_ceil_of_input_over_512(tmp_path):
    err = second_line_error(tmp_path, MOON, input_length=1025)
    assert err.field == "hash_ids" and "expected ceil(1025/512) = 3" in err.message


def test_native_block_hashes_must_match_prompt_and_come_with_their_size(tmp_path):
    err = second_line_error(tmp_path, NATIVE, block_hashes=[1], hash_block_size=16)
    assert err.field == "block_hashes" and "expected ceil(20/16) = 2" in err.message
    err = second_line_error(tmp_path, NATIVE, block_hashes=[1, 2])
    assert err.field == "hash_block_size" and "missing" in err.message


def test_prompt_tokens_must_agree_with_prompt_token_ids(tmp_path):
    err = second_line_error(tmp_path, NATIVE, prompt_token_ids=[1, 2, 3])
    assert err.field == "prompt_tokens" and "disagrees" in err.message


def test_negative_token_id(tmp_path):
    err = trace_error(tmp_path, lines({"prompt_token_ids": [1, -2], "output_tokens": 1}))
    assert err.field == "prompt_token_ids" and "negative" in err.message


@pytest.mark.parametrize("record", [{"prompt_token_ids": [3, 7, True], "output_tokens": 1},
                                    {"prompt_tokens": 20, "output_tokens": 1,
                                     "block_hashes": [5, False], "hash_block_size": 16}])
def test_a_boolean_among_integer_ids_is_refused(tmp_path, record):
    err = trace_error(tmp_path, lines(record))      # (numpy reads true as 1)
    assert err.message == "expected a list of 64-bit integers, found a boolean"


def test_an_id_beyond_64_bits_is_the_one_named(tmp_path):
    err = trace_error(tmp_path, lines({"prompt_token_ids": [3, 2**64], "output_tokens": 1}))
    assert err.message == ("expected a list of 64-bit integers, found 18446744073709551616 "
                           "(beyond 64 bits)")


def test_ids_that_no_one_64_bit_type_holds_are_named_so(tmp_path):
    err = trace_error(tmp_path, lines({"prompt_tokens": 20, "output_tokens": 1,
                                       "block_hashes": [-1, 2**63], "hash_block_size": 16}))
    assert err.message == ("expected 64-bit integers of one kind: it mixes negative ids with "
                           "ids of 2**63 or more")


def test_timestamps_going_backwards_unless_sort(tmp_path):
    text = lines(MOON, {**MOON, "timestamp": 2000}, {**MOON, "timestamp": 1000})
    err = trace_error(tmp_path, text)
    assert (err.location.split(":")[-1], err.field) == ("3", "timestamp")
    assert err.message == ("time goes backwards: it arrives 1 s before line 2; use --sort "
                           "to accept an unsorted trace")      # (seconds apart: not ms)
    path = tmp_path / "t.jsonl"
    assert [r.arrival_s for r in read_trace(path, TraceOptions(sort=True))] == [0.0, 1.0, 2.0]


def test_an_azure_row_going_backwards_says_by_how_much_not_since_when(tmp_path):
    text = AZURE_HEADER + "2023-11-16 18:15:45.1,10,5\n2023-11-16 18:15:41.1,10,5\n"
    err = trace_error(tmp_path, text, name="t.csv")
    assert (err.location.split(":")[-1], err.field) == ("3", "TIMESTAMP")
    assert err.message.startswith("time goes backwards: it arrives 4 s before line 2;")


def test_azure_times_with_and_without_a_zone_are_not_mixed(tmp_path):
    """A zone's offset between two rows was taken as a gap (here 5 hours); times all with a
    zone, or all without, read as before."""
    zoned = AZURE_ROW.replace(",374", "+05:00,374")
    err = trace_error(tmp_path, AZURE_HEADER + zoned + AZURE_ROW, name="t.csv")
    assert (err.location.split(":")[-1], err.field, err.message) == (
        "3", "TIMESTAMP", "'2023-11-16 18:15:46.6805900' has no time zone, and the rows before "
                          "do: their gap would be off by the zone's offset")
    err = trace_error(tmp_path, AZURE_HEADER + AZURE_ROW + zoned, name="t.csv")
    assert err.message.startswith("'2023-11-16 18:15:46.6805900+05:00' has a time zone, and "
                                  "the rows before do not")
    path = tmp_path / "zoned.csv"
    path.write_text(AZURE_HEADER + zoned + zoned.replace("46.68", "47.68"))
    assert [r.arrival_s for r in read_trace(path)] == [0.0, 1.0]


@pytest.mark.parametrize("field, base", [("arrival_s", NATIVE), ("timestamp", MOON)])
@pytest.mark.parametrize("digits", [310, 5000])
def test_a_time_too_big_for_a_float_is_one_error_not_a_traceback(tmp_path, field, base,
                                                                 digits):
    text = lines(base).rstrip("\n") + "\n" + json.dumps(base).replace(
        f'"{field}": 0', f'"{field}": 1' + "0" * (digits - 1)) + "\n"
    err = trace_error(tmp_path, text)
    assert err.location.endswith(":2")
    assert ("absurd as a time" in err.message and err.field == field) if digits < 4300 \
        else "digits" in err.message


def test_unknown_format(tmp_path):
    err = trace_error(tmp_path, "a,b,c\n1,2,3\n", name="x.csv")
    assert (err.location.split(":")[-1], err.field) == ("1", "format")
    assert "unknown format" in err.message


def test_unknown_forced_format(tmp_path):
    err = trace_error(tmp_path, lines(MOON), TraceOptions(fmt="parquet"))
    assert err.field == "format" and "parquet" in err.message


@pytest.mark.parametrize("row, field, words", [
    ("2023-11-16 18:15:47.0,-3,44", "ContextTokens", "must not be negative"),
    ("2023-11-16 18:15:47.0,374,-1", "GeneratedTokens", "must not be negative"),
    ("2023-11-16 18:15:47.0,12.5,44", "ContextTokens", "expected an integer"),
    ("2023-11-16 18:15:47.0,374,nan", "GeneratedTokens", "expected an integer"),
    ("2023-11-16 18:15:47.0,374", "GeneratedTokens", "columns"),
    ("yesterday,374,44", "TIMESTAMP", "expected a time"),
    ("2023-02-30 18:15:47.0,374,44", "TIMESTAMP", "invalid date"),
    ("2023-11-16 18:15:40.0,374,44", "TIMESTAMP", "backwards"),
])
def test_bad_azure_rows_name_the_row_and_column(tmp_path, row, field, words):
    err = trace_error(tmp_path, AZURE_HEADER + AZURE_ROW + row + "\n", name="a.csv")
    assert (err.location.split(":")[-1], err.field) == ("3", field)
    assert words in err.message


def test_model_filter_needs_a_burstgpt_trace(tmp_path):
    err = trace_error(tmp_path, lines(MOON), TraceOptions(model_filter="GPT-4"))
    assert err.field == "trace_model" and err.message.startswith("this mooncake trace has no")


def test_a_model_filter_that_keeps_nothing_names_the_traces_models(tmp_path):
    burst = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
             "5,ChatGPT,100,20,120,Conversation log\n6,GPT-4,50,10,60,Conversation log\n"
             "7,Llama,50,0,50,Conversation log\n")                # (failed: not counted)
    err = trace_error(tmp_path, burst, TraceOptions(model_filter="gpt4"), name="b.csv")
    assert (err.field, err.message) == ("trace_model", f"{tmp_path / 'b.csv'} has no row of "
                                        "model 'gpt4'; its models: ChatGPT, GPT-4")
    err = trace_error(tmp_path, burst, TraceOptions(model_filter="llama"), name="b.csv")
    assert err.message == ("no requests: every row read with the model filter (--trace-model) "
                           "was left out (failed (BurstGPT Response tokens 0): 1, another "
                           "model (--trace-model): 2)")     # (its rows are there, all failed)


def test_a_failed_burstgpt_row_is_checked_before_it_is_left_out(tmp_path):
    burst = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
             "5,ChatGPT,100,20,120,Conversation log\n6,ChatGPT,abc,0,0,Conversation log\n")
    err = trace_error(tmp_path, burst, name="b.csv")
    assert (err.field, err.message) == ("Request tokens", "expected an integer, got 'abc'")


def test_window_that_keeps_nothing(tmp_path):
    err = trace_error(tmp_path, lines(MOON), TraceOptions(start_s=10))
    assert "no request left" in err.message


@pytest.mark.parametrize("opts, field", [
    (TraceOptions(rate_scale=0), "rate_scale"),
    (TraceOptions(rate_scale=float("nan")), "rate_scale"),
    (TraceOptions(limit=0), "limit"),
    (TraceOptions(start_s=5, end_s=5), "end_s"),
])
def test_bad_options(tmp_path, opts, field):
    assert trace_error(tmp_path, lines(MOON), opts).field == field


def test_a_line_longer_than_the_limit_is_refused_without_reading_it_whole(tmp_path,
                                                                           monkeypatch):
    from kvsim.workloads import lines
    monkeypatch.setattr(lines, "MAX_LINE_BYTES", 1024)
    err = trace_error(tmp_path, json.dumps(NATIVE) + "\n" + "x" * 5000 + "\n")
    assert err.one_line() == f"{tmp_path / 't.jsonl'}:2: line longer than 1,024 bytes; not a trace file?"


def test_a_read_error_mid_trace_is_one_line(tmp_path, monkeypatch):
    from kvsim.workloads import lines

    class Failing:
        def __init__(self):
            self.calls = 0

        def readline(self, limit):
            self.calls += 1
            if self.calls > 1:
                raise OSError(5, "Input/output error")
            return (json.dumps(NATIVE) + "\n").encode()

    got = lines._raw_lines(Failing(), tmp_path / "t.jsonl")
    assert next(got) == (json.dumps(NATIVE) + "\n").encode()
    with pytest.raises(TraceError, match=r"t.jsonl:2: read error: Input/output error"):
        next(got)


@pytest.mark.parametrize("line, field", [
    ({**NATIVE, "priority": 2**31}, "priority"),
    ({**NATIVE, "prompt_token_ids": [[1, 2], [3, 4]], "prompt_tokens": None}, "prompt_token_ids"),
    ({**MOON, "hash_ids": [[1], [2]]}, "hash_ids"),
    ({**MOON, "hash_ids": [1, -2]}, "hash_ids"),
    ({**MOON, "timestamp": 1e300}, "timestamp"),
])
def test_ranges_and_flat_id_lists(tmp_path, line, field):
    err = trace_error(tmp_path, json.dumps(line) + "\n")
    assert err.field == field and err.location == f"{tmp_path / 't.jsonl'}:1"


@pytest.mark.parametrize("pack, words", [
    ("bz2", "bzip2-compressed; kvsim reads plain text or gzip: unpack it first (bzip2 -dc "
            "FILE > OUT)"),
    ("xz", "xz-compressed; kvsim reads plain text or gzip: unpack it first (xz -dc FILE > "
           "OUT)"),
    ("gzip2", "gzip-compressed inside gzip; kvsim reads plain text or gzip: unpack it first "
              "(gzip -dc FILE > OUT)"),
])
def test_a_packing_other_than_gzip_is_named_not_read_as_text(tmp_path, pack, words):
    import bz2
    import gzip
    import lzma
    text = lines(NATIVE).encode()
    packed = {"bz2": bz2.compress, "xz": lzma.compress,
              "gzip2": lambda b: gzip.compress(gzip.compress(b))}[pack](text)
    err = trace_error(tmp_path, packed, name="t.jsonl.x")
    assert err.message == words and err.location.endswith("t.jsonl.x")


def test_a_rate_scale_that_puts_arrivals_past_any_trace_is_refused(tmp_path):
    text = lines(NATIVE, {**NATIVE, "arrival_s": 2})
    err = trace_error(tmp_path, text, TraceOptions(rate_scale=1e-300))
    assert err.field == "rate_scale"
    assert err.message == ("rate scale 1e-300 puts request 1 at 2e+300 s, later than a trace "
                           "may hold (1e+11 s)")


def test_lines_ended_by_a_lone_cr_are_named_as_such(tmp_path):
    text = lines(NATIVE, {**NATIVE, "arrival_s": 1}).replace("\n", "\r")
    err = trace_error(tmp_path, text)
    assert err.message == ("a line break is a lone CR (classic Mac line ends): end lines with "
                           "LF or CRLF") and err.location.endswith(":1")


def test_a_text_trace_that_starts_like_a_bzip2_mark_is_read(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("BZh,ContextTokens,GeneratedTokens\n1,2,3\n")    # (no digit after BZh)
    err = trace_error(tmp_path, path.read_text(), name="t.csv")
    assert "compressed" not in err.message
