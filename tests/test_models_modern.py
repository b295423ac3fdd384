"""MLA, mixture of experts, sliding-window and chunked-local models (issue #19), with every
expected number worked out by hand in the comment next to it."""

import json
from dataclasses import replace

import pytest

from kvsim.cache.attention_groups import LayerGroup, group_layers
from kvsim.cache.multi_group import NULL, MultiGroupKVManager
from kvsim.errors import ConfigError
from kvsim.sim.config import RunConfig
from kvsim.sim.perf.cost_model import CostModel
from kvsim.sim.perf.kv_layout import kv_layout, longest_request
from kvsim.sim.perf.memory import kv_pool
from kvsim.sim.perf.models import list_models, resolve_model, weight_dtype_bytes
from kvsim.sim.perf.moe import expected_experts
from kvsim.sim.serving.runner import resolve_deployment

GIB = 1 << 30
NEW = ["llama-3.1-405b", "llama-3.3-70b", "llama-4-scout", "llama-4-maverick", "qwen3-8b",
       "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b", "mixtral-8x22b",
       "deepseek-v3", "gpt-oss-120b", "gpt-oss-20b", "gemma-3-27b", "gemma-3-12b"]


def test_catalog_lists_the_new_families_and_hf_ids_resolve():
    assert set(list_models()) >= set(NEW)
    assert resolve_model("Qwen/Qwen3-32B").name == "qwen3-32b"
    assert resolve_model("deepseek-ai/DeepSeek-R1").name == "deepseek-v3"
    assert resolve_model("openai/gpt-oss-120b").family == "gpt_oss"


@pytest.mark.parametrize("name, kv_bytes", [
    ("llama-3.1-405b", 2 * 126 * 8 * 128 * 2),      # 516,096: GQA, 8 KV heads
    ("qwen3-32b", 2 * 64 * 8 * 128 * 2),            # 262,144
    ("qwen3-235b-a22b", 2 * 94 * 4 * 128 * 2),      # 192,512
    ("mixtral-8x7b", 2 * 32 * 8 * 128 * 2),         # 131,072
    ("deepseek-v3", 61 * (512 + 64) * 2),           # 70,272: MLA latent + rope key, no V
    ("gpt-oss-120b", 2 * 36 * 8 * 64 * 2),          # 73,728: every layer, as a full token
    ("gemma-3-27b", 2 * 62 * 16 * 128 * 2),         # 507,904
    ("llama-4-scout", 2 * 48 * 8 * 128 * 2)])       # 196,608
def test_kv_bytes_per_token(name, kv_bytes):
    assert resolve_model(name).kv_bytes_per_token("bf16") == kv_bytes


def test_mla_latent_is_not_split_over_tensor_parallel_ranks():
    m = resolve_model("deepseek-v3")
    assert m.kv_bytes_per_token_per_gpu(8) == m.kv_bytes_per_token() == 70_272
    assert resolve_model("qwen3-32b").kv_bytes_per_token_per_gpu(8) == 262_144 // 8


@pytest.mark.parametrize("name, total, active", [
    ("deepseek-v3", 671.03, 37.55), ("mixtral-8x7b", 46.70, 12.88),
    ("qwen3-235b-a22b", 235.09, 22.19), ("qwen3-30b-a3b", 30.53, 3.35),
    ("gpt-oss-120b", 116.79, 5.71), ("llama-4-maverick", 400.71, 17.18),
    ("llama-3.1-405b", 405.85, 405.85), ("qwen3-32b", 32.76, 32.76)])
def test_total_and_activated_parameters_match_the_published_sizes(name, total, active):
    # published: DeepSeek-V3 671B/37B, Mixtral 46.7B/12.9B, Qwen3 235B/22B and 30.5B/3.3B,
    # gpt-oss-120b 116.8B/5.1B (OpenAI leaves the 0.58B input embedding out of "active"),
    # Llama 4 Maverick 400B/17B (text weights only), Llama 3.1 405B
    m = resolve_model(name)
    assert m.num_params / 1e9 == pytest.approx(total, abs=0.01)
    assert m.active_params / 1e9 == pytest.approx(active, abs=0.01)


def test_deepseek_shape_dense_first_layers_and_shared_expert():
    m = resolve_model("deepseek-v3")
    assert (m.num_moe_layers, m.num_experts, m.experts_per_token) == (58, 256, 8)
    assert m.shared_expert_intermediate_size == 2048 and m.intermediate_size == 18432


def test_layer_groups_follow_vllm():
    # gpt-oss-120b: 18 sliding + 18 full -> group size 18, two groups
    size, groups = group_layers(resolve_model("gpt-oss-120b").layer_kinds, 128)
    assert size == 18 and groups == (LayerGroup("sliding", 18, 128), LayerGroup("full", 18))
    # Gemma 3 27B: layers 5, 11, ..., 59 global (10), 52 local -> size 10; the 52 split into
    # 6 groups of layers i, i+6, ...: 9, 9, 9, 9, 8, 8 (8 padding layers)
    size, groups = group_layers(resolve_model("gemma-3-27b").layer_kinds, 1024)
    assert size == 10 and [g.num_layers for g in groups] == [9, 9, 9, 9, 8, 8, 10]
    # Llama 4: every 4th layer is NoPE global attention -> 36 chunked + 12 full, size 12
    size, groups = group_layers(resolve_model("llama-4-scout").layer_kinds, 0, 8192)
    assert size == 12 and [(g.kind, g.num_layers) for g in groups] == [("chunked", 12)] * 3 + [
        ("full", 12)]
    # 12 sliding + 13 full: 13 < 1.5 * 12, so the larger count is the size (gpt-oss-20b+eagle)
    assert group_layers(["sliding"] * 12 + ["full"] * 13, 128)[0] == 13


@pytest.mark.parametrize("name, length, blocks", [
    ("gpt-oss-120b", 100, 7 + 7),            # nothing has left the 128-token window yet
    ("gpt-oss-120b", 1000, 63 + 9),          # sliding: 63 - (999 - 127) // 16 = 63 - 54
    ("gpt-oss-120b", 8192, 512 + 8),         # 512 - (8191 - 127) // 16 = 512 - 504
    ("gpt-oss-120b", 32768, 2048 + 8),
    ("gemma-3-27b", 32768, 2048 + 6 * 64),   # 6 local groups: 2048 - (32767 - 1023) // 16
    ("llama-4-scout", 10000, 625 + 3 * 113),  # chunked: 625 - 8192 // 16 = 113
    ("deepseek-v3", 8192, 512)])
def test_blocks_per_request(name, length, blocks):
    assert kv_layout(resolve_model(name), block_size=16).blocks_per_request(length) == blocks


def test_hybrid_pool_counts_blocks_of_group_size_pages():
    pool = kv_pool("gpt-oss-120b", "h100-80gb", weight_dtype="int4", activation_reserve=GIB)
    # a block holds 16 tokens of 18 layers: 18 * 16 * (2 * 8 * 64 * 2) = 589,824 bytes
    assert pool.bytes_per_block == 589_824
    assert pool.num_gpu_blocks == pool.kv_bytes // 589_824
    assert pool.layout.describe()[0] == {"kind": "sliding", "num_layers": 18,
                                         "sliding_window": 128, "bytes_per_token": 36_864}


def test_longest_request_counts_every_groups_worst_case():
    layout = kv_layout(resolve_model("gpt-oss-20b"), block_size=16)
    # sliding worst case: ceil((127 + 2048) / 16) + 1 = 137 blocks; full: ceil(L / 16)
    assert longest_request(layout, 1137, 2048, 131072) == 1000 * 16
    assert longest_request(layout, 10_000_000, 2048, 131072) == 131072


def test_a_hybrid_pool_caps_max_model_len_at_its_longest_request_and_says_so():
    """1,137 blocks of gpt-oss-20b hold a 16,000-token request (the sliding groups take the
    rest): that caps max_model_len (kv_pool); asking for more names that length, not
    blocks x block size (18,192)."""
    config = RunConfig(model="gpt-oss-20b", num_gpu_blocks=1137,
                       max_num_batched_tokens=2048)
    deployment = resolve_deployment(config)
    assert (deployment.max_model_len, deployment.max_model_len_limit) == (16_000, "kv_pool")
    with pytest.raises(ConfigError, match=r"^field 'max_model_len': max_model_len 20,000 "
                       r"tokens exceeds the KV pool of 1,137 blocks, whose longest request "
                       r"has 16,000 tokens \(its attention groups share the blocks\)"):
        resolve_deployment(replace(config, max_model_len=20_000))
    assert resolve_deployment(replace(config, max_model_len=8_000)).max_model_len_limit == \
        "given"
    assert resolve_deployment(replace(config, max_model_len=16_000)).max_model_len_limit == \
        "kv_pool"       # (given, but raising it would be refused)
    assert resolve_deployment(RunConfig(model="gpt-oss-20b")).max_model_len_limit == "model"
    assert resolve_deployment(RunConfig(model="gpt-oss-20b", max_model_len=131072)
                              ).max_model_len_limit == "model"


def _manager(num_blocks=20):
    return MultiGroupKVManager(num_blocks, 4, (LayerGroup("full", 1), LayerGroup("sliding", 1, 8)))


def test_sliding_window_frees_blocks_that_left_the_window():
    m = _manager()
    assert m.allocate("a", list(range(16)), 16) == list(range(8))       # 4 blocks per group
    assert m.num_free_blocks == 12
    # computed 16: tokens 0..8 are skipped (16 - 8 + 1 = 9): two whole sliding blocks freed;
    # the 17th token opens a fifth block in each group
    m.allocate("a", list(range(17)), 1, num_computed_tokens=16)
    assert m.num_blocks_held("a") == 5 + 3 and m.num_free_blocks == 12
    assert m.tables("a")[1][:2] == [NULL, NULL]
    m.free("a")
    assert m.num_free_blocks == 20


def test_allocation_is_atomic_and_counts_the_blocks_it_frees():
    m = _manager(num_blocks=9)
    m.allocate("a", list(range(16)), 16)                          # 8 of 9 blocks
    assert m.allocate("b", list(range(100, 108)), 8) is None     # needs 4, 1 free
    assert m.num_free_blocks == 1 and not m.has_request("b")
    # "a" grows by one block per group but frees two sliding blocks: net 0, fits
    assert m.num_blocks_needed("a", 1) == 2 - 2 and m.can_allocate("a", 1)
    assert m.allocate("a", list(range(17)), 1, num_computed_tokens=16) is not None
    assert m.num_free_blocks == 1


def test_prefix_hit_needs_only_the_window_in_a_sliding_group():
    m = _manager()
    m.allocate("a", list(range(12)), 12)
    m.free("a")
    hit = m.lookup(list(range(13)))
    # 12 tokens hit; the sliding group only needs blocks 1-2 (skipped(12) = 5 tokens: block 0)
    assert hit.num_tokens == 12
    assert hit.tables[0] == [0, 1, 2] and hit.tables[1][0] == NULL and len(hit.tables[1]) == 3
    m.allocate("b", list(range(13)), 1, hit)
    assert m.tables("b")[0][:3] == [0, 1, 2]


def test_expected_distinct_experts():
    assert expected_experts(8, 2, 1) == 2.0
    assert expected_experts(8, 2, 2) == pytest.approx(8 * (1 - 0.75 ** 2))   # 3.5
    assert expected_experts(256, 8, 10_000) == pytest.approx(256)


def test_moe_cost_reads_only_touched_experts():
    cm = CostModel("mixtral-8x7b", "h100-80gb", tp=2)
    m, c = cm.model, cm._c
    per_expert = 32 * 3 * 4096 * 14336                     # one expert over all 32 layers
    assert (c.moe_experts, c.moe_top_k) == (8, 2)
    pm = cm.gpu.hbm_bandwidth_bytes_per_s * cm.profile.gemm.memory_efficiency
    assert c.moe_expert_s == pytest.approx(per_expert / 2 * 2 / pm)
    assert c.gemm_byte_s == pytest.approx((m.linear_params_total - 8 * per_expert) / 2 * 2 / pm)
    one, many = cm.decode_durations(1, 100, 1)[0], cm.decode_durations(64, 6400, 1)[0]
    assert many > one


def test_hf_config_files_of_each_family_read_like_the_catalog(tmp_path):
    from kvsim.sim.perf._catalog import load_catalog
    for name, entry in load_catalog("hf_models.json")["models"].items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(entry["config"]))
        from_file = resolve_model(path)
        assert replace(from_file, name=name) == resolve_model(name), name


@pytest.mark.parametrize("change, field", [
    ({"layer_types": ["full_attention"] * 3}, "layer_types"),
    ({"layer_types": ["sliding_attention", "banana"] * 18}, "layer_types"),
    ({"sliding_window": None}, "sliding_window"),
    ({"num_local_experts": 0}, "num_local_experts")])
def test_bad_configs_name_file_and_field(tmp_path, change, field):
    from kvsim.sim.perf._catalog import load_catalog
    cfg = {**load_catalog("hf_models.json")["models"]["gpt-oss-120b"]["config"], **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as err:
        resolve_model(path)
    assert str(path) in str(err.value) and field in str(err.value)
    assert "\n" not in str(err.value)


def test_mla_config_needs_its_latent_rank(tmp_path):
    from kvsim.sim.perf._catalog import load_catalog
    cfg = dict(load_catalog("hf_models.json")["models"]["deepseek-v3"]["config"])
    del cfg["kv_lora_rank"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="kv_lora_rank"):
        resolve_model(path)


def test_cli_run_of_a_hybrid_model_reports_groups_and_active_params(tmp_path):
    from clirun import kvsim
    out = tmp_path / "oss"
    done = kvsim("run", "sample:azure-conv", "--limit", "40", "--model", "gpt-oss-20b",
                 "--gpu", "h100-80gb", "--out", out)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    kv = summary["kv"]
    assert kv["bytes_per_token"] == 2 * 24 * 8 * 64 * 2                     # 49,152
    assert kv["bytes_per_block_per_gpu"] == 12 * 16 * 2 * 8 * 64 * 2        # 12-layer blocks
    assert [g["kind"] for g in kv["groups"]] == ["sliding", "full"]
    assert summary["model"]["active_params"] == resolve_model("gpt-oss-20b").active_params
    assert summary["num_completed"] == 40


def test_cli_bad_hybrid_config_and_unsupported_layout_exit_2(tmp_path):
    from clirun import kvsim
    from kvsim.sim.perf._catalog import load_catalog
    cfg = dict(load_catalog("hf_models.json")["models"]["gpt-oss-20b"]["config"])
    cfg["layer_types"] = cfg["layer_types"][:5]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    done = kvsim("run", "sample:azure-conv", "--model", path, "--out", tmp_path / "x")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"kvsim: error: {path}: field 'layer_types': expected a list of 24 layer types "
        "(one per layer)"]
    done = kvsim("run", "sample:azure-conv", "--model", "gpt-oss-20b", "--layout", "contiguous",
                 "--out", tmp_path / "y")
    assert done.returncode == 2
    assert "error: --layout: gpt-oss-20b has sliding-window" in done.stderr
    done = kvsim("run", "sample:azure-conv", "--model", "gpt-oss-20b", "--eviction", "lfu",
                 "--out", tmp_path / "y")
    assert done.returncode == 2 and "error: --eviction: " in done.stderr     # (it named layout)


def test_chunked_local_group_frees_the_blocks_before_the_current_chunk():
    m = MultiGroupKVManager(40, 4, (LayerGroup("chunked", 1, 8), LayerGroup("full", 1)))
    m.allocate("a", list(range(8)), 8)                                   # 2 + 2 blocks
    # computed 8 = one whole chunk: the chunked group drops blocks 0-1 (8 // 8 * 8 tokens)
    m.allocate("a", list(range(9)), 1, num_computed_tokens=8)
    assert m.tables("a")[0][:2] == [NULL, NULL] and m.num_blocks_held("a") == 1 + 3
    # computed 12, still in the second chunk: nothing more to free; 13th token opens block 3
    m.allocate("a", list(range(13)), 1, num_computed_tokens=12)
    assert m.num_blocks_held("a") == 2 + 4


def test_a_simulated_hybrid_run_gives_every_block_back():
    from kvsim.sim.serving.runner import simulate
    from kvsim.workloads import read_trace, sample_path
    from kvsim.workloads.options import TraceOptions
    requests = read_trace(sample_path("mooncake"), TraceOptions(limit=60))
    result = simulate(requests, RunConfig(model="gpt-oss-20b", gpu="h100-80gb",
                                          num_gpu_blocks=3000))
    kv = result.replicas[0].kv
    assert isinstance(kv, MultiGroupKVManager)
    assert kv.num_free_blocks == 3000 and not kv._requests
    too_long = sum(r.prompt_tokens >= result.deployment.max_model_len for r in requests)
    assert too_long == 2 and result.replicas[0].num_finished == 60 - too_long


@pytest.mark.parametrize("rope, context", [
    (None, 32768),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 131072),
    ({"rope_type": "linear", "factor": 2.0}, 65536),
    ({"rope_type": "dynamic", "factor": 2.0}, 65536),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 32768),
    ({"rope_type": "longrope", "factor": 4.0}, 32768),
    ({"rope_type": "yarn", "factor": float("inf")}, None)])
def test_a_config_json_context_counts_its_rope_scaling_as_vllm_does(tmp_path, rope, context):
    config = {"model_type": "qwen2", "hidden_size": 1024, "num_attention_heads": 16,
              "num_key_value_heads": 4, "num_hidden_layers": 4, "intermediate_size": 2816,
              "vocab_size": 32000, "max_position_embeddings": 32768, "rope_scaling": rope}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    if context is None:
        with pytest.raises(ConfigError, match="rope_scaling factor must be a number above 0"):
            resolve_model(str(path))
        return
    assert resolve_model(str(path)).max_model_len == context


@pytest.mark.parametrize("quant, weights", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "int4"),
    ({"quant_method": "gptq", "bits": 8}, "int8"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),
    ({"quant_method": "mxfp4"}, "int4"),
    ({"quant_method": "awq", "w_bit": 8}, "int8"),
    ({"quant_method": "gptq", "bits": 3}, "int4"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "int4"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "int4"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float"}}}}, "fp8")])
def test_a_quantized_checkpoint_is_sized_by_its_weights_as_stored(tmp_path, quant, weights):
    config = {
        "model_type": "llama", "hidden_size": 8192, "num_attention_heads": 64,
        "num_key_value_heads": 8, "num_hidden_layers": 80, "intermediate_size": 28672,
        "vocab_size": 128256, "max_position_embeddings": 8192, "quantization_config": quant}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = resolve_model(str(path))
    assert spec.weight_dtype == weights
    pool = kv_pool(str(path), "a100-80gb", tp=2)    # (the weights as stored, per GPU)
    assert pool.weight_bytes == -(-spec.weight_bytes(weights) // 2)


def test_gpt_oss_keeps_its_attention_and_routers_16_bit():
    # its quantization_config: MXFP4 experts, modules_to_not_convert self_attn and mlp.router
    spec = resolve_model("gpt-oss-120b")
    assert spec.kept_16bit == ("attention", "router")
    attention = 36 * (2880 * (64 * 64 + 2 * 8 * 64) + 64 * 64 * 2880)     # 26,542,080 a layer
    routers = 36 * 2880 * 128
    assert spec.kept_linear_params == attention + routers == 968_785_920
    quantized = spec.linear_params_total - spec.kept_linear_params
    int4 = weight_dtype_bytes("int4")
    assert spec.weight_bytes("int4") == -(-(quantized * int4
                                            + (spec.num_params - quantized) * 2) // 1)
    assert spec.weight_bytes("bf16") == spec.num_params * 2       # (16-bit: nothing to keep)


@pytest.mark.parametrize("names, kept", [
    (["model.layers.*.self_attn", "model.layers.*.mlp.router", "lm_head"],
     ("attention", "router")),
    (["self_attn"], ("attention",)),
    (["gate"], ("router",)),                # a dense model has no router: nothing changes
    (["model.layers.0.self_attn"], ()),     # one layer only: not modelled
    (["visual", "lm_head", "model.embed_tokens"], ())])
def test_modules_to_not_convert_keep_whole_parts_16_bit(tmp_path, names, kept):
    config = {
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "intermediate_size": 14336,
        "vocab_size": 128256, "max_position_embeddings": 8192, "quantization_config": {
            "quant_method": "awq", "bits": 4, "modules_to_not_convert": names}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = resolve_model(str(path))
    assert spec.kept_16bit == kept
    attention = 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096) if "attention" in kept else 0
    assert spec.kept_linear_params == attention
    plain = replace(spec, kept_16bit=())
    assert spec.weight_bytes("int4") - plain.weight_bytes("int4") == pytest.approx(
        attention * (2 - weight_dtype_bytes("int4")), abs=1)


def test_weights_kept_16_bit_are_read_at_16_bits_every_decode_step():
    spec = resolve_model("gpt-oss-120b")
    kept = CostModel(spec, "h100-80gb", weight_dtype="int4")
    plain = CostModel(replace(spec, kept_16bit=()), "h100-80gb", weight_dtype="int4")
    extra = spec.kept_linear_params * (2 - weight_dtype_bytes("int4"))
    hbm = kept.gpu.hbm_bandwidth_bytes_per_s * kept.profile.gemm.memory_efficiency
    assert kept._c.gemm_byte_s - plain._c.gemm_byte_s == pytest.approx(extra / hbm)


def test_an_unknown_quantization_is_refused_not_sized_as_bf16(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 1024,
                                "num_attention_heads": 16, "num_hidden_layers": 2,
                                "intermediate_size": 2816, "vocab_size": 32000,
                                "max_position_embeddings": 4096,
                                "quantization_config": {"quant_method": "hqq"}}))
    with pytest.raises(ConfigError, match=r"field 'quantization_config': quant_method 'hqq' "
                                          r"\(known: awq, .*\) is not one kvsim can size"):
        resolve_model(str(path))
    config = json.loads(path.read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 5}
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="'gptq' with these settings .* is not one kvsim can"):
        resolve_model(str(path))
