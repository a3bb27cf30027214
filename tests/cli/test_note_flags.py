"""Core's notes name parameters (kvcalc.core.notes.Note); the CLI writes them as flags in one place (issue 23)."""

from __future__ import annotations

import pickle

import typer

from kvcalc.cli.app import app
from kvcalc.cli.flags import command_flags, rendered
from kvcalc.cli.output import Report, Table, _with_flags
from kvcalc.core.notes import Note, concat

DRAFT = Note("{spec_method} draft without {draft}: give {draft} PATH", "spec_method", "draft")
FLAGS = {"spec_method": "--spec-method", "draft": "--draft-config"}


def test_a_note_reads_its_parameters_names_and_renders_flags():
    assert DRAFT == "spec_method draft without draft: give draft PATH"  # the library's text
    assert DRAFT.rendered(FLAGS) == "--spec-method draft without --draft-config: give --draft-config PATH"
    assert DRAFT.rendered({}) == str(DRAFT)  # a parameter no flag sets keeps its name
    assert pickle.loads(pickle.dumps(DRAFT)).rendered(FLAGS) == DRAFT.rendered(FLAGS)


def test_concat_keeps_the_marks_and_plain_text_stays_plain():
    joined = concat("user: ", Note("{lengths} (3 given)", "lengths"), "; more")
    assert isinstance(joined, Note) and joined.rendered({"lengths": "--lengths"}) == "user: --lengths (3 given); more"
    assert concat("a", "b") == "ab" and not isinstance(concat("a", "b"), Note)
    braces = concat("{lengths} stays", Note("{draft}", "draft"))  # only a Note's own parameters are marks
    assert braces.rendered({"lengths": "--lengths", "draft": "--draft-config"}) == "{lengths} stays--draft-config"


def test_every_note_of_a_report_is_rendered_before_output():
    table = Table("t", ["a"], [[DRAFT]], caption=DRAFT)
    report = _with_flags(Report({"notes": [DRAFT], "deep": {"x": (DRAFT, 1)}}, [table], [DRAFT], [DRAFT]), FLAGS)
    flagged = DRAFT.rendered(FLAGS)
    assert report.doc == {"notes": [flagged], "deep": {"x": (flagged, 1)}}
    assert report.notes == report.text == [flagged] and report.tables[0].rows == [[flagged]]
    assert report.tables[0].caption == flagged
    assert rendered(["plain", 3, None], FLAGS) == ["plain", 3, None]


def test_a_commands_flags_are_its_options_then_the_table():
    group = typer.main.get_command(app)
    sim = command_flags("sim", group.get_command(None, "sim"))
    assert sim["spec_method"] == "--spec-method" and sim["max_model_len"] == "--max-model-len"
    assert sim["rate_per_s"] == "--rate"  # PARAMETER_FLAGS
    assert command_flags("size", group.get_command(None, "size"))["draft"] == "--draft-config"


def test_size_writes_the_config_notes_on_stderr_with_flags(tmp_path):
    import json

    from typer.testing import CliRunner

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512, "vocab_size": 1000,
              "max_position_embeddings": 4096, "num_nextn_predict_layers": 1,
              "quantization_config": {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    result = CliRunner().invoke(app, ["size", "--config", str(path), "--tokens", "100", "--json"])
    assert result.exit_code == 0, result.output
    assert "so give --dtype fp8 to match" in result.stderr  # the Note's {dtype}
    assert "(--spec-tokens K --spec-method mtp adds them)" in result.stderr
    warnings = json.loads(result.stdout)["warnings"]
    assert any("give --dtype fp8" in w for w in warnings) and any("--spec-method mtp adds" in w for w in warnings)
