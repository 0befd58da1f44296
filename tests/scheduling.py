"""How the suite shares out its tests between pytest-xdist's workers (scripts/test.sh runs it
with ``-n auto --dist loadgroup``), and the durations that the sharing goes by.

* **Units.** xdist's ``loadgroup`` sends a group of tests (an ``xdist_group`` mark) to one worker
  and every other test on its own. Here, the tests of a module that share a module- or class-scoped
  fixture (with the same parameters) form one group, so a fixture that builds, trains or flashes
  is set up once per run, not once per worker. A module lists in ``PER_WORKER_FIXTURES`` the
  module fixtures cheap enough to set up on each worker (a temporary folder): they do not tie
  tests together. An ``xdist_group`` mark a test carries itself wins.
* **Order.** The units run longest first (from ``tests/durations.json``; a test it does not
  list counts ``DEFAULT_SECONDS``), so the long ones start at once and the short ones fill the
  end (xdist hands each worker its next unit when it is nearly idle). xdist's own reordering by
  group size is turned off.
* **Prefetched set-ups.** The tests of a file whose set-up the session builds in the background
  (tests/prefetch.py names them in ``INSITU_TESTS_PREFETCHING``) are ordered as if they took
  ``PREFETCHED_SECONDS``: after the long tests, before the many short ones, so the build has the
  long tests' time to finish and the short ones fill the other worker while they run.
* **Durations.** ``pytest --store-durations`` (serial or parallel) writes each test's seconds
  (setup + call + teardown) into ``tests/durations.json``, keeping the entries of tests that did
  not run. The file is only a guide for the order: a stale one makes the run less even, never
  wrong.

Without ``--dist loadgroup`` (a plain ``pytest``, or ``-n 2`` alone) none of this applies.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from prefetch import PREFETCHING_ENV

DURATIONS = Path(__file__).with_name("durations.json")
#: A test that the durations file does not list (most take a few hundredths of a second).
DEFAULT_SECONDS = 0.1
#: Tests faster than this are left out of the durations file (they count DEFAULT_SECONDS).
STORE_ABOVE_SECONDS = 0.3
#: Where a unit that waits on a prefetched build is ordered (as if it took this long).
PREFETCHED_SECONDS = 1.0

_UNIT = pytest.StashKey[str]()
_COST = pytest.StashKey[float]()


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help=f"write each test's seconds into {DURATIONS.name} (the parallel run's order)")


def _loadgroup(config) -> bool:
    """``--dist loadgroup``: in the controller its option; in a worker, xdist's flag for it."""
    return getattr(config.option, "dist", "no") == "loadgroup" or getattr(config.option, "loadgroup", False)


def pytest_configure(config):
    if _loadgroup(config):
        config.option.loadscopereorder = False      # keep the order _LongestFirst gives
        config.pluginmanager.register(_Units(), "insitu-units")
        config.pluginmanager.register(_LongestFirst(), "insitu-longest-first")
    if config.getoption("store_durations"):
        config.pluginmanager.register(_DurationRecorder(config), "insitu-durations")


def _durations() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


def _shared_fixtures(item) -> list[str]:
    """The keys of the module- and class-scoped fixtures ``item`` uses: the fixture's name with
    the parameters of the item's module-scoped parametrization (each parameter is its own set-up)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    cheap = set(getattr(item.module, "PER_WORKER_FIXTURES", ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    keys, scoped_params = [], []
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if not defs or defs[-1].scope not in ("module", "class", "package"):
            continue
        if name in params:
            # xdist takes what follows the last "@" after the last "]" as the group's name
            scoped_params.append(re.sub(r"[\[\]@\s]", "_", f"{name}={params[name]!r}"))
        if name not in cheap:
            keys.append(name)
    suffix = "(" + ",".join(sorted(scoped_params)) + ")" if scoped_params else ""
    return [f"{item.nodeid.split('::')[0]}::{name}{suffix}" for name in keys]


class _Units:
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items):
        """Before xdist reads the marks: one ``xdist_group`` per set of tests joined by a shared
        fixture (union-find over the fixtures' keys), and each test's unit and estimated seconds."""
        _mark_units(items)


class _LongestFirst:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        """After pytest's own ordering by fixture: longest unit first; a unit's tests keep their
        order."""
        cost: dict[str, float] = {}
        first: dict[str, int] = {}
        prefetching = set(filter(None, os.environ.get(PREFETCHING_ENV, "").split(",")))
        deferred = set()
        for index, item in enumerate(items):
            unit = item.stash[_UNIT]
            cost[unit] = cost.get(unit, 0.0) + item.stash[_COST]
            first.setdefault(unit, index)
            if item.nodeid.split("::")[0] in prefetching:
                deferred.add(unit)
        for unit in deferred:
            cost[unit] = PREFETCHED_SECONDS
        items.sort(key=lambda item: (-cost[item.stash[_UNIT]], first[item.stash[_UNIT]]))


def _mark_units(items) -> None:
    durations = _durations()
    parent: dict[str, str] = {}

    def find(key: str) -> str:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    shared = {}
    for item in items:
        keys = _shared_fixtures(item)
        shared[item.nodeid] = keys
        for key in keys[1:]:
            parent[find(key)] = find(keys[0])
    for item in items:
        item.stash[_COST] = durations.get(item.nodeid, DEFAULT_SECONDS)
        own = [mark.args[0] if mark.args else mark.kwargs.get("name", "default")
               for mark in item.iter_markers("xdist_group")]
        if own:
            item.stash[_UNIT] = "@" + "_".join(sorted(map(str, own)))
        elif shared[item.nodeid]:
            group = find(shared[item.nodeid][0])
            item.add_marker(pytest.mark.xdist_group(group))
            item.stash[_UNIT] = "@" + group
        else:
            item.stash[_UNIT] = item.nodeid


class _DurationRecorder:
    """Sums each test's phases as their reports arrive (from the workers too) and writes them."""

    def __init__(self, config):
        self.config = config
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report):
        nodeid = report.nodeid
        if "@" in nodeid and nodeid.rfind("@") > nodeid.rfind("]"):
            nodeid = nodeid[:nodeid.rfind("@")]         # loadgroup's group suffix
        self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workerinput"):         # a worker: the controller writes
            return
        merged = _durations()
        for nodeid, seconds in self.seconds.items():
            if seconds > STORE_ABOVE_SECONDS:
                merged[nodeid] = round(seconds, 1)
            else:
                merged.pop(nodeid, None)
        tmp = DURATIONS.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
        tmp.replace(DURATIONS)
