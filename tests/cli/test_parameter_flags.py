"""Core names its parameters, the CLI names flags (issue 23): the messages a user sees are unchanged.

Each case is an error that core raises as a ParameterError naming its own parameter (`tp`, `method`,
`repo_id`, `{model}` ...) and kvcalc.cli.app writes with the command's flag. The expected lines are what the
CLI printed before core stopped naming flags (checked old tree against new over 43 such errors: identical).
"""

from __future__ import annotations

import pytest

from kvcalc.cli.app import flag_message
from kvcalc.core.errors import ParameterError

CASES = [
    (("size", "-m", "llama-3-8b", "--tp", "3"),
     "--tp 3 does not divide the 8 KV heads of Llama-3-8B: use a --tp that divides 8 (1, 2, 4, 8) or a "
     "multiple of 8"),
    (("size", "-m", "llama-3-8b", "--spec-tokens", "2", "--spec-method", "mtp"),
     "--spec-method mtp: Llama-3-8B's config has no MTP layers (num_nextn_predict_layers, mtp_num_hidden_layers) "
     "for the drafter; give the drafter's config with --draft-config PATH"),
    (("size", "--layers", "4"),
     "explicit model dimensions need --layers, --kv-heads and --head-dim together (missing --kv-heads, "
     "--head-dim); or give --model/--config and override some of them"),
    (("size", "-m", "llama-3-8b", "--config", "x"), "give either --model or --config, not both"),
    (("size", "-m", "llama-3-8b", "--tokens", "0"), "--tokens must be a positive integer, got 0"),
    (("size", "--model", "a/b/c"), "--model 'a/b/c': a Hugging Face model is org/name (e.g. meta-llama/Llama-3.1-8B)"),
    (("frag", "--lengths", "1,x"), "--lengths item 2: 'x' is not an integer length"),
    (("frag", "--seed", "3"), "--seed applies only to --dist: add --dist or drop --seed"),
    (("frag", "--lengths", "5", "--dist", "uniform:high=4"), "give one source of lengths, not --lengths and --dist"),
    (("frag", "--lengths", "5", "--max-len", "2"),
     "length 5 (item 1) is above --max-len 2: raise --max-len to at least 5 or leave it out (default: next power "
     "of two)"),
    (("frag", "--dist", "uniform:high=4", "--count", "0"), "--count must be a positive number of lengths, got 0"),
]


@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(args) for args, _ in CASES])
def test_core_parameters_are_shown_as_the_flags_typed(run_cli, args, message):
    result = run_cli(*args)
    assert result.exit_code == 2
    assert result.stderr == f"error: {message}\n"


def test_marked_parameters_are_rewritten_where_marked_only():
    # `model` is also an everyday word of the message: only the marked place becomes the flag
    exc = ParameterError("{model} 'x/': a Hugging Face model is org/name; or give {config} DIR", "model", "config")
    assert str(exc) == "model 'x/': a Hugging Face model is org/name; or give config DIR"  # the library's reading
    flags = {"model": "--model", "config": "--config"}
    assert flag_message(exc, flags) == "--model 'x/': a Hugging Face model is org/name; or give --config DIR"
    assert flag_message(exc, {}) == str(exc)  # a command without the flag: the parameter's own name


def test_an_unknown_gpu_names_the_options_of_a_custom_one(run_cli):
    # core/gpus.get_gpu marks {gpu_memory} {bandwidth} {flops}; sim has those options, size says its own alternative
    result = run_cli("sim", "--gpu", "nosuch")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: unknown GPU 'nosuch': choose one of ")
    assert result.stderr.endswith(", or give --gpu-memory --bandwidth --flops\n")
    assert run_cli("size", "-m", "llama-3-8b", "--gpu", "nosuch").stderr.endswith(", or give --kv-memory SIZE\n")
