"""The root app: help, version, unknown commands and options are one-line errors with exit 2."""

import subprocess
import sys


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
    for other in ("kvcalc.cli.frag", "kvcalc.cli.share", "kvcalc.cli.sim", "kvcalc.cli.bench"):
        assert f"'{other}'" not in loaded


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
