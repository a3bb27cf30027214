"""`kvcalc share` through the CLI: the JSON contract, closed forms, and every bad input as one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCENARIO_KEYS = {"logical_blocks", "physical_blocks", "cow_copies", "saved_blocks", "saved_fraction", "peak_blocks"}
TRACE_KEYS = {"requests", "prompt_tokens", "hit_tokens", "token_hit_rate", "hit_blocks", "peak_used_blocks",
              "evictions"}


def write_mooncake(path: Path, records: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


@pytest.fixture
def mooncake(tmp_path: Path) -> Path:
    return write_mooncake(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
        {"timestamp": 5, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
        {"timestamp": 9, "input_length": 600, "output_length": 10, "hash_ids": [0, 3]},
    ])


def test_default_scenario(run_cli) -> None:
    result = run_cli("share", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert set(doc) >= SCENARIO_KEYS
    # P = 1000, K = 4, G = 200, B = 16: 62 + 4 · ceil((8 + 200)/16) = 62 + 52 = 114; logical 4 · 75 = 300
    assert (doc["physical_blocks"], doc["logical_blocks"], doc["cow_copies"]) == (114, 300, 3)
    assert doc["saved_blocks"] == 186 and doc["saved_fraction"] == pytest.approx(0.62)
    table = run_cli("share")
    assert table.exit_code == 0 and "closed form" in table.stdout and "114" in table.stdout


def test_scenario_with_a_model_gives_bytes(run_cli) -> None:
    doc = run_cli("share", "--prefix", "64", "--branches", "2", "--gen", "16", "--block", "16",
                  "--model", "llama-3-8b", "--dtype", "fp16", "--json").json()
    # Llama-3-8B fp16: 2 · 32 layers · 8 heads · 128 · 2 B = 131072 B per token; a 16-token block 2 MiB
    assert doc["block_bytes"] == 16 * 131072
    # 4 shared + 2 · 1 own = 6 physical blocks, 2 · 5 = 10 logical
    assert (doc["physical_blocks"], doc["logical_blocks"]) == (6, 10)
    assert doc["saved_bytes"] == 4 * 16 * 131072


def test_beam_mode_is_seeded(run_cli) -> None:
    a = run_cli("share", "--mode", "beam", "--branches", "4", "--gen", "40", "--seed", "3", "--json").json()
    b = run_cli("share", "--mode", "beam", "--branches", "4", "--gen", "40", "--seed", "3", "--json").json()
    assert a == b and a["mode"] == "beam" and set(a) >= SCENARIO_KEYS
    assert a["logical_blocks"] == 4 * -(-1040 // 16)


def test_trace_mode_contract(run_cli, mooncake: Path) -> None:
    result = run_cli("share", "--trace", "mooncake", str(mooncake), "--block", "16", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert set(doc) >= TRACE_KEYS and set(doc["without_prefix_caching"]) >= TRACE_KEYS
    # hand-computed in tests/test_share.py: 992 + 512 hit tokens of 2700, 62 + 32 blocks
    assert (doc["hit_tokens"], doc["hit_blocks"], doc["prompt_tokens"]) == (1504, 94, 2700)
    assert doc["token_hit_rate"] == pytest.approx(1504 / 2700)
    assert doc["without_prefix_caching"]["hit_tokens"] == 0 and doc["capacity_blocks"] is None
    table = run_cli("share", "--trace", "mooncake", str(mooncake))
    assert table.exit_code == 0 and "55.70 %" in table.stdout


def test_trace_capacity_and_memory(run_cli, mooncake: Path) -> None:
    doc = run_cli("share", "--trace", "mooncake", str(mooncake), "--capacity-blocks", "70", "--json").json()
    assert doc["capacity_blocks"] == 70 and doc["evictions"] > 0
    # 142 MiB / 2 MiB per Llama-3-8B fp16 block of 16 tokens = 71 blocks, less vLLM's null block: 70 free
    mem = run_cli("share", "--trace", "mooncake", str(mooncake), "--memory", "142MiB", "--model", "llama-3-8b",
                  "--json").json()
    assert mem["capacity_blocks"] == 70 and mem["null_blocks"] == 1 and mem["evictions"] == doc["evictions"]


def test_azure_trace_says_there_is_no_sharing_information(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100,5\n")
    result = run_cli("share", "--trace", "azure", str(path))
    assert result.exit_code == 0 and "no sharing information" in result.stdout
    assert run_cli("share", "--trace", "azure", str(path), "--json").json()["has_prefix_ids"] is False


def one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("--branches", "0"), ("--branches", "at least 1")),
        (("--prefix", "-5"), ("--prefix",)),
        (("--gen", "-1"), ("--gen",)),
        (("--block", "0"), ("--block",)),
        (("--mode", "greedy"), ("greedy",)),
        (("--dtype", "fp8"), ("--dtype", "model")),
        (("--capacity-blocks", "5"), ("--capacity-blocks", "--trace")),
        (("--model", "nope-7b"), ("nope-7b",)),
        (("--branches", "100000", "--gen", "100000"), ("scenario too large",)),
    ],
)
def test_bad_scenario_input(run_cli, args: tuple[str, ...], fragments: tuple[str, ...]) -> None:
    one_line_error(run_cli("share", *args), *fragments)


def test_bad_trace_input(run_cli, tmp_path: Path, mooncake: Path) -> None:
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n{oops\n')
    one_line_error(run_cli("share", "--trace", "mooncake", str(bad_json)), ":2", "JSON")
    missing = write_mooncake(tmp_path / "missing.jsonl", [{"timestamp": 0, "output_length": 1, "hash_ids": [0]}])
    one_line_error(run_cli("share", "--trace", "mooncake", str(missing)), "input_length")
    negative = write_mooncake(tmp_path / "neg.jsonl", [{"timestamp": 0, "input_length": -4, "output_length": 1,
                                                        "hash_ids": [0]}])
    one_line_error(run_cli("share", "--trace", "mooncake", str(negative)), "negative")
    too_few = write_mooncake(tmp_path / "few.jsonl", [{"timestamp": 0, "input_length": 1000, "output_length": 1,
                                                       "hash_ids": [0]}])
    one_line_error(run_cli("share", "--trace", "mooncake", str(too_few)), "hash_ids")
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--block", "24"), "24", "divide 512")
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--capacity-blocks", "10"),
                   "smaller than request 2", "70")
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--memory", "1GiB"), "--model")
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--memory", "1GiB",
                           "--capacity-blocks", "100", "--model", "llama-3-8b"), "not both")
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--branches", "2"), "--branches")
    one_line_error(run_cli("share", "--trace", "mooncake", str(tmp_path / "absent.jsonl")), "no such file")
    one_line_error(run_cli("share", "--trace", "parquet", str(mooncake)), "parquet")


def test_sliding_window_model_pages_only_the_window(run_cli):
    # Mistral-7B-v0.1: every layer keeps only the last 4,096 tokens: one sliding group (vllm layout), a block of
    # 32 layers · 8 KV heads · 128 · 2 (K, V) · 2 B · 16 tokens = 2,097,152 B, exact (no upper bound any more).
    # 8,000 shared + 100 generated: the last token was written at 8,099, so each branch keeps blocks from
    # floor((8,099 − 4,095) / 16) = 250 to ceil(8,100 / 16) − 1 = 506: the prompt's blocks 250..499 (8,000 = 500
    # full blocks) shared, ceil(100 / 16) = 7 own -> 250 + 2 · 7 = 264 physical blocks
    doc = run_cli("share", "--prefix", "8000", "--branches", "2", "--gen", "100", "--model", "mistral-7b-v0.1",
                  "--json").json()
    assert doc["block_bytes"] == 2_097_152 and doc["bytes_upper_bound"] is False
    assert doc["physical_blocks"] == 264 and doc["physical_bytes"] == 264 * 2_097_152
    assert [(g["kind"], g["window"], g["physical_blocks"]) for g in doc["kv_cache_groups"]["groups"]] == [
        ("sliding", 4096, 264)]
    result = run_cli("share", "--prefix", "8000", "--branches", "2", "--gen", "100", "--model", "mistral-7b-v0.1")
    assert "upper bound" not in result.stdout and "vllm layout" in result.stdout
    doc = run_cli("share", "--model", "llama-3-8b", "--json").json()
    assert doc["bytes_upper_bound"] is False and "kv_cache_groups" not in doc
    assert "upper bound" not in run_cli("share", "--model", "llama-3-8b").stdout
    one_line_error(run_cli("share", "--model", "llama-3-8b", "--mamba-cache-mode", "align"), "recurrent")
    one_line_error(run_cli("share", "--layout", "ideal"), "model")


def test_one_branch_and_one_dropped_beam_are_singular(run_cli) -> None:
    # QA2 #9: "1 branches" -> "1 branch"; more than one stays plural
    one = run_cli("share", "--branches", "1")
    assert one.exit_code == 0, one.stderr
    assert "parallel: 1 branch × (1,000 shared + 200 generated tokens)" in one.stdout
    two = run_cli("share", "--branches", "2")
    assert "parallel: 2 branches ×" in two.stdout


@pytest.mark.parametrize("flag", ["--prefix", "--branches", "--gen", "--seed", "--block", "--limit",
                                  "--capacity-blocks", "--layers"])
def test_every_integer_option_says_not_an_integer_the_same_way(run_cli, flag) -> None:
    # QA2 #5: the wording of size/frag, not pydantic's "Input should be a valid integer"
    result = run_cli("share", flag, "abc")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {flag} 'abc' is not an integer: write a whole number")
    assert result.stderr.count("\n") == 1


def test_integer_spellings_are_read_exactly(run_cli, mooncake) -> None:
    # 1e3 = 1000, 4.0 = 4, 2_00 = 200, 1.6e1 = 16: the same document as the plain spellings
    plain = run_cli("share", "--prefix", "1000", "--branches", "4", "--gen", "200", "--block", "16", "--json")
    spelled = run_cli("share", "--prefix", "1e3", "--branches", "4.0", "--gen", "2_00", "--block", "1.6e1", "--json")
    assert spelled.exit_code == 0, spelled.stderr
    assert spelled.json() == plain.json()
    trace = ("--trace", "mooncake", str(mooncake))
    plain = run_cli("share", *trace, "--limit", "2", "--capacity-blocks", "100", "--json")
    spelled = run_cli("share", *trace, "--limit", "2e0", "--capacity-blocks", "1e2", "--json")
    assert spelled.exit_code == 0, spelled.stderr
    assert spelled.json() == plain.json() and plain.json()["requests"] == 2


@pytest.mark.parametrize("args", [("--seed", "5"), ("--seed", "0"), ("--seed", "5", "--mode", "parallel")])
def test_seed_in_parallel_mode_is_refused(run_cli, args) -> None:
    # QA2 #4: parallel branches draw nothing at random; a seed there changed nothing without a word
    result = run_cli("share", *args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: --seed applies to --mode beam") and result.stderr.count("\n") == 1


def test_seed_in_beam_mode_still_works(run_cli) -> None:
    a = run_cli("share", "--mode", "beam", "--seed", "5", "--json")
    assert a.exit_code == 0, a.stderr
    assert a.json()["seed"] == 5
    assert run_cli("share", "--mode", "beam", "--json").json()["seed"] == 0  # the default seed


def test_trace_replays_in_arrival_order(run_cli, tmp_path: Path) -> None:
    # file order t = 5000 ms (2,048 tokens, ids 7..10) then t = 0 (1,024 tokens, ids 7, 8): in arrival order
    # the short prompt caches 64 full blocks and the long one hits them all, 64 · 16 = 1,024 tokens (in file
    # order the short one would hit 63 blocks of the long one's, never its last token: 1,008)
    path = write_mooncake(tmp_path / "late_first.jsonl", [
        {"timestamp": 5000, "input_length": 2048, "output_length": 1, "hash_ids": [7, 8, 9, 10]},
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [7, 8]},
    ])
    doc = run_cli("share", "--trace", "mooncake", str(path), "--json").json()
    assert (doc["hit_tokens"], doc["hit_blocks"]) == (1024, 64)


def test_a_hash_id_past_int64_is_one_line_naming_file_line_and_value(run_cli, tmp_path: Path) -> None:
    path = write_mooncake(tmp_path / "huge_id.jsonl", [
        {"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1, 2**70]},
    ])
    one_line_error(run_cli("share", "--trace", "mooncake", str(path)), f"{path}:2", str(2**70))


def test_a_negative_beam_seed_names_the_option_and_the_fix(run_cli) -> None:
    one_line_error(run_cli("share", "--mode", "beam", "--seed", "-1"), "--seed -1", "--seed 0")


def test_memory_errors_name_the_option_and_the_bytes(run_cli, mooncake: Path) -> None:
    # 20 MiB / 2 MiB per Llama-3-8B block = 10 blocks; request 2 needs ceil(1110 / 16) = 70, and vLLM's null block
    # one more: 71 = 142 MiB
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--memory", "20MiB", "--model",
                           "llama-3-8b"), "--memory 20.00 MiB holds 10 blocks", "give at least 142MiB")
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--memory", "1KiB", "--model",
                           "llama-3-8b"), "--memory 1.00 KiB holds no block of 2.00 MiB")
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--capacity-blocks", "0"),
                   "--capacity-blocks 0")


def test_work_past_the_machines_memory_is_refused_with_the_figures(run_cli, mooncake: Path, monkeypatch) -> None:
    from kvcalc.core import host_memory

    monkeypatch.setattr(host_memory, "available_bytes", lambda: 1 << 20)  # a machine with 1 MiB to spare
    one_line_error(run_cli("share", "--branches", "1000"), "--branches 1000 × (--prefix 1000 + --gen 200)",
                   "1.00 MiB available", "lower --branches, --prefix or --gen")
    # the trace's pool: every request's blocks (nothing evicted in vLLM's free-queue order: the never-used blocks
    # outlast the hand-outs), P + O − 1 positions each: ceil(1,009/16) + ceil(1,109/16) + ceil(609/16) = 64 + 70 + 39
    # = 173 blocks, ~18 KiB
    monkeypatch.setattr(host_memory, "available_bytes", lambda: 4096)
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake)), "pool of 173 blocks",
                   "4.00 KiB available", "bound it with --capacity-blocks")
    monkeypatch.setattr(host_memory, "available_bytes", lambda: 1 << 40)
    assert run_cli("share", "--branches", "1000", "--json").exit_code == 0


# Four requests, written out of arrival order (t = 30, 10, 0, 20). Replayed in arrival order, block 16:
#   t=0  700 tokens [1, 3]: cold; caches 700 // 16 = 43 full blocks (32 of id 1, 11 of id 3)
#   t=10 1024 [1, 2]: id 1's 32 blocks hit (id 3 != id 2)            512
#   t=20 512 [1]: all 32 cached, but the last token is recomputed: 31  496
#   t=30 1536 [1, 2, 4]: ids 1 and 2, 64 blocks                        1,024   -> 2,032 hit tokens
# Block 32: 512 + 15 · 32 = 480 + 1,024 -> 2,016. In file order (block 16) the 1024-token request would come
# second and hit 63 blocks (1,008) and the 700-token one 512: 1,008 + 512 + 496 = 2,016, not 2,032.
HAND_TRACE = [
    {"timestamp": 30, "input_length": 1536, "output_length": 0, "hash_ids": [1, 2, 4]},
    {"timestamp": 10, "input_length": 1024, "output_length": 0, "hash_ids": [1, 2]},
    {"timestamp": 0, "input_length": 700, "output_length": 0, "hash_ids": [1, 3]},
    {"timestamp": 20, "input_length": 512, "output_length": 5, "hash_ids": [1]},
]


@pytest.mark.parametrize(("block", "hit_tokens", "hit_blocks"), [(16, 2032, 127), (32, 2016, 63)])
def test_hand_computed_replay_through_the_cli(run_cli, tmp_path: Path, block: int, hit_tokens: int,
                                              hit_blocks: int) -> None:
    path = write_mooncake(tmp_path / "hand.jsonl", HAND_TRACE)
    doc = run_cli("share", "--trace", "mooncake", str(path), "--block", str(block), "--json").json()
    assert (doc["hit_tokens"], doc["hit_blocks"], doc["prompt_tokens"]) == (hit_tokens, hit_blocks, 3772)
    assert doc["evictions"] == 0 and doc["without_prefix_caching"]["hit_tokens"] == 0


@pytest.mark.parametrize(("bound", "hit_tokens", "evictions"), [
    # X = 1024 tokens [1, 2], then Y = 1024 [5, 6], then X again; 64 blocks of 16 each, one at a time.
    (("--capacity-blocks", "64"), 0, 128),  # Y evicts all of X, X again evicts all of Y
    # 96: Y takes the 32 never-used blocks and evicts 32 of X's, tail first (freed in reverse, as vLLM):
    # X's id-1 half survives, X again hits 512 tokens and evicts 32 of Y's
    (("--capacity-blocks", "96"), 512, 64),
    # 128: X again hits 63 blocks (1,008) and evicts one block (the least recently used, X's own last) for its last
    (("--capacity-blocks", "128"), 1008, 1),
    # 130 MiB / (16 tokens × 128 KiB per Llama-3-8B bf16 token = 2 MiB) = 65 blocks, less vLLM's null block: 64
    # free, as --capacity-blocks 64
    (("--memory", "130MiB", "--model", "llama-3-8b"), 0, 128),
])
def test_a_bounded_pool_evicts_by_hand(run_cli, tmp_path: Path, bound: tuple[str, ...], hit_tokens: int,
                                       evictions: int) -> None:
    path = write_mooncake(tmp_path / "evict.jsonl", [
        {"timestamp": t, "input_length": 1024, "output_length": 0, "hash_ids": ids}
        for t, ids in ((0, [1, 2]), (1, [5, 6]), (2, [1, 2]))
    ])
    doc = run_cli("share", "--trace", "mooncake", str(path), *bound, "--json").json()
    assert (doc["hit_tokens"], doc["evictions"], doc["peak_used_blocks"]) == (hit_tokens, evictions, 64)


@pytest.mark.parametrize(("args", "fragments"), [
    (("--block", "1e12"), ("--block 1000000000000", "at most 2,147,483,647")),  # was an OverflowError
    (("--block", "1e400"), ("--block 1.000e+400",)),
    (("--prefix", "1e400"), ("--prefix 1.000e+400", "scenario too large")),  # not 401 digits
    (("--mode", ""), ("--mode ''", "parallel or beam")),  # was read as the default
    (("--model", "llama-3-8b", "--dtype", ""), ("--dtype ''",)),  # was read as the default
])
def test_huge_and_empty_scenario_values(run_cli, args: tuple[str, ...], fragments: tuple[str, ...]) -> None:
    one_line_error(run_cli("share", *args), *fragments)


def test_huge_and_empty_trace_values(run_cli, tmp_path: Path, mooncake: Path) -> None:
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--block", "1e400"), "--block 1.000e+400")
    # 768 neither divides 512 nor is a multiple of it (1,024 is: a block of two whole hash ids)
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--block", "768"),
                   "--block 768 does not divide 512 and is not a multiple of it", "1,024, 2,048, 4,096")
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,374,44\r\n")
    one_line_error(run_cli("share", "--trace", "azure", str(azure), "--block", "1e400"), "--block 1.000e+400")
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--model", "llama-3-8b", "--dtype", ""),
                   "--dtype ''")


def test_an_empty_trace_path_is_refused_as_empty(run_cli) -> None:
    result = run_cli("share", "--trace", "mooncake", "")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: the path is empty: give the path")
    assert "is a directory" not in result.stderr


def test_trace_replay_on_a_hybrid_model_is_sized_per_group(run_cli, mooncake):
    # gpt-oss-120b (18 full + 18 sliding W 128, block 16, a block id 18 · 16 · 2,048 = 589,824 B), the 3-request
    # trace above, one at a time:
    #   1: 1,000 tokens, no hit; its 62 full prompt blocks are hashed in both groups; past the window the sliding
    #      group frees blocks 0..53 ((1,000 − 127) // 16 = 54), which stay cached
    #   2: 1,100 tokens, ids [0, 1, 2]: blocks 0..61 match in both groups -> 62 · 16 = 992 hit tokens
    #   3: 600 tokens, ids [0, 3]: id 0 covers blocks 0..31 -> 512 hit tokens
    # hit 1,504 of 2,700 prompt tokens = 55.70 %; the largest request (1,110 tokens) holds ceil(1,110/16) = 70
    # blocks in each group at its peak: 140 blocks
    doc = run_cli("share", "--trace", "mooncake", str(mooncake), "--model", "gpt-oss-120b", "--capacity-blocks",
                  "2000", "--json").json()
    assert (doc["layout"], doc["block_size"], doc["block_bytes"]) == ("vllm", 16, 589_824)
    assert doc["hit_tokens"] == 1_504 and doc["prompt_tokens"] == 2_700 and doc["evictions"] == 0
    assert [(g["kind"], g["hit_tokens"]) for g in doc["groups"]] == [("full", 1_504), ("sliding", 1_504)]
    assert doc["largest_request_blocks"] == 140
    # --memory is counted in block ids: 100 MiB = 104,857,600 // 589,824 = 177 blocks, less vLLM's null block: 176
    assert run_cli("share", "--trace", "mooncake", str(mooncake), "--model", "gpt-oss-120b", "--memory", "100MiB",
                   "--json").json()["capacity_blocks"] == 176
    # 50 MiB = 88 blocks, 87 free < 140: refused, naming (140 + the null block) · 589,824 B = 81,216 KiB
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--model", "gpt-oss-120b", "--memory",
                           "50MiB"), "holds 87 free blocks", "140", "--memory 81216KiB or more")
    one_line_error(run_cli("share", "--trace", "mooncake", str(mooncake), "--model", "gpt-oss-120b"), "--memory")


def test_trace_on_a_mamba_hybrid_states_its_mode(run_cli, mooncake):
    # Nemotron-H-56B, mamba_cache_mode none (default): no state is saved, so nothing hits, and the report says so
    result = run_cli("share", "--trace", "mooncake", str(mooncake), "--model", "Nemotron-H-56B", "--memory",
                     "20GiB", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["hit_tokens"] == 0 and doc["mamba_cache_mode"] == "none" and doc["block_size"] == 4128
    table = run_cli("share", "--trace", "mooncake", str(mooncake), "--model", "Nemotron-H-56B", "--memory", "20GiB")
    assert "mamba_cache_mode none: a hit needs a state saved at exactly that boundary" in table.stdout
