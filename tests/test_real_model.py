"""The Llama decoder and ModelRunner: config parsing, RoPE, and whole-model consistency between
one prefill, chunked prefill, token-by-token decode and mixed batches (fp32, paged KV)."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

from kvsim.real_backend.backend_model import LlamaConfig  # noqa: E402
from shapes import llama  # noqa: E402
from kvsim.real_backend.llama import RotaryEmbedding, apply_rope, build_model  # noqa: E402
from kvsim.real_backend.model_runner import ModelRunner, RequestChunk  # noqa: E402

TINY_LLAMA = {  # ../shared/tools/vllm-oracle/tiny-llama/config.json
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "head_dim": 64, "hidden_act": "silu",
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
GQA = llama(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=97)
MHA = llama(num_layers=2, hidden_size=96, num_heads=3, num_kv_heads=3, head_dim=32,
                  intermediate_size=160, vocab_size=101, rope_theta=500000.0)
TOL = 1e-4


def rel_err(out: "torch.Tensor", ref: "torch.Tensor") -> float:
    return float((out - ref).abs().max() / ref.abs().max())


def runner_for(cfg: LlamaConfig, block_size: int, seed: int = 1, **kw) -> ModelRunner:
    return ModelRunner.create(cfg, num_blocks=64, block_size=block_size, seed=seed, **kw)


def shuffled_table(gen, num_blocks: int = 64, length: int = 20) -> list[int]:
    return torch.randperm(num_blocks, generator=gen)[:length].tolist()


def test_config_from_hf_dict():
    cfg = LlamaConfig.from_hf_dict(TINY_LLAMA)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (2, 256, 4, 4)
    assert (cfg.head_dim, cfg.intermediate_size, cfg.vocab_size) == (64, 512, 32000)
    assert (cfg.rope_theta, cfg.rms_eps, cfg.max_position) == (10000.0, 1e-5, 4096)
    assert cfg.kv_bytes_per_token("fp32") == 2 * 2 * 256 * 4


def test_config_defaults_and_validation():
    d = {k: v for k, v in TINY_LLAMA.items() if k not in ("head_dim", "num_key_value_heads")}
    cfg = LlamaConfig.from_hf_dict({**d, "hidden_size": 128})
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.group_size) == (32, 4, 1)
    with pytest.raises(ValueError, match="multiple"):
        LlamaConfig.from_hf_dict({**TINY_LLAMA, "num_key_value_heads": 3})


def test_rope_depends_only_on_relative_position(gen):
    rope = RotaryEmbedding(16, 10000.0, 8)
    q, k = torch.randn(1, 1, 16, generator=gen), torch.randn(1, 1, 16, generator=gen)

    def score(m: int, n: int) -> float:
        angles = rope(torch.tensor([m, n]), torch.float32)
        both = apply_rope(torch.cat([q, k]), angles)   # grows the table past 8 on demand
        return float((both[0] * both[1]).sum())
    assert score(3, 1) == pytest.approx(score(40, 38), rel=1e-4)
    assert score(3, 1) != pytest.approx(score(3, 2), rel=1e-3)


def test_weights_are_seeded_and_device_independent():
    a, b = build_model(GQA, seed=3), build_model(GQA, seed=3)
    c = build_model(GQA, seed=4)
    wa, wb, wc = (m.layers[1].mlp.down_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    half = build_model(GQA, seed=3, dtype="bf16")
    assert torch.equal(half.lm_head.weight, a.lm_head.weight.bfloat16())


@pytest.mark.parametrize("cfg", [GQA, MHA], ids=["gqa", "mha"])
@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_prefill_chunked_and_decode_agree(gen, cfg, block_size):
    n = 33
    tokens = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
    table = shuffled_table(gen, length=n // block_size + 1)
    whole = runner_for(cfg, block_size).forward([RequestChunk(tokens, 0, table)])

    chunked = runner_for(cfg, block_size)
    cuts = sorted(torch.randperm(n - 2, generator=gen)[:3].add(1).tolist()) + [n]
    start = 0
    for cut in cuts:
        logits = chunked.forward([RequestChunk(tokens[start:cut], start, table)])
        start = cut
    assert rel_err(logits, whole) < TOL

    decoded = runner_for(cfg, block_size)
    decoded.forward([RequestChunk(tokens[:20], 0, table)])
    for pos in range(20, n):
        logits = decoded.forward([RequestChunk(tokens[pos:pos + 1], pos, table)])
    assert rel_err(logits, whole) < TOL


def test_mixed_batch_matches_requests_run_alone(gen):
    """Prefill chunks and decodes packed in one stream give each request's solo logits."""
    lengths = [23, 9, 30, 14]
    prompts = [torch.randint(0, GQA.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    perm = torch.randperm(64, generator=gen).tolist()
    tables = [perm[i * 8:(i + 1) * 8] for i in range(4)]
    done = [17, 8, 0, 13]              # cached already; the batch computes the rest
    batched = runner_for(GQA, 4)
    batched.forward([RequestChunk(p[:d], 0, t) for p, d, t in zip(prompts, done, tables) if d])
    mixed = batched.forward([RequestChunk(p[d:], d, t) for p, d, t in zip(prompts, done, tables)])
    for i, (prompt, table) in enumerate(zip(prompts, tables)):
        alone = runner_for(GQA, 4).forward([RequestChunk(prompt, 0, table)])
        assert rel_err(mixed[i:i + 1], alone) < TOL, i


def test_greedy_and_low_precision(gen):
    tokens = torch.randint(0, GQA.vocab_size, (12,), generator=gen).tolist()
    batch = [RequestChunk(tokens, 0, [3, 1, 2]), RequestChunk([5], 0, [0])]  # prefill + decode
    ref = runner_for(GQA, 8).forward(batch)
    for dtype in ("bf16", "fp16"):
        low = runner_for(GQA, 8, dtype=dtype).forward(batch)
        assert low.dtype == torch.float32
        assert torch.nn.functional.cosine_similarity(low, ref).min().item() > 0.99
    assert runner_for(GQA, 8).greedy(batch) == ref.argmax(-1).tolist()


def test_runner_rejects_mismatched_store():
    from kvsim.real_backend.kv_store import PagedKVStore
    store = PagedKVStore.for_model(MHA, num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="shape"):
        ModelRunner(build_model(GQA), store)


def test_bench_smoke(capsys):
    from kvsim.real_backend.bench import main
    result = main(["--repeats", "1", "--prefill", "8", "--decode-batch", "2", "--context", "9",
                   "--block-size", "4", "--threads", "1"])
    assert set(result) == {"prefill", "decode"} and result["decode"]["min_ms"] > 0
    assert '"prefill"' in capsys.readouterr().out
