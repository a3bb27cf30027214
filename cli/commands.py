"""The registry of commands: (command name, module in kvcalc.cli that defines `command`)."""

COMMANDS: list[tuple[str, str]] = [
    ("size", "size"),
    ("frag", "frag"),
    ("share", "share"),
    ("bench", "bench"),
    ("sim", "sim"),
    ("plan", "plan"),
    ("verify", "verify"),
]
