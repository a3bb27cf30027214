"""`kvcalc bench` (being built; see the issue tracker)."""


def command() -> None:
    """Not built yet."""
    raise ValueError("kvcalc bench is not built yet")
