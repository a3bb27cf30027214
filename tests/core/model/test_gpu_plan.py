"""vLLM's start-up figures: the block and concurrency arithmetic against public log lines, and the KV-cache
groups of hybrids by vLLM's hybrid allocator rules, computed by hand."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.gpus import get_gpu
from kvcalc.core.model.gpu_plan import cache_groups, plan_gpu
from kvcalc.core.model.layers import LayerGroup
from kvcalc.core.model.models import ModelSpec, get_preset

GIB = 2**30


def uniform(bytes_per_token: int) -> ModelSpec:
    """A full-attention model of `bytes_per_token` at bf16: L layers of 1 KV head of d, 2 · L · d · 2 B."""
    layers = bytes_per_token // (2 * 128 * 2)
    assert layers * 2 * 128 * 2 == bytes_per_token
    return ModelSpec(name=f"m{bytes_per_token}", layers=layers, num_attention_heads=1, kv_heads=1, head_dim=128,
                     hidden_size=128, max_position_embeddings=None)


def printed_gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.2f}"


@pytest.mark.parametrize(("bytes_per_token", "printed", "blocks", "max_model_len", "concurrency", "tokens"), [
    # "Available KV cache memory: 34.81 GiB" ... 190,100 blocks of 16, "92.82x" at 32,768 tokens per request
    (12_288, "34.81", 190_100, 32_768, "92.82", None),
    # Phi-4 (204,800 B/token): 45.21 GiB -> 14,815 blocks, "462.97x" at 512
    (204_800, "45.21", 14_815, 512, "462.97", None),
    # Qwen3-1.7B (114,688 B/token): 18.78 GiB -> "GPU KV cache size: 175,856 tokens" (vLLM issue #33263)
    (114_688, "18.78", 175_856 // 16, 40_960, None, 175_856),
])
def test_public_log_lines(bytes_per_token, printed, blocks, max_model_len, concurrency, tokens):
    spec = uniform(bytes_per_token)
    # The memory those blocks take: vLLM prints it rounded to two decimals of a GiB, as the log shows.
    kv_bytes = blocks * 16 * bytes_per_token
    assert printed_gib(kv_bytes) == printed
    plan = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=max_model_len, kv_memory_bytes=kv_bytes)
    assert plan.num_blocks == blocks
    if concurrency is not None:
        # blocks / cdiv(max_model_len, 16): 190,100 / 2,048 = 92.822; 14,815 / 32 = 462.969
        assert f"{float(plan.max_concurrency):.2f}" == concurrency
    if tokens is not None:
        assert plan.kv_cache_tokens == tokens  # int(concurrency · max_model_len) = blocks · 16 here
    # From the printed GiB itself the count is only known to ± 0.005 GiB: 2 decimals hide up to 0.005 GiB,
    # i.e. 0.005 · 2^30 / (16 · bytes per token) blocks (1.6 for Phi-4, 1,707 for the 12,288 B model).
    from_printed = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=max_model_len,
                            kv_memory_bytes=int(float(printed) * GIB)).num_blocks
    assert abs(from_printed - blocks) <= 0.005 * GIB / (16 * bytes_per_token) + 1


def test_memory_from_the_gpu():
    spec = get_preset("Llama-3-8B")
    plan = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=8192, gpu_name="H100-SXM",
                    gpu_memory_bytes=get_gpu("H100-SXM").memory_bytes, gpu_memory_utilization=0.9,
                    max_num_seqs=1024, vllm_version="0.19")
    requested = int(81_091 * 2**20 * 0.9)  # the engine sees 79.19 GiB (81,091 MiB) on an H100 80GB
    # weights: 8,030,261,248 params at bf16; embeddings and untied head 2 · 128,256 · 4,096 (vocab a multiple of
    # 64 already); plus the rotary cache 8,192 positions · 128 · 2 B
    weights = 8_030_261_248 * 2 + 8192 * 128 * 2
    # activation: max(forward 8,192 · 5 · 14,336 · 2 B, sampler 12.4 B + 2 B per request per vocab entry ·
    # 1,024 · 128,256 + 8,192 · 4,096 · 2 B held hidden states + 64 MiB) — the sampler
    sampler = -(-(144 * 1024 * 128_256) // 10) + 8192 * 4096 * 2 + 64 * 2**20
    assert sampler > 8192 * 5 * 14_336 * 2
    assert plan.requested_bytes == requested and plan.weights_bytes == weights
    assert plan.activation_bytes == sampler and plan.non_torch_bytes == 256 * 2**20
    assert plan.kv_cache_bytes == requested - weights - sampler - 256 * 2**20
    assert plan.num_blocks == plan.kv_cache_bytes // (16 * 131_072)  # 32 layers' pages of 16 tokens · 4 KiB
    assert plan.kv_cache_tokens == plan.num_blocks * 16  # 0.19's line: blocks // groups × block size
    assert any("activation" in e for e in plan.estimates) and any("bf16 assumed" in e for e in plan.estimates)
    # --tp 2: half the weights (the rotary cache is on every GPU) and half the KV heads on each GPU; each half
    # table, 64,128 × 4,096 × 2 B = 525,336,576 B = 250.5 × 2 MiB, is 1 MiB short of a 2-MiB multiple, so the
    # caching allocator charges the whole 502-MiB segment (weight_tensors.py): +1 MiB for each of the two tables
    two = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=8192, tp=2,
                   gpu_memory_bytes=get_gpu("H100-SXM").memory_bytes)
    assert two.weights_bytes == 8_030_261_248 + 8192 * 128 * 2 + 2 * 2**20
    assert two.page_bytes == 16 * 2 * 4 * 128 * 2
    # 0.21: the 0.84-GiB CUDA graph estimate is subtracted too
    later = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=8192, gpu_memory_utilization=0.9,
                     gpu_memory_bytes=get_gpu("H100-SXM").memory_bytes, max_num_seqs=1024, vllm_version="0.21")
    assert plan.kv_cache_bytes - later.kv_cache_bytes == 860 * 2**20


def test_pipeline_stages_split_layers_as_vllm():
    from kvcalc.core.model.vllm_memory import pp_layers

    assert pp_layers(32, 4) == (8, 8, 8, 8)
    assert pp_layers(33, 4) == (8, 8, 9, 8)  # the remainder goes to the stages before the last
    assert pp_layers(35, 4) == (9, 9, 9, 8)


def test_sliding_window_bound_and_groups():
    # Gemma-3-27B: 52 sliding (window 1024) + 10 full layers, equal pages (16 · 8,192 B): groups of 10 layers,
    # 6 sliding groups (the last padded) and 1 full one.
    page, group_size, groups = cache_groups(get_preset("Gemma-3-27B"), 16, 16, 131_072, 1, 8192)
    assert (page, group_size) == (16 * 8192, 10)
    assert [(g.kind, g.layers) for g in groups] == [("full", 10)] + [("sliding", 10)] * 5 + [("sliding", 2)]
    full, sliding = groups[0], groups[1]
    assert full.blocks_per_request == 131_072 // 16
    # sliding: cdiv(min(1024 − 1 + 8192, 131,072), 16) + 1 = 576 + 1 (the window may start inside a block)
    assert sliding.blocks_per_request == 577
    plan = plan_gpu(get_preset("Gemma-3-27B"), kv_dtype_bits=16, block_size=16, max_model_len=131_072,
                    kv_memory_bytes=100 * GIB)
    assert plan.num_blocks == 100 * GIB // (page * 10)
    assert plan.max_concurrency == pytest.approx(plan.num_blocks / (8192 + 6 * 577))


def test_mamba_hybrid_grows_the_attention_block():
    # Nemotron-H-56B at tp 8: attention 1 KV head · 256 · 2 B = 512 B per token per layer; a Mamba layer's state
    # on one GPU 2,112,512 B. Attention blocks grow to 16 · cdiv(2,112,512, 16 · 512) = 16 · 258 = 4,128 tokens,
    # the page 4,128 · 512 = 2,113,536 B, the state padded to it. 10 attention + 54 Mamba layers: groups of 10.
    page, group_size, groups = cache_groups(get_preset("Nemotron-H-56B"), 16, 16, 8192, 8, 8192)
    assert (page, group_size) == (2_113_536, 10)
    assert [(g.kind, g.layers, g.block_size) for g in groups] == (
        [("full", 10, 4128)] + [("mamba2", 10, 0)] * 5 + [("mamba2", 4, 0)])
    # one request of 8,192 tokens: cdiv(8192, 4128) = 2 attention blocks + one block in each of 6 Mamba groups
    assert sum(g.blocks_per_request for g in groups) == 8


def test_uniform_type_with_unequal_pages_is_one_table():
    # Nemotron-Super-like: every KV layer full attention, heads 8 and 4: one block table, pages side by side
    spec = ModelSpec.from_groups("m", (LayerGroup("full", 3, kv_heads=8, k_head_dim=128, v_head_dim=128),
                                      LayerGroup("full", 1, kv_heads=4, k_head_dim=128, v_head_dim=128)),
                                 num_attention_heads=32, hidden_size=4096, max_position_embeddings=4096)
    page, group_size, groups = cache_groups(spec, 16, 16, 4096, 1, 8192)
    assert (page, group_size, len(groups)) == (16 * (3 * 4096 + 2048), 1, 1)


def test_bad_inputs_name_the_parameter():
    spec = get_preset("Llama-3-8B")
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=8, gpu_memory_bytes=GIB,
                 gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="leave no KV memory"):
        plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=8, gpu_memory_bytes=8 * GIB)


def _recurrent(name: str):
    """The pure recurrent configs of test_architecture_configs.py, read as size reads them."""
    import json
    import tempfile
    from pathlib import Path

    from kvcalc.core.model.hf_config import load_config

    from .test_architecture_configs import FALCON_MAMBA_7B, MAMBA_CODESTRAL, RWKV4_169M

    config = {"mamba2": MAMBA_CODESTRAL, "falcon_mamba": FALCON_MAMBA_7B, "rwkv": RWKV4_169M}[name]
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(config))
        return load_config(Path(d) / "config.json", name=name)


@pytest.mark.parametrize("version", ["0.19", "0.21"])
def test_attention_free_model_one_state_page_per_layer_per_sequence(version):
    """Mamba-Codestral: vLLM pages its 64 equal Mamba-2 layers as one group, a block of max_model_len tokens (its
    Mamba block size) holding one sequence's state, so a request takes one block."""
    spec = _recurrent("mamba2")
    plan = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=4096, kv_memory_bytes=10 * GIB,
                    vllm_version=version)
    # one layer's state: conv 3 · 10,240 + SSM 128 · 64 · 128 = 1,079,296 bf16 scalars = 2,158,592 B
    assert plan.page_bytes == 2_158_592 and plan.group_size == 64 and plan.block_bytes == 138_149_888
    # 10 GiB // 138,149,888 B = 77 sequences (77 · 131.75 MiB = 9.91 GiB)
    assert plan.num_blocks == 77 and plan.blocks_per_request == 1 and plan.max_concurrency == 77
    # 0.19: 77 blocks // 1 group × block 4,096; later: int(77 × 4,096): the same 315,392 tokens
    assert plan.block_size == 4096 and plan.kv_cache_tokens == 77 * 4096 == 315_392
    assert plan.groups[0].kind == "mamba2" and plan.groups[0].layers == 64
    # --pp 2: each stage pages its own 32 layers' states: 10 GiB // (32 · 2,158,592 B) = 155 sequences
    two = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=4096, kv_memory_bytes=10 * GIB, pp=2,
                   vllm_version=version)
    assert two.num_blocks == 10 * GIB // (32 * 2_158_592) == 155 and two.kv_cache_tokens == 155 * 4096


def test_attention_free_model_under_tensor_parallelism_on_a_gpu():
    """FalconMamba-7B at tp 2: d_inner 8,192 splits, so a layer's state is (4,096 · 3 + 4,096 · 16) · 2 B."""
    spec = _recurrent("falcon_mamba")
    plan = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=8192, tp=2,
                    gpu_memory_bytes=get_gpu("H100-SXM").memory_bytes, gpu_memory_utilization=0.9,
                    max_num_seqs=1024, vllm_version="0.19")
    assert plan.page_bytes == (4096 * 3 + 4096 * 16) * 2 == 155_648 and plan.block_bytes == 64 * 155_648
    assert plan.num_blocks == plan.kv_cache_bytes // 9_961_472
    assert plan.kv_cache_tokens == plan.num_blocks * 8192 and plan.max_concurrency == plan.num_blocks
    # the weights hold no rotary cache (no attention) and nothing rounds (no attention or MLP tensors enumerated):
    # per layer in_proj 4,096 · 16,384 + conv 8,192 · 4 + x_proj 8,192 · (256 + 32) + dt_proj 256 · 8,192 + A
    # 8,192 · 16 + out_proj 8,192 · 4,096 = 105,283,584; × 64 + the two tables 2 · 65,024 · 4,096 = 7,270,825,984
    # parameters, at bf16 (2 B) over tp 2: 7,270,825,984 B per GPU
    assert plan.weights_bytes == 64 * 105_283_584 + 2 * 65_024 * 4096 == 7_270_825_984


@pytest.mark.parametrize(("name", "kwargs", "message"), [
    ("rwkv", {}, "RWKV-4 is not among vLLM's models"),
    ("mamba2", {"mamba_cache_mode": "align"}, "attention-free model's prefix caching is not modelled"),
])
def test_attention_free_refusals(name, kwargs, message):
    from kvcalc.core.errors import ParameterError

    with pytest.raises(ParameterError, match=message):
        plan_gpu(_recurrent(name), kv_dtype_bits=16, block_size=16, max_model_len=1024, kv_memory_bytes=GIB,
                 **kwargs)


def _config(config: dict) -> ModelSpec:
    import json
    import tempfile
    from pathlib import Path

    from kvcalc.core.model.hf_config import load_config

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(config))
        return load_config(Path(d) / "config.json")


@pytest.mark.parametrize(("pp", "slots", "blocks"), [
    # Gemma-2-9B: 42 layers alternating sliding (W 4,096; layer 0) and full, 21 of each, 8 KV heads × 256: one
    # 16-token page of one layer 16 · 2 · 8 · 256 · 2 B = 131,072 B; G = 21, a group per type.
    (1, 0, 10 * GIB // (21 * 131_072)),  # one stage: a block id is a page in each of 21 slots: 3,900
    # pp 2 (21 + 21 layers): stage 0 holds layers 0-20 (11 sliding, 10 full), stage 1 layers 21-41 (10, 11):
    # 11 slots each, a block id 11 · 131,072 B: 10 GiB // 1,441,792 B = 7,447
    (2, 11, 7447),
    # pp 4 (10, 11, 11, 10 layers as vLLM's get_pp_indices splits 42): 5/5, 6/5, 5/6, 5/5 sliding/full: 6 slots
    # on the fullest stage, 10 GiB // (6 · 131,072) = 13,653
    (4, 6, 13_653),
])
def test_pipeline_stages_of_a_sliding_window_hybrid(pp, slots, blocks):
    from .test_hf_config import GEMMA_2_9B

    spec = _config(GEMMA_2_9B)
    plan = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=8192, pp=pp, kv_memory_bytes=10 * GIB,
                    vllm_version="0.19")
    assert plan.page_bytes == 131_072 and plan.group_size == 21 and plan.stage_slots == slots
    assert plan.num_blocks == blocks
    # one request of 8,192 tokens: full 512 blocks, sliding cdiv(min(4,095 + 8,192, 8,192), 16) + 1 = 513
    assert plan.blocks_per_request == 1025
    assert plan.kv_cache_tokens == blocks // 2 * 16  # 0.19: blocks // groups × block size


def test_pipeline_stages_of_a_mamba_hybrid():
    """Jamba-1.5-Mini: 4 attention layers (4, 12, 20, 28) and 28 Mamba layers; G = 4 (28 ≥ 1.5 · 4), the Mamba
    layers in 7 runs of 4 in model order. pp 2 (layers 0-15, 16-31): stage 0 has attention 4 and 12 (2 of run 0)
    and Mamba layers 0-13 of the Mamba order (runs 0-2 whole, 2 of run 3): 4 slots; stage 1 likewise 4. A stage
    then pages as many slots as the whole model: the same blocks per GiB, 1,310,720 B a block id (4 slots of
    80 tokens · 4,096 B, the attention block vLLM aligns to the Mamba state)."""
    from .test_real_configs import JAMBA_15_MINI

    spec = _config(JAMBA_15_MINI)
    for pp in (2, 4):
        plan = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=8192, pp=pp, kv_memory_bytes=10 * GIB)
        assert plan.stage_slots == 4 and plan.page_bytes * 4 == 1_310_720
        assert plan.num_blocks == 10 * GIB // 1_310_720 == 8192


def test_pipeline_stages_of_a_hybrid_from_the_gpu():
    """Predicted memory: every stage's own KV memory over its own slots; the least blocks count."""
    from kvcalc.core.model.gpu_plan import stage_slots
    from kvcalc.core.model.kv_groups import kv_layout

    from .test_hf_config import GEMMA_2_9B

    spec = _config(GEMMA_2_9B)
    plan = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=8192, pp=2,
                    gpu_memory_bytes=get_gpu("H100-SXM").memory_bytes, gpu_memory_utilization=0.9)
    slots = stage_slots(spec, kv_layout(spec, 16, 16), 16, 1, 2)
    assert slots == (11, 11)
    assert plan.num_blocks == min(s.available // (11 * 131_072) for s in plan.stages)


def test_pipeline_stages_of_a_hybrid_preset_are_refused():
    """A preset does not record which layer is which, so a hybrid's stages cannot be planned: one line."""
    from kvcalc.core.errors import ParameterError

    with pytest.raises(ParameterError, match="does not know which layer is which"):
        plan_gpu(get_preset("Gemma-2-9B"), kv_dtype_bits=16, block_size=16, max_model_len=8192, pp=2,
                 kv_memory_bytes=GIB)


@given(pattern=st.lists(st.booleans(), min_size=2, max_size=40), pp=st.integers(1, 6))
@settings(max_examples=200, deadline=None)
def test_stage_slots_bounds(pattern, pp):
    """Any order of sliding (True) and full layers, any pp: a stage never pages more slots than the model's G, and
    at least, for each layer type, its layers on the stage spread over that type's runs (pigeonhole)."""
    from kvcalc.core.model.gpu_plan import stage_slots
    from kvcalc.core.model.kv_groups import kv_layout
    from kvcalc.core.model.vllm_memory import pp_layers

    if all(pattern) or not any(pattern) or pp > len(pattern):
        return
    sliding = LayerGroup("sliding", pattern.count(True), kv_heads=2, k_head_dim=64, v_head_dim=64, window=512,
                         q_heads=4)
    full = LayerGroup("full", pattern.count(False), kv_heads=2, k_head_dim=64, v_head_dim=64, q_heads=4)
    groups = (sliding, full) if pattern[0] else (full, sliding)
    order = tuple(groups.index(sliding if s else full) for s in pattern)
    spec = ModelSpec.from_groups("p", groups, num_attention_heads=4, hidden_size=256, max_position_embeddings=4096,
                                 layer_order=order)
    layout = kv_layout(spec, 16, 16)
    slots = stage_slots(spec, layout, 16, 1, pp)
    tables = {g.kind: g.tables for g in layout.groups}
    start = 0
    for n, got in zip(pp_layers(len(pattern), pp), slots, strict=True):
        part = pattern[start:start + n]
        start += n
        assert got <= layout.group_size
        for kind, count in (("sliding", part.count(True)), ("full", part.count(False))):
            assert got >= -(-count // tables[kind])


@pytest.mark.parametrize(("gpu", "version", "utilization", "max_seqs"), [
    ("H100-SXM", "0.21", 0.92, 1024),  # vLLM 0.21: 0.92; >= 70 GiB and not an A100: 1,024 sequences
    ("H100-SXM", "0.19", 0.9, 1024),
    ("A100-80GB", "0.21", 0.92, 256),  # an A100 keeps 256
    ("L40S", "0.21", 0.92, 256),  # under 70 GiB
])
def test_defaults_are_vllms_for_the_version_and_gpu(gpu, version, utilization, max_seqs):
    """Left out, gpu_memory_utilization and max_num_seqs are vLLM's own for the version and GPU (defined once, in
    vllm_memory): the same plan as with them given."""
    spec, memory = get_preset("Llama-3-8B"), get_gpu(gpu).memory_bytes
    common = dict(kv_dtype_bits=16, block_size=16, max_model_len=8192, gpu_name=gpu, gpu_memory_bytes=memory,
                  vllm_version=version)
    assert plan_gpu(spec, **common) == plan_gpu(spec, **common, gpu_memory_utilization=utilization,
                                                max_num_seqs=max_seqs)
    assert plan_gpu(spec, **common).gpu_memory_utilization == utilization
    assert plan_gpu(spec, **common) != plan_gpu(spec, **common, gpu_memory_utilization=0.5)
    assert plan_gpu(spec, **common) != plan_gpu(spec, **common, max_num_seqs=1280 - max_seqs)  # 256 <-> 1,024
