"""tests/scheduling.py under pytest-xdist as scripts/test.sh runs it (``-n 2 --dist loadgroup``):
tests that share a module fixture run on one worker, so the fixture is set up once per run. The
premise broke once without a sound: pytest 9.2 with xdist 3.8 ran the suite, grouping nothing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]

MODULE = '''
import json, os
import pytest

PER_WORKER_FIXTURES = ("cheap",)

def _note(what):
    with open(os.environ["SETUPS"], "a") as fh:
        fh.write(json.dumps([what, os.environ.get("PYTEST_XDIST_WORKER")]) + "\\n")

@pytest.fixture(scope="module")
def costly():
    _note("costly")

@pytest.fixture(scope="module")
def cheap():
    _note("cheap")

@pytest.mark.parametrize("i", range(6))
def test_uses_costly(costly, i):
    _note(f"costly-test-{i}")

@pytest.mark.parametrize("i", range(6))
def test_uses_cheap(cheap, i):
    _note(f"cheap-test-{i}")
'''


def test_tests_sharing_a_module_fixture_run_on_one_worker(tmp_path):
    (tmp_path / "test_shared.py").write_text(MODULE)
    (tmp_path / "conftest.py").write_text("")
    setups = tmp_path / "setups.jsonl"
    env = {"SETUPS": str(setups), "PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "scheduling", "-p", "no:cacheprovider",
                          "-n", "2", "--dist", "loadgroup", "-v", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    notes = [json.loads(line) for line in setups.read_text().splitlines()]
    workers = {what: worker for what, worker in notes}
    assert [what for what, _ in notes].count("costly") == 1, notes     # set up once in the run
    assert {workers[f"costly-test-{i}"] for i in range(6)} == {workers["costly"]}, notes
    # A fixture the module calls cheap ties nothing: its tests are units of their own (xdist
    # names a grouped test NODEID@GROUP).
    passed = [line.split()[-1] for line in run.stdout.splitlines() if "PASSED" in line]
    assert len(passed) == 12 and all(("@" in test) == ("uses_costly" in test) for test in passed), passed
