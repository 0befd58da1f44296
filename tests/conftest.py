"""Shared test helpers: the installed `insitu` console script and its environment, insitu's cache
as a test sees it, and the suite's Hypothesis settings."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from insitu.resources import cache_dir
from prefetch import pytest_sessionfinish, pytest_sessionstart as start_prefetch, pytest_terminal_summary  # noqa: F401
from scheduling import pytest_addoption, pytest_configure  # noqa: F401  (the suite's parallel run)

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

# ------------------------------------------------------------------------------ insitu's cache
#
# insitu finds its cache as resources.cache_dir resolves it: $INSITU_CACHE, else
# $XDG_CACHE_HOME/insitu, else ~/.cache/insitu. A test that needs a cache of its own (to look at what
# a run wrote there, or to see that nothing was built) sets INSITU_CACHE, the first of the three, so
# whatever the outer environment sets cannot leak in: setting XDG_CACHE_HOME alone loses to an
# INSITU_CACHE that the user exported (the README documents it; scripts/setup.sh builds there).
# `insitu_cache` is the fixture for a test; `cache_env` the same variable for the subprocesses of a
# module-scoped fixture.

#: The cache of the environment the suite runs in, read before any test redirects it: where
#: `scripts/setup.sh` put the slow one-offs (the Cortex-M7 twin's firmware, the board image) and where
#: the tests that do not redirect the cache share pretrained models and built twins.
SHARED_CACHE = cache_dir()


def cache_env(folder, share: tuple[str, ...] = (), own_verilog: bool = False) -> dict[str, str]:
    """The environment variables that make insitu (this process or a subprocess) use ``folder`` as
    its cache, whatever the outer environment sets. The folders of the cache named in ``share``
    (``"mcu-twin"``, ``"rtl-twin"``, ``"lrt"`` ...) are linked to the shared ones: slow one-offs
    that the test does not look at are built once for the whole suite. The converted Verilog
    (keyed by its sources, never stale; 10 s a conversion) is shared too, unless ``own_verilog``
    (a cache the test checks is left empty)."""
    folder = Path(folder)
    for name in (*share, *(() if own_verilog else ("rtl-verilog",))):
        (SHARED_CACHE / name).mkdir(parents=True, exist_ok=True)
        if not (folder / name).is_symlink():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).symlink_to(SHARED_CACHE / name)
    return {"INSITU_CACHE": str(folder)}


@pytest.fixture
def insitu_cache(tmp_path, monkeypatch) -> Path:
    """An empty cache of this test's own (``cache_dir()`` is it, here and in the `insitu` commands
    that `run_cli` starts); returns its root, so ``insitu_cache / "lrt"`` is ``cache_dir("lrt")``."""
    root = tmp_path / "insitu-cache"
    root.mkdir()
    for name, value in cache_env(root, own_verilog=True).items():
        monkeypatch.setenv(name, value)
    assert cache_dir() == root
    return root


# ------------------------------------------------------------------------------ Hypothesis
#
# Every machine runs the same examples, so a property test cannot pass on one machine and fail on
# the next by chance (or pass only the second time):
# * derandomize: each test's examples come from a seed hashed from the test itself, not a random
#   one per run (Hypothesis' own "ci" profile, which it loads only where a CI variable is set: here
#   always, so a laptop runs what CI runs);
# * database=None: no .hypothesis/ folder in the checkout, whose saved failures would be replayed
#   first on the one machine that found them (an example worth keeping goes into the test as an
#   @example, where every machine runs it);
# * deadline=None and no too_slow health check: timing depends on the machine and its load;
# * Hypothesis also draws constants found in the source of the project's modules already imported
#   (its "local constants"), so which tests ran before, or a file run alone, changed the examples
#   even with derandomize: `pytest_sessionstart` empties that pool for this profile.
# The examples then depend only on the test's source and the Hypothesis version, which
# scripts/constraints.txt pins (one per Python: 3.10 draws other examples than 3.11/3.12).
# To search for new failures: `pytest --hypothesis-profile=explore` (random seeds, more examples).
settings.register_profile("insitu", derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", derandomize=False, database=None, deadline=None, print_blob=True,
                          max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("insitu")


def pytest_sessionstart(session):
    start_prefetch(session)
    if settings.get_current_profile_name() != "insitu":
        return
    try:        # Hypothesis' internals (the versions scripts/constraints.txt pins); absent: no pool
        from hypothesis.internal.conjecture import providers
    except ImportError:
        return
    if all(hasattr(providers, name) for name in ("_get_local_constants", "Constants", "CONSTANTS_CACHE")):
        no_constants = providers.Constants()
        providers._get_local_constants = lambda: no_constants
        providers.CONSTANTS_CACHE.cache.clear()


def insitu_cli(*args, check=False, timeout=300, env=None, **kwargs) -> subprocess.CompletedProcess:
    """Run the real `insitu` console script of this interpreter's environment."""
    exe = VENV_BIN / "insitu"
    if not exe.exists():
        pytest.fail(f"{exe} is missing: install insitu into this environment (bash scripts/setup.sh)")
    full_env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, check=check, env=full_env, cwd=kwargs.pop("cwd", ROOT), **kwargs)


@pytest.fixture
def run_cli():
    return insitu_cli


_SUITES = ("unit", "rtl", "firmware", "system")


def pytest_collection_modifyitems(config, items):
    """Every test carries the marker of its folder (tests/unit -> unit ...), so `-m unit` is the
    whole fast inner loop even where a module forgot its `pytestmark`."""
    for item in items:
        suite = Path(str(item.fspath)).parent.name
        if suite in _SUITES and not item.get_closest_marker(suite):
            item.add_marker(getattr(pytest.mark, suite))
