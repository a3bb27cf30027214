"""The memory this machine has available, and a check made before a large allocation rather than after.

Work whose size an option sets (`frag --count 1e9` holds 8 GB of lengths) is refused up front, with the
bytes it needs and the bytes there are, instead of running for a minute and being killed by the kernel.
"""

from __future__ import annotations

import os

from .errors import ParameterError
from .units import format_bytes

_MEMINFO = "/proc/meminfo"


def available_bytes() -> int | None:
    """Bytes that can be allocated without swapping: Linux's MemAvailable (free memory plus the page cache
    and other memory the kernel can reclaim), else free physical pages (os.sysconf); None when neither is
    known, and then nothing is refused."""
    try:
        with open(_MEMINFO, encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    number, unit = line.split()[1:3]
                    return int(number) * (1024 if unit.lower() == "kb" else 1)  # the kernel's kB are KiB
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages, page_bytes = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    return pages * page_bytes if pages > 0 and page_bytes > 0 else None


def check_fits(needed_bytes: int, what: str, fix: str, *params: str) -> None:
    """ValueError when `needed_bytes` exceed the memory available, naming both figures, `what` and `fix`; a
    ParameterError when the message names `params` (parameters the fix changes)."""
    available = available_bytes()
    if available is not None and needed_bytes > available:
        message = (f"{what} would take {format_bytes(needed_bytes)} of memory; this machine has "
                   f"{format_bytes(available)} available: {fix}")
        raise ParameterError(message, *params) if params else ValueError(message)
