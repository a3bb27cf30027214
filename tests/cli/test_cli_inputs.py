"""The thin commands' inputs (cli/size_inputs.py, frag_inputs.py, share_inputs.py) against the commands typer
builds: every flag reaches the checks, and every flag a check names is one the command has."""

from __future__ import annotations

import dataclasses

import pytest
import typer.main

from kvcalc.cli.app import app
from kvcalc.cli.frag_inputs import FragOptions
from kvcalc.cli.share_inputs import CURVE_FLAGS, GROUP_FLAGS, SCENARIO_FLAGS, TRACE_FLAGS, ShareOptions
from kvcalc.cli.size_inputs import SizeOptions


def _params(command: str) -> dict[str, set[str]]:
    """{parameter name: its option spellings} of a `kvcalc` command."""
    group = typer.main.get_command(app)
    return {p.name: set(p.opts) for p in group.get_command(None, command).params}


@pytest.mark.parametrize(("command", "options", "renamed"), [
    ("size", SizeOptions, {"kv_memory_bytes": "kv_memory"}),
    ("frag", FragOptions, {}),
    ("share", ShareOptions, {}),
])
def test_every_flag_has_one_field(command, options, renamed):
    # A flag missing here would be parsed and then never checked nor used; a field without a flag is never set.
    fields = {f.name for f in dataclasses.fields(options)}
    assert {renamed.get(name, name) for name in _params(command)} == fields


def test_share_mode_tables_name_real_flags_once():
    flags = set().union(*_params("share").values())
    tables = [SCENARIO_FLAGS, TRACE_FLAGS, CURVE_FLAGS, GROUP_FLAGS]
    named = [flag for table in tables for flag in table]
    assert set(named) <= flags, set(named) - flags
    assert len(named) == len(set(named))  # a flag belongs to one mode


def test_share_given_reads_each_flag_from_its_field():
    values = {f.name: None for f in dataclasses.fields(ShareOptions)}
    opts = ShareOptions(**{**values, "json_flag": False, "fmt": None, "capacity_blocks": 8, "tier_mode": "x"})
    assert opts.given(*TRACE_FLAGS) == ["--capacity-blocks"]
    assert opts.given(*CURVE_FLAGS) == ["--tier-mode"]
    assert opts.given(*SCENARIO_FLAGS, *GROUP_FLAGS) == []


def test_size_gpu_options_are_size_flags():
    values = {f.name: None for f in dataclasses.fields(SizeOptions)}
    flags = set().union(*_params("size").values())
    assert set(SizeOptions(**values).gpu_options()) <= flags
