"""docs/vllm-semantics.md in executable form (``tests/fixtures/vllm/refmodel.py``, no kvsim, no
vLLM) replays every oracle fixture whose model has full attention only exactly as real vLLM
did: the document describes what vLLM does, not what kvsim does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
NAMES = sorted(p.name[: -len(".vllm.json")] for p in FIXTURES.glob("*.vllm.json"))


def _refmodel():
    spec = importlib.util.spec_from_file_location("refmodel", FIXTURES / "refmodel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


refmodel = _refmodel()
FULL_ATTENTION = [n for n in NAMES if refmodel.local_attention(n) is None]


@pytest.mark.parametrize("name", FULL_ATTENTION)
def test_the_document_replays_the_oracle(name, capsys):
    assert refmodel.check(name), capsys.readouterr().out


def test_the_models_with_local_attention_are_the_thirteen_hybrid_fixtures():
    skipped = sorted(set(NAMES) - set(FULL_ATTENTION))
    assert skipped == ["gemma3_local_global", "gemma3_nochunk_priority", "gemma3_pool_preempt",
                       "gpt_oss_alternating", "gptoss_priority_midrun", "hybrid_threshold_noreserve",
                       "hybrid_twins_swa", "llama4_chunked_local", "llama4_chunked_twins",
                       "llama4_small_budget", "sliding_window_all", "sliding_window_hybrid",
                       "swa_long_resent"]
    assert len(FULL_ATTENTION) == 26
