"""Checks of arguments and the sizes users type, written once for every command and library call.

A bad value raises :class:`ArgumentError`: a ``ValueError`` for library callers and a usage error
(exit code 2, one line naming the argument) for the CLI.
"""

from __future__ import annotations

import math
import re
from numbers import Integral, Real

from insitu.errors import UsageError

__all__ = ["ArgumentError", "check_int", "check_number", "parse_size", "format_size"]


class ArgumentError(UsageError, ValueError):
    """A bad argument: names it, says what it must be and what it got."""


def check_int(name: str, value, low: int | None = 1, high: int | None = None, what: str = "") -> int:
    """``value`` as an int in ``[low, high]`` (either bound may be None), else an error naming
    ``name``; ``what`` says where a bound comes from. Bools are not integers here."""
    if not isinstance(value, bool) and isinstance(value, Integral):
        number = int(value)
        if (low is None or number >= low) and (high is None or number <= high):
            return number
    if low is not None and high is not None:
        need = f"an integer in [{low}, {high}]"
    elif low is not None:
        need = f"an integer >= {low}"
    elif high is not None:
        need = f"an integer <= {high}"
    else:
        need = "an integer"
    raise ArgumentError(f"{name} must be {need}{f' ({what})' if what else ''}, got {value!r}")


def check_number(name: str, value, positive: bool = True) -> float:
    """``value`` as a finite float (> 0 when ``positive``), else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) \
            or (positive and value <= 0):
        need = "a positive finite number" if positive else "a finite number"
        raise ArgumentError(f"{name} must be {need}, got {value!r}")
    return float(value)


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)(?:i?[bB])?\s*")


def parse_size(text) -> int:
    """Bytes from ``262144``, ``256K``, ``256KB``, ``256KiB``, ``0.5M`` (K = 1024, as
    microcontroller datasheets and ``micropython -X heapsize`` count)."""
    if isinstance(text, Integral) and not isinstance(text, bool):
        value = int(text)
    else:
        m = _SIZE.fullmatch(str(text))
        if not m:
            raise ArgumentError(f"not a memory size: {text!r} (give bytes, or K / M suffixes: "
                                "262144, 256K, 0.5M)")
        exact = float(m[1]) * {"": 1, "K": 1024, "M": 1024 ** 2}[m[2].upper()]
        if exact != int(exact):
            raise ArgumentError(f"not a whole number of bytes: {text!r}")
        value = int(exact)
    if value <= 0:
        raise ArgumentError(f"a memory size must be positive, got {text!r}")
    return value


def format_size(n: int) -> str:
    """Bytes as people read them: ``1.5 KiB``, ``512 B``."""
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"
