"""The firmware on 32-bit words: the Cortex-M7 twin (MicroPython v1.28.0 in QEMU), with the
firmware deployed as ``.py`` sources, so the board itself compiles every module (viper included).

A 32-bit MicroPython differs from the unix port where 64-bit habits hide: small ints have 31 bits
(0x40000000 and up are heap objects, and viper refuses them as constants), a viper function that
returns an int of 2**30 or more boxes it, big-int arithmetic allocates. Here:

- every firmware module compiles from source and ``mpremote run FILE`` of each source runs on a
  board that has the firmware runtime but no generated ``tte_model``;
- the ``.py`` fallback of ``insitu.mcu.flash`` trains through fw_train.serve() bit-exactly like
  the host simulator;
- a training step allocates no heap (gc.mem_alloc() with the collector off), for a plain scheme,
  one whose bias steps leave 32-bit words (the old big-int path), and with accumulated gradients.

One twin for the module: the runtime sources are deployed once, each test adds its model.
"""

import binascii
import subprocess

import numpy as np
import pytest

from insitu.sparse import abi, golden
from insitu.mcu.device import TrainingDevice
from insitu.mcu.flash import firmware_files as runtime_files
from insitu.mcu.flash import flash
from insitu.sparse.simulate import Simulator
from insitu.mcu.board_runs import Prepared
from insitu.mcu.twin import McuTwin, find_tool
from insitu.resources import package_dir
from insitu.training import sample_order

pytestmark = pytest.mark.firmware

MODEL, TASK, SEED = "mbv2-tiny", "digits", 0
FIRMWARE = package_dir("firmware")


def mpremote(port, *args, timeout=60) -> str:
    run = subprocess.run([find_tool("mpremote"), "connect", port, *args], capture_output=True,
                         text=True, timeout=timeout)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    return run.stdout


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """The Cortex-M7 twin with the firmware runtime (firmware/*.py) deployed as sources."""
    with McuTwin(tmp_path_factory.mktemp("cortex-m7") / "flash", twin="qemu") as twin:
        result = flash(twin.port, runtime_files(), compile_mpy=False)
        assert result["arch"] is None
        assert sorted(f["name"] for f in result["files"]) == sorted(p.name for p in FIRMWARE.glob("*.py"))
        yield twin


_PREPARED = {}


def prepared(scheme: str, lr: float = 0.05, accumulate: int = 1, patches: int | None = None) -> Prepared:
    key = (scheme, lr, accumulate, patches)
    if key not in _PREPARED:
        _PREPARED[key] = Prepared(MODEL, TASK, scheme, lr, SEED, accumulate=accumulate, patches=patches)
    return _PREPARED[key]


def deploy_model(port, prep) -> None:
    """The generated module as source, and its blob (the .py fallback of flash)."""
    files = {"tte_model.py": prep.compiled.module.encode(), "tte_model.bin": prep.compiled.blob}
    result = flash(port, files, compile_mpy=False)
    assert sorted(f["name"] for f in result["files"]) == sorted(files)


def test_every_firmware_source_compiles_and_runs_on_the_board(board):
    sources = sorted(FIRMWARE.glob("*.py"))
    assert {p.name for p in sources} >= {"fw_train.py", "link.py", "tte_abi.py", "tte_kernels.py"}
    # A board flashed with the runtime but no model yet (a test before may have added one).
    mpremote(board.port, "exec", "import os\nfor n in os.listdir():\n    if n.startswith('tte_model'):\n"
                                 "        os.remove(n)")
    modules = [p.stem for p in sources]
    out = mpremote(board.port, "exec", f"import sys\nfor n in {modules!r}:\n    m = __import__(n)\n"
                                       "    print(n, m.__file__)\nprint(sys.implementation._machine)")
    lines = out.splitlines()
    assert lines[:-1] == [f"{name} {name}.py" for name in modules]        # compiled here, from source
    assert "Cortex-M7" in lines[-1]
    for path in sources:                                                   # each file as __main__
        mpremote(board.port, "run", str(path), timeout=120)


@pytest.mark.parametrize("patches", [None, 2])
def test_sources_train_bit_exactly_like_the_host_simulator(board, patches):
    """With patches=2 the first stage runs in 2x2 patches: each sample goes to the board a window
    of its image at a time (MSG_INPUT parts), each window's patch run as it arrives."""
    prep = prepared("bias-4", patches=patches)
    assert prep.compiled.stages == (4 if patches else 0)
    deploy_model(board.port, prep)
    samples, tests = 10, 6
    sim = Simulator(prep.compiled)
    order = sample_order(len(prep.y_train), SEED, 0, samples)
    dev = TrainingDevice(board.port, timeout_s=30.0, reconnect_s=10.0)
    if patches:
        dev.input_part_bytes = 37      # in MSG_INPUT parts that straddle the windows' ends
    try:
        info = dev.with_recovery(dev.start)
        assert (info["model"], info["done"], info["platform"]) == (prep.compiled.model_id, 0, "qemu")
        dev.set_checkpoint_every(samples)
        for n, i in enumerate(order):
            done, predicted, _ = dev.train(n, int(prep.y_train[i]), prep.compiled.input_stream(prep.x_train[i]))
            assert (done, predicted) == (n + 1, sim.train_step(prep.x_train[i], int(prep.y_train[i])))
        for t in range(tests):
            assert dev.predict(t, prep.compiled.input_stream(prep.x_test[t])) == sim.predict(prep.x_test[t])
        dev.bye()                                                          # checkpoints, back to the REPL
    finally:
        dev.close()
    ckpt = bytes.fromhex(mpremote(board.port, "exec", "import binascii\n"
                                  "print(binascii.hexlify(open('tte_ckpt.bin', 'rb').read()).decode())").strip())
    assert ckpt[:4] == b"TTE1" and ckpt[4:20].decode() == prep.compiled.model_id
    assert int.from_bytes(ckpt[20:24], "little") == samples
    assert ckpt[24:] == sim.trained_bytes()


# Mirrors fw_train.serve()'s training step (M.train, then M.apply every ACCUMULATE steps), in a
# function so that no global is created inside the measured window.
_STEPS = """
import gc
import tte_model as M
def steps(X, L):
    A = bytearray(M.ARENA_BYTES)
    f = open("tte_model.bin", "rb")
    P = bytearray(M.PROGRAM_BYTES)
    f.readinto(P)
    M.init(A, P, f)
    io, x0, nx = M.IO_OFF, M.INPUT_OFF, M.INPUT_BYTES
    alloc = []
    for i in range(len(L)):
        A[x0:x0 + nx] = X[i * nx:(i + 1) * nx]
        A[io] = L[i]
        gc.collect()
        gc.disable()
        before = gc.mem_alloc()
        M.train(A, P, f)
        if M.ACCUMULATE > 1 and (A[io + 12] | A[io + 13] << 8) % M.ACCUMULATE == 0:
            M.apply(A, P, f)
        after = gc.mem_alloc()
        gc.enable()
        alloc.append(after - before)
    print("alloc", alloc)
    out = bytearray()
    for o, n in M.TRAINED:
        out += A[o:o + n]
    print("trained", out.hex())
steps(SAMPLES, LABELS)
"""


class _Watched(Simulator):
    """The host simulator, counting the bias steps whose update leaves 32-bit words: rq(G, m, sh)
    with sh <= 15 and |floor(G*m / 2**15)| > 2**16 (the firmware's former big-int path)."""

    wide = 0

    def _run(self, segment):
        for o in self.c.calls[segment]:
            op, f = abi.fields(self.P, o)
            if op in ("bias_upd", "apply_b"):
                m = golden.view(self.A, f["um_off"], "i32", f["O"]).astype(np.int64)
                sh = golden.view(self.A, f["ush_off"], "i32", f["O"]).astype(np.int64)
                if op == "apply_b":
                    g = golden.view(self.A, f["gb_off"], "i32", f["O"]).astype(np.int64)
                else:
                    g = golden.view(self.A, f["gy_off"], "i16", f["O"] * f["HW"]).astype(np.int64)
                    g = g.reshape(f["O"], -1).sum(axis=1)
                self.wide += int(((sh <= 15) & (np.abs((g * m) >> 15) > 1 << 16)).sum())
            golden.run(self.A, self.P, o, self.blob)


@pytest.mark.parametrize("scheme, lr, accumulate, samples", [
    ("bias-4", 0.05, 1, 4),
    ("bias-4", 100.0, 1, 6),           # bias steps beyond 32-bit words
    ("last-2", 0.05, 3, 6),            # accumulated gradients: apply_w, apply_b every 3 steps
], ids=["bias-4", "bias-4-wide-steps", "last-2-accumulate-3"])
def test_a_training_step_allocates_no_heap(board, scheme, lr, accumulate, samples):
    prep = prepared(scheme, lr, accumulate)
    order = sample_order(len(prep.y_train), SEED, 0, samples)
    sim = _Watched(prep.compiled)
    for i in order:
        sim.train_step(prep.x_train[i], int(prep.y_train[i]))
    if lr > 1:
        assert sim.wide > 0, "the scheme was meant to take the wide bias step"
    deploy_model(board.port, prep)
    x = b"".join(np.asarray(prep.x_train[i], np.int8).tobytes() for i in order)
    labels = bytes(int(prep.y_train[i]) for i in order)
    out = dict(line.split(" ", 1) for line in mpremote(board.port, "exec", _STEPS.replace("SAMPLES", repr(x)).replace("LABELS", repr(labels))).splitlines())
    assert out["alloc"] == str([0] * samples), f"heap bytes allocated by each training step: {out['alloc']}"
    assert binascii.unhexlify(out["trained"]) == sim.trained_bytes()        # and bit-exact
