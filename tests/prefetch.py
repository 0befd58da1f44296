"""Slow one-off set-ups that a run starts at once, in the background, beside the tests that do not
need them: the boards' Debian ARM userlands (scripts/arm-userland.sh, 1-2 minutes each, mostly
downloading and unpacking). A test that needs one calls the same script, which waits on the
build's lock and then finds the root built.

Started by the process that runs the session (pytest's, or xdist's controller), only where the
selected tests include the ones that use them (their file or folder is among the arguments and
``-m`` selects system tests); the script is a no-op where the cached root is current, and rebuilds
a stale one (made by another version of the script). What is still running
when the session ends is stopped (the script removes its half-built root). The output of each
job is in the session's temporary folder, named in the summary when a job failed; the tests
that need it say why they skip or fail themselves.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from _pytest.mark.expression import Expression

SYSTEM = Path(__file__).parent / "system"
USERLAND_TESTS = SYSTEM / "test_arm_userland.py"
#: The test files (relative to the root, comma-separated) whose set-ups this session prefetches:
#: set by the controller before xdist starts its workers, which inherit it (tests/scheduling.py
#: runs those files' tests late, so no worker waits on a build that has only begun).
PREFETCHING_ENV = "INSITU_TESTS_PREFETCHING"

_jobs: list[tuple[str, subprocess.Popen, Path]] = []


def _selected(config, test_file: Path, marker: str) -> bool:
    """Whether the session's arguments and ``-m`` may select tests of ``test_file`` (marked ``marker``)."""
    markexpr = config.getoption("markexpr", "")
    if markexpr and not Expression.compile(markexpr).evaluate(lambda name, **_: name == marker):
        return False
    args = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    return any(arg == test_file or arg in test_file.parents for arg in args)


def pytest_sessionstart(session):
    config = session.config
    if hasattr(config, "workerinput") or config.getoption("collectonly"):
        return
    if not _selected(config, USERLAND_TESTS, "system") or os.geteuid() != 0:
        return
    if str(SYSTEM) not in sys.path:         # where the test modules import it from, too
        sys.path.insert(0, str(SYSTEM))
    arm_userland = importlib.import_module("arm_userland")
    logs, building = None, False
    for arch in arm_userland.ARCHES:
        # The script itself says whether the cached root is current (a no-op, a second) or stale.
        building |= not (arm_userland.cache_root() / arch / ".insitu-userland").is_file()
        logs = logs or Path(tempfile.mkdtemp(prefix="insitu-prefetch-"))
        log = logs / f"arm-userland-{arch}.log"
        out = open(log, "w")
        process = subprocess.Popen(["bash", str(arm_userland.SCRIPT), arch], stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        _jobs.append((f"the {arch} userland", process, log))
    if building:
        os.environ[PREFETCHING_ENV] = str(USERLAND_TESTS.relative_to(config.rootpath))


def pytest_sessionfinish(session):
    for _, process, _ in _jobs:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def pytest_terminal_summary(terminalreporter):
    for what, process, log in _jobs:
        if process.returncode not in (0, None, -signal.SIGTERM):
            terminalreporter.write_line(f"prefetch of {what} failed (exit {process.returncode}): {log}")
