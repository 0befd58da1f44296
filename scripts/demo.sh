#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), checks the toolchain and runs the main job: on-device
# training on a simulated twin board: the TT network with its contractions on the twin's PEs.
# Extra arguments go to `insitu train` (a later option wins: `demo.sh --algo lrt`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
cd "$root"
# The toolchain report goes to stderr so that `demo.sh --json` prints clean JSON; a missing optional
# tool is reported but does not stop the training.
insitu doctor >&2 || echo "[demo] some tools are missing (see above); training goes on" >&2
exec insitu train --board ultra96v2-sim --algo tt --samples 6000 "$@"
