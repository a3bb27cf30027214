"""`kvcalc share --trace … --capacity` and the tier options through the CLI: the JSON contract on a trace
worked by hand (tests/core/share/test_capacity.py has the arithmetic), the other formats, the figure, and
every bad input as one line, exit 2."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

# Block 512: hits at capacity C are 0, 1, 2, 4, 5, 5 blocks for C = 0..5 (lru_reference.HAND)
LLAMA3_8B_BLOCK_512 = 2 * 32 * 8 * 128 * 2 * 512  # K and V, layers, KV heads, head dim, bf16 bytes, tokens = 64 MiB




def test_curve_json(run_cli, hand_trace: Path) -> None:
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--capacity",
                     "512,1536,2048", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    (curve,) = doc["curves"]
    assert [p["capacity_blocks"] for p in curve["points"]] == [1, 3, 4]
    assert [p["hit_tokens"] for p in curve["points"]] == [512, 4 * 512, 5 * 512]
    assert curve["unbounded_hit_tokens"] == 2560 and curve["prompt_tokens"] == 6145
    assert curve["unbounded_hit_rate"] == pytest.approx(2560 / 6145)
    assert {k: v["capacity_blocks"] for k, v in curve["reach"].items()} == {"50pct": 3, "90pct": 4, "99pct": 4}


def test_block_sweep_and_bytes(run_cli, hand_trace: Path) -> None:
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), "--blocks", "256,512", "--capacity",
                     "192MiB", "--model", "Llama-3-8B", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert [c["block_size"] for c in doc["curves"]] == [256, 512]
    by_block = {c["block_size"]: c for c in doc["curves"]}
    assert by_block[512]["cached_block_bytes"] == LLAMA3_8B_BLOCK_512
    # 192 MiB = 3 block ids of 64 MiB at block 512, less vLLM's null block (--layout vllm, the default): 2 blocks,
    # 2 hit blocks (HAND at C = 2); = 6 ids of 32 MiB at block 256, less the null block: 5
    assert by_block[512]["points"][0]["capacity_blocks"] == 2 and by_block[512]["points"][0]["hit_tokens"] == 1024
    assert by_block[256]["points"][0]["capacity_blocks"] == 5
    # the bytes columns are the pool that holds the blocks, null block included: (2 + 1) * 64 MiB = 192 MiB
    assert by_block[512]["points"][0]["capacity_bytes"] == 3 * LLAMA3_8B_BLOCK_512 and doc["model"]["null_blocks"] == 1
    table = run_cli("share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--capacity", "192MiB",
                    "--model", "Llama-3-8B").stdout
    assert "block 512: bytes are vLLM's pool of block ids of 64.00 MiB and its null block" in table
    assert "floor(bytes / 64.00 MiB) − 1 cached blocks" in table
    # --layout ideal is kvcalc's own pool, no null block: 3 blocks (4 hit blocks at C = 3) and 6
    ideal = run_cli("share", "--trace", "mooncake", str(hand_trace), "--blocks", "256,512", "--capacity",
                    "192MiB", "--model", "Llama-3-8B", "--layout", "ideal", "--json").json()
    by_block = {c["block_size"]: c for c in ideal["curves"]}
    assert by_block[512]["points"][0]["capacity_blocks"] == 3 and by_block[512]["points"][0]["hit_tokens"] == 2048
    assert by_block[256]["points"][0]["capacity_blocks"] == 6 and ideal["model"]["null_blocks"] == 0


def test_gpu_tier_in_bytes_leaves_out_vllms_null_block(run_cli, hand_trace: Path) -> None:
    # --gpu-cache 128 MiB = 2 block ids of 64 MiB (Llama-3-8B, block 512), less vLLM's null block: 1 block, the
    # hand-worked GPU 1 / host 2 of test_tiers_json: hits 512, 3 * 512, 0; --layout ideal: 2 blocks, no null block
    args = ("share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--gpu-cache", "128MiB",
            "--host-cache", "1024", "--model", "Llama-3-8B")
    tiers = run_cli(*args, "--json").json()["tiers"]
    gpu, host, disk = tiers["by_tier"]
    assert (gpu["capacity_blocks"], gpu["null_blocks"], host["capacity_blocks"]) == (1, 1, 2)
    assert gpu["capacity_bytes"] == 2 * LLAMA3_8B_BLOCK_512  # the block and the null block's id
    assert (gpu["hit_tokens"], host["hit_tokens"], disk["hit_tokens"]) == (512, 3 * 512, 0)
    assert "gpu tier: --gpu-cache 128MiB is vLLM's pool of 2 block ids of 64.00 MiB, less its null block" in \
        run_cli(*args).stdout
    ideal = run_cli(*args, "--layout", "ideal", "--json").json()["tiers"]["by_tier"][0]
    assert (ideal["capacity_blocks"], ideal["null_blocks"], ideal["capacity_bytes"]) == (2, 0, 2 * LLAMA3_8B_BLOCK_512)
    # a GPU cache in tokens is a cache's blocks, no pool: 1024 tokens = 2 blocks under either layout
    tokens = run_cli(*args[:7], "1024", *args[8:], "--json").json()["tiers"]["by_tier"][0]
    assert (tokens["capacity_blocks"], tokens["null_blocks"]) == (2, 0)


def test_tiers_json(run_cli, hand_trace: Path) -> None:
    # GPU 1 block, host 2 blocks, no disk (hand-worked in test_capacity.test_hand_worked_tiers)
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--gpu-cache", "512",
                     "--host-cache", "1024", "--model", "Llama-3-8B", "--json")
    assert result.exit_code == 0, result.stderr
    tiers = result.json()["tiers"]
    gpu, host, disk = tiers["by_tier"]
    assert (gpu["hit_tokens"], host["hit_tokens"], disk["hit_tokens"]) == (512, 3 * 512, 0)
    assert (host["read_blocks"], host["write_blocks"], tiers["dropped_blocks"]) == (3, 6, 4)
    assert host["read_bytes"] == 3 * LLAMA3_8B_BLOCK_512 and host["write_bytes"] == 6 * LLAMA3_8B_BLOCK_512
    assert host["read_bytes_by_group"] == {"full": 3 * LLAMA3_8B_BLOCK_512}
    assert host["bandwidth_bytes_per_s"] == 25e9 and disk["bandwidth_bytes_per_s"] == 5e9
    # the trace spans 3 s; every request in its own 1 s bin: the peak second is the busiest request's bytes
    assert tiers["duration_s"] == 3.0
    assert host["mean_read_bytes_per_s"] == pytest.approx(3 * LLAMA3_8B_BLOCK_512 / 3.0)
    assert host["loading_pays"] in (True, False) and host["break_even_bytes_per_s"] > 0
    assert tiers["vllm_cache_groups"] == 1 and "#56871" not in result.stdout


def test_vllm_56871_note_for_a_model_with_several_groups(run_cli, hand_trace: Path) -> None:
    # Gemma-3-27B under vLLM's layout: 10 full layers set the group size, so 52 sliding layers span
    # ceil(52 / 10) = 6 block tables (60 slots, 8 padding): 7 KV cache groups. A 512-token block is 10 + 60
    # layer slots of 512 tokens · 8 KiB (16 KV heads · 128 · 2 · 2 B) = 70 · 4 MiB = 280 MiB (the 62 real layers:
    # 248 MiB), so 1 GiB of host holds 1,024 // 280 = 3 blocks; under #56871 3 // 7 = 0
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--gpu-cache", "512",
                     "--host-cache", "1GiB", "--model", "Gemma-3-27B")
    assert result.exit_code == 0, result.stderr
    assert "7 KV cache groups" in result.stdout and "0 blocks, not 3" in result.stdout


def test_tier_bandwidths_and_mode(run_cli, hand_trace: Path) -> None:
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--gpu-cache", "512",
                     "--host-cache", "1024", "--host-bw", "64GB/s", "--tier-mode", "inclusive", "--json")
    assert result.exit_code == 0, result.stderr
    tiers = result.json()["tiers"]
    assert tiers["mode"] == "inclusive" and tiers["by_tier"][1]["bandwidth_bytes_per_s"] == 64e9


@pytest.mark.parametrize("fmt", ["csv", "markdown", "table"])
def test_other_formats(run_cli, hand_trace: Path, fmt: str) -> None:
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--capacity", "512:2048:3",
                     "--gpu-cache", "512", "--format", fmt)
    assert result.exit_code == 0, result.stderr
    assert "2,560" in result.stdout or "2560" in result.stdout


def test_plot(run_cli, hand_trace: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    figure = tmp_path / "curve.png"
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--capacity", "512:4096",
                     "--plot", str(figure))
    assert result.exit_code == 0, result.stderr
    assert figure.stat().st_size > 1000 and figure.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("args", "message"), [
    (["--capacity", "1GiB"], "give a model"),
    (["--capacity", "3X"], "--capacity '3X' is neither tokens"),
    (["--capacity", "1M", "--memory", "1GiB"], "different modes"),
    (["--capacity", "1M", "--prefix", "10"], "different modes"),
    (["--gpu-cache", "1M", "--blocks", "16,32"], "one block size"),
    (["--host-cache", "1M"], "add --gpu-cache"),
    (["--capacity", "1M", "--tier-mode", "x"], "--tier-mode applies to tiers"),
    (["--gpu-cache", "1M", "--tier-mode", "x"], "--tier-mode 'x' is not one of"),
    (["--gpu-cache", "1M", "--host-bw", "fast"], "--host-bw 'fast' is not a bandwidth"),
    (["--gpu-cache", "1M,2M"], "--gpu-cache '1M,2M' gives 2 sizes"),
    (["--capacity", "1M", "--plot", "x.txt"], ".png or .svg"),
    (["--capacity", "1M", "--block", "24"], "--block 24 does not divide 512"),
    (["--capacity", "1M", "--blocks", "16,x"], "--blocks '16,x'"),
    (["--capacity", "1M", "--gpu", "H100-SXM"], "applies to a model"),
    (["--capacity", "1M", "--model", "Llama-3-8B", "--gpu", "H100-SXM"], "add --gpu-cache"),
    (["--gpu-cache", "1M", "--model", "Llama-3-8B", "--gpu", "H999"], "unknown GPU 'H999'"),
    (["--gpu-cache", "1M", "--model", "Llama-3-70B"], "more --tp"),
    (["--plot", "x.png"], "add --capacity"),
])
def test_bad_input_is_one_line(run_cli, hand_trace: Path, args: list[str], message: str) -> None:
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), *args)
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_capacity_needs_a_trace(run_cli) -> None:
    result = run_cli("share", "--capacity", "1M")
    assert result.exit_code == 2 and "add --trace" in result.stderr


def test_recurrent_hybrid_states_at_prompt_ends(run_cli, hand_trace: Path) -> None:
    # Nemotron-H (Mamba-2 hybrid): with states only where prompts end, 3 of the 5 hit blocks remain
    # (tests/core/share/test_capacity.py works it by hand); kvcalc's ideal layout: vLLM's pages it at block 4,608
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--capacity", "1TiB",
                     "--model", "Nemotron-H-56B", "--layout", "ideal", "--json")
    assert result.exit_code == 0, result.stderr
    (curve,) = result.json()["curves"]
    assert curve["unbounded_hit_tokens"] == 5 * 512
    assert curve["unbounded_hit_rate_states_at_prompt_ends"] == pytest.approx(3 * 512 / 6145)
    groups = result.json()["model"]["cached_block_bytes_by_group"]["512"]
    assert set(groups) == {"full", "state_mamba2"} and groups["state_mamba2"] > groups["full"]


CELL = re.compile(r"|true|false|-?\d+|-?\d+\.\d+(e[-+]\d+)?|-?\d+e[-+]\d+|[A-Za-z][A-Za-z0-9_.+\-]*")


def test_csv_cells_are_machine_readable(run_cli, hand_trace: Path) -> None:
    """Every CSV cell empty, a number, true/false or a plain label (tests/cli/test_csv_output.py's rule); one
    CSV table per table people see; the capacity as typed (1GiB) is display only."""
    args = ["share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--capacity", "64MiB:1GiB:3",
            "--gpu-cache", "64MiB", "--host-cache", "128MiB", "--model", "Gemma-3-27B"]
    result = run_cli(*args, "--format", "csv")
    assert result.exit_code == 0, result.stderr
    chunks = result.stdout.rstrip("\n").split("\n\n")
    assert len(chunks) == run_cli(*args, "--format", "markdown").stdout.count("### ") == 4
    for chunk in chunks:
        title, *lines = chunk.split("\n")
        assert title.startswith("# ")
        header, *rows = list(csv.reader(lines))
        for row in rows:
            assert len(row) == len(header)
            for cell in row:
                assert CELL.fullmatch(cell), (header, cell)
    assert "sliding_1024" in result.stdout and "capacity_bytes" in result.stdout


def test_recurrent_hybrid_states_at_prompt_ends_per_capacity(run_cli, hand_trace: Path) -> None:
    # HAND at block 512, states saved after each prompt's last full block: r0 saves after id 3 (block 3); r1
    # resumes there (3 blocks) if block 3 — at depth 3 before r1 — is still cached, so only with C >= 3; r2 and r3
    # find no saved state on their chains. C = 2 blocks (1,024 tokens): 0; C = 3 (1,536): 3 blocks.
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--capacity", "1024,1536",
                     "--model", "Nemotron-H-56B", "--layout", "ideal", "--json")
    assert result.exit_code == 0, result.stderr
    (curve,) = result.json()["curves"]
    assert [p["hit_rate_states_at_prompt_ends"] for p in curve["points"]] == [0.0, pytest.approx(3 * 512 / 6145)]
    assert curve["unbounded_hit_rate_states_at_prompt_ends"] == pytest.approx(3 * 512 / 6145)


def test_capacity_bytes_count_vllm_padded_pages(run_cli, hand_trace: Path) -> None:
    """Gemma-3-27B at block 512: vLLM's layout pages 10 full + 60 sliding layer slots (8 of them padding), 70 ·
    512 tokens · 8 KiB = 280 MiB a cached block; kvcalc's ideal pool its 62 real layers, 248 MiB. 1 GiB holds
    1,024 // 280 = 3 blocks (4 hit blocks on HAND, lru_reference) against 1,024 // 248 = 4 (5 hit blocks)."""
    args = ["share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--capacity", "1GiB", "--model",
            "Gemma-3-27B", "--json"]
    vllm, ideal = run_cli(*args).json(), run_cli(*args, "--layout", "ideal").json()
    assert vllm["model"]["layout"] == "vllm" and ideal["model"]["layout"] == "ideal"
    assert vllm["curves"][0]["cached_block_bytes"] == 70 * 512 * 8192 == 280 * 2**20
    assert ideal["curves"][0]["cached_block_bytes"] == 62 * 512 * 8192 == 248 * 2**20
    groups = vllm["model"]["cached_block_bytes_by_group"]["512"]
    assert groups == {"full": 10 * 4 * 2**20, "sliding_1024": 60 * 4 * 2**20}
    assert [p["capacity_blocks"] for p in vllm["curves"][0]["points"]] == [3]
    assert [p["hit_tokens"] for p in vllm["curves"][0]["points"]] == [4 * 512]
    assert [p["capacity_blocks"] for p in ideal["curves"][0]["points"]] == [4]
    assert [p["hit_tokens"] for p in ideal["curves"][0]["points"]] == [5 * 512]
    table = run_cli(*args[:-1]).stdout
    assert "vLLM's layout: 32.00 MiB of it padding" in " ".join(table.split())  # 8 slots · 4 MiB


def test_capacity_layout_inputs(run_cli, hand_trace: Path) -> None:
    base = ["share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--capacity", "1GiB"]
    # Nemotron-H: its Mamba-2 state (16,900,096 B a layer) forces vLLM's block to 512 · ceil(16,900,096 / (512 ·
    # 4,096)) = 512 · 9 = 4,608 tokens: bytes at block 512 would be a pool vLLM does not page
    result = run_cli(*base, "--model", "Nemotron-H-56B")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "pages Nemotron-H-56B at block 4,608, not 512" in result.stderr
    assert "give --block 4608, or --layout ideal" in result.stderr
    for extra, message in ((["--layout", "fancy"], "--layout 'fancy' is not one of vllm, ideal"),
                           (["--mamba-cache-mode", "all"], "--mamba-cache-mode applies to scenario and trace modes")):
        result = run_cli(*base, "--model", "Gemma-3-27B", *extra)
        assert result.exit_code == 2 and message in result.stderr, result.stderr
