"""Deploying files to a MicroPython board's flash with mpremote, on a board and on its twin alike.

- ``.py`` modules are cross-compiled to ``.mpy`` for the architecture the *device* reports
  (``sys.implementation._mpy``): ``armv7emsp`` on the STM32F746 and its Cortex-M7 twin, ``x64``
  on the unix-port twin. So the twins run compiled code too, through the same path. ``boot.py``
  and ``main.py`` stay source (MicroPython runs only those names at boot), and a device whose
  .mpy version differs from mpy-cross's gets sources.
- A device whose arch is ``armv7emsp`` (the STM32F746, its Cortex-M7 twin) also gets the C kernels
  (``tte_native.mpy``, :mod:`insitu.mcu.native`), which ``tte_ops`` imports instead of the viper
  kernels.
- Each file is copied to ``NAME.tmp``; a snippet run on the device checks every copy's SHA-256 and
  only then renames them over the old files (and removes a stale ``.py`` that would shadow a new
  ``.mpy``, or the reverse). A failed flash leaves the old files in place.
- A file the device already holds with the same SHA-256 (the runtime of a board flashed before) is
  not sent again: the copies are the slow part of a flash (mpremote writes 256 bytes a round trip).
- mpremote's soft reset before the first command is kept (no ``resume``): it stops what runs and
  gives the copy a clean heap, and the next import loads the new code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import tempfile
from pathlib import Path

from insitu.errors import InsituError, UsageError
from insitu.mcu import native
from insitu.mcu.link import LinkError
from insitu.mcu.twin import find_tool

log = logging.getLogger(__name__)

# sys.implementation._mpy = version | sub-version << 8 | native arch << 10 (py/persistentcode.h).
_ARCHES = (None, "x86", "x64", "armv6", "armv6m", "armv7m", "armv7em", "armv7emsp", "armv7emdp",
           "xtensa", "xtensawin", "rv32imc", "rv64imc")
_SOURCE_ONLY = ("boot.py", "main.py")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_MARK = "insitu-flash:"
#: sys.platform of the twins: the Cortex-M7 twin (QEMU port) and the unix port.
TWIN_PLATFORMS = ("qemu", "linux")

# Runs on the device: a file's SHA-256 in 512-byte reads (a weight blob must not need its size in
# heap).
_HASH = """
import hashlib, binascii
_b = bytearray(512)
def _h(path):
    d = hashlib.sha256()
    with open(path, 'rb') as f:
        while True:
            k = f.readinto(_b)
            if not k:
                break
            d.update(memoryview(_b)[:k])
    return binascii.hexlify(d.digest()).decode()
"""

# Runs on the device: hash each copy, and only if every copy matches remove the shadows of every
# file flashed (sent or already there) and rename the copies.
_DEVICE_SNIPPET = "import os, json\n" + _HASH.replace("{", "{{").replace("}", "}}") + """
_want = {want}
_got = {{n: _h(n + '.tmp') for n in _want}}
_ok = _got == _want
if _ok:
    for n, ss in {shadows}.items():
        for s in ss:
            try:
                os.remove(s)
            except OSError:
                pass
    for n in _want:
        os.rename(n + '.tmp', n)
print('{mark}' + json.dumps({{'ok': _ok, 'sha256': _got}}))
"""

# Runs on the device: what it is, and the SHA-256 of those of _NAMES it holds (none where it cannot
# hash: every file is then sent).
_PROBE_SNIPPET = """
import sys, json
_have = {}
try:
""" + "".join("    " + line + "\n" for line in _HASH.strip().splitlines()) + """    for n in _NAMES:
        try:
            _have[n] = _h(n)
        except OSError:
            pass
except Exception:
    pass
print(_MARK + json.dumps([sys.platform, getattr(sys.implementation, '_mpy', 0),
                          getattr(sys.implementation, '_machine', ''), _have]))
"""


#: The slowest copy rate `flash` waits for (bytes/s) before it calls the link stuck.
COPY_FLOOR_BYTES_PER_S = 2048


def _mpremote(port: str, args: list[str], timeout_s: float) -> str:
    """Run ``mpremote connect PORT ARGS``; its stdout, or an error that says what failed."""
    try:
        run = subprocess.run([find_tool("mpremote"), "connect", port, *args], capture_output=True,
                             text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise InsituError(f"mpremote on {port} did not finish in {timeout_s:g} s; reset the board "
                          "and flash again") from None
    if run.returncode == 0:
        return run.stdout
    output = (run.stderr + run.stdout).strip()
    tail = "\n".join(output.splitlines()[-8:])
    if "failed to access" in output or "no device found" in output:
        raise LinkError(f"cannot open the serial port {port} (mpremote: {tail}); is the board "
                        "plugged in? `insitu mcu emulate` starts a simulated one")
    if "could not enter raw repl" in output:
        raise InsituError(f"the board on {port} does not answer Ctrl-C: a program that ignores it "
                          "runs there (the insitu firmware while it serves). Press the board's "
                          "reset button (a twin: `kill -USR1` its `insitu mcu emulate`) and flash again")
    raise InsituError(f"mpremote failed on {port}:\n{tail}")


def probe(port: str, timeout_s: float = 30.0, holds=()) -> dict:
    """The device's platform, machine and .mpy format: ``{"platform", "machine", "mpy_version",
    "arch", "sha256"}`` (machine: ``sys.implementation._machine``, e.g. "mps2-an500 with
    Cortex-M7"; sha256: the hex digest of each file named in ``holds`` that the device has)."""
    _check_port(port)
    snippet = f"_MARK = {_MARK!r}\n_NAMES = {sorted(holds)!r}\n" + _PROBE_SNIPPET
    out = _mpremote(port, ["exec", snippet], timeout_s)
    said = [line for line in out.splitlines() if line.startswith(_MARK)]
    if not said:
        raise InsituError(f"the board on {port} did not say what it is:\n{out.strip()[-300:]}")
    platform, mpy, machine, have = json.loads(said[-1][len(_MARK):])
    arch = (mpy >> 10) & 0x0F
    return {"platform": platform, "machine": machine, "mpy_version": (mpy & 0xFF, (mpy >> 8) & 3),
            "arch": _ARCHES[arch] if arch < len(_ARCHES) else None, "sha256": have}


def _mcu_board(name: str):
    from insitu.boards import get_board

    spec = get_board(name)
    if spec.mcu is None:
        raise UsageError(f"board {name!r} is not a microcontroller; flash takes an mcu board "
                         "(stm32f746-disco, or its twin stm32f746-disco-sim)")
    return spec


def _check_board(spec, port: str, platform: str) -> None:
    from insitu.boards import twin_name

    # The twins are MicroPython's QEMU port (the Cortex-M7 twin) and its unix port.
    is_twin_port = platform in TWIN_PLATFORMS
    if spec.is_twin and not is_twin_port:
        raise UsageError(f"{port} is a real board (MicroPython on {platform}), not a twin: use "
                         f"--board {spec.twin_of}")
    if not spec.is_twin and is_twin_port:
        raise UsageError(f"{port} is a simulated board (MicroPython's {platform} port): use "
                         f"--board {twin_name(spec)}")


def _check_port(port: str) -> None:
    # mpremote also takes shortcuts (a0, u0, auto); a path is checked here for a clearer message.
    if os.sep in port and not os.path.exists(port):
        raise LinkError(f"cannot open the serial port {port}: no such device; is the board "
                        "plugged in? `insitu mcu emulate` starts a simulated one")


def _mpy_cross_version() -> tuple[int, int]:
    out = subprocess.run([find_tool("mpy-cross"), "--version"], capture_output=True, text=True).stdout
    match = re.search(r"mpy v(\d+)\.(\d+)", out)
    if not match:
        raise InsituError(f"cannot tell the .mpy version of mpy-cross from {out.strip()!r}")
    return int(match[1]), int(match[2])


def compile_to_mpy(source: Path, name: str, arch: str | None, out: Path) -> None:
    """``source`` compiled by mpy-cross to ``out`` (for ``arch``, e.g. armv7emsp, or the host's)."""
    cmd = [find_tool("mpy-cross"), "-s", name, "-o", str(out)]
    if arch:
        cmd.append(f"-march={arch}")
    run = subprocess.run([*cmd, str(source)], capture_output=True, text=True)
    if run.returncode != 0:
        raise InsituError(f"mpy-cross could not compile {name}:\n{run.stderr.strip()}")


def flash(port: str, files: dict[str, bytes | Path], *, compile_mpy: bool = True,
          board: str | None = None, timeout_s: float = 120.0) -> dict:
    """Deploy ``files`` (device name -> content or local path) to the board's flash folder.

    With ``board``, the device on ``port`` must be that board: a twin (``-sim``) is MicroPython's
    QEMU or unix port, a real board is neither. Returns ``{"port", "platform", "machine", "arch",
    "files": [{"name", "source", "bytes", "sha256", "sent"}]}`` (sent: False for a file the device
    already held with that SHA-256, which is not copied again).
    """
    if not files:
        raise UsageError("nothing to flash")
    for name in files:
        if not _NAME.fullmatch(name):
            raise UsageError(f"cannot flash {name!r}: device files are plain names in the flash "
                             "folder (letters, digits, _ . -), not paths")
    spec = _mcu_board(board) if board is not None else None
    # The names each file may have on the device: a module as source or as .mpy.
    holds = set(files) | {n[:-3] + ".mpy" for n in files if n.endswith(".py") and n not in _SOURCE_ONLY}
    if _KERNEL_DISPATCH in files:
        holds.add(f"{native.MODULE}.mpy")
    device = probe(port, timeout_s, holds)
    if spec is not None:
        _check_board(spec, port, device["platform"])
    compile_mpy = compile_mpy and device["mpy_version"] == _mpy_cross_version()
    if compile_mpy and _KERNEL_DISPATCH in files and device["arch"] == native.ARCH \
            and os.environ.get(KERNELS_ENV, "auto") != "viper":
        files = {**files, **_c_kernels()}
    deployed, commands = [], []
    with tempfile.TemporaryDirectory(prefix="insitu-flash-") as stage:
        stage = Path(stage)
        for name, content in files.items():
            source = Path(content) if isinstance(content, Path) else None
            data = source.read_bytes() if source else bytes(content)
            local = stage / name
            local.write_bytes(data)
            if compile_mpy and name.endswith(".py") and name not in _SOURCE_ONLY:
                name = name[:-3] + ".mpy"
                compile_to_mpy(local, local.name, device["arch"], stage / name)
                local = stage / name
                data = local.read_bytes()
            sha256 = hashlib.sha256(data).hexdigest()
            sent = device["sha256"].get(name) != sha256
            deployed.append({"name": name, "source": str(source) if source else None,
                             "bytes": len(data), "sha256": sha256, "sent": sent})
            if sent:
                commands += ["fs", "cp", str(local), f":{name}.tmp", "+"]
        want = {f["name"]: f["sha256"] for f in deployed if f["sent"]}
        shadows = {n: [n[:-4] + ".py"] if n.endswith(".mpy") else [n[:-3] + ".mpy"]
                   for n in (f["name"] for f in deployed) if n.endswith((".py", ".mpy"))}
        snippet = _DEVICE_SNIPPET.format(want=repr(want), shadows=repr(shadows), mark=_MARK)
        # The copies take their time over a slow link (the twin's UART: ~8 KB/s): the timeout
        # grows with the bytes sent, at a quarter of that rate.
        sent_bytes = sum(f["bytes"] for f in deployed if f["sent"])
        out = _mpremote(port, [*commands, "exec", snippet], timeout_s + sent_bytes / COPY_FLOOR_BYTES_PER_S)
    report = [line for line in out.splitlines() if line.startswith(_MARK)]
    if not report:
        raise InsituError(f"the board on {port} did not report its copies:\n{out.strip()[-500:]}")
    result = json.loads(report[-1][len(_MARK):])
    if not result["ok"]:
        bad = [n for n in want if result["sha256"].get(n) != want[n]]
        raise InsituError(f"copies on {port} differ from what was sent ({', '.join(bad)}); the old "
                          "files are kept. Flash again; if it persists the board's flash may be "
                          "full (mpremote df)")
    return {"port": port, "platform": device["platform"], "machine": device["machine"],
            "arch": device["arch"] if compile_mpy else None, "files": deployed}


#: The firmware module that imports the C kernels where they are (firmware/tte_ops.py).
_KERNEL_DISPATCH = "tte_ops.py"
#: ``INSITU_MCU_KERNELS=viper`` flashes no C kernels (to compare the two on a fresh device).
KERNELS_ENV = "INSITU_MCU_KERNELS"


def _c_kernels() -> dict[str, Path]:
    """The C kernels' native module for a Cortex-M7 (built once, cached); none, with a warning,
    where it cannot be built here (the viper kernels run instead, slower: the result says so)."""
    try:
        return {f"{native.MODULE}.mpy": native.native_mpy(log.warning)}
    except InsituError as exc:
        log.warning("the C kernels cannot be built here, the board runs the viper kernels: %s", exc)
        return {}


def firmware_files() -> dict[str, Path]:
    """The firmware runtime: every ``firmware/*.py`` shipped with insitu."""
    from insitu.resources import package_dir

    return {p.name: p for p in sorted(package_dir("firmware").glob("*.py"))}
