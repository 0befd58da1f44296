#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), checks the toolchain and runs the main job: on-device
# training on a simulated twin board. Extra arguments go to `insitu train`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
cd "$root"
insitu doctor
exec insitu train --board ultra96v2-sim "$@"
