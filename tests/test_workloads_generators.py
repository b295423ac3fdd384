"""Synthetic workloads: arrivals, lengths, presets, priorities, determinism."""

import dataclasses

import numpy as np
import pytest

from kvsim.errors import ConfigError
from kvsim.workloads import read_trace, sample_path
from kvsim.workloads.generators import (
    PRESETS, Arrivals, GenConfig, fixed, generate, lognormal, parse_lengths, resampled, uniform,
    write_workload)
from kvsim.workloads.generators.arrivals import first
from kvsim.workloads.generators.presets import zipf_weights


def rng(seed=0):
    return np.random.Generator(np.random.PCG64(seed))


def gaps(arrivals, n=20000, seed=0):
    return np.diff(first(arrivals.times(rng(seed)), n))


def cv(x):
    return x.std() / x.mean()


# --- arrivals -------------------------------------------------------------------------------

def test_poisson_arrivals_start_at_zero_with_mean_gap_one_over_rate():
    times = first(Arrivals("poisson", rate=4.0).times(rng()), 5)
    assert times[0] == 0.0 and (np.diff(times) >= 0).all()
    g = gaps(Arrivals("poisson", rate=4.0))
    assert g.mean() == pytest.approx(0.25, rel=0.03) and cv(g) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("target", [0.5, 3.0])
def test_gamma_arrivals_have_the_chosen_burstiness(target):
    g = gaps(Arrivals("gamma", rate=2.0, cv=target), n=50000)
    assert g.mean() == pytest.approx(0.5, rel=0.05) and cv(g) == pytest.approx(target, rel=0.1)


def test_trace_arrivals_replay_the_trace_timestamps_then_repeat_its_gaps():
    trace = [r.arrival_s for r in read_trace(sample_path("mooncake"))]
    times = first(Arrivals("trace", path=str(sample_path("mooncake"))).times(rng()), 302)
    assert times[:300].tolist() == pytest.approx(trace)
    assert times[301] - times[300] == pytest.approx(trace[1] - trace[0])
    by_name = first(Arrivals("trace", path="sample:mooncake").times(rng()), 300)
    assert by_name.tolist() == times[:300].tolist()     # (a sample by name, as elsewhere)


@pytest.mark.parametrize("arrivals, field", [
    (Arrivals("weekly"), "arrival"), (Arrivals("poisson", rate=0), "rate"),
    (Arrivals("gamma", cv=-1), "cv"), (Arrivals("trace"), "arrival_trace")])
def test_bad_arrivals(arrivals, field):
    with pytest.raises(ConfigError) as info:
        arrivals.checked()
    assert info.value.field == field


# --- lengths --------------------------------------------------------------------------------

def test_length_distributions():
    assert fixed(7).sample(rng(), 3).tolist() == [7, 7, 7]
    drawn = uniform(3, 5).sample(rng(), 1000)
    assert set(drawn.tolist()) == {3, 4, 5}
    assert lognormal(200, 0.8).sample(rng(), 40000).mean() == pytest.approx(200, rel=0.03)
    assert lognormal(200, 0.8, low=150, high=160).sample(rng(), 100).min() >= 150


def test_resampled_lengths_come_from_the_trace():
    trace = read_trace(sample_path("azure-conv"))
    drawn = resampled(sample_path("azure-conv"), "output").sample(rng(), 500)
    assert set(drawn.tolist()) <= {r.output_tokens for r in trace}
    assert resampled("sample:azure-conv", "output").sample(rng(), 500).tolist() == \
        drawn.tolist()


def test_length_specs_parse():
    assert parse_lengths("fixed:12") == fixed(12)
    assert parse_lengths("uniform:1:9") == uniform(1, 9)
    assert parse_lengths("lognormal:161:1.0") == lognormal(161, 1.0)
    assert parse_lengths("trace:/x.csv", "output") == resampled("/x.csv", "output")
    with pytest.raises(ConfigError, match="cannot read length distribution"):
        parse_lengths("fixed:many")
    for spec, why in [("uniform:9:1", "uniform:9:1: LO is above HI"),
                      ("fixed:0", "0 tokens: a length must be from 1 to 10,000,000"),
                      ("fixed:100000000", "100000000 tokens: a length must be from 1 to "
                                          "10,000,000"),    # (what kvsim run refuses)
                      ("lognormal:1e9:5", "lognormal mean 1e9: must be above 0 and at most "
                                          "1,000,000 tokens")]:
        with pytest.raises(ConfigError, match=why.replace(".", r"\.")):
            parse_lengths(spec)


# --- presets --------------------------------------------------------------------------------

def test_zipf_weights_fall_off_as_a_power_law():
    w = zipf_weights(3, 1.0)
    assert w.tolist() == pytest.approx([6 / 11, 3 / 11, 2 / 11])


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_writes_a_trace_that_loads_back(tmp_path, name):
    path = tmp_path / "w.jsonl"
    summary = write_workload(name, path, GenConfig(num_requests=60, seed=3))
    assert summary == {"preset": name, "path": str(path), "num_requests": 60, "seed": 3}
    loaded = read_trace(path)
    generated = generate(name, GenConfig(num_requests=60, seed=3))
    assert [r.request_id for r in loaded] == list(range(60))
    assert [r.arrival_s for r in loaded] == [r.arrival_s for r in generated]
    assert [r.prompt_tokens for r in loaded] == [r.prompt_tokens for r in generated]
    assert loaded[0].arrival_s == 0.0


def test_same_seed_same_file_byte_for_byte(tmp_path):
    config = GenConfig(num_requests=80, seed=11, high_priority_fraction=0.2)
    write_workload("chat", tmp_path / "a.jsonl", config)
    write_workload("chat", tmp_path / "b.jsonl", config)
    write_workload("chat", tmp_path / "c.jsonl", dataclasses.replace(config, seed=12))
    a, b, c = ((tmp_path / f"{x}.jsonl").read_bytes() for x in "abc")
    assert a == b and a != c


def test_a_shorter_workload_is_the_start_of_a_longer_one():
    short = generate("agent", GenConfig(num_requests=50, seed=5))
    long = generate("agent", GenConfig(num_requests=120, seed=5))
    for s, l in zip(short, long):
        assert (s.arrival_s, s.prompt_tokens, s.session_id) == \
            (l.arrival_s, l.prompt_tokens, l.session_id)
        assert (s.prefix_hashes == l.prefix_hashes).all()


@pytest.mark.parametrize("preset, block", [("chat", 16), ("chat", 7), ("agent", 64),
                                           ("customer-service", 16)])
def test_a_continuation_keeps_its_parents_names_as_renaming_its_whole_prompt_would(
        monkeypatch, preset, block):
    """A turn's blocks inside its parent's prompt take the parent's renamed ids instead of
    being hashed and renamed again: the same ids, request by request."""
    from kvsim.workloads.generators import build
    config = GenConfig(num_requests=400, seed=2, hash_block_size=block)
    reused = generate(preset, config)
    monkeypatch.setattr(build, "_named_prefix_ids", lambda names, segments, size, parent:
                        names.rename(build.prefix_ids(segments, size)))
    whole = generate(preset, config)
    if preset != "customer-service":        # (its requests continue nothing)
        assert sum(r.continues is not None for r in reused) > 100
    assert [r.prefix_hashes.tolist() for r in reused] == [r.prefix_hashes.tolist() for r in whole]


def by_session(requests):
    sessions = {}
    for r in requests:
        sessions.setdefault(r.session_id, []).append(r)
    return sessions


def test_chat_turns_extend_the_previous_turn_and_share_the_system_prompt():
    requests = generate("chat", GenConfig(num_requests=300, seed=1))
    system_blocks = PRESETS["chat"].system_tokens // 16
    first_block = {r.block_hashes(16)[0] for r in requests}
    assert len(first_block) == 1
    multi = [turns for turns in by_session(requests).values() if len(turns) > 1]
    assert multi
    for turns in multi:
        for before, after in zip(turns, turns[1:]):
            shared = before.prompt_tokens // 16
            assert after.prompt_tokens > before.prompt_tokens + before.output_tokens
            assert (after.block_hashes(16)[:shared] == before.block_hashes(16)).all()
    other = [t[0] for t in by_session(requests).values()][:2]
    a, b = (r.block_hashes(16) for r in other)
    assert (a[:system_blocks] == b[:system_blocks]).all() and a[system_blocks] != b[system_blocks]


def test_customer_service_requests_share_exactly_their_templates():
    requests = generate("customer-service", GenConfig(num_requests=200, seed=2))
    by_template = {}
    for r in requests:
        by_template.setdefault(r.template_id, []).append(r)
    assert 1 < len(by_template) <= 50
    popular = max(by_template.values(), key=len)
    assert len(popular) > 200 / 50                 # Zipf: the head is more than average
    heads = {r.block_hashes(16)[0] for r in requests}
    assert len(heads) == len(by_template)          # one distinct first block per template
    a, b = popular[:2]
    assert common_blocks(a, b) >= 300 // 16 - 1     # templates are hundreds of tokens at least
    other = next(r for r in requests if r.template_id != a.template_id)
    assert common_blocks(a, other) == 0


def common_blocks(a, b) -> int:
    x, y = a.block_hashes(16), b.block_hashes(16)
    n = min(len(x), len(y))
    differ = np.flatnonzero(x[:n] != y[:n])
    return int(differ[0]) if len(differ) else n


def test_rag_requests_share_the_system_prompt_and_draw_from_a_document_pool():
    preset = dataclasses.replace(PRESETS["rag"], num_documents=20)
    requests = generate(preset, GenConfig(num_requests=100, seed=4))
    system_blocks = preset.system_tokens // 16
    heads = {tuple(r.block_hashes(16)[:system_blocks]) for r in requests}
    assert len(heads) == 1
    second = {r.block_hashes(16)[system_blocks + 2] for r in requests}
    assert len(second) <= 20                       # the first document comes from the pool
    assert all(r.prompt_tokens > preset.system_tokens + 4 * 100 for r in requests)


def test_long_doc_requests_are_one_of_a_few_long_documents_then_a_question():
    requests = generate("long-doc", GenConfig(num_requests=60, seed=2))
    by_doc = {}
    for r in requests:
        by_doc.setdefault(r.template_id, []).append(r)
    assert 1 < len(by_doc) <= PRESETS["long-doc"].num_documents
    for asked in by_doc.values():       # one document: the same prefix up to its last block
        assert min(common_blocks(a, b) for a in asked for b in asked) >= 80_000 // 16 - 1
    first = [asked[0] for asked in by_doc.values()]
    assert all(common_blocks(a, b) == 0 for a in first for b in first if a is not b)
    assert all(80_000 < r.prompt_tokens <= 100_000 + 1000 for r in requests)


def test_agent_context_grows_each_call():
    requests = generate("agent", GenConfig(num_requests=200, seed=6))
    for calls in by_session(requests).values():
        for before, after in zip(calls, calls[1:]):
            assert after.prompt_tokens > before.prompt_tokens + before.output_tokens
            assert (after.block_hashes(16)[:before.prompt_tokens // 16]
                    == before.block_hashes(16)).all()
        assert len({c.template_id for c in calls}) == 1


def test_sharegpt_like_lengths_and_no_shared_prefixes(tmp_path):
    requests = generate("sharegpt-like", GenConfig(num_requests=4000, seed=7))
    assert np.mean([r.prompt_tokens for r in requests]) == pytest.approx(161, rel=0.08)
    assert np.mean([r.output_tokens for r in requests]) == pytest.approx(338, rel=0.08)
    assert all(r.prefix_hashes is None for r in requests)
    write_workload("sharegpt-like", tmp_path / "s.jsonl", GenConfig(num_requests=2))
    assert "block_hashes" not in (tmp_path / "s.jsonl").read_text()


def test_high_priority_fraction_marks_whole_sessions():
    requests = generate("chat", GenConfig(num_requests=2000, seed=8, high_priority_fraction=0.3))
    sessions = by_session(requests).values()
    assert all(len({r.priority for r in turns}) == 1 for turns in sessions)
    high = np.mean([turns[0].priority == 0 for turns in sessions])
    assert high == pytest.approx(0.3, abs=0.06)
    assert {r.priority for r in requests} == {0, 1}
    assert {r.priority for r in generate("chat", GenConfig(num_requests=50))} == {0}


def test_length_overrides_and_gamma_arrivals_through_the_config():
    config = GenConfig(num_requests=500, seed=9, arrival="gamma", cv=4.0, rate=10.0,
                       input_tokens=fixed(100), output_tokens=fixed(5))
    requests = generate("sharegpt-like", config)
    assert {(r.prompt_tokens, r.output_tokens) for r in requests} == {(100, 5)}
    assert cv(np.diff([r.arrival_s for r in requests])) > 2


def test_token_ids_mode_writes_vllm_oracle_lines(tmp_path):
    config = GenConfig(num_requests=20, seed=10, token_ids=True, vocab_size=1000)
    write_workload("chat", tmp_path / "t.jsonl", config)
    requests = read_trace(tmp_path / "t.jsonl")
    ids = np.concatenate([r.prompt_token_ids for r in requests])
    assert ids.min() >= 3 and ids.max() < 1000
    assert all(r.prompt_tokens == len(r.prompt_token_ids) for r in requests)
    heads = {tuple(r.prompt_token_ids[:300]) for r in requests}
    assert len(heads) == 1                         # the shared system prompt


@pytest.mark.parametrize("config, field", [
    (GenConfig(num_requests=0), "num_requests"),
    (GenConfig(high_priority_fraction=1.5), "high_priority_fraction"),
    (GenConfig(hash_block_size=0), "hash_block_size")])
def test_bad_configs(config, field):
    with pytest.raises(ConfigError) as info:
        generate("chat", config)
    assert info.value.field == field


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'chitchat'"):
        generate("chitchat")


def test_a_preset_that_cannot_make_a_request_is_an_error_not_a_hang():
    preset = dataclasses.replace(PRESETS["chat"], max_context_tokens=10)
    with pytest.raises(ConfigError, match="makes no requests"):
        generate(preset, GenConfig(num_requests=5))


def test_a_missing_directory_is_made_and_a_file_in_the_way_is_a_user_error(tmp_path):
    from kvsim.errors import KvsimError
    write_workload("chat", tmp_path / "missing" / "x.jsonl", GenConfig(num_requests=2))
    assert len((tmp_path / "missing" / "x.jsonl").read_text().splitlines()) == 2
    (tmp_path / "file").write_text("")
    with pytest.raises(KvsimError, match="is not a directory") as info:
        write_workload("chat", tmp_path / "file" / "x.jsonl", GenConfig(num_requests=2))
    assert info.value.field == "out"


@pytest.mark.parametrize("settings, field", [
    ({"arrival_trace": "t.jsonl"}, "arrival_trace"),     # (poisson: the file is not read)
    ({"cv": 3.0}, "cv"),
    ({"cv": 3.0, "arrival": "trace", "arrival_trace": "t.jsonl"}, "cv"),
])
def test_an_arrival_option_of_another_process_is_refused_not_ignored(settings, field):
    from kvsim.errors import ConfigError
    from kvsim.workloads.generators import GenConfig
    with pytest.raises(ConfigError) as err:
        GenConfig(**settings).checked()
    assert err.value.field == field


@pytest.mark.parametrize("changes, field, words", [
    ({"rate": 1e-300, "num_requests": 5}, "rate", "5 requests at 1e-300 a second span up to "
                                                  "5e+300 s, more than a trace may (1e+11 s)"),
    ({"hash_block_size": 20_000_000}, "hash_block_size",
     "20,000,000 is more than kvsim reads (10,000,000)"),
])
def test_gen_refuses_what_its_trace_reader_would_refuse(tmp_path, changes, field, words):
    """A workload kvsim could not read back is refused before anything is written."""
    with pytest.raises(ConfigError) as refused:
        write_workload("chat", tmp_path / "w.jsonl", GenConfig(**changes))
    assert (refused.value.field, refused.value.message.split("; raise")[0]) == (field, words)
    assert not (tmp_path / "w.jsonl").exists()
