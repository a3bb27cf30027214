"""`kvcalc sim` (being built; see the issue tracker)."""


def command() -> None:
    """Not built yet."""
    raise ValueError("kvcalc sim is not built yet")
