"""The root app: help, version, unknown commands and options are one-line errors with exit 2."""

import subprocess
import sys

import pytest


def test_help_lists_every_command(run_cli):
    result = run_cli("--help")
    assert result.exit_code == 0
    for name in ("size", "frag", "share", "bench", "sim"):
        assert name in result.stdout


def test_version(run_cli):
    result = run_cli("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("kvcalc ")


def test_unknown_command_is_one_line_error(run_cli):
    result = run_cli("nope")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_python_dash_m_runs():
    proc = subprocess.run([sys.executable, "-m", "kvcalc", "--version"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("kvcalc ")


def test_a_command_imports_only_its_own_module():
    """Commands load lazily: `kvcalc size` never imports the modules of frag, share, sim or bench."""
    code = (
        "import sys\n"
        "from kvcalc.cli.app import main\n"
        "sys.argv = ['kvcalc', 'size', '--model', 'llama-3-8b', '--json']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('kvcalc.cli.'))\n"
        "print(loaded, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    loaded = proc.stderr.strip().splitlines()[-1]
    assert "kvcalc.cli.size" in loaded
    from kvcalc.cli.commands import COMMANDS

    for _, module in COMMANDS:
        if module != "size":
            assert f"'kvcalc.cli.{module}'" not in loaded


def test_flags_show_no_value_in_help(run_cli):
    # typer prints `--json <bool>` by default, which reads as if `--json true` were the way to use it.
    for args in (("--help",), ("size", "--help"), ("frag", "--help"), ("sim", "--help")):
        result = run_cli(*args)
        assert result.exit_code == 0 and "<bool>" not in result.stdout, args
    assert "<int>" in run_cli("size", "--help").stdout  # options that take a value still say which


def test_the_command_list_shows_each_summary_on_joined_lines(run_cli):
    # frag's docstring wraps its first paragraph; the list reflows it instead of keeping the hard breaks.
    text = " ".join(line.strip("│ ") for line in run_cli("--help").stdout.splitlines())
    assert "utilisation, block-table bytes, and KV bytes" in " ".join(text.split())


def test_json_with_another_format_is_refused_before_any_work(run_cli):
    for args in (("size", "--json", "--format", "csv"), ("frag", "--format=markdown", "--json"),
                 ("sim", "--json", "--format", "CSV")):
        result = run_cli(*args)
        assert result.exit_code == 2 and result.stdout == "", args
        assert result.stderr.startswith("error: --json and --format") and result.stderr.count("\n") == 1
    assert run_cli("size", "--json", "--format", "json").exit_code == 0


def test_a_parameter_error_names_parameters_in_core_and_flags_in_the_cli(run_cli):
    import pytest

    from kvcalc.core.errors import ParameterError
    from kvcalc.cuda_ext.bench import BenchConfig

    # Core (a library): the dataclass's own field names.
    with pytest.raises(ParameterError, match=r"^num_q_heads 12 must be 1 to 16 times num_kv_heads 8 ") as caught:
        BenchConfig(device="cpu", num_q_heads=12, num_kv_heads=8)
    assert caught.value.params == ("num_q_heads", "num_kv_heads") and caught.value.param == "num_q_heads"
    # The CLI: the same error with the flags the user typed (PARAMETER_FLAGS for the two head counts).
    result = run_cli("bench", "--device", "cpu", "--q-heads", "12", "--kv-heads", "8")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --q-heads 12 must be 1 to 16 times --kv-heads 8 ")


def test_flag_message_rewrites_only_the_named_parameters_as_whole_words():
    from kvcalc.cli.app import flag_message
    from kvcalc.core.errors import ParameterError

    exc = ParameterError("block_size 12 is not a power of two (block_sizes and tp 2 are fine)", "block_size")
    flags = {"block_size": "--block", "block_sizes": "--blocks", "tp": "--tp"}
    # tp is not named by the error, block_sizes is another word: both stay
    assert flag_message(exc, flags) == "--block 12 is not a power of two (block_sizes and tp 2 are fine)"
    assert flag_message(ParameterError("tp 3 does not divide 8", "tp"), {}) == "tp 3 does not divide 8"


def test_a_parameter_error_without_a_parameter_is_a_bug():
    import pytest

    from kvcalc.core.errors import ParameterError

    with pytest.raises(TypeError):
        ParameterError("something is wrong")


def test_the_default_dtype_is_one_constant():
    from kvcalc.core.dtypes import DEFAULT_DTYPE, parse_dtype

    assert DEFAULT_DTYPE == "bf16" == parse_dtype(DEFAULT_DTYPE)


def test_every_command_defaults_to_one_dtype_and_says_it(run_cli):
    from kvcalc.cli.app import _load_command
    from kvcalc.core.dtypes import DEFAULT_DTYPE

    for name in ("size", "frag", "share", "sim", "bench"):  # the KV precision (verify's is the model's)
        (param,) = [p for p in _load_command(name, name).params if p.name == "dtype"]
        # frag and share take --dtype only with a model (None: not given), and then apply DEFAULT_DTYPE
        assert param.default in (DEFAULT_DTYPE, None), name
        assert param.default == DEFAULT_DTYPE or f"default {DEFAULT_DTYPE}" in param.help, name
    assert run_cli("size", "--json").json()["dtype"] == DEFAULT_DTYPE
    assert run_cli("frag", "-m", "llama-3-8b", "--json").json()["model"]["dtype"] == DEFAULT_DTYPE
    assert run_cli("share", "-m", "llama-3-8b", "--json").json()["dtype"] == DEFAULT_DTYPE


def test_every_seed_is_one_option_that_refuses_a_negative(run_cli):
    import pytest

    pytest.importorskip("torch")  # bench is among them
    for args in (("frag", "--dist", "lognormal:mean=100"), ("share", "--mode", "beam"), ("sim",),
                 ("bench", "--device", "cpu")):
        result = run_cli(*args, "--seed", "-1")
        assert result.exit_code == 2 and result.stdout == "", args
        assert result.stderr.startswith("error: --seed -1 is negative: give a whole number from 0 to 2**63-1"), args
        assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("args", [
    ("size", "-m", "llama-3-8b", "--tokens", "10", "--tokens", "20"),
    ("size", "-m", "llama-3-8b", "-n", "10", "--tokens=20"),
    ("frag", "--lengths", "10", "--lengths", "20"),
    ("frag", "--dist", "uniform:high=9", "--dist", "uniform:high=8"),
    ("share", "--prefix", "10", "--prefix", "20"),
    ("sim", "--rate", "1", "--rate", "2"),
    ("bench", "--device", "cpu", "--batch", "2", "--batch", "4"),
])
def test_a_value_option_given_twice_is_refused_naming_both_values(run_cli, args):
    # click keeps the last value silently; which one was meant is a guess
    result = run_cli(*args)
    assert result.exit_code == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: --") and "is given twice (" in result.stderr


def test_options_that_take_several_values_and_flags_may_repeat(run_cli):
    assert run_cli("frag", "--block", "16", "--block", "32", "--json").json()["paged"][1]["block_size"] == 32
    assert run_cli("size", "-m", "llama-3-8b", "--tokens", "16", "--json", "--json").exit_code == 0
    # a value after `--` or one that looks like an option is a value, not a second option
    assert run_cli("frag", "--lengths-file", "/nonexistent/--lengths").stderr.startswith("error: /nonexistent/")


def test_a_blank_path_is_quoted_in_the_message(run_cli):
    result = run_cli("size", "--config", " ")
    assert result.exit_code == 2 and result.stderr == "error: ' ': no such file; check the path\n"


@pytest.mark.parametrize("args", [("bench", "--device", "cpu", "--save", "-"), ("sim", "--timeline", "-")])
def test_dash_for_an_output_file_is_refused_not_written_as_a_file_named_dash(run_cli, args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_cli(*args)
    assert result.exit_code == 2 and "-: give a file name" in result.stderr and not (tmp_path / "-").exists()


@pytest.mark.parametrize("args", [("bench", "--device", "cpu", "--save", "--json"),
                                  ("sim", "--requests", "3", "--timeline", "--json")])
def test_an_option_after_an_output_flag_is_not_taken_as_its_file(run_cli, args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_cli(*args)
    assert result.exit_code == 2 and "--json: that is an option, not a file name" in result.stderr
    assert not (tmp_path / "--json").exists()


@pytest.fixture
def unwritable_dir(tmp_path):
    """A folder in which no file can be created by this process: a read-only one, or /sys when root (whom
    permissions do not stop)."""
    import os

    if os.geteuid() != 0:
        tmp_path.chmod(0o500)
        yield tmp_path
        tmp_path.chmod(0o700)
        return
    try:
        open("/sys/kvcalc-probe", "ab").close()
    except PermissionError:
        yield __import__("pathlib").Path("/sys")
    else:  # pragma: no cover
        pytest.skip("no folder here refuses a write by root")


@pytest.mark.parametrize("args", [
    ("sim", "--timeline", "{dir}/timeline.csv"),
    ("sim", "--plot={dir}/sim.png"),
    ("frag", "-m", "llama-3-8b", "--plot", "{dir}/frag.png"),
    ("share", "--capacity", "1GiB", "--plot", "{dir}/share.png"),
    ("plan", "--plot", "{dir}/plan.svg"),
    ("bench", "--device", "cpu", "--save", "{dir}/bench.json"),
])
def test_an_unwritable_output_path_is_refused_naming_the_option_before_any_work(run_cli, unwritable_dir, args):
    args = tuple(a.format(dir=unwritable_dir) for a in args)
    flag = next(a.partition("=")[0] for a in args if a.partition("=")[0] in ("--timeline", "--plot", "--save"))
    result = run_cli(*args)
    assert result.exit_code == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {flag} {unwritable_dir}/"), result.stderr
    assert "cannot be written (permission denied)" in result.stderr and "read" not in result.stderr


def test_the_write_check_leaves_an_existing_file_as_it_was_and_creates_none(tmp_path):
    from kvcalc.cli.options import check_output_path

    kept = tmp_path / "kept.csv"
    kept.write_text("old\n")
    check_output_path("--timeline", kept)
    check_output_path("--timeline", tmp_path / "new.csv")
    assert kept.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["kept.csv"]


def test_every_path_option_is_known_as_read_or_written():
    """A new option naming a file must be sorted: written (checked before any work) or read."""
    import typer.main

    from kvcalc.cli.app import INPUT_PATHS, OUTPUT_PATHS, app

    group = typer.main.get_command(app)
    seen = set()
    for name in group.list_commands(None):
        for param in group.get_command(None, name).params:
            annotation = getattr(param.type, "name", "")
            if annotation == "path" or "Path" in repr(param.type) or param.name in ("plot", "timeline", "save"):
                seen |= {opt for opt in param.opts if opt.startswith("--")}
    assert seen and seen <= set(OUTPUT_PATHS) | INPUT_PATHS, seen - set(OUTPUT_PATHS) - INPUT_PATHS
    assert set(OUTPUT_PATHS) <= seen
