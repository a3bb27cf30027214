"""Issue 23: each default of a sim run — max batched tokens (8,192), max sequences (256, or 1,024 on a large GPU),
the memory utilisation (the vLLM version's) and the swap bandwidth (the host link's) — is defined once. Every
place that takes one reads the same constant: SimOptions and the scheduler, the memory plan of sim
(core/sim/hardware.py) and of size (core/model/gpu_plan.py, vllm_memory.py), the step-time model, and the help
text of sim and size. A source scan finds no second literal."""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

from kvcalc.core.model import gpu_plan, vllm_memory
from kvcalc.core.model.models import get_preset
from kvcalc.core.share.tier_links import DEFAULT_HOST_BANDWIDTH
from kvcalc.core.sim import hardware, paged_groups, steptime
from kvcalc.core.sim.options import DEFAULT_SWAP_BANDWIDTH, DEFAULT_SWAP_BANDWIDTH_BYTES_PER_S, SimOptions
from kvcalc.core.sim.scheduler import SchedulerConfig
from kvcalc.core.sim.setup import build

REPO = Path(__file__).resolve().parents[2]
TOKENS = vllm_memory.DEFAULT_MAX_NUM_BATCHED_TOKENS
VERSION = vllm_memory.get_version(vllm_memory.DEFAULT_VLLM_VERSION)
# a parameter or field that takes one of the four defaults
NAMES = re.compile(r"(max_(num_)?batched_tokens|max_(num_)?seqs|memory_utili[sz]ation|swap_bandwidth(_bytes_per_s)?)$")


def _default(func, name):
    return inspect.signature(func).parameters[name].default


def _help(run_cli, monkeypatch, command: str) -> str:
    monkeypatch.setenv("COLUMNS", "250")  # wide enough that rich folds no help text
    result = run_cli(command, "--help")
    assert result.exit_code == 0
    return " ".join(result.stdout.replace("│", " ").split())


def test_max_batched_tokens_one_constant(run_cli, monkeypatch):
    assert TOKENS == 8192  # vLLM's max_num_batched_tokens default (vllm_memory.py, its one definition)
    readers = [SimOptions().max_batched_tokens, SchedulerConfig().max_batched_tokens,
               _default(hardware.plan_memory, "max_batched_tokens"),
               _default(gpu_plan.plan_gpu, "max_num_batched_tokens"),
               _default(vllm_memory.predict_memory, "max_num_batched_tokens"),
               _default(paged_groups.GroupedPagedPolicy, "max_batched_tokens"),
               {f.name: f.default for f in fields(hardware.MemoryPlan)}["max_num_batched_tokens"]]
    assert readers == [TOKENS] * len(readers)
    assert "max_num_batched_tokens), at most 2,147,483,647. [default: 8192]" in _help(run_cli, monkeypatch, "sim")
    assert "sliding blocks; default 8192)" in _help(run_cli, monkeypatch, "size")


def test_max_seqs_one_rule(run_cli, monkeypatch):
    large, other = vllm_memory.MAX_NUM_SEQS_LARGE_GPU, vllm_memory.MAX_NUM_SEQS_OTHER_GPU
    assert (large, other, vllm_memory.LARGE_GPU_BYTES) == (1024, 256, 70 * 2**30)  # vllm serve (arg_utils.py)
    no_gpu = vllm_memory.default_max_num_seqs(0)
    assert SchedulerConfig().max_seqs == gpu_plan.DEFAULT_MAX_NUM_SEQS == no_gpu == other
    assert {f.name: f.default for f in fields(hardware.MemoryPlan)}["max_num_seqs"] == other
    assert _default(vllm_memory.predict_memory, "max_num_seqs") == large
    spec = get_preset("Llama-3.1-8B")
    for gpu, expected in (("H200", large), ("A100-80GB", other), ("A100-40GB", other)):
        g = hardware.get_gpu(gpu)
        assert hardware.plan_memory(spec, g, kv_dtype_bits=16, block_size=16).max_num_seqs == expected, gpu

        def size_plan(seqs, g=g):
            return gpu_plan.plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=8192, gpu_name=g.name,
                                     gpu_memory_bytes=g.memory_bytes, max_num_seqs=seqs)

        # size's plan by default is its plan at the expected max_num_seqs (the sampler's warm-up depends on it)
        assert size_plan(None) == size_plan(expected) != size_plan(large + other - expected), gpu
    rule = f"{large:,} on a GPU of 70 GiB or more other than"
    assert rule in _help(run_cli, monkeypatch, "sim") and rule in _help(run_cli, monkeypatch, "size")
    assert f"else {other}, as vllm serve" in _help(run_cli, monkeypatch, "sim")


def test_memory_utilization_is_the_versions(run_cli, monkeypatch):
    spec, gpu = get_preset("Llama-3.1-8B"), hardware.get_gpu("H100-SXM")
    for version in vllm_memory.VLLM_VERSIONS.values():
        sim_plan = hardware.plan_memory(spec, gpu, kv_dtype_bits=16, block_size=16, vllm_version=version.name)
        size_plan = gpu_plan.plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=8192, gpu_name=gpu.name,
                                      gpu_memory_bytes=gpu.memory_bytes, vllm_version=version.name)
        assert sim_plan.memory_utilization == size_plan.gpu_memory_utilization == version.default_gpu_memory_utilization
    assert hardware.default_utilization(vllm_memory.DEFAULT_VLLM_VERSION) == VERSION.default_gpu_memory_utilization
    assert SimOptions().memory_utilization is None  # "not given": the version's, never a literal of sim's own
    sim_help, size_help = _help(run_cli, monkeypatch, "sim"), _help(run_cli, monkeypatch, "size")
    for version in vllm_memory.VLLM_VERSIONS.values():
        value = f"{version.default_gpu_memory_utilization:g}"
        assert f"{value} for {version.name}" in sim_help and value in size_help


def test_swap_bandwidth_is_the_host_links(run_cli, monkeypatch):
    assert DEFAULT_SWAP_BANDWIDTH_BYTES_PER_S == DEFAULT_HOST_BANDWIDTH == 25e9  # core/share/tier_links.py
    assert _default(steptime.build_model, "swap_bandwidth_bytes_per_s") == DEFAULT_HOST_BANDWIDTH
    job = build(SimOptions(requests=5))
    assert job.sim.steptime.swap_bandwidth_bytes_per_s == DEFAULT_HOST_BANDWIDTH
    assert DEFAULT_SWAP_BANDWIDTH == "25GB" and "(default: 25GB)" in _help(run_cli, monkeypatch, "sim")


SCANNED = ["core", "cli"]


def _literal(node) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _literal_defaults(tree: ast.AST):
    """(line, name) of every parameter or class field of a NAMES default given as a number (or option(number))."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = [*zip(positional[len(positional) - len(a.defaults):], a.defaults, strict=True),
                     *zip(a.kwonlyargs, a.kw_defaults, strict=True)]
            yield from ((node.lineno, arg.arg) for arg, d in pairs if NAMES.search(arg.arg) and _literal(d))
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and NAMES.search(node.target.id):
            value = node.value
            if _literal(value) or (isinstance(value, ast.Call) and value.args and _literal(value.args[0])):
                yield node.lineno, node.target.id


@pytest.mark.parametrize("folder", SCANNED)
def test_no_default_is_a_second_literal(folder):
    found = []
    for path in sorted((REPO / folder).rglob("*.py")):
        tree = ast.parse(path.read_text())
        found += [f"{path.relative_to(REPO)}:{line} {name}" for line, name in _literal_defaults(tree)]
        values = [n.value for n in ast.walk(tree) if _literal(n)]
        name = str(path.relative_to(REPO))
        if 25e9 in values:  # the host link: its one definition
            assert name == "core/share/tier_links.py", name
        if 0.92 in values:  # a vLLM version's utilisation: VLLM_VERSIONS is its one definition
            assert name == "core/model/vllm_memory.py", name
    assert not found  # each reads its constant (a number here would be a second definition)
