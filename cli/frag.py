"""`kvcalc frag` (being built; see the issue tracker)."""


def command() -> None:
    """Not built yet."""
    raise ValueError("kvcalc frag is not built yet")
