"""Round-10 QA: every command on real config.json files of 2025-26 models not tried before (tests/round10_configs.py),
each number by hand from the config's fields and vLLM v1's rules. All of them agreed with kvcalc before and after.

Llama-4-Maverick: 48 layers of 8 KV heads × 128, bf16: 2 · 8 · 128 · 2 = 4,096 B a token a layer, 196,608 B a token;
every 4th layer (3, 7, .., 47: no_rope_layers' default) full, the other 36 chunked by attention_chunk_size 8,192
(a sequence of n tokens keeps the tokens of its last chunk: from (n − 1) // 8,192 · 8,192 on). rope_scaling null:
max_position_embeddings 1,048,576 is the length. vLLM's groups: 12 full + 36 chunked layers, groups of 12 slots.
Qwen3-VL-30B-A3B: the text_config's 48 layers of 4 KV heads × 128: 2,048 B a token a layer, 98,304 B a token;
M-RoPE ("default" type) leaves the 262,144 positions unscaled.
GLM-4.5V: 46 layers of 8 KV heads × 128: 4,096 B a layer, 188,416 B a token; 65,536 positions.
Ministral-3-8B: 34 layers of 8 KV heads × 128: 139,264 B a token; yarn factor 16 × original 16,384 = 262,144.
dots.llm1: a model_type without rules, read as a plain decoder: 62 layers of 32 KV heads × 128 (MHA): 16,384 B a layer,
1,015,808 B a token; 32,768 positions.
Qwen2.5-Omni-7B: the thinker's text_config (thinker_config.text_config: vLLM serves the thinker): 28 layers of 4 KV
heads × 128: 2,048 B a layer, 57,344 B a token. Before this round it was refused ("missing the field
'num_hidden_layers' ... give layers": the thinker was not looked into, and the refusal lost its --layers); its
audio tower (and any audio_config but Gemma-3n's) was never counted in the weights.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from round10_configs import (
    DOTS_LLM1,
    GLM45V,
    LLAMA4_MAVERICK,
    MINISTRAL3_8B,
    PLAMO2_1B,
    QWEN3_VL_30B_A3B,
    QWEN25_OMNI_7B,
    write,
)

GiB = 2**30


def _json(run_cli, *args: str) -> dict:
    result = run_cli(*args, "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()


def test_maverick_size_frag_share_by_chunk(run_cli, tmp_path: Path) -> None:
    config = str(write(tmp_path / "maverick", LLAMA4_MAVERICK))
    doc = _json(run_cli, "size", "--config", config, "--tokens", "20000")
    kinds = {g["kind"]: (g["layers"], g["window"]) for g in doc["model"]["layer_groups"]}
    assert kinds == {"chunked": (36, 8192), "full": (12, None)} and doc["bytes_per_token"] == 48 * 4096 == 196_608
    # n = 20,000: the chunked layers keep 20,000 − 16,384 = 3,616 tokens: (12 · 20,000 + 36 · 3,616) · 4,096 B
    assert doc["bytes_per_seq"] == (12 * 20_000 + 36 * 3616) * 4096 == 1_516_240_896
    assert doc["model"]["max_position_embeddings"] == 1_048_576
    frag = _json(run_cli, "frag", "--config", config, "--lengths", "20000,100")["paged"][0]
    # full: cdiv(20,000, 16) + cdiv(100, 16) = 1,250 + 7; chunked (vLLM frees the blocks before the chunk's start,
    # 16,384 / 16 = 1,024 of them): blocks 1,024 .. 1,249 = 226 for the 20,000, all 7 of the 100, in 3 tables
    assert {g["kind"]: g["blocks"] for g in frag["groups"]} == {"full": 1257, "chunked": 3 * (226 + 7)}
    share = _json(run_cli, "share", "--config", config, "--prefix", "20000", "--branches", "3", "--gen", "100")
    # 3 branches of 20,100 tokens; the prefix is 1,250 whole blocks (shared), each branch 7 blocks of its own:
    # full 1,250 + 3 · 7 = 1,271; chunked (chunk start 16,384): shared blocks 1,024 .. 1,249 (226) + 3 · 7, 3 tables
    groups = {g["kind"]: g["physical_blocks"] for g in share["kv_cache_groups"]["groups"]}
    assert groups == {"full": 1250 + 3 * 7, "chunked": 3 * (226 + 3 * 7)}
    # logical: 3 branches · (1,257 full + 3 · 233 chunked blocks) = 5,868
    assert share["logical_blocks"] == 3 * (1257 + 3 * 233) == 5868


def test_maverick_pool_at_tp8(run_cli, tmp_path: Path) -> None:
    config = str(write(tmp_path / "maverick", LLAMA4_MAVERICK))
    doc = _json(run_cli, "size", "--config", config, "--tp", "8", "--kv-memory", "30GiB")
    plan = doc["gpu_plan"]
    # tp 8: 1 KV head a GPU, a page 16 · 2 · 1 · 128 · 2 = 8,192 B; 1 full + 3 chunked groups of 12 slots: 98,304 B
    assert (plan["page_bytes"], plan["group_size"], plan["block_bytes"]) == (8192, 12, 98_304)
    # 30 GiB // 98,304 = 327,680 ids; a 1,048,576-token request: 65,536 full + 3 · cdiv(8,192 + 8,192, 16) = 68,608
    # (ChunkedLocalAttentionSpec: the chunk plus max_num_batched_tokens 8,192)
    assert (plan["num_blocks"], plan["blocks_per_request"]) == (30 * GiB // 98_304, 68_608) == (327_680, 68_608)
    assert plan["kv_cache_tokens"] == 327_680 * 1_048_576 // 68_608 == 5_008_124
    assert doc["per_gpu_bytes_per_token"] == 196_608 // 8


def test_qwen3_vl_and_glm45v_nested_text_config_pools(run_cli, tmp_path: Path) -> None:
    qwen = str(write(tmp_path / "qwen3vl", QWEN3_VL_30B_A3B))
    doc = _json(run_cli, "size", "--config", qwen, "--tp", "4", "--kv-memory", "12GiB")
    assert (doc["bytes_per_token"], doc["model"]["max_position_embeddings"]) == (98_304, 262_144)
    plan = doc["gpu_plan"]
    # tp 4: 1 of the 4 KV heads a GPU: a page 16 · 2 · 128 · 2 = 8,192 B, 48 layers in one group: 393,216 B;
    # 12 GiB // 393,216 = 32,768 ids; a 262,144-token request 16,384: concurrency 2, 524,288 tokens
    assert (plan["block_bytes"], plan["num_blocks"], plan["blocks_per_request"]) == (393_216, 32_768, 16_384)
    assert plan["kv_cache_tokens"] == 524_288
    glm = str(write(tmp_path / "glm45v", GLM45V))
    doc = _json(run_cli, "size", "--config", glm, "--tp", "8", "--kv-memory", "23GiB")
    assert (doc["bytes_per_token"], doc["model"]["max_position_embeddings"]) == (188_416, 65_536)
    plan = doc["gpu_plan"]
    # tp 8: 1 KV head a GPU, 46 layers · 8,192 B = 376,832 B a block id; 23 GiB // 376,832 = 65,536 ids; a request
    # of 65,536 tokens needs 4,096: concurrency 16, 1,048,576 tokens
    assert (plan["block_bytes"], plan["num_blocks"], plan["blocks_per_request"]) == (376_832, 65_536, 4096)
    assert plan["kv_cache_tokens"] == 1_048_576


def test_ministral3_yarn_length_and_unknown_vision_tower(run_cli, tmp_path: Path) -> None:
    config = str(write(tmp_path / "ministral3", MINISTRAL3_8B))
    doc = _json(run_cli, "size", "--config", config, "--kv-memory", "17GiB")
    assert doc["bytes_per_token"] == 34 * 4096 == 139_264 and doc["model"]["max_position_embeddings"] == 262_144
    plan = doc["gpu_plan"]
    # a page 16 · 4,096 = 65,536 B, 34 layers: 2,228,224 B a block id; 17 GiB // 2,228,224 = 8,192 ids; a request of
    # 262,144 tokens needs 16,384: concurrency 0.5, 131,072 tokens
    assert (plan["block_bytes"], plan["num_blocks"], plan["blocks_per_request"]) == (2_228_224, 8192, 16_384)
    assert plan["kv_cache_tokens"] == 131_072
    # the vision tower's width is not in the file: the weights cannot be counted, said in one line with the fix
    result = run_cli("size", "--config", config, "--gpu", "H200")
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(lines) == 1 and "pixtral" in lines[0] and "--kv-memory" in lines[0]


def test_dots1_plain_decoder_weights_and_pool(run_cli, tmp_path: Path) -> None:
    config = str(write(tmp_path / "dots1", DOTS_LLM1))
    doc = _json(run_cli, "size", "--config", config, "--tp", "4", "--kv-memory", "31GiB")
    assert doc["bytes_per_token"] == 62 * 16_384 == 1_015_808
    plan = doc["gpu_plan"]
    # tp 4: 8 KV heads a GPU, a page 16 · 2 · 8 · 128 · 2 = 65,536 B, 62 layers: 4,063,232 B; 31 GiB // that = 8,192;
    # a 32,768-token request 2,048 ids: concurrency 4, 131,072 tokens
    assert (plan["block_bytes"], plan["num_blocks"], plan["kv_cache_tokens"]) == (4_063_232, 8192, 131_072)
    gpu = _json(run_cli, "size", "--config", config, "--tp", "4", "--gpu", "H200")["gpu_plan"]
    # parameters by hand: embeddings and head 2 · 152,064 · 4,096 = 1,245,708,288; attention 62 · 4 · 4,096² =
    # 4,160,749,568; dense layer 0 3 · 4,096 · 10,944 = 134,479,872; 61 MoE layers of 128 experts · 3 · 4,096 · 1,408
    # + 2 shared (3 · 4,096 · 2,816) + router 4,096 · 128 + bias 128 = 137,232,916,096; norms 527,872: 142,774,381,696,
    # 71,387,190,848 B a GPU at bf16 / tp 4; kvcalc 0.1 % more (routers and norms are whole on every GPU)
    assert gpu["weights_bytes"] == pytest.approx(142_774_381_696 * 2 / 4, rel=2e-3)


def test_qwen25_omni_thinker_and_its_audio_tower(run_cli, tmp_path: Path) -> None:
    config = str(write(tmp_path / "omni", QWEN25_OMNI_7B))
    doc = _json(run_cli, "size", "--config", config, "--tokens", "32768", "--kv-memory", "7GiB")
    assert (doc["bytes_per_token"], doc["model"]["max_position_embeddings"]) == (28 * 2048, 32_768) == (57_344, 32_768)
    assert doc["bytes_per_seq"] == 32_768 * 57_344 == 1_879_048_192
    plan = doc["gpu_plan"]
    # a page 16 · 2 · 4 · 128 · 2 = 32,768 B, 28 layers: 917,504 B a block id; 7 GiB // 917,504 = 8,192 ids; a
    # 32,768-token request needs 2,048: concurrency 4, 131,072 tokens
    assert (plan["block_bytes"], plan["num_blocks"], plan["kv_cache_tokens"]) == (917_504, 8192, 131_072)
    # the thinker's towers sit on the GPU too (weights.audio_tower_params, vision_tower_params), in bf16. Audio,
    # Whisper-style (d 1,280, 32 layers, F 5,120, 128 mel bins, 1,500 positions, output_dim 3,584):
    #   convs 128·1,280·3 + 1,280 + 1,280²·3 + 1,280 = 5,409,280; positions 1,500·1,280 = 1,920,000;
    #   a layer 4·1,280² + 3·1,280 + 2·1,280·5,120 + 5,120 + 1,280 + 4·1,280 = 19,676,160, 32 of them 629,637,120;
    #   final norm 2,560; projector 1,280·3,584 + 3,584 = 4,591,104: 641,560,064
    # Vision (embed_dim 1,280, depth 32, MLP 4·h = 5,120 as the file names none, patch 14, not gated):
    #   a layer 4·h² + 4·h + 2·h·5,120 + 5,120 + h + 4·h = 19,677,440, 32 of them 629,678,080; patches
    #   3·14²·h + h = 753,920; norm 2·h; projector h·3,584 + 3,584² = 17,432,576: 647,867,136
    # It was refused in this round's first fix (the audio tower not counted); without the towers it was 1.29e9
    # parameters, 2.58 GB, short.
    bare = {**QWEN25_OMNI_7B, "thinker_config": {k: v for k, v in QWEN25_OMNI_7B["thinker_config"].items()
                                                 if k not in ("audio_config", "vision_config")}}
    weights = [_json(run_cli, "size", "--config", str(write(tmp_path / name, c)), "--gpu", "H200")["gpu_plan"][
        "weights_bytes"] for name, c in (("omni", QWEN25_OMNI_7B), ("bare", bare))]
    assert weights[0] - weights[1] == (641_560_064 + 647_867_136) * 2
    broken = {**QWEN25_OMNI_7B, "thinker_config": {**QWEN25_OMNI_7B["thinker_config"], "audio_config": {
        "model_type": "qwen2_5_omni_audio_encoder", "encoder_layers": 32}}}
    for command, option in ((("size", "--gpu", "H200"), "--kv-memory"),
                            (("sim", "--gpu", "H200", "--requests", "2"), "--weights-bytes"),
                            (("plan", "--gpu-cost", "H200=3", "--slo", "ttft=5", "--requests", "2", "--tp", "1",
                              "--replicas", "1", "--jobs", "1", "--no-cache"), "--weights-bytes")):
        result = run_cli(command[0], "--config", str(write(tmp_path / "broken", broken)), *command[1:])
        lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.exit_code == 2 and len(lines) == 1 and result.stdout == "", result.stderr
        assert "audio_config (qwen2_5_omni_audio_encoder) has no positive integer d_model" in lines[0]
        assert f"give {option}" in lines[0]


def test_plamo2_hybrid_as_vllm_places_it(run_cli, tmp_path: Path) -> None:
    # vLLM's plamo2.is_mamba (mamba_step 2): layer i is Mamba unless i % 2 == 1, so 8 attention layers (1, 3, .., 15)
    # of 1 KV head × hidden_size_per_head 128: 2 · 128 · 2 = 512 B a token a layer, 4,096 B for the 8 (full
    # attention: vLLM's Plamo2AttentionMixer passes no window). 8 Mamba-2 layers, vLLM's mamba2_state_shape with
    # n_groups 0: conv (4 − 1) · (32 heads · 128 = 4,096) = 12,288 scalars, SSM 32 · 128 · 64 = 262,144, both in the
    # model dtype (no torch_dtype: bf16, said): 548,864 B a layer, 4,390,912 B a sequence. It was refused before
    # this round ("not an architecture kvcalc knows ... mamba_step").
    config = str(write(tmp_path / "plamo2", PLAMO2_1B))
    result = run_cli("size", "--config", config, "--tokens", "4096", "--kv-memory", "10GiB", "--json")
    assert result.exit_code == 0 and "assumed bf16" in result.stderr, result.stderr
    doc = result.json()
    assert (doc["bytes_per_token"], doc["state_bytes_per_seq"]) == (8 * 512, 8 * 548_864) == (4096, 4_390_912)
    plan = doc["gpu_plan"]
    # block raised until an attention page holds a state page: 16 · cdiv(548,864, 16 · 512) = 16 · 67 = 1,072 tokens,
    # a page 1,072 · 512 = 548,864 B (no padding); groups of 8 slots: 1 full + 1 state, 4,390,912 B a block id;
    # 10 GiB // 4,390,912 = 2,445 ids; a request of max_position_embeddings 10,485,760 tokens: cdiv(·, 1,072) =
    # 9,782 full + 1 state page = 9,783; "GPU KV cache size" 2,445 · 10,485,760 // 9,783 = 2,620,636 tokens
    assert (plan["block_size"], plan["page_bytes"], plan["group_size"]) == (1072, 548_864, 8)
    assert (plan["block_bytes"], plan["num_blocks"], plan["blocks_per_request"]) == (4_390_912, 2445, 9783)
    assert plan["kv_cache_tokens"] == 2445 * 10_485_760 // 9783 == 2_620_636
    frag = _json(run_cli, "frag", "--config", config, "--lengths", "100,2000")["paged"][0]
    # block 1,072: full cdiv(100, ·) + cdiv(2,000, ·) = 1 + 2; one state page a request
    assert {g["kind"]: g["blocks"] for g in frag["groups"]} == {"full": 3, "state": 2}
    share = _json(run_cli, "share", "--config", config, "--prefix", "1000", "--branches", "3", "--gen", "50")
    # 1,050 tokens a branch fit one block of 1,072, which the 1,000-token prefix does not fill: nothing whole to
    # share, each branch its own full block and its own state page
    assert {g["kind"]: g["physical_blocks"] for g in share["kv_cache_groups"]["groups"]} == {"full": 3, "state": 3}
    assert share["logical_blocks"] == 6
    # mamba_step 3: attention where i % 3 == 1 (1, 4, 7, 10, 13); mamba_enabled false: 16 attention layers
    for changes, attention in (({"mamba_step": 3}, 5), ({"mamba_enabled": False}, 16)):
        doc = _json(run_cli, "size", "--config", str(write(tmp_path / "v", {**PLAMO2_1B, **changes})), "--tokens", "16")
        assert (doc["bytes_per_token"], doc["state_bytes_per_seq"]) == (attention * 512, (16 - attention) * 548_864)


def test_plamo2_sim_timeline_at_block_1072(run_cli, tmp_path: Path) -> None:
    # One request, P = 1,070, O = 5 (block 1,072): the full table 1 block (1,070 tokens, tail 2), the state group 1
    # page counted whole (1,072 slots): 2,142 useful. Decodes: 1,071 and 1,072 tokens fill the block (tails 1, 0);
    # n = 1,072 opens a second: 1,073 + 1,072 = 2,145, tail 2 · 1,072 − 1,073 = 1,071; then 2,146, 1,070. The free
    # slots: size --gpu's 29,578 ids less the null block and the 2 held, 29,575 · 1,072 = 31,704,400
    config = str(write(tmp_path / "plamo2", PLAMO2_1B))
    timeline = tmp_path / "t.csv"
    doc = _json(run_cli, "sim", "--config", config, "--gpu", "H200", "--requests", "1", "--rate", "inf",
                "--prompt-dist", "uniform:low=1070,high=1070", "--output-dist", "uniform:low=5,high=5",
                "--timeline", str(timeline))
    tables = [g["kind"] for g in doc["kv_cache_groups"]["groups"] for _ in range(g["block_tables"])]
    assert sorted(tables) == ["full", "state"] and doc["memory_plan"]["block_size"] == 1072
    full = tables.index("full")
    rows = list(csv.DictReader(timeline.open()))
    assert [int(r[f"group{full}_blocks"]) for r in rows] == [1, 1, 1, 2, 2]
    assert [int(r[f"group{1 - full}_blocks"]) for r in rows] == [1] * 5
    assert [(int(r["useful_slots"]), int(r["tail_fragmentation_slots"])) for r in rows] == [
        (2142, 2), (2143, 1), (2144, 0), (2145, 1071), (2146, 1070)]
    plan = _json(run_cli, "size", "--config", config, "--gpu", "H200")["gpu_plan"]
    assert plan["num_blocks"] == doc["memory_plan"]["num_blocks"] == 29_578
    assert int(rows[0]["free_slots"]) == (29_578 - 1 - 2) * 1072 == 31_704_400


CASES = {"maverick": (LLAMA4_MAVERICK, "8", ()), "qwen3vl": (QWEN3_VL_30B_A3B, "1", ()), "glm45v": (GLM45V, "4", ()),
         "ministral3": (MINISTRAL3_8B, "1", ("--weights-bytes", "17GiB")), "dots1": (DOTS_LLM1, "4", ()),
         "omni": (QWEN25_OMNI_7B, "1", ("--weights-bytes", "17GiB")), "plamo2": (PLAMO2_1B, "1", ())}


@pytest.mark.parametrize("name", list(CASES))
def test_every_command_runs_and_agrees_on_bytes(run_cli, tmp_path: Path, name: str) -> None:
    config, tp, weights = CASES[name]
    path = str(write(tmp_path / name, config))
    per_token = _json(run_cli, "size", "--config", path, "--tokens", "16")["bytes_per_token"]
    sim = _json(run_cli, "sim", "--config", path, "--gpu", "H200", "--tp", tp, *weights, "--requests", "20",
                "--max-model-len", "32768")
    # each GPU keeps its share of the KV heads (Qwen3-VL's 4 heads: 1 a GPU at tp 4; none here has fewer than tp)
    assert sim["completed"] == 20 and sim["memory_plan"]["kv_bytes_per_token"] * int(tp) == per_token
    plan = _json(run_cli, "plan", "--config", path, "--gpu-cost", "H200=3", "--tp", tp, "--replicas", "1", *weights,
                 "--requests", "20", "--max-model-len", "32768", "--slo", "ttft=5", "--jobs", "1", "--no-cache")
    (point,) = plan["points"]  # the one GPU count asked for: its pool is sim's
    assert point["memory"]["kv_pool_bytes"] == sim["memory_plan"]["kv_pool_bytes"]
    assert point["memory"]["num_blocks"] == sim["memory_plan"]["num_blocks"]
