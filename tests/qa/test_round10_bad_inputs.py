"""Round-10 QA: bad inputs not tried before, on the round-10 real configs (tests/round10_configs.py): a config.json
broken in one field (nested text_config fields included), malformed files, option values out of range or in unknown
units, empty traces and traces with bad rows. Each is refused with exactly one `error:` line on stderr naming the
option, the field or the file, exit 2, no traceback, nothing on stdout.

Six were not, before this round (fixed in core/model):
* a config nested 100,000 lists deep: a RecursionError traceback from json (hf_config._parse now says it in one line);
* Llama-4's no_rope_layers holding 2s: read as chunked layers (any true value), silently (hf_layers: 0 or 1 only);
* Qwen-MoE's mlp_only_layers holding strings or layers past the last: silently ignored by the weight count (hf_ffn);
* an unknown architecture refused for a missing field said "give layers" (a core parameter name; hf_families.refusal
  now keeps the --layers mark of the failure it wraps);
* `--model /path/to/config.json` (a path where an org/name id belongs) was stripped of its slashes and reported as
  'path/to/config.json': not org/name, or looked up in the hub cache as org 'tmp' (hub.cached_config: a path is said
  to be one, and --config named).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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

# folder name -> (base config, {field: value}; a text_config field prefixed "tc."; None deletes it)
BROKEN: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "mav_chunk0": (LLAMA4_MAVERICK, {"tc.attention_chunk_size": 0}),
    "mav_chunk_str": (LLAMA4_MAVERICK, {"tc.attention_chunk_size": "8192"}),
    "mav_nope_short": (LLAMA4_MAVERICK, {"tc.no_rope_layers": [1, 0] * 10}),
    "mav_nope_2": (LLAMA4_MAVERICK, {"tc.no_rope_layers": [2] * 48}),
    "mav_interleave0": (LLAMA4_MAVERICK, {"tc.interleave_moe_layer_step": 0}),
    "mav_experts_neg": (LLAMA4_MAVERICK, {"tc.num_local_experts": -128}),
    "mav_tc_list": (LLAMA4_MAVERICK, {"text_config": [1, 2]}),
    "qwen_layers_str": (QWEN3_VL_30B_A3B, {"tc.num_hidden_layers": "48"}),
    "qwen_layers_float": (QWEN3_VL_30B_A3B, {"tc.num_hidden_layers": 48.5}),
    "qwen_kv_bool": (QWEN3_VL_30B_A3B, {"tc.num_key_value_heads": True}),
    "qwen_kv_64": (QWEN3_VL_30B_A3B, {"tc.num_key_value_heads": 64}),
    "qwen_mlp_only_str": (QWEN3_VL_30B_A3B, {"tc.mlp_only_layers": ["a"]}),
    "qwen_mlp_only_99": (QWEN3_VL_30B_A3B, {"tc.mlp_only_layers": [0, 99]}),
    "qwen_rope_str": (QWEN3_VL_30B_A3B, {"tc.rope_scaling": {"rope_type": "yarn", "factor": "4"}}),
    "qwen_vocab0": (QWEN3_VL_30B_A3B, {"tc.vocab_size": 0}),
    "glm_rope_factor0": (GLM45V, {"tc.rope_parameters": {"rope_type": "linear", "factor": 0}}),
    "glm_dtype": (GLM45V, {"tc.dtype": "bfloat17"}),
    "glm_experts_str": (GLM45V, {"tc.n_routed_experts": "128"}),
    "glm_head_dim_neg": (GLM45V, {"tc.head_dim": -128}),
    "mini_yarn_orig_neg": (MINISTRAL3_8B, {"tc.rope_parameters": {"rope_type": "yarn", "factor": 16.0,
                                                                   "original_max_position_embeddings": -1}}),
    "mini_window_neg": (MINISTRAL3_8B, {"tc.sliding_window": -1}),
    "dots_layers_1e9": (DOTS_LLM1, {"num_hidden_layers": 10**9}),
    "dots_kv_3": (DOTS_LLM1, {"num_key_value_heads": 3}),
    "dots_heads0": (DOTS_LLM1, {"num_attention_heads": 0}),
    "dots_dtype_int": (DOTS_LLM1, {"torch_dtype": 16}),
    "plamo_step1": (PLAMO2_1B, {"mamba_step": 1}),
    "plamo_step_str": (PLAMO2_1B, {"mamba_step": "2"}),
    "plamo_enabled_str": (PLAMO2_1B, {"mamba_enabled": "yes"}),
    "plamo_heads0": (PLAMO2_1B, {"mamba_num_heads": 0}),
    "plamo_head_neg": (PLAMO2_1B, {"hidden_size_per_head": -128}),
}
_MINI_NAN = json.dumps({**MINISTRAL3_8B, "text_config": {**MINISTRAL3_8B["text_config"], "rope_parameters": {
    "rope_type": "yarn", "factor": 1.5, "original_max_position_embeddings": 16384}}})
TEXTS = {"deep": "[" * 100_000 + "]" * 100_000, "dup": '{"model_type": "dots1", "num_hidden_layers": 62, '
         '"num_hidden_layers": 61}', "two_boms": "\ufeff\ufeff{}", "trailing": json.dumps(DOTS_LLM1) + " x",
         "empty_file": "", "null": "null", "nan_factor": _MINI_NAN.replace("1.5", "NaN"),
         "inf_factor": _MINI_NAN.replace("1.5", "Infinity")}
_OMNI = json.loads(json.dumps(QWEN25_OMNI_7B))
del _OMNI["thinker_config"]["text_config"]["num_hidden_layers"]
_OMNI["thinker_config"]["text_config"]["model_type"] = "omni_fork_text"
TEXTS["omni_no_layers"] = json.dumps(_OMNI)
ROW = {"timestamp": 0, "input_length": 512, "output_length": 10, "hash_ids": [1]}
FILES = {"t_empty.jsonl": "", "t_blank.jsonl": "\n\n", "t_neg.jsonl": json.dumps({**ROW, "input_length": -5}),
         "t_str.jsonl": json.dumps({**ROW, "timestamp": "0"}), "t_cut.jsonl": '{"timestamp": 0, "input_length": 512',
         "t_hash.jsonl": json.dumps({**ROW, "hash_ids": ["a"]}),
         "t_few.jsonl": json.dumps({**ROW, "input_length": 5000}), "t_list.jsonl": "[1, 2, 3]",
         "t_ok.jsonl": json.dumps(ROW), "t_nan.jsonl": json.dumps(ROW).replace('"timestamp": 0', '"timestamp": NaN'),
         "az_empty.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n",
         "az_word.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,abc,10\n",
         "az_nohead.csv": "1,2,3\n", "lens_float.txt": "100\n12.5\n", "lens_words.txt": "100 two\n",
         "lens_empty.txt": ""}

# (what the one error line names, the command line; a word of BROKEN / TEXTS / FILES / a base name is its path)
CASES = [
    ("'attention_chunk_size' must be a positive integer, got 0", "size --config mav_chunk0"),
    ("'attention_chunk_size'", "frag --lengths 100 --config mav_chunk_str"),
    ("no_rope_layers lists 20 layers", "size --config mav_nope_short"),
    ("no_rope_layers must list 1 (RoPE: chunked) or 0", "sim --gpu H200 --tp 8 --requests 2 --config mav_nope_2"),
    ("'interleave_moe_layer_step'", "size --gpu H200 --tp 8 --config mav_interleave0"),
    ("'num_local_experts'", "size --gpu H200 --tp 8 --config mav_experts_neg"),
    ("'num_hidden_layers'", "size --config mav_tc_list"),
    ("'num_hidden_layers' must be a positive integer, got '48'", "size --config qwen_layers_str"),
    ("'num_hidden_layers'", "share --prefix 100 --config qwen_layers_float"),
    ("'num_key_value_heads'", "size --config qwen_kv_bool"),
    ("not a multiple of 64 KV heads", "size --config qwen_kv_64"),
    ("'mlp_only_layers' must be a list of integers", "size --gpu H200 --config qwen_mlp_only_str"),
    ("mlp_only_layers names layers [99], outside 0 .. 47", "sim --gpu H200 --requests 2 --config qwen_mlp_only_99"),
    ("rope scaling factor '4'", "size --config qwen_rope_str"),
    ("'vocab_size'", "size --gpu H200 --config qwen_vocab0"),
    ("rope scaling factor 0", "size --config glm_rope_factor0"),
    ("'bfloat17'", "size --config glm_dtype"),
    ("'n_routed_experts'", "size --gpu H200 --tp 4 --config glm_experts_str"),
    ("'head_dim'", "frag --lengths 100 --config glm_head_dim_neg"),
    ("original_max_position_embeddings -1", "size --config mini_yarn_orig_neg"),
    ("'sliding_window'", "size --config mini_window_neg"),
    ("more than the 65,536 layers", "size --config dots_layers_1e9"),
    ("not a multiple of 3 KV heads", "size --config dots_kv_3"),
    ("'num_attention_heads'", "size --config dots_heads0"),
    ("'torch_dtype' is 16", "size --gpu H200 --config dots_dtype_int"),
    ("mamba_step 1 must be at least 2", "size --config plamo_step1"),
    ("'mamba_step' must be a positive integer, got '2'", "frag --lengths 100 --config plamo_step_str"),
    ("'mamba_enabled' must be true or false", "sim --gpu H200 --config plamo_enabled_str"),
    ("'mamba_num_heads'", "size --gpu H200 --config plamo_heads0"),
    ("'hidden_size_per_head'", "share --prefix 100 --config plamo_head_neg"),
    ("nested too deeply", "size --config deep"),
    ("(missing the field 'num_hidden_layers'; add it to the file or give --layers)", "size --config omni_no_layers"),
    ("the key 'num_hidden_layers' is given twice", "sim --gpu H200 --config dup"),
    ("not valid JSON", "size --config two_boms"),
    ("not valid JSON (Extra data", "size --config trailing"),
    ("not valid JSON", "frag --lengths 100 --config empty_file"),
    ("expected a JSON object", "size --config null"),
    ("rope scaling factor nan", "size --config nan_factor"),
    ("rope scaling factor inf", "size --config inf_factor"),
    ("--model 'MAVPATH' is a path, not a Hugging Face model id (org/name): give a local config.json or the folder "
     "that holds it with --config", "frag --lengths 100 --model MAVPATH"),
    ("is a path, not a Hugging Face model id", "size --model ./models/qwen3-vl"),
    ("--model 'a/b/c': a Hugging Face model is org/name", "sim --gpu H200 --model a/b/c"),
    ("--kv-memory", "size --config mav --kv-memory 12XiB"),
    ("--memory", "size --config mav --memory 10GB/s"),
    ("--memory", "size --config mav --memory nan"),
    ("--tokens", "size --config mav --tokens 12k"),
    ("--tp 3 does not divide the 8 KV heads", "size --config mav --gpu H200 --tp 3"),
    ("--pp -1", "size --config qwen --gpu H200 --tp 8 --pp -1"),
    ("--gpu-memory-utilization", "size --config glm --gpu H200 --tp 8 --gpu-memory-utilization nan"),
    ("unknown GPU 'B999'", "size --config dots --gpu B999"),
    ("--lengths item 2", "frag --config mav --lengths 100,abc"),
    ("lens_empty.txt is empty", "frag --config qwen --lengths-file lens_empty.txt"),
    ("lens_float.txt:2", "frag --config qwen --lengths-file lens_float.txt"),
    ("lens_words.txt:1", "frag --config qwen --lengths-file lens_words.txt"),
    ("sigma='nan'", "frag --config glm --dist lognormal:mean=100,sigma=nan"),
    ("zipf needs max", "frag --config glm --dist zipf:a=2"),
    ("holds no requests", "frag --config dots --trace azure az_empty.csv"),
    ("az_word.csv:2", "frag --config dots --trace azure az_word.csv"),
    ("no column TIMESTAMP", "frag --config dots --trace azure az_nohead.csv"),
    ("holds no requests", "frag --config dots --trace mooncake t_blank.jsonl"),
    ("holds no requests", "share --config qwen --trace mooncake t_empty.jsonl --memory 10GiB"),
    ("t_neg.jsonl:1", "share --config qwen --trace mooncake t_neg.jsonl --memory 10GiB"),
    ("t_str.jsonl:1: timestamp '0'", "share --config qwen --trace mooncake t_str.jsonl --memory 10GiB"),
    ("t_cut.jsonl:1: not valid JSON", "share --config qwen --trace mooncake t_cut.jsonl --memory 10GiB"),
    ("hash_ids holds 'a'", "share --config qwen --trace mooncake t_hash.jsonl --memory 10GiB"),
    ("need 10 hash_ids", "share --config qwen --trace mooncake t_few.jsonl --memory 10GiB"),
    ("expected a JSON object per line", "sim --config qwen --gpu H200 --trace mooncake t_list.jsonl"),
    ("timestamp nan is not finite", "sim --config qwen --gpu H200 --trace mooncake t_nan.jsonl"),
    # Maverick, one request of 512 + 10 tokens: 4 tables (1 full + 3 chunked) of cdiv(521, 16) = 33 block ids each;
    # 1 KiB holds no 768 KiB block id at all (it said "-1 free", past the null block); (132 + 1) · 768 KiB = 99.75 MiB
    ("--memory 1.00 KiB holds 0 free blocks of 768.00 KiB, fewer than the 132 the largest request holds at its peak",
     "share --config mav --trace mooncake t_ok.jsonl --memory 1KiB"),
    ("unknown trace kind 'lmsys'", "share --config qwen --trace lmsys t_neg.jsonl --memory 10GiB"),
    ("--requests 0", "sim --config mav --gpu H200 --tp 8 --requests 0"),
    ("--rate 0", "sim --config mav --gpu H200 --tp 8 --rate 0"),
    ("low=0 is out of range", "sim --config qwen --gpu H200 --prompt-dist uniform:low=0,high=0"),
    ("--block 7", "sim --config qwen --gpu H200 --block 7"),
    ("--slo 'tpot=5parsecs'", "sim --config qwen --gpu H200 --slo tpot=5parsecs --requests 2"),
    ("--host-cache '-1GiB'", "sim --config glm --gpu H200 --tp 4 --host-cache -1GiB --trace mooncake t_ok.jsonl"),
    ("--preempt 'suspend'", "sim --config glm --gpu H200 --tp 4 --preempt suspend"),
    ("give --weights-bytes", "sim --config mini --gpu H200"),
    ("--weights-bytes abc", "sim --config mini --gpu H200 --weights-bytes abc"),
    ("--tp '8,x'", "plan --config mav --gpu-cost H200=3 --slo ttft=5 --tp 8,x"),
    ("--gpu-cost 'H200=-3'", "plan --config mav --gpu-cost H200=-3 --slo ttft=5"),
    ("--gpu-cost 'H200'", "plan --config mav --gpu-cost H200 --slo ttft=5"),
    ("--slo is required", "plan --config qwen --gpu-cost H200=3"),
    ("--block '16,0'", "plan --config glm --gpu-cost H200=3 --slo ttft=5 --block 16,0"),
    ("give --weights-bytes", "plan --config mini --gpu-cost H200=3 --slo ttft=5 --tp 1 --replicas 1"),
    ("--weights-bytes -5GiB", "plan --config mini --gpu-cost H200=3 --slo ttft=5 --weights-bytes -5GiB"),
]


def _edited(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    config = json.loads(json.dumps(base))
    for key, value in changes.items():
        target, key = (config["text_config"], key[3:]) if key.startswith("tc.") else (config, key)
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return config


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("round10")
    out = {name: str(write(folder / name, _edited(base, changes))) for name, (base, changes) in BROKEN.items()}
    for name, text in TEXTS.items():
        (folder / name).mkdir()
        (folder / name / "config.json").write_text(text)
        out[name] = str(folder / name)
    for name, config in (("mav", LLAMA4_MAVERICK), ("qwen", QWEN3_VL_30B_A3B), ("glm", GLM45V),
                         ("mini", MINISTRAL3_8B), ("dots", DOTS_LLM1)):
        out[name] = str(write(folder / name, config))
    for name, text in FILES.items():
        (folder / name).write_text(text)
        out[name] = str(folder / name)
    return out | {"MAVPATH": str(Path(out["mav"]) / "config.json")}


def test_forty_new_cases() -> None:
    assert len(CASES) >= 40 and len({c for _, c in CASES}) == len(CASES)


@pytest.mark.parametrize(("names", "command"), CASES, ids=[c for _, c in CASES])
def test_bad_input_is_one_named_error_line(run_cli, files: dict[str, str], names: str, command: str) -> None:
    result = run_cli(*[files.get(word, word) for word in command.split()])
    names = names.replace("MAVPATH", files["MAVPATH"])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2, (result.exit_code, result.stderr[-500:])
    assert len(errors) == 1 and "Traceback" not in result.stderr and result.stdout == "", result.stderr
    assert names in errors[0], errors[0]


def test_valid_no_rope_layers_still_read(run_cli, tmp_path: Path) -> None:
    # the list as transformers writes it (1 = RoPE, chunked; 0 = NoPE, full): every 4th layer full, as the default
    listed = _edited(LLAMA4_MAVERICK, {"tc.no_rope_layers": [int((i + 1) % 4 != 0) for i in range(48)]})
    result = run_cli("size", "--config", str(write(tmp_path / "m", listed)), "--tokens", "16", "--json")
    assert result.exit_code == 0, result.stderr
    kinds = {g["kind"]: g["layers"] for g in result.json()["model"]["layer_groups"]}
    assert kinds == {"chunked": 36, "full": 12}
