"""`kvcalc share` (being built; see the issue tracker)."""


def command() -> None:
    """Not built yet."""
    raise ValueError("kvcalc share is not built yet")
