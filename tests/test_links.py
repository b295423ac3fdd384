"""Links between trace lines (``request_id`` / ``continues``): a named request is kept only
until the last line that continues it, counted by a first reading of the file."""

import json
from collections import Counter

import pytest

from kvsim.errors import TraceError
from kvsim.workloads import read_trace
from kvsim.workloads.jsonl import native_requests
from kvsim.workloads.lines import numbered_lines
from kvsim.workloads.links import Links, count_continuations
from kvsim.workloads.request import Request


def write(tmp_path, lines, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return path


def line(t, prompt, output, **kw):
    return {"arrival_s": t, "prompt_tokens": prompt, "output_tokens": output, **kw}


@pytest.fixture
def made_links(monkeypatch):
    """The :class:`Links` each reading of a native file makes, in order; each counts the
    file's continuations at its first name."""
    import kvsim.workloads.jsonl as jsonl
    import kvsim.workloads.links as links_module
    monkeypatch.setattr(links_module, "KEEP_UNCOUNTED", 0)
    made, original = [], jsonl._links
    monkeypatch.setattr(jsonl, "_links", lambda path: made.append(original(path)) or made[-1])
    return made


def test_a_named_request_is_let_go_after_its_last_continuation(tmp_path, made_links):
    """a is continued twice (by b and c), b once (by d), d never: the open names after each
    line are {a}, {a, b}, {b}, {}, {}."""
    path = write(tmp_path, [
        line(0, 4, 2, request_id="a"),
        line(1, 8, 2, request_id="b", continues="a"),
        line(2, 8, 2, continues="a"),
        line(3, 12, 2, request_id="d", continues="b"),
        line(4, 4, 2)])
    open_after = [sorted(made_links[0]._open)
                  for _ in native_requests(numbered_lines(path), path)]
    assert open_after == [["a"], ["a", "b"], ["b"], [], []]
    requests = read_trace(path)
    assert requests[1].continues is requests[0] and requests[2].continues is requests[0]
    assert requests[3].continues is requests[1]


def test_requests_named_before_the_count_are_let_go_by_what_was_read_since():
    """Counted once more than 2 are open (at c): a was continued once of twice, b once of
    once, c not yet: b goes at once, a and c after their last continuations."""
    lines = [{"request_id": "a"}, {"request_id": "b", "continues": "a"},
             {"request_id": "c", "continues": "b"}, {"continues": "a"}, {"continues": "c"}]
    counted = []
    links = Links(lambda: counted.append(1) or Counter({"a": 2, "b": 1, "c": 1}),
                  keep_uncounted=2)
    open_after = []
    for i, record in enumerate(lines, start=1):
        links.read(record, f"t:{i}", i, Request(0, float(i), 4 * i, 2))
        open_after.append(sorted(links._open))
    assert open_after == [["a"], ["a", "b"], ["a", "c"], ["c"], []]
    assert counted == [1]


def test_without_a_count_every_named_request_is_kept():
    links = Links()
    parent, child = Request(0, 0.0, 4, 2), Request(0, 1.0, 8, 2)
    links.read({"request_id": 7}, "t:1", 1, parent)
    links.read({"continues": 7}, "t:2", 2, child)
    assert child.continues is parent and links.num_open == 1


def test_a_continuation_the_first_reading_missed_is_one_clear_line():
    """The file changed between the two readings: the count said nobody continues 'a'."""
    links = Links(lambda: Counter(), keep_uncounted=0)
    links.read({"request_id": "a"}, "t.jsonl:1", 1, Request(0, 0.0, 4, 2))
    assert links.num_open == 0
    with pytest.raises(TraceError, match="t.jsonl:2: field 'continues': 'a' is continued more "
                                         "often than a first reading of the file counted"):
        links.read({"continues": "a"}, "t.jsonl:2", 2, Request(0, 1.0, 8, 2))


@pytest.mark.parametrize("keep, readings", [(2, 1), (1, 2)])
def test_a_trace_with_few_names_is_read_once(tmp_path, monkeypatch, keep, readings):
    """At most 2 names are open at once: with KEEP_UNCOUNTED 2 the file is read once (a
    --limit look at a long trace stops as early); with 1 it is counted too."""
    path = write(tmp_path, [line(0, 4, 2, request_id="x"), line(1, 4, 2, request_id="y"),
                            line(2, 8, 2, continues="x"), line(3, 4, 2)])
    import kvsim.workloads.jsonl as jsonl
    import kvsim.workloads.links as links_module
    monkeypatch.setattr(links_module, "KEEP_UNCOUNTED", keep)
    counts = []
    monkeypatch.setattr(jsonl, "count_continuations",
                        lambda lines: counts.append(1) or count_continuations(lines))
    requests = read_trace(path)
    assert len(requests) == 4 and requests[2].continues is requests[0]
    assert 1 + len(counts) == readings


@pytest.mark.parametrize("text, name", [
    ('{"continues": 12, "prompt_tokens": 4}', "12"),
    ('{"continues" :  "s-1" }', "s-1"),
    ('{"continues": -3}', "-3"),
    ('{"continues": "é"}', "é"),
    ('{"contin\\u0075es": "escaped"}', "escaped"),          # only json reads the escape
    ('{"continues": "a\\"b"}', 'a"b'),
    ('{"continues": "a", "continues": "b"}', "b"),          # json keeps the last key
    ('{"session_id": "\\"continues\\": \\"x\\"", "continues": "y"}', "y"),
    ('{"continues": 1.5}', None),                            # not a name: the run says so
    ('{"continues": true}', None),
    ('{"continues": null}', None),
    ('{"continues": [1]}', None),
    ('["continues", 1]', None),
    ('{"continues": "a"', None),                             # truncated
    ('{"prompt_tokens": 4}', None),
])
def test_the_first_reading_counts_what_the_run_reads_as_continues(text, name):
    assert count_continuations([(1, text)]) == (Counter({name: 1}) if name else Counter())


def test_the_first_reading_stops_at_an_unreadable_line(tmp_path):
    """Lines past the first undecodable one are never run (it is an error), so not counted."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"continues": "a"}\n\xff\n{"continues": "b"}\n')
    assert count_continuations(numbered_lines(path)) == Counter({"a": 1})


def test_a_long_session_keeps_one_turn_open(tmp_path, made_links):
    """A 200-turn session, each turn continuing the last: one named request open at a time,
    none after the last turn (nobody continues it)."""
    rows, prompt = [line(0, 4, 2, request_id="t0")], 4
    for i in range(1, 200):
        prompt += 8
        rows.append(line(i, prompt, 2, request_id=f"t{i}", continues=f"t{i - 1}"))
    path = write(tmp_path, rows)
    peak = max(made_links[0].num_open for _ in native_requests(numbered_lines(path), path))
    assert peak == 1 and made_links[0].num_open == 0


@pytest.mark.parametrize("rate_scale", [0.5, 1.0, 2.0])
def test_a_continuation_is_checked_against_its_parents_time_as_written(tmp_path, rate_scale):
    """The loader re-times each request as it passes (``--rate-scale``); a continuation's
    own time, as written, is compared with its parent's as written."""
    from kvsim.workloads import TraceOptions
    path = write(tmp_path, [line(0, 100, 10), line(2, 100, 10, request_id="a"),
                            line(3, 200, 10, continues="a")])
    first, parent, turn = read_trace(path, TraceOptions(rate_scale=rate_scale))
    assert [r.arrival_s for r in (first, parent, turn)] == [0, 2 / rate_scale, 3 / rate_scale]
    assert turn.continues is parent
