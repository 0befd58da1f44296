"""A serial twin of the X-NUCLEO-LPM01A PowerShield on a pseudo-terminal.

It speaks the ASCII command set and the ``ascii_dec`` data stream that
:mod:`insitu.measure.powershield` documents (same sources), with a current trace the caller
chooses, so the energy a meter integrates has a known value:

- commands arrive as lines; each is answered ``\\r\\nPowerShield > ack <command>\\r\\n\\r\\n`` or, when
  refused, ``\\r\\nPowerShield > error <command>\\r\\n`` + ``PowerShield > Error detail: <why>``;
  configuration commands need host control (``htc``) first; ``stop`` is not acked, it ends the
  stream with ``PowerShield > Acquisition completed``;
- after ``start`` one ``DDDD-EE`` line per sample at ``freq`` (current in amperes:
  ``DDDD x 10^-EE``, four significant digits), paced in real time; before the first sample of
  each second a ``TimeStamp: SSSSs MMMms, buff PP%`` line and, as on the board, a NUL byte ahead
  of the next sample;
- ``stall(seconds)`` holds the stream back while the board keeps sampling (its buffer fills), and
  then sends the backlog: no sample is lost; ``inject_garbage()`` puts a line of noise into the
  stream between two samples.

The error detail texts are the twin's own words. Only ``ascii_dec`` is streamed: ``start`` after
``format bin_hexa`` is refused.

::

    with PowerShieldTwin(lambda t: 1e-3 * (1 + t)) as twin:
        meter = open_meter(f"powershield:{twin.port}")
"""

from __future__ import annotations

import atexit
import math
import os
import re
import select
import shutil
import tempfile
import threading
import time
import tty
from pathlib import Path
from typing import Callable

from insitu.errors import InsituError

FREQS = {"100k": 100_000, "50k": 50_000, "20k": 20_000, "10k": 10_000, "5k": 5_000, "2k": 2_000,
         "1k": 1_000, "500": 500, "200": 200, "100": 100, "50": 50, "20": 20, "10": 10, "5": 5,
         "2": 2, "1": 1}
_PROMPT = b"PowerShield > "
_ANSWERED = "answered"       # a command handler that wrote its own ack
_UNITS = {"": 1.0, "u": 1e-6, "m": 1e-3, "k": 1e3}


def parse_value(text: str) -> float:
    """A PowerShield numerical argument: ``3300m``, ``100u``, ``2``, ``2-3`` (power of ten)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(?:([umk])|([+-]\d{1,2}))?", text.strip())
    if not match:
        raise ValueError(text)
    value = float(match[1])
    if match[3]:
        return value * 10.0 ** int(match[3])
    return value * _UNITS[match[2] or ""]


def encode_current(amps: float) -> bytes:
    """``DDDD-EE``: four digits times ten to the minus two-digit exponent (``6409-07`` = 640.9 uA)."""
    if not amps > 0:
        return b"0000-00"
    exponent = 3 - math.floor(math.log10(amps))         # mantissa in [1000, 9999]
    mantissa = round(amps * 10.0 ** exponent)
    if mantissa > 9999:                                 # rounding up to the next decade
        mantissa, exponent = round(mantissa / 10), exponent - 1
    if exponent < 0:
        return b"%04d+%02d" % (mantissa, -exponent)
    return b"%04d-%02d" % (mantissa, exponent)


def decode_current(text: str | bytes) -> float:
    text = text.decode() if isinstance(text, bytes) else text
    sign = -1 if text[4] == "-" else 1
    return int(text[:4]) * 10.0 ** (sign * int(text[5:7]))


class PowerShieldTwin:
    """A simulated PowerShield on a pty; ``start()`` returns the port path for pyserial."""

    def __init__(self, current: Callable[[float], float] = lambda t: 1e-3, board_id: str = "TWIN0001"):
        self.current = current
        self.board_id = board_id
        self.port: str | None = None
        self.commands: list[str] = []          # every command line received, in order
        self.sent_samples = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._reset_settings()

    def _reset_settings(self) -> None:
        self.host_control = False
        self.volts = 3.3
        self.freq = 100
        self.acqtime: float | None = 10.0      # seconds; None: infinite
        self.output = "current"
        self.format = "ascii_dec"
        self.trigsrc = "sw"
        self.acquiring = False
        self._stall_until = 0.0
        self._garbage: list[bytes] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> PowerShieldTwin:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> str:
        if self._thread is not None:
            raise InsituError("this PowerShield twin is already running; stop() it first")
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)
        os.set_blocking(self._master, False)
        self._wake_r, self._wake_w = os.pipe()
        self._dir = Path(tempfile.mkdtemp(prefix="insitu-powershield-"))
        self.port = str(self._dir / "tty")
        os.symlink(os.ttyname(self._slave), self.port)   # a stable name, like /dev/ttyACM0
        self._out = bytearray()
        self._in = bytearray()
        self._running = True
        self._thread = threading.Thread(target=self._serve, name=f"powershield twin {self.port}",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.stop)
        return self.port

    def stop(self) -> None:
        if self._thread is None:
            return
        atexit.unregister(self.stop)
        self._running = False
        os.write(self._wake_w, b"\0")
        self._thread.join()
        self._thread = None
        for fd in (self._master, self._slave, self._wake_r, self._wake_w):
            os.close(fd)
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- test controls -----------------------------------------------------------------------

    def stall(self, seconds: float) -> None:
        """Send nothing for ``seconds`` while sampling goes on; the backlog follows."""
        with self._lock:
            self._stall_until = time.monotonic() + seconds

    def inject_garbage(self, line: bytes = b"\x7f#%noise%#\x1b") -> None:
        """Put one line of noise into the stream, between two samples."""
        with self._lock:
            self._garbage.append(line)

    def expected(self, index: int) -> float:
        """The current (A) of sample ``index`` as the twin sends it (four significant digits)."""
        return decode_current(encode_current(self.current(index / self.freq)))

    # -- the serving thread ------------------------------------------------------------------

    def _serve(self) -> None:
        while self._running:
            wait = 0.05
            if self.acquiring:
                wait = min(wait, 1.0 / self.freq)
            writable = [self._master] if self._out else []
            try:
                readable, ready, _ = select.select([self._master, self._wake_r], writable, [], wait)
            except OSError:
                break
            if self._wake_r in readable:
                os.read(self._wake_r, 64)
            if self._master in readable:
                try:
                    self._in += os.read(self._master, 4096)
                except (BlockingIOError, OSError):
                    pass
                self._commands()
            if self.acquiring:
                self._stream()
            if self._out:
                try:
                    n = os.write(self._master, self._out)
                    del self._out[:n]
                except (BlockingIOError, OSError):
                    pass

    def _say(self, text: str) -> None:
        self._out += b"\r\n" + _PROMPT + text.encode() + b"\r\n"

    def _ack(self, line: str) -> None:
        self._say(f"ack {line}")
        self._out += b"\r\n"

    def _error(self, line: str, detail: str) -> None:
        self._say(f"error {line}")
        self._say(f"Error detail: {detail}")

    def _commands(self) -> None:
        while True:
            cut = min((i for i in (self._in.find(b"\n"), self._in.find(b"\r")) if i >= 0), default=-1)
            if cut < 0:
                return
            raw, self._in = bytes(self._in[:cut]), self._in[cut + 1:]
            line = raw.decode("ascii", errors="replace").strip()
            if line:
                self.commands.append(line)
                self._command(line)

    def _command(self, line: str) -> None:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if self.acquiring and name not in ("stop", "status", "echo", "pwr", "targrst"):
            self._error(line, "acquisition in progress: stop it first")
            return
        if name == "htc":
            self.host_control = True
            return self._ack(line)
        if name == "echo":
            self._out += b"\r\n" + _PROMPT + line.encode() + b"\r\n"
            return
        if name == "stop":
            if self.acquiring:
                self._end_acquisition()
            return
        if not self.host_control:
            return self._error(line, "host control required: send htc first")
        handler = getattr(self, f"_cmd_{name}", None)
        if handler is None:
            return self._error(line, "unknown command")
        try:
            detail = handler(arg)
        except ValueError as exc:
            detail = f"invalid argument {exc}"
        if detail is None:
            self._ack(line)
        elif detail is not _ANSWERED:
            self._error(line, detail)

    def _cmd_hrc(self, arg):
        self.host_control = False

    def _cmd_powershield(self, arg):
        self._ack(f"powershield {self.board_id}")
        return _ANSWERED

    def _cmd_status(self, arg):
        return None

    def _cmd_volt(self, arg):
        if arg == "get":                                # e.g. "ack volt get 3300-03"
            self._ack(f"volt get {round(self.volts * 1000):04d}-03")
            return _ANSWERED
        volts = round(parse_value(arg), 9)
        if not 1.8 <= volts <= 3.3:
            return "voltage out of range [1800m; 3300m]"
        self.volts = volts

    def _cmd_freq(self, arg):
        if arg not in FREQS:
            return "frequency not in {" + ", ".join(FREQS) + "}"
        self.freq = FREQS[arg]

    def _cmd_acqtime(self, arg):
        if arg in ("0", "inf"):
            self.acqtime = None
            return None
        seconds = round(parse_value(arg), 9)
        if not 100e-6 <= seconds <= 100:
            return "acquisition time out of range [100u; 100]"
        self.acqtime = seconds

    def _choice(self, arg, valid, attr):
        if arg not in valid:
            return f"value not in {{{', '.join(valid)}}}"
        setattr(self, attr, arg)

    def _cmd_output(self, arg):
        return self._choice(arg, ("current", "energy"), "output")

    def _cmd_format(self, arg):
        return self._choice(arg, ("ascii_dec", "bin_hexa"), "format")

    def _cmd_trigsrc(self, arg):
        return self._choice(arg, ("sw", "d7"), "trigsrc")

    def _cmd_acqmode(self, arg):
        return None if arg in ("dyn", "stat") else "value not in {dyn, stat}"

    def _cmd_funcmode(self, arg):
        return None if arg in ("optim", "high") else "value not in {optim, high}"

    def _cmd_trigdelay(self, arg):
        return None if 0 <= parse_value(arg) <= 30 else "trigger delay out of range [0; 30]"

    def _cmd_pwr(self, arg):
        return None if arg.split()[:1] and arg.split()[0] in ("auto", "on", "off", "get") \
            else "value not in {auto, on, off, get}"

    def _cmd_pwrend(self, arg):
        return None if arg in ("on", "off") else "value not in {on, off}"

    def _cmd_lcd(self, arg):
        return None

    def _cmd_start(self, arg):
        if self.format != "ascii_dec":
            return "this twin streams ascii_dec only"
        if self.output != "current":
            return "this twin streams output current only"
        if self.freq > 10_000 or (self.freq > 5_000 and self.acqtime is None):
            return "ascii_dec is limited to 5k for an unlimited acquisition (10k for 1 s)"
        if self.trigsrc != "sw":
            return "this twin has no D7 trigger input: use trigsrc sw"
        self._ack("start")
        self.acquiring = True
        self._t0 = time.monotonic()
        self._next = 0
        self._nul = False
        with self._lock:
            self._stall_until = 0.0
            self._garbage.clear()
        return _ANSWERED

    def _stream(self) -> None:
        now = time.monotonic()
        due = int((now - self._t0) * self.freq) + 1          # sample 0 is taken at start
        if self.acqtime is not None:
            due = min(due, max(1, round(self.acqtime * self.freq)))
        with self._lock:
            if now < self._stall_until:
                return
            garbage, self._garbage = self._garbage, []
        while self._next < due:
            i = self._next
            if i and i % self.freq == 0:
                seconds, ms = divmod(round(i * 1000 / self.freq), 1000)
                load = min(99, len(self._out) * 100 // 65536)
                self._out += b"TimeStamp: %04ds %03dms, buff %02d%%\r\n" % (seconds, ms, load)
                self._nul = True
            if garbage:
                self._out += garbage.pop(0) + b"\r\n"
            self._out += (b"\0" if self._nul else b"") + encode_current(self.current(i / self.freq)) + b"\r\n"
            self._nul = False
            self._next += 1
            self.sent_samples = self._next
        if self.acqtime is not None and self._next >= round(self.acqtime * self.freq):
            self._end_acquisition()

    def _end_acquisition(self) -> None:
        self._stream_rest()
        self.acquiring = False
        self._say("Acquisition completed")

    def _stream_rest(self) -> None:
        with self._lock:
            self._stall_until = 0.0
        if self.acquiring and (self.acqtime is None or self._next < round(self.acqtime * self.freq)):
            acq, self.acqtime = self.acqtime, None
            try:
                self._stream()
            finally:
                self.acqtime = acq
