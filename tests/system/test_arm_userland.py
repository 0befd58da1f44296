"""The boards' PS-side Python on their own kind of CPU: TT training on a twin under qemu-user gives
x86's result, step for step.

The ZedBoard's PS is a 32-bit Cortex-A9 (Debian armhf), where NumPy's default integer is int32
and an int product past 2**31 wraps without a word; the Ultra96-V2's is a Cortex-A53 (arm64).
``scripts/arm-userland.sh`` builds their Debian userlands once into insitu's cache (about 1.5 min
each, as root); without root and without a cached one these tests skip and say so.
"""

import json
import os

import pytest

import arm_userland
from conftest import cache_env, insitu_cli

pytestmark = pytest.mark.system
#: A wheel of the tree (seconds): built on each worker, so the two boards' runs go side by side.
PER_WORKER_FIXTURES = ("site",)

#: The TT paper network. On the 32-bit CPU, 6 steps of batch 64 and 100 test samples: the fewest
#: whose counters pass 2**31 (macs_16x4 counts the probes' inferences too: 2,256,371,712), about
#: 50 s under qemu-arm. On the 64-bit one (NumPy's int is int64 there) a step and a probe.
TRAIN = ["train", "--algo", "tt", "--model", "paper", "--json"]
SAMPLES = {"armhf": ["--samples", "384", "--test-samples", "100"],
           "arm64": ["--samples", "64", "--test-samples", "20"]}
#: What the host's clock measures, not the run.
HOST_TIMING = ("seconds", "samples_per_second")
#: Exact: the accelerator's counters and everything counted. An int32 wrap shows in them.
EXACT = ("samples", "accuracy", "test_samples", "pl_cycles", "cycles_by_op", "dma_bytes", "ops",
         "macs_16x4", "macs_16x16", "ranks", "pruned_ranks", "parameters", "memory_bits")
#: Floats computed by NumPy's exp and log and by BLAS may differ in their last bit between x86
#: and ARM (libm, SIMD kernels, summation order); an int32 wrap is no last-bit difference.
REL = 1e-9


def same(got, want, path="") -> list[str]:
    """Where two JSON documents differ: ints, strings and structure exactly, floats to ``REL``."""
    if isinstance(want, dict) and isinstance(got, dict):
        missing = [f"{path}.{k}: in one only" for k in sorted(set(got) ^ set(want))]
        return missing + [d for k in sorted(set(got) & set(want)) for d in same(got[k], want[k], f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in same(g, w, f"{path}[{i}]")]
    if isinstance(want, float) and isinstance(got, float):
        return [] if got == pytest.approx(want, rel=REL) else [f"{path}: {got!r} != {want!r}"]
    return [] if (type(got), got) == (type(want), want) else [f"{path}: {got!r} != {want!r}"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The working tree's insitu for the guests' PYTHONPATH (the cached roots do not hold it)."""
    return arm_userland.insitu_site(tmp_path_factory.mktemp("insitu-site") / "site")


_roots: dict = {}


def userland(arch: str):
    """The cached (or freshly built) root of ``arch``, or a skip that says why there is none."""
    if arch not in _roots:
        try:
            _roots[arch] = arm_userland.userland(arch)
        except arm_userland.Unavailable as exc:
            _roots[arch] = exc
    root = _roots[arch]
    if isinstance(root, Exception):
        pytest.skip(f"no {arch} userland: {root}")
    return root


@pytest.mark.parametrize("arch, machine, int_dtype, product", [
    ("armhf", "armv7l", "int32", 605032704),        # 70000 * 70000 = 4.9e9 wraps in 32 bits
    ("arm64", "aarch64", "int64", 4900000000),
])
def test_userland_numpy_integers(arch, machine, int_dtype, product, tmp_path):
    """The premise: armhf's NumPy makes int32 of Python ints and wraps silently; arm64's does not."""
    root = userland(arch)
    run = arm_userland.run_python(arch, root, ["-c", """
import json, platform, sys, warnings
import numpy as np
warnings.simplefilter("error")             # an overflow warning would not be silent
print(json.dumps({"machine": platform.machine(), "maxsize": sys.maxsize, "numpy": np.__version__,
                  "dtype": str(np.array([1, 2]).dtype), "product": int((np.array([70000]) * 70000)[0])}))
"""], timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert (got["machine"], got["dtype"], got["product"]) == (machine, int_dtype, product), got


@pytest.mark.parametrize("arch", list(arm_userland.ARCHES))
def test_tt_training_on_the_twin_matches_x86(arch, site, tmp_path):
    """`insitu train --algo tt` on the arch's twin board: the same accuracy, cycles, DMA bytes and
    MAC counts under qemu (the board's CPU) as on x86, and the same loss curve (to its last bits)."""
    root = userland(arch)
    board = arm_userland.ARCHES[arch].board
    args = [*TRAIN, *SAMPLES[arch], "--board", board]
    # Each run its own cache: the twin writes its overlay there.
    guest = arm_userland.run_python(arch, root, ["-m", "insitu", *args], pythonpath=[site],
                                    env=cache_env(tmp_path / "guest-cache"),
                                    timeout=540, cwd=tmp_path)
    assert guest.returncode == 0, guest.stderr[-3000:]
    host = insitu_cli(*args, env=cache_env(tmp_path / "host-cache"), timeout=300)
    assert host.returncode == 0, host.stderr[-3000:]
    got, want = json.loads(guest.stdout), json.loads(host.stdout)
    if arch == "armhf":
        assert want["macs_16x4"] > 2**31, "the run no longer passes 2**31: it checks less than it says"
    for key in EXACT:
        assert got[key] == want[key], f"{arch}: {key} is {got[key]!r}, x86 gives {want[key]!r}"
    assert [p["samples"] for p in got["curve"]] == [p["samples"] for p in want["curve"]]
    differences = same({k: v for k, v in got.items() if k not in HOST_TIMING},
                       {k: v for k, v in want.items() if k not in HOST_TIMING})
    assert not differences, f"{arch} differs from x86: " + "; ".join(differences)
    if os.environ.get("INSITU_ARM_TIMES"):
        print(f"\n{arch}: {got['seconds']:.1f} s of training under qemu, {want['seconds']:.1f} s on x86")
