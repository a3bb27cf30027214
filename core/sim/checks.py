"""Checks of `kvcalc sim`'s options that no single model object owns: numbers that must be finite, byte
sizes that must stay within float range, options that only one workload mode uses, and a scale guard.

Every check raises a ParameterError with one line that names the option (its SimOptions field), the value
as typed, and the fix — nothing is clamped or guessed. `None` means "not given"; the defaults are applied
after these checks, so an option given with its default value is still refused where it does not apply.
"""

from __future__ import annotations

import math
import sys

from ..errors import ParameterError
from ..units import format_int_short, parse_bytes

# Requests per run. Measured on a 2-core machine: 10,000 constructed requests take 6 s at 1 req/s and 18 s
# overloaded at 100 req/s, so 10^6 requests take tens of minutes to hours, silently off a TTY. Above the limit the
# run is refused (the option's help states the limit); more requests do not change the statistics much.
MAX_REQUESTS = 1_000_000

# Upper bounds of the integer options, checked before any arithmetic: past them a count reaches float
# arithmetic (memory plan, step time) or a numpy int64 array and overflows instead of being refused. Token and
# sequence counts stop at int32, as the pool's block ids and per-block fills do. tp is checked by
# kvcalc.core.model.layers.check_tp (MAX_TP), as in every command. Each option's help states its bound.
INT32_MAX = 2**31 - 1
INT_BOUNDS = {
    "block_size": INT32_MAX,
    "max_batched_tokens": INT32_MAX,
    "max_seqs": INT32_MAX,
    "max_model_len": INT32_MAX,
    "spec_tokens": INT32_MAX,
}

# Options of a constructed workload, refused with a trace.
CONSTRUCTED_ONLY = ("rate", "requests", "prompt_dist", "output_dist", "arrival", "burstiness")


def finite_float(name: str, value: float | str, *, allow_inf: bool = False, inf_meaning: str = "") -> float:
    """`value` (a float or the text typed) as a finite float; `inf` only when `allow_inf` (then it is returned
    as math.inf and means `inf_meaning`). A literal that overflows (1e400) is refused, not read as inf."""
    text = str(value).strip()
    if isinstance(value, str):
        try:
            number = float(text)
        except ValueError:
            raise ParameterError(f"{name} {text!r} is not a number", name) from None
    else:
        number = float(value)
    if allow_inf and number == math.inf and text.lower().lstrip("+") in ("inf", "infinity"):
        return math.inf
    if not math.isfinite(number):
        hint = f" ({text} overflows a float)" if text.lower().lstrip("+-") not in ("inf", "infinity", "nan") else ""
        allowed = f"; inf means {inf_meaning}" if allow_inf else ""
        raise ParameterError(f"{name} {text}: give a finite number{hint}{allowed}", name)
    return number


def byte_count(name: str, text: str, unit: str = "bytes") -> int:
    """A byte size or byte rate (`80GiB`, `3.35e12`; `unit` names it in errors) as an exact positive int
    that a float can still hold."""
    try:
        value = parse_bytes(text)
    except ValueError as exc:
        if "must be positive" in str(exc):
            raise ParameterError(f"{name} {text}: must be a positive number of {unit}, e.g. 25GB", name) from None
        message = str(exc) if unit == "bytes" else str(exc).replace("the memory size", f"the {unit} figure")
        raise ParameterError(f"{name} {text}: {message}", name) from None
    if value > sys.float_info.max:
        raise ParameterError(f"{name} {text}: too large to compute with (above {sys.float_info.max:.3g}); "
                             "give the real figure", name)
    return value


def check_int_bounds(values: dict[str, int | None]) -> None:
    """Refuse an integer option above its bound in INT_BOUNDS (None: not given)."""
    for name, bound in INT_BOUNDS.items():
        value = values.get(name)
        if value is not None and value > bound:
            raise ParameterError(f"{name} {format_int_short(value)} is above its limit of {bound:,}; give a real "
                                 "figure", name)


def check_mode_options(*, trace: bool, given: dict[str, bool], limit: bool, time_scale: bool) -> None:
    """Options of one workload mode given in the other: refuse them, saying which mode uses them.

    `given` maps each constructed-workload option (CONSTRUCTED_ONLY) to whether the user gave it.
    """
    if trace:
        wrong = [name for name in CONSTRUCTED_ONLY if given.get(name)]
        if wrong:
            raise ParameterError(
                f"{', '.join(wrong)} {'applies' if len(wrong) == 1 else 'apply'} to a constructed workload, not to "
                f"trace (it brings its own arrivals and lengths); drop {'it' if len(wrong) == 1 else 'them'}, "
                "or use time_scale/limit", *wrong, "trace", "time_scale", "limit"
            )
        return
    if limit:
        raise ParameterError("limit applies to trace (how many of its first arrivals to take); for a constructed "
                             "workload use requests", "limit", "trace", "requests")
    if time_scale:
        raise ParameterError("time_scale applies to trace; for a constructed workload change rate",
                             "time_scale", "trace", "rate")


def check_requests(requests: int) -> None:
    """At least one request, and the scale guard: refuse runs that would take hours rather than run silently."""
    if requests < 1:
        raise ParameterError(f"requests {requests} must be at least 1", "requests")
    if requests > MAX_REQUESTS:
        raise ParameterError(
            f"requests {requests:,} is above the simulator's limit of {MAX_REQUESTS:,} per run "
            "(10,000 take 6-18 s, so 10^6 already take tens of minutes); simulate fewer", "requests"
        )
