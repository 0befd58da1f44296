#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the whole test suite in parallel; benchmarks are
# excluded by pyproject's addopts (run them with: .venv/bin/python -m pytest -m benchmark -s).
# Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The tests run on the Cortex-M7 twin and the FPGA boards' image twin (Python 3.10, pynq 3.0.1) too.
INSITU_SETUP_MCU=1 INSITU_SETUP_BOARD_IMAGE=1 source "$root/scripts/setup.sh"
cd "$root"
# On every core (pytest-xdist), each worker handed the longest tests first and the tests that share
# a costly fixture together (tests/scheduling.py). INSITU_TEST_WORKERS=0 runs in this process.
exec python -m pytest -n "${INSITU_TEST_WORKERS:-auto}" --dist loadgroup "$@"
