"""Catalog lookups and KV pool sizing, with the expected numbers worked out by hand."""

import json

import pytest

from kvsim.errors import ConfigError, KvsimError
from kvsim.sim.perf.gpus import list_gpus, resolve_gpu
from kvsim.sim.perf.memory import estimate_activation_bytes, kv_offloading_blocks, kv_pool
from kvsim.sim.perf.kv_layout import kv_layout
from kvsim.sim.perf.models import list_models, resolve_model

GIB = 1 << 30


def test_catalog_lists_every_required_name():
    assert set(list_gpus()) == {"a100-40gb", "a100-80gb", "h100-80gb", "h200", "l4", "l40s"}
    assert set(list_models()) >= {
        "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3.1-8b", "llama-3-70b",
        "llama-3.1-70b", "qwen2.5-7b", "qwen2.5-72b", "mistral-7b", "opt-13b", "opt-66b"}


def test_hf_ids_and_names_resolve_to_the_same_spec():
    assert resolve_model("meta-llama/Llama-2-7b-hf") == resolve_model("llama-2-7b")
    assert resolve_model("META-LLAMA/LLAMA-2-7B-HF").name == "llama-2-7b"
    assert resolve_model("Qwen/Qwen2.5-72B").name == "qwen2.5-72b"
    # the Instruct release's config.json says 32,768 (the base's 131,072 needs YaRN there)
    instruct = resolve_model("Qwen/Qwen2.5-72B-Instruct")
    assert (instruct.name, instruct.max_model_len) == ("qwen2.5-72b-instruct", 32768)
    assert resolve_model("qwen2.5-7b-instruct").max_model_len == 32768
    assert resolve_model("facebook/opt-13b").name == "opt-13b"
    assert resolve_gpu("H100").name == "h100-80gb"
    assert resolve_gpu("A100-SXM4-80GB").name == "a100-80gb"


@pytest.mark.parametrize("name, billions", [
    ("llama-2-7b", 6.738), ("llama-2-13b", 13.016), ("llama-2-70b", 68.977),
    ("llama-3-8b", 8.030), ("llama-3-70b", 70.554), ("mistral-7b", 7.242),
    ("qwen2.5-7b", 7.616), ("qwen2.5-72b", 72.706), ("opt-13b", 12.853), ("opt-66b", 65.720)])
def test_parameter_counts_match_the_published_sizes(name, billions):
    assert resolve_model(name).num_params / 1e9 == pytest.approx(billions, abs=0.001)


def test_mistral_7b_v0_1_keeps_its_published_4096_token_sliding_window():
    """Its config.json has sliding_window 4096 on every layer (as its own config read from a
    file said; the catalog had every layer full)."""
    layout = kv_layout(resolve_model("mistral-7b"))
    assert [g.as_dict() for g in layout.groups] == [
        {"kind": "sliding", "num_layers": 32, "sliding_window": 4096}]


def test_a100_40gb_memory_is_what_nvidia_smi_reports():
    assert resolve_gpu("a100-40gb").memory_bytes == 40536 * 2 ** 20


def test_llama_2_7b_derived_quantities():
    m = resolve_model("llama-2-7b")
    assert m.num_params == 6_738_415_616                    # the HF checkpoint's count
    assert m.weight_bytes("bf16") == 13_476_831_232
    assert m.kv_bytes_per_token("bf16") == 2 * 32 * 32 * 128 * 2 == 524_288
    # 4 GEMMs per layer: 4 * 4096^2 (attention) + 3 * 4096 * 11008 (SwiGLU) = 202,375,168
    assert m.linear_flops_per_token == 2 * 32 * 202_375_168
    assert resolve_model("llama-3-70b").kv_bytes_per_token_per_gpu(tp=4) == 2 * 80 * 2 * 128 * 2


def test_unknown_names_suggest_close_matches():
    with pytest.raises(ConfigError, match=r"did you mean 'llama-3-8b'"):
        resolve_model("llama3-8")
    with pytest.raises(KvsimError, match=r"unknown GPU 'a100-80'.*did you mean.*'a100-80gb'"):
        resolve_gpu("a100-80")


def test_hf_config_json_path_resolves(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 16,
           "num_key_value_heads": 4, "num_hidden_layers": 12, "intermediate_size": 5632,
           "vocab_size": 32000, "max_position_embeddings": 2048}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = resolve_model(str(path))
    assert (m.num_layers, m.head_dim, m.num_kv_heads, m.gated_mlp) == (12, 128, 4, True)
    assert m.kv_bytes_per_token() == 2 * 12 * 4 * 128 * 2
    assert resolve_model(tmp_path).num_layers == 12              # the folder works too


def test_opt_config_json_matches_the_catalog(tmp_path):
    cfg = {"model_type": "opt", "hidden_size": 5120, "num_attention_heads": 40,
           "num_hidden_layers": 40, "ffn_dim": 20480, "vocab_size": 50272,
           "max_position_embeddings": 2048, "_name_or_path": "facebook/opt-13b"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert resolve_model(tmp_path / "config.json").num_params == resolve_model("opt-13b").num_params


def test_config_json_missing_a_field_names_it(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mistral", "hidden_size": 4096}))
    with pytest.raises(ConfigError, match="num_attention_heads") as err:
        resolve_model(path)
    assert err.value.location == str(path)
    path.write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ConfigError, match="'gpt2' is not supported"):
        resolve_model(path)
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    with pytest.raises(ConfigError, match=r": LlamaForCausalLM \(no model_type\) is not "):
        resolve_model(path)         # (not "model_type 'None'")


def test_config_json_with_absurdly_many_layers_is_refused_at_once(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
           "num_attention_heads": 32, "num_hidden_layers": 10**12, "num_key_value_heads": 8,
           "vocab_size": 128256, "max_position_embeddings": 131072}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="from 1 to 10,000, got 1,000,000,000,000") as err:
        resolve_model(path)       # (a table per layer: a MemoryError before)
    assert (err.value.location, err.value.field) == (str(path), "num_hidden_layers")


def test_kv_pool_llama_2_7b_on_a100_80gb():
    # 0.9 * 80 GiB = 77,309,411,328 usable; weights 13,476,831,232; activations 2 GiB
    # -> 61,685,096,448 for KV; a block is 16 * 524,288 = 8,388,608 bytes -> 7353.4 -> 7353 blocks.
    pool = kv_pool("llama-2-7b", "a100-80gb", tp=1, block_size=16, activation_reserve=2 * GIB)
    assert pool.usable_bytes == 77_309_411_328
    assert pool.kv_bytes == 61_685_096_448
    assert pool.num_gpu_blocks == 7353
    assert "7,353 blocks" in pool.explanation and "a100-80gb" in pool.explanation


def test_kv_pool_opt_13b_on_a100_40gb_is_the_vllm_paper_setup():
    # vLLM paper (Kwon et al. 2023, Fig. 1): OPT-13B on A100-40GB keeps ~26 GB of weights and
    # ~12 GB of KV at 800 KB/token -> ~15.7K token slots (12 GiB / 800 KiB = 15,728).
    # Here: 0.9 * 40,536 MiB (what nvidia-smi reports) = 38,254,569,062; weights
    # 12,853,473,280 * 2 = 25,706,946,560; activations for 2048 batched tokens:
    # 2048 * (2*20480 + 4*5120) * 2 = 251,658,240 plus fp32 logits 256 * 50272 * 4 = 51,478,528
    # -> 303,136,768. KV: 12,244,485,734 bytes (11.40 GiB); block = 16 * 819,200 = 13,107,200
    # -> 934 blocks = 14,944 slots (-5.0% against the paper's round 12 GB).
    pool = kv_pool("opt-13b", "a100-40gb", block_size=16, max_num_batched_tokens=2048,
                   max_num_seqs=256)
    assert pool.activation_reserve_bytes == 303_136_768
    assert pool.kv_bytes == 12_244_485_734
    assert pool.num_gpu_blocks == 934
    assert pool.num_token_slots == pytest.approx(15_728, rel=0.06)


def test_kv_pool_splits_weights_and_kv_heads_over_tp():
    # llama-2-70b tp4: weights 137,953,296,384 / 4 = 34,488,324,096 per GPU; 8 KV heads / 4 = 2
    # per GPU -> 2*80*2*128*2 = 81,920 B/token, block 1,310,720. (77,309,411,328 - 34,488,324,096
    # - 1 GiB) / 1,310,720 = 31,850.6 -> 31,850.
    pool = kv_pool("llama-2-70b", "a100-80gb", tp=4, activation_reserve=GIB)
    assert pool.weight_bytes == 34_488_324_096
    assert pool.num_gpu_blocks == 31_850


def test_int4_weights_fit_a_70b_model_on_one_card():
    # llama-2-70b: 68,451,041,280 GEMM weights x 4.25 bits (4-bit + fp16 scale and zero per
    # 128) = 36,364,615,680 bytes, plus 525,606,912 embedding, LM-head and norm weights kept
    # 16-bit (as vLLM's quantization keeps them) = 1,051,213,824: 37,415,829,504 bytes;
    # (77,309,411,328 - 37,415,829,504 - 1 GiB) / (16 x 327,680) = 7,404.4 -> 7,404 blocks.
    pool = kv_pool("llama-2-70b", "a100-80gb", tp=1, activation_reserve=GIB,
                   weight_dtype="int4")
    assert pool.weight_bytes == 37_415_829_504
    assert pool.num_gpu_blocks == 7_404
    with pytest.raises(ConfigError, match="unknown weight dtype 'int3'"):
        kv_pool("llama-2-70b", "a100-80gb", weight_dtype="int3")


def test_smaller_weights_make_memory_bound_decode_faster():
    from kvsim.sim.perf.cost_model import CostModel
    bf16 = CostModel("llama-2-70b", "h100-80gb", tp=4)
    int4 = CostModel("llama-2-70b", "h100-80gb", tp=4, weight_dtype="int4")
    one, big = (bf16.decode_durations(1, 1000, 1)[0], int4.decode_durations(1, 1000, 1)[0])
    # batch-1 decode is bound by reading the weights (3.8x fewer bytes); launch, attention and
    # all-reduce costs stay, and the fitted GEMMs' per-kernel latency: 18.0 ms against 24.1 ms
    assert big < 0.8 * one and one - big > 0.005
    assert int4.block_bytes == bf16.block_bytes     # KV stays bf16


def test_model_too_big_explains_with_numbers():
    with pytest.raises(ConfigError) as err:
        kv_pool("llama-2-70b", "a100-80gb", tp=1, activation_reserve=GIB)
    text = str(err.value)
    assert "llama-2-70b does not fit on a100-80gb with tp=1" in text
    assert "72.00 GiB usable" in text and "weights need 128.48 GiB" in text
    assert text.endswith("raise --tp or use a larger GPU (they need more than the whole GPU), "
                         "or store the weights quantized (--weight-dtype int4, int8 or fp8)")
    with pytest.raises(ConfigError) as err:     # (it would fit the whole GPU: utilization helps)
        kv_pool("llama-3-8b", "l4", tp=1, gpu_memory_utilization=0.5)
    assert str(err.value).endswith("raise --tp, use a larger GPU or raise "
                                   "--gpu-memory-utilization, or store the weights quantized "
                                   "(--weight-dtype int4, int8 or fp8)")
    with pytest.raises(ConfigError) as err:     # (4-bit already: no narrower weights to offer)
        kv_pool("llama-2-70b", "l4", tp=1, weight_dtype="int4")
    assert str(err.value).endswith("(they need more than the whole GPU)")


def test_activation_estimate_and_kv_offloading_blocks():
    m = resolve_model("llama-2-7b")
    # 8192 * (3*11008 + 4*4096) * 2 + 256 * 32000 * 4
    assert estimate_activation_bytes(m) == 8192 * (33024 + 16384) * 2 + 32_768_000
    # a 16-token block of llama-2-7b: 16 x 2 x 32 layers x 4096 x 2 bytes = 8 MiB
    assert kv_offloading_blocks("llama-2-7b", 4) == 4 * GIB // 8_388_608 == 512
    # vLLM's size is the whole replica's: at TP 2 a block is half as big on each of 2 ranks
    assert kv_offloading_blocks("llama-2-7b", 4, tp=2) == 512
    # an MLA block (DeepSeek-V3: 61 layers x 576 x 2 bytes a token, 1,124,352 bytes, rounded
    # up to 4 KiB pages: 1,126,400) is one copy for the replica: each rank holds it whole
    assert kv_offloading_blocks("deepseek-v3", 100) == 100 * GIB // 1_126_400 == 95_325
    assert kv_offloading_blocks("deepseek-v3", 100, tp=8) == 95_325
    with pytest.raises(ConfigError):
        kv_offloading_blocks("llama-2-7b", -1)


def test_a_step_too_large_for_the_gpu_names_the_token_budget_not_the_model():
    with pytest.raises(ConfigError, match="lower --max-num-batched-tokens") as err:
        kv_pool("llama-3.1-8b", "a100-80gb", tp=1, block_size=16,
                max_num_batched_tokens=2**31 - 1)
    assert err.value.field == "max_num_batched_tokens"
    with pytest.raises(ConfigError, match="raise --tp") as err:
        kv_pool("llama-3-70b", "a100-80gb", tp=1, block_size=16)
    assert err.value.field == "model"


def test_a_config_file_without_a_name_is_named_by_its_folder_or_itself(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
           "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
           "vocab_size": 128256, "max_position_embeddings": 131072}
    (tmp_path / "Llama-X").mkdir()
    downloaded, loose = tmp_path / "Llama-X" / "config.json", tmp_path / "mine.json"
    for path in (downloaded, loose):
        path.write_text(json.dumps(cfg))
    assert resolve_model(downloaded).name == "Llama-X"
    assert resolve_model(loose).name == str(loose)        # (it was 'custom')


def test_a_hugging_face_snapshot_is_named_by_its_folder_not_by_the_blob_it_links(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
           "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
           "vocab_size": 128256, "max_position_embeddings": 131072}
    blob, snapshot = tmp_path / "blobs" / "f00", tmp_path / "snapshots" / "abc123"
    blob.parent.mkdir()
    snapshot.mkdir(parents=True)
    blob.write_text(json.dumps(cfg))
    (snapshot / "config.json").symlink_to(blob)
    assert resolve_model(snapshot / "config.json").name == "abc123"


def test_a_block_too_big_for_the_kv_room_is_blamed_on_the_block_size_not_the_model():
    from kvsim.errors import ConfigError
    with pytest.raises(ConfigError) as refused:
        kv_pool("llama-3.1-8b", "a100-80gb", block_size=1 << 20)
    assert refused.value.field == "block_size"
    assert refused.value.message.startswith("one block of 1,048,576 tokens needs "
                                            "137,438,953,472 bytes per GPU, more than the ")
    assert refused.value.message.endswith("(16-token blocks fit); lower --block-size")
    assert kv_pool("llama-3.1-8b", "a100-80gb", block_size=1 << 14).num_gpu_blocks > 0
