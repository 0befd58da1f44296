"""The STMicroelectronics X-NUCLEO-LPM01A PowerShield over pyserial, as MLPerf Tiny drives it.

Spec: ``powershield:PORT[;volts=3.3][;freq=1k][;baud=3686400]`` — e.g. ``powershield:/dev/ttyACM0``.

Where the protocol comes from
-----------------------------
- The command set (``htc``/``hrc``, ``volt <1800m..3300m>``, ``freq {100k..1}``,
  ``acqtime <s>|0|inf``, ``output current|energy``, ``format ascii_dec|bin_hexa``,
  ``trigsrc sw|d7``, ``start``, ``stop``...), the ``ascii_dec`` decoding ("6409-07 <=> 6409 x
  10^-7 = 640.9uA") and the ascii_dec limits (unlimited acquisition up to 5k, 10k for 1 s): the
  command table that MLPerf Tiny's energy runner carries, transcribed from ST's UM2269 "Getting
  started with PowerShield firmware" (github.com/mlcommons/tiny, benchmark/runner/power_manager.py
  and power_manager/power_manager_lpm.py).
- Answers: ``PowerShield > ack <command>`` / ``PowerShield > error <command>`` followed by
  ``PowerShield > Error detail: <text>``; ``stop`` is not acked, the stream ends with
  ``PowerShield > Acquisition completed`` (MLPerf Tiny, same files); the exact framing
  ``\\r\\nPowerShield > ack htc\\r\\n\\r\\n`` and 3 686 400 baud (an LPM01 driver for pyserial by
  "Markus", 2019, found by the code search).
- The stream: one ``DDDD-EE`` line per sample (9 bytes with ``\r\n``), ``TimeStamp: <s>s <ms>ms,
  buff <load>%`` lines (MLPerf Tiny's reader; LPM01A-lib, github.com/lazicdanilo/LPM01A-lib and
  its forks, which also notes the NUL byte ahead of the sample after a timestamp), lines carrying
  several concatenated values (MLPerf Tiny's ``extract_current_values``), ``end`` and ``summary``
  lines around the end of an acquisition (github.com/zissis-pap/x-nucleo-lpm01a-gui's parser).

What it does
------------
``open()`` takes host control (``htc``) and configures ``volt``, ``freq``, ``acqtime 0``
(unlimited), ``output current`` (amperes; ``energy`` output has no documented unit), ``format
ascii_dec`` and ``trigsrc sw``; any ``error`` answer is a :class:`MeterError` quoting the board's
error detail. ``start()`` sends ``start``. A reader thread splits the stream into lines as they
come: a sample is current x ``volts`` (the PowerShield supplies the target at that voltage),
timed ``i / freq`` on the board's clock and re-anchored at every ``TimeStamp`` line (the
timestamp is the time of the next sample), so a lost sample shifts no later time. A stalled
stream makes ``read()`` return ``[]``; the board buffers meanwhile (``buff`` load) and nothing is
lost when it resumes. A line that is none of these is garbage: skipped (the stream resynchronises
at the next newline) and counted in :attr:`PowerShieldMeter.garbage_lines`. ``stop()`` sends
``stop`` and waits for ``Acquisition completed``; ``close()`` hands control back (``hrc``).
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque

from insitu.errors import UsageError
from insitu.measure import meters
from insitu.measure.meters import Meter, MeterError, Sample

BAUD = 3_686_400
FREQS = {"100k": 100_000, "50k": 50_000, "20k": 20_000, "10k": 10_000, "5k": 5_000, "2k": 2_000,
         "1k": 1_000, "500": 500, "200": 200, "100": 100, "50": 50, "20": 20, "10": 10, "5": 5,
         "2": 2, "1": 1}
PROMPT = "PowerShield > "
_VALUES = re.compile(r"(?:\d{4}[+-]\d{2})+")
_VALUE = re.compile(r"(\d{4})([+-])(\d{2})")
_TIMESTAMP = re.compile(r"TimeStamp:\s*(\d+)s\s+(\d+)ms,\s*buff\s+(\d+)%")
_MESSAGES = ("ack ", "error", "Error detail", "Acquisition completed", "summary")
_ACK_TIMEOUT_S = 2.0


def decode(token: str) -> float:
    """``6409-07`` -> 6.409e-4 (amperes)."""
    m = _VALUE.fullmatch(token)
    if m is None:
        raise ValueError(f"{token!r} is not a PowerShield value (4 digits, a sign, 2 digits)")
    exponent = int(m[3]) if m[2] == "+" else -int(m[3])
    return int(m[1]) * 10.0 ** exponent


class PowerShieldMeter(Meter):
    """An X-NUCLEO-LPM01A on a serial port; see the module docstring for the protocol."""

    def __init__(self, port: str, *, volts: float = 3.3, freq: str = "1k", baud: int = BAUD):
        if not port:
            raise UsageError("--meter powershield: give the serial port, e.g. powershield:/dev/ttyACM0")
        if not 1.8 <= volts <= 3.3:
            raise UsageError(f"--meter powershield:{port}: volts must be within 1.8..3.3 V "
                             f"(the PowerShield's supply range), got {volts!r}")
        if freq not in FREQS:
            raise UsageError(f"--meter powershield:{port}: freq must be one of {', '.join(FREQS)}, "
                             f"got {freq!r}")
        if FREQS[freq] > 5_000:
            raise UsageError(f"--meter powershield:{port}: ascii_dec streams at most 5k for an "
                             f"unlimited acquisition, got freq={freq}")
        self.port, self.volts, self.freq_text, self.baud = port, float(volts), freq, int(baud)
        self.freq = FREQS[freq]
        self.name = f"powershield:{port}"
        self.garbage_lines = 0          # lines skipped as noise
        self.garbage_seen: deque[str] = deque(maxlen=5)
        self.timestamps = 0             # TimeStamp lines seen in this acquisition
        self.realigned = 0              # timestamps that disagreed with the sample count
        self.buffer_load = 0            # the board's last reported transmit-buffer load (%)
        self._ser = None
        self._reader: threading.Thread | None = None
        self._cond = threading.Condition()
        self._samples: deque[Sample] = deque()
        self._messages: deque[str] = deque()
        self._error: BaseException | None = None
        self._acquiring = False
        self._completed = False
        self._running = False
        self._host_control = False

    # -- the port and its reader thread ------------------------------------------------------

    def _fail(self, what: str) -> MeterError:
        return MeterError(f"{self.name}: {what}")

    def open(self) -> None:
        if self._ser is not None:
            return
        try:
            import serial
        except ImportError:
            raise self._fail("pyserial is not installed: pip install 'insitu[measure]'") from None
        try:
            self._ser = serial.Serial(self.port, baudrate=self.baud, timeout=0.05, write_timeout=2.0)
        except (serial.SerialException, OSError, ValueError) as exc:
            raise self._fail(f"cannot open the port ({exc}): is the PowerShield plugged in, is this "
                             "its port (ls /dev/ttyACM*), and does no other program hold it?") from None
        self._running = True
        self._reader = threading.Thread(target=self._read_loop, name=f"meter {self.name}", daemon=True)
        self._reader.start()
        try:
            self._command("htc", what="no PowerShield answered (is this an X-NUCLEO-LPM01A, at "
                                      f"{self.baud} baud?)")
            self._host_control = True
            self._command(f"volt {round(self.volts * 1000)}m")
            self._command(f"freq {self.freq_text}")
            self._command("acqtime 0")
            self._command("output current")
            self._command("format ascii_dec")
            self._command("trigsrc sw")
        except BaseException:
            self.close()
            raise

    def _port(self):
        if self._ser is None:
            raise self._fail("the port is not open")
        return self._ser

    def _write_line(self, line: str) -> None:
        ser = self._port()
        try:
            ser.write(line.encode("ascii") + b"\r\n")
        except Exception as exc:
            raise self._fail(f"writing {line!r} failed: {exc}") from None

    def _command(self, line: str, what: str | None = None) -> str:
        """Send a command and wait for its ``ack``; an ``error`` raises with the board's detail."""
        with self._cond:
            self._messages.clear()
        self._write_line(line)
        deadline = time.monotonic() + _ACK_TIMEOUT_S
        refused = None
        while True:
            message = self._next_message(deadline)
            if message is None:
                if refused is not None:
                    raise self._fail(f"refused {line!r} ({refused})")
                raise self._fail(what or f"no answer to {line!r} within {_ACK_TIMEOUT_S:g} s")
            if refused is not None and message.startswith("Error detail"):
                detail = message.partition(":")[2].strip()
                raise self._fail(f"refused {line!r}: {detail}")
            if message.startswith("ack") and line in message:
                return message[len("ack"):].strip()
            if message.startswith("error") and line.split()[0] in message:
                refused = message
                deadline = min(deadline, time.monotonic() + 0.5)   # its detail follows at once

    def _next_message(self, deadline: float) -> str | None:
        with self._cond:
            while not self._messages:
                if self._error is not None:
                    raise self._fail(f"the port failed: {self._error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._messages.popleft()

    def _read_loop(self) -> None:
        pending = b""
        try:
            while self._running:
                ser = self._port()
                chunk = ser.read(ser.in_waiting or 1)
                if not chunk:
                    continue
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    self._line(raw)
        except Exception as exc:          # the port went away (unplugged, closed under us)
            if self._running:
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()

    def _line(self, raw: bytes) -> None:
        text = raw.replace(b"\0", b"").strip(b"\r \t")
        if not text:
            return
        try:
            line = text.decode("ascii")
        except UnicodeDecodeError:
            return self._garbage(text.decode("ascii", errors="replace"))
        if not line.isprintable():
            return self._garbage(line)
        if _VALUES.fullmatch(line):
            if self._acquiring:
                values = [decode(m.group()) for m in _VALUE.finditer(line)]
                with self._cond:
                    for amps in values:
                        t = self._anchor_t + (self._count - self._anchor_i) / self.freq
                        self._samples.append(Sample(t, amps * self.volts, self.volts, amps))
                        self._count += 1
                    self._cond.notify_all()
            return
        if line.startswith("TimeStamp"):
            m = _TIMESTAMP.search(line)
            if not m:
                return self._garbage(line)
            if self._acquiring:
                t = int(m[1]) + int(m[2]) / 1000
                expected = self._anchor_t + (self._count - self._anchor_i) / self.freq
                if abs(expected - t) > 0.5 / self.freq:
                    self.realigned += 1
                self._anchor_t, self._anchor_i = t, self._count
                self.timestamps += 1
                self.buffer_load = int(m[3])
            return
        message = line[len(PROMPT):].strip() if line.startswith(PROMPT) else line
        if (message.startswith(_MESSAGES) or message in ("ack", "end")
                or line.startswith(PROMPT.strip()) or not self._acquiring):
            with self._cond:
                if message.startswith("Acquisition completed"):
                    self._completed = True      # after stop, or at the end of a finite acqtime
                self._messages.append(message)
                self._cond.notify_all()
            return
        self._garbage(line)

    def _garbage(self, line: str) -> None:
        self.garbage_lines += 1
        self.garbage_seen.append(line[:40])

    # -- Meter -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._ser is None:
            self.open()
        if self._acquiring:
            raise self._fail("already started; stop() it first")
        with self._cond:
            self._samples.clear()
            self._count = self._anchor_i = 0
            self._anchor_t = 0.0
            self.timestamps = self.realigned = 0
        self._acquiring, self._completed = True, False
        try:
            self._command("start")
        except BaseException:
            self._acquiring = False
            raise
        self.started_at = time.time()

    def read(self, timeout_s: float = 1.0) -> list[Sample]:
        if self.started_at is None:
            raise self._fail("read before start()")
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._samples and self._error is None and self._acquiring and not self._completed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            out = list(self._samples)
            self._samples.clear()
            if not out and self._error is not None:
                raise self._fail(f"the port failed during the acquisition: {self._error}")
        return out

    def stop(self) -> None:
        if not self._acquiring or self._ser is None:
            return
        if self._error is not None or self._completed:   # the port is gone (read() says so),
            self._acquiring = False                        # or the board ended on its own
            return
        with self._cond:
            self._messages.clear()
        try:
            self._write_line("stop")          # not acked: the stream ends with the completion line
            deadline = time.monotonic() + _ACK_TIMEOUT_S
            while not self._completed:
                if self._next_message(deadline) is None and not self._completed:
                    raise self._fail("no 'Acquisition completed' within "
                                     f"{_ACK_TIMEOUT_S:g} s of stop")
        finally:
            self._acquiring = False

    def close(self) -> None:
        if self._ser is None:
            return
        try:
            if self._host_control and self._error is None and not self._acquiring:
                self._write_line("hrc")           # back to standalone, as MLPerf Tiny leaves it
                time.sleep(0.01)
        except MeterError:
            pass
        self._host_control = False
        self._running = False
        if self._reader is not None:
            self._reader.join(1.0)
            self._reader = None
        try:
            self._ser.close()
        except Exception:
            pass
        self._ser = None

    def describe(self) -> dict:
        return {"meter": self.name, "kind": "powershield", "port": self.port, "volts": self.volts,
                "freq_hz": self.freq, "baud": self.baud, "garbage_lines": self.garbage_lines,
                "garbage_examples": list(self.garbage_seen), "timestamps": self.timestamps,
                "realigned": self.realigned}


_OPTIONS = ("volts", "freq", "baud")


def parse_spec(arg: str) -> PowerShieldMeter:
    """``PORT[;volts=V][;freq=F][;baud=B]`` -> a :class:`PowerShieldMeter` (not yet opened)."""
    port, *options = (arg or "").split(";")
    kw: dict = {}
    for option in options:
        if not option.strip():
            continue
        key, eq, value = (s.strip() for s in option.partition("="))
        if not eq or key not in _OPTIONS:
            raise UsageError(f"--meter powershield:{arg}: unknown option {option!r}; the options "
                             f"are {', '.join(k + '=' for k in _OPTIONS)}")
        try:
            kw[key] = float(value) if key == "volts" else int(value) if key == "baud" else value
        except ValueError:
            raise UsageError(f"--meter powershield:{arg}: {key}= needs a number, got {value!r}") from None
    return PowerShieldMeter(port.strip(), **kw)


meters.KINDS["powershield"] = parse_spec
