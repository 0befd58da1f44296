"""Argument checks shared by the LRT experiments (one error type, one wording)."""

from __future__ import annotations

from numbers import Integral

from insitu.errors import UsageError

__all__ = ["LrtArgumentError", "check_int"]


class LrtArgumentError(UsageError, ValueError):
    """A bad argument of an LRT experiment: a ValueError for library callers and a usage error
    (exit code 2, one-line message) for the CLI."""


def check_int(name: str, value, low: int) -> int:
    """``value`` as an int, or an error naming ``name`` (bools are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        raise LrtArgumentError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)
