"""Errors that the CLI turns into a clear message and a non-zero exit.

Library code raises these (never ``sys.exit``); ``insitu.cli`` maps them to exit codes.
"""


class InsituError(Exception):
    """A user-facing error: the message says what is wrong and what to do. Exit code 1."""

    exit_code = 1


class UsageError(InsituError):
    """Bad names or arguments given by the user (unknown board, unknown dataset...). Exit code 2."""

    exit_code = 2


class DatasetError(InsituError):
    """A dataset file that is missing, truncated or corrupt; the message names the file."""


class DataFileError(DatasetError):
    """A file of the user's own dataset (``--dataset folder:|npz:|csv:``) that cannot be used as
    given (unreadable, empty class, bad labels, NaN, shapes that differ). Exit code 2, like the
    other bad arguments: the user fixes the file."""

    exit_code = 2


class BoardFileError(InsituError):
    """A malformed board TOML file; the message names the file and the key."""
