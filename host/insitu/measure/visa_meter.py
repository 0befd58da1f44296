"""SCPI instruments over PyVISA: a DMM measuring current, or a power analyzer / supply readback.

Spec: ``visa:RESOURCE[;backend=@sim|PATH.yaml@sim|@py][;func=power|current][;volts=V]
[;samples=N][;interval=S][;timeout=S]``, e.g.
``visa:USB0::0x2A8D::0x1301::MY1234::INSTR;func=current;volts=5``.

The exchange, in SCPI-99 terms (IEEE 488.2 common commands plus the CONFigure / SAMPle / TRIGger /
INITiate / FETCh subsystems that DMMs such as the Keysight 34460/34465 series implement):

open
    ``*IDN?`` must answer (an empty answer or a timeout is an unreachable instrument); ``*CLS``
    clears the status and error queue. No ``*RST``: on a supply it would switch the output off.
configure
    ``CONF:POW`` (``func=power``: readings are watts) or ``CONF:CURR:DC`` (``func=current``:
    readings are amperes, power = current x ``volts``); ``SAMP:COUN N`` readings per trigger;
    ``TRIG:SOUR IMM``; with ``interval=S`` also ``SAMP:SOUR TIM`` and ``SAMP:TIM S``, read back with
    ``SAMP:TIM?`` (the instrument may round it). After each command ``SYST:ERR?`` must answer
    ``0,...`` / ``+0,...``: an instrument that refuses a command is misconfigured, and the error
    names the command and the instrument's own error text.
acquire (a worker thread, block after block until ``stop()``)
    ``INIT`` then ``FETC?``, which returns the block's N comma-separated readings once they are
    taken. Sample times: with a sample interval, ``t_i = block start + i * interval`` on the
    instrument's timer (the block starts at the host time of ``INIT``, never before the previous
    block's last sample + one interval); without one, the readings are spread evenly over the
    host time between ``INIT`` and the answer. A block is handed out once the host clock has
    passed its last sample (no sample is stamped in the future). ``stop()`` sends ``ABOR``.
garbage
    An answer that is not comma-separated finite numbers (or holds the SCPI overload value
    9.9E37) is answered by one resynchronisation: stale answers still in the output queue are read
    and dropped, ``*CLS``, and ``FETC?`` again (FETCh does not erase the readings, so the same block
    comes back). A second bad answer is a :class:`~insitu.measure.meters.MeterError` that quotes it.

Tests drive it against pyvisa-sim with instruments defined in ``tests/unit/data/scpi_power.yaml``.
"""

from __future__ import annotations

import math
import threading
import time
import warnings

from insitu.errors import UsageError
from insitu.measure import meters
from insitu.measure.meters import Meter, MeterError, Sample, SampleQueue

#: SCPI's value for an overload / invalid reading (SCPI-99 vol. 1, 7.2.1.5 "9.91E37 NaN").
_OVERLOAD = 9.9e37
_FUNCS = {"power": "CONF:POW", "current": "CONF:CURR:DC"}
_OPTIONS = ("backend", "func", "volts", "samples", "interval", "timeout")


def _install_hint() -> str:
    return "pip install 'insitu[measure]' (pyvisa, pyvisa-py, pyvisa-sim)"


class VisaMeter(Meter):
    """An SCPI instrument over PyVISA; see the module docstring for the exchange."""

    def __init__(self, resource: str, *, backend: str = "", func: str = "power",
                 volts: float | None = None, samples: int = 10, interval: float | None = None,
                 timeout_s: float = 10.0):
        if not resource:
            raise UsageError("--meter visa: give a VISA resource, e.g. "
                             "visa:USB0::0x2A8D::0x1301::MY1234::INSTR or visa:TCPIP0::10.0.0.5::INSTR")
        if func not in _FUNCS:
            raise UsageError(f"--meter visa:{resource}: func must be power or current, got {func!r}")
        if func == "current" and volts is None:
            raise UsageError(f"--meter visa:{resource};func=current: give the supply voltage the "
                             "current is drawn at (;volts=3.3): power = current x volts")
        if volts is not None and not volts > 0:
            raise UsageError(f"--meter visa:{resource}: volts must be positive, got {volts!r}")
        if samples < 1:
            raise UsageError(f"--meter visa:{resource}: samples must be at least 1, got {samples!r}")
        if interval is not None and not interval > 0:
            raise UsageError(f"--meter visa:{resource}: interval must be positive seconds, got {interval!r}")
        if not timeout_s > 0:
            raise UsageError(f"--meter visa:{resource}: timeout must be positive seconds, got {timeout_s!r}")
        self.resource, self.backend, self.func = resource, backend, func
        self.volts, self.samples, self.interval, self.timeout_s = volts, int(samples), interval, timeout_s
        self.name = f"visa:{resource}"
        self.idn: str | None = None
        self.resyncs = 0                      # garbage answers that one resynchronisation fixed
        self._rm = self._inst = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._samples = SampleQueue()

    # -- connection ------------------------------------------------------------------------

    def _fail(self, what: str) -> MeterError:
        return MeterError(f"{self.name}: {what}")

    def open(self) -> None:
        if self._inst is not None:
            return
        try:
            import pyvisa
            from pyvisa.resources import MessageBasedResource
        except ImportError:
            raise self._fail(f"PyVISA is not installed: {_install_hint()}") from None
        try:
            self._rm = pyvisa.ResourceManager(self.backend) if self.backend else pyvisa.ResourceManager()
        except (OSError, ValueError, pyvisa.Error) as exc:
            where = f"backend {self.backend!r}" if self.backend else "the default VISA library"
            raise self._fail(f"cannot load {where}: {exc} (for a simulated instrument give "
                             ";backend=PATH.yaml@sim; for pure-Python VISA ;backend=@py)") from None
        try:
            inst = self._rm.open_resource(self.resource, open_timeout=int(self.timeout_s * 1000))
        except Exception as exc:             # VisaIOError, OSError (refused socket), ValueError (bad name)
            self._close_rm()
            raise self._fail(f"cannot open the instrument: {exc}; check the resource name, the "
                             "cable or network, and that no other program holds it") from None
        if not isinstance(inst, MessageBasedResource):
            inst.close()
            self._close_rm()
            raise self._fail("this resource is not a message-based instrument: SCPI needs an "
                             "...::INSTR or ...::SOCKET resource")
        inst.read_termination = inst.write_termination = "\n"
        inst.timeout = int(self.timeout_s * 1000)
        self._inst = inst
        try:
            idn = self._query("*IDN?").strip()
            if not idn or not idn.isprintable():
                raise self._fail(f"no instrument answered *IDN? (answer {idn!r}): is the resource "
                                 "right and the instrument on?")
            self.idn = idn
            self._write("*CLS")
            self._configure()
        except BaseException:
            self.close()
            raise

    def _instrument(self):
        if self._inst is None:
            raise self._fail("the instrument is not open")
        return self._inst

    def _write(self, command: str) -> None:
        inst = self._instrument()
        try:
            inst.write(command)
        except Exception as exc:
            raise self._fail(f"writing {command!r} failed: {exc}") from None

    def _query(self, command: str) -> str:
        inst = self._instrument()
        try:
            with warnings.catch_warnings():       # an empty answer: reported below, not warned
                warnings.filterwarnings("ignore", "read string doesn't end with termination")
                return inst.query(command)
        except Exception as exc:
            raise self._fail(f"no answer to {command!r}: {exc}") from None

    def _command(self, command: str) -> None:
        """Send a setting and check the instrument's error queue accepted it."""
        self._write(command)
        answer = self._query("SYST:ERR?").strip()
        code = answer.split(",", 1)[0].strip()
        try:
            ok = int(code) == 0
        except ValueError:
            raise self._fail(f"SYST:ERR? after {command!r} answered {answer!r}, not an SCPI error "
                             "entry (code,\"text\")") from None
        if not ok:
            raise self._fail(f"the instrument refused {command!r}: {answer}; it may not support "
                             f"func={self.func} (a DMM measures current: ;func=current;volts=V)")

    def _configure(self) -> None:
        self._command(_FUNCS[self.func])
        self._command(f"SAMP:COUN {self.samples:d}")
        self._command("TRIG:SOUR IMM")
        if self.interval is not None:
            self._command("SAMP:SOUR TIM")
            self._command(f"SAMP:TIM {self.interval:.6f}")
            answer = self._query("SAMP:TIM?").strip()
            try:
                got = float(answer)
            except ValueError:
                raise self._fail(f"SAMP:TIM? answered {answer!r}, not a number of seconds") from None
            if not got > 0:
                raise self._fail(f"SAMP:TIM? answered {answer!r}: the sample interval must be positive")
            self.interval = got                 # the instrument's own (possibly rounded) interval

    def close(self) -> None:
        self.stop()
        if self._inst is not None:
            try:
                self._inst.close()
            except Exception:
                pass
            self._inst = None
        self._close_rm()

    def _close_rm(self) -> None:
        if self._rm is not None:
            try:
                self._rm.close()
            except Exception:
                pass
            self._rm = None

    # -- acquisition -----------------------------------------------------------------------

    def start(self) -> None:
        if self._inst is None:
            self.open()
        if self._thread is not None:
            raise self._fail("already started; stop() it first")
        self._stop.clear()
        self._samples.clear()
        self._last_t = None
        self.started_at, self._t0 = time.time(), time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"meter {self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                t_init = time.monotonic() - self._t0
                self._write("INIT")
                readings = self._fetch()
                t_done = time.monotonic() - self._t0
                times = self._times(t_init, t_done, len(readings))
                block = [self._sample(t, r) for t, r in zip(times, readings)]
                # A real instrument answers FETC? once its last reading is taken; one that answers
                # sooner (a simulator) is held back, so no sample is stamped in the future.
                ahead = self._t0 + times[-1] - time.monotonic()
                if ahead > 0:
                    self._stop.wait(ahead)
                self._samples.put(block)
                self._last_t = times[-1]
        except BaseException as exc:            # reported by read()
            self._samples.fail(exc)

    def _times(self, t_init: float, t_done: float, n: int) -> list[float]:
        if self.interval is not None:
            start = t_init if self._last_t is None else max(t_init, self._last_t + self.interval)
            return [start + i * self.interval for i in range(n)]
        span = max(t_done - t_init, 0.0)
        start = t_init if self._last_t is None else max(t_init, self._last_t)
        return [start + (i + 0.5) * span / n for i in range(n)]

    def _sample(self, t: float, reading: float) -> Sample:
        if self.func == "power":
            return Sample(t, reading, volts=self.volts)
        assert self.volts is not None               # func=current requires it (__init__)
        return Sample(t, reading * self.volts, volts=self.volts, amps=reading)

    def _fetch(self) -> list[float]:
        answer = self._query("FETC?")
        readings = parse_readings(answer)
        if readings is not None:
            return readings
        self._resync()
        again = self._query("FETC?")
        readings = parse_readings(again)
        if readings is None:
            raise self._fail(f"answered {_clip(answer)} and, after resynchronising (*CLS), "
                             f"{_clip(again)} to FETC?: not comma-separated readings (an overload, "
                             "a wrong function, or another program talking to the instrument)")
        self.resyncs += 1
        return readings

    def _resync(self) -> None:
        """Drop answers left in the instrument's output queue, then clear its status."""
        inst = self._instrument()
        saved = inst.timeout
        inst.timeout = 100
        try:
            for _ in range(64):
                try:
                    inst.read()
                except Exception:
                    break
        finally:
            inst.timeout = saved
        self._write("*CLS")

    def read(self, timeout_s: float = 1.0) -> list[Sample]:
        if self.started_at is None:
            raise self._fail("read before start()")
        out, err = self._samples.take(timeout_s, lambda: self._thread is not None)
        if isinstance(err, MeterError):
            raise err
        if err is not None:
            raise self._fail(f"acquisition failed: {err}") from err
        return out

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(self.timeout_s + 5.0)
        self._thread = None
        if self._inst is not None:
            try:
                self._inst.write("ABOR")
            except Exception:
                pass

    def describe(self) -> dict:
        return {"meter": self.name, "kind": "visa", "resource": self.resource,
                "backend": self.backend or None, "idn": self.idn, "func": self.func,
                "volts": self.volts, "samples_per_block": self.samples,
                "interval_s": self.interval, "resyncs": self.resyncs}


def _clip(text: str, n: int = 60) -> str:
    text = text.strip()
    return repr(text if len(text) <= n else text[:n] + "...")


def parse_readings(answer: str) -> list[float] | None:
    """Comma-separated finite readings, or None for anything else (garbage, overload, empty)."""
    fields = answer.strip().split(",")
    try:
        values = [float(f) for f in fields]
    except ValueError:
        return None
    if not values or any(not math.isfinite(v) or abs(v) >= _OVERLOAD for v in values):
        return None
    return values


def parse_spec(arg: str) -> VisaMeter:
    """``RESOURCE[;key=value...]`` -> a :class:`VisaMeter` (not yet opened)."""
    resource, *options = (arg or "").split(";")
    resource = resource.strip()
    kw: dict = {}
    for option in options:
        if not option.strip():
            continue
        key, eq, value = option.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or key not in _OPTIONS:
            raise UsageError(f"--meter visa:{arg}: unknown option {option!r}; the options are "
                             f"{', '.join(k + '=' for k in _OPTIONS)}")
        try:
            if key in ("volts", "interval"):
                kw[key] = float(value)
            elif key == "timeout":
                kw["timeout_s"] = float(value)
            elif key == "samples":
                kw[key] = int(value)
            else:
                kw[key] = value
        except ValueError:
            raise UsageError(f"--meter visa:{arg}: {key}= needs a number, got {value!r}") from None
    return VisaMeter(resource, **kw)


meters.KINDS["visa"] = parse_spec
