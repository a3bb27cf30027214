"""The typer command-line interface: parse, call kvcalc.core, render. No arithmetic here."""
