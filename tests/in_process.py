"""`insitu ARGS` run by click inside the test's own process, for the tests of what a command
refuses: the same command objects, checks, messages and exit codes (insitu's group turns its
errors into them) as the console script, without starting an interpreter and importing insitu
again for each case (about 0.4 s a run, more with the command's own imports). The console script
itself is run by each module's other tests."""

from __future__ import annotations

import os
import subprocess
import traceback

from click.testing import CliRunner


def insitu_in_process(*args, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    """What :func:`conftest.insitu_cli` returns (``returncode``, ``stdout``, ``stderr``), for a run
    of ``insitu ARGS`` in this process, with ``env`` set and in ``cwd`` while it runs. An exception
    that escapes the command leaves its traceback in ``stderr``, as Python prints it for the
    console script (exit code 1)."""
    from insitu.cli import main

    before = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, [str(a) for a in args], env=env)
    finally:
        os.chdir(before)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        text = "".join(traceback.format_exception(result.exception))
        stderr += text if text.startswith("Traceback") else "Traceback (most recent call last):\n" + text
    return subprocess.CompletedProcess(["insitu", *map(str, args)], result.exit_code, result.stdout, stderr)
