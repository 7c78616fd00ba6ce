"""How much memory a command may ask for: a limit from the machine's physical memory, and a
check that refuses a job before it allocates more."""

from __future__ import annotations

import os

#: Share of the physical memory one command may plan to use (``memory_limit``): a benchmark whose
#: estimated peak, or an input array (``rattn rank``) whose declared size, is larger is refused
#: before anything is allocated, instead of dying of MemoryError or swapping the machine to a halt.
MEMORY_FRACTION = 0.8

#: Used when the physical memory cannot be read (no ``os.sysconf``, e.g. on Windows).
FALLBACK_MEMORY_LIMIT = 8 * 2**30


def memory_limit() -> tuple[int, str]:
    """(bytes, description) of the most memory one command may plan to use: MEMORY_FRACTION of
    the physical memory (``SC_PAGE_SIZE × SC_PHYS_PAGES``), or FALLBACK_MEMORY_LIMIT where that
    cannot be read."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        physical = -1
    if physical <= 0:
        return FALLBACK_MEMORY_LIMIT, "the fallback limit (physical memory unknown)"
    return int(MEMORY_FRACTION * physical), (
        f"{MEMORY_FRACTION:.0%} of the {physical / 2**30:.3g} GiB of physical memory"
    )


def format_bytes(n: int) -> str:
    """``n`` in bytes and in GiB, e.g. "3221225472 bytes (3 GiB)"."""
    return f"{n} bytes ({n / 2**30:.3g} GiB)"


def require_memory(what: str, needed: int) -> None:
    """Raise ValueError naming ``what``, the estimate ``needed`` and the limit (``memory_limit``)
    when ``needed`` bytes are more than the limit."""
    limit, why = memory_limit()
    if needed > limit:
        raise ValueError(
            f"{what} needs about {format_bytes(needed)}, more than the limit of "
            f"{format_bytes(limit)}, {why}"
        )
