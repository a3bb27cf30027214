"""`kvcalc size` (being built; see the issue tracker)."""


def command() -> None:
    """Not built yet."""
    raise ValueError("kvcalc size is not built yet")
