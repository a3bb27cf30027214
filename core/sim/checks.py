"""Checks of `kvcalc sim`'s options that no single model object owns: numbers that must be finite, byte
sizes that must stay within float range, options that only one workload mode uses, and a scale guard.

Every check raises ValueError with one line that names the option, the value as typed, and the fix
(DESIGN: "never clamp or guess silently"). `None` means "not given"; the defaults are applied after these
checks, so an option given with its default value is still refused where it does not apply.
"""

from __future__ import annotations

import math
import sys

from ..units import parse_bytes

# Requests per run. Measured (QA, 2-core machine): 10,000 constructed requests take 6 s at 1 req/s and 18 s
# overloaded at 100 req/s, so 10^6 requests take tens of minutes to hours, silently off a TTY. Above the limit the
# run is refused (`--requests --help` states the limit); more requests do not change the statistics much.
MAX_REQUESTS = 1_000_000

# Constructed-workload options and what they mean without a trace (for the "applies to" errors).
CONSTRUCTED_ONLY = ("--rate", "--requests", "--prompt-dist", "--output-dist", "--arrival", "--burstiness")


def finite_float(flag: str, value: float | str, *, allow_inf: bool = False, inf_meaning: str = "") -> float:
    """`value` (a float or the text typed) as a finite float; `inf` only when `allow_inf` (then it is returned
    as math.inf and means `inf_meaning`). A literal that overflows (1e400) is refused, not read as inf."""
    text = str(value).strip()
    if isinstance(value, str):
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{flag} {text!r} is not a number") from None
    else:
        number = float(value)
    if allow_inf and number == math.inf and text.lower().lstrip("+") in ("inf", "infinity"):
        return math.inf
    if not math.isfinite(number):
        hint = f" ({text} overflows a float)" if text.lower().lstrip("+-") not in ("inf", "infinity", "nan") else ""
        allowed = f"; inf means {inf_meaning}" if allow_inf else ""
        raise ValueError(f"{flag} {text}: give a finite number{hint}{allowed}")
    return number


def byte_count(flag: str, text: str, unit: str = "bytes") -> int:
    """A byte size or byte rate (`80GiB`, `3.35e12`; `unit` names it in errors) as an exact positive int
    that a float can still hold."""
    try:
        value = parse_bytes(text)
    except ValueError as exc:
        if "must be positive" in str(exc):
            raise ValueError(f"{flag} {text}: must be a positive number of {unit}, e.g. 25GB") from None
        raise ValueError(f"{flag} {text}: {exc}") from None
    if value > sys.float_info.max:
        raise ValueError(f"{flag} {text}: too large to compute with (above {sys.float_info.max:.3g}); "
                         "give the real figure")
    return value


def check_mode_options(*, trace: bool, given: dict[str, bool], limit: bool, time_scale: bool) -> None:
    """Options of one workload mode given in the other: refuse them, saying which mode uses them.

    `given` maps each constructed-workload flag (CONSTRUCTED_ONLY) to whether the user gave it.
    """
    if trace:
        wrong = [flag for flag in CONSTRUCTED_ONLY if given.get(flag)]
        if wrong:
            raise ValueError(
                f"{', '.join(wrong)} {'applies' if len(wrong) == 1 else 'apply'} to a constructed workload, not to "
                f"--trace (a trace brings its own arrivals and lengths); drop {'it' if len(wrong) == 1 else 'them'}, "
                "or use --time-scale/--limit"
            )
        return
    if limit:
        raise ValueError("--limit applies to --trace (the first N requests of the trace); "
                         "for a constructed workload use --requests")
    if time_scale:
        raise ValueError("--time-scale applies to --trace; for a constructed workload change --rate")


def check_requests(count: int) -> None:
    """The scale guard: refuse runs that would take hours rather than run silently."""
    if count > MAX_REQUESTS:
        raise ValueError(
            f"--requests {count:,} is above the simulator's limit of {MAX_REQUESTS:,} requests per run "
            "(10,000 take 6-18 s, so 10^6 already take tens of minutes); simulate fewer requests"
        )
