"""Recording a power trace while something runs, and the energy it took, per phase.

:class:`Recorder` pulls samples from a :class:`~insitu.measure.meters.Meter` and appends them to a
CSV as they arrive; :func:`run_command` records while a command runs as a subprocess (``insitu
power record``), :func:`measure_call` while a function runs in this process (``insitu train
--meter``). Both end with a *record*: the energy of the whole trace and of each phase the run
marked (:mod:`insitu.measure.phases`), written beside the CSV as JSON.

Files, for ``--trace run.csv`` (``--run-dir DIR``: ``DIR/power.csv`` and so on):

- ``run.csv`` — a header, then one row per sample: ``host_time`` (``time.time()`` of the sample:
  ``meter.started_at + t``), ``t`` (seconds since the acquisition started, the meter's clock),
  ``watts``, ``volts``, ``amps`` (empty where the meter does not measure them). Each batch of rows
  goes to the file in one ``write`` of complete lines as soon as the meter hands it over (and to
  the disk, ``fsync``, every few seconds), so a run that is interrupted, whose command crashes or
  whose meter disconnects leaves a valid CSV of everything measured until then.
- ``run.phases.jsonl`` — the phase markers the run appended (the file :data:`PHASE_ENV` names).
- ``run.json`` — the record (the summary ``--json`` prints), written atomically at the end.

None of the three is ever overwritten: a recording refuses to start (a :class:`UsageError`, before
the meter opens) when any of them exists (:func:`check_new`; :func:`free_trace` finds the first free
name of a series), and a meter that cannot be opened or started removes the two files it had just
created, so no run leaves a trace beside another run's record.

Energy per training sample (``energy_per_training_sample_j``) is the energy of the ``train`` phase
divided by the samples it counted, never the whole run's energy: loading, evaluation and the
recorder's own start and drain are not training.

Energy is the trapezoidal integral of the samples (:func:`insitu.measure.energy.integrate`); a phase is clipped to its
interval, the power at its edges interpolated between the samples around them. The samples are
kept in memory for the summary (16 bytes each: an hour at 10 kHz is 0.6 GB).
"""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import threading
import time
from array import array
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from insitu.errors import InsituError, UsageError
from insitu.io import atomic_write_json, save_figure
from insitu.measure.energy import integrate
from insitu.measure.meters import Meter, MeterError, Sample
from insitu.measure.phases import PHASE_ENV, intervals, listening, mark, read_markers

CSV_COLUMNS = ("host_time", "t", "watts", "volts", "amps")

#: How a recording ended (the record's ``ended``).
ENDED = ("exit", "interrupted", "meter-error", "error")

_FSYNC_EVERY_S = 2.0


def sidecar_paths(out: str | Path) -> tuple[Path, Path]:
    """The record (JSON) and phase-marker file that go beside the CSV ``out``."""
    out = Path(out)
    return out.with_suffix(".json"), out.with_suffix(".phases.jsonl")


def _taken_message(path: Path, out: Path, what: str) -> str:
    whose = "" if path == out else f" (the {'record' if path.suffix == '.json' else 'phase markers'} of {out})"
    return (f"{what}: {path}{whose} exists already, and a power trace, its record and its phase "
            f"markers are never overwritten: choose another path, or delete it")


def check_new(out: str | Path, what: str = "--trace") -> Path:
    """``out`` when neither it nor its sidecars (:func:`sidecar_paths`) exist; else a
    :class:`UsageError` naming the file that does, and what to do."""
    out = Path(out)
    for path in (out, *sidecar_paths(out)):
        if path.exists() or path.is_symlink():
            raise UsageError(_taken_message(path, out, what))
    return out


def free_trace(base: str | Path) -> Path:
    """The first of ``base`` (``power.csv``), ``power-1.csv``, ``power-2.csv``... that exists
    neither itself nor with its sidecars."""
    base = Path(base)
    for n in range(0, 100_000):
        path = base if n == 0 else base.with_name(f"{base.stem}-{n}{base.suffix}")
        if not any(p.exists() or p.is_symlink() for p in (path, *sidecar_paths(path))):
            return path
    raise UsageError(f"no free name for the power trace beside {base} (tried {base.stem}-1 to "
                     f"{base.stem}-99999): choose one with --power-out")


# ----------------------------------------------------------------------------------- recording

class Recorder:
    """Streams a meter's samples into a CSV (see the module's docstring) and keeps them for the
    summary. ``start()``, then ``pump()`` as often as possible, then ``finish()``."""

    def __init__(self, meter: Meter, out: str | Path, what: str = "--trace"):
        self.meter, self.out, self.what = meter, Path(out), what
        self.record_path, self.phase_path = sidecar_paths(self.out)
        self.t, self.w = array("d"), array("d")
        self.started_at: float | None = None
        self.meter_error: MeterError | None = None
        self._fd: int | None = None
        self._last_fsync = 0.0
        self._meter_live = False

    # -- the CSV
    def _write(self, text: str) -> None:
        assert self._fd is not None, "the CSV is open (start() made it)"
        data = text.encode()
        while data:
            n = os.write(self._fd, data)
            data = data[n:]

    def start(self) -> None:
        """Create the CSV (its header) and the marker file, both new (a :class:`UsageError` when
        either, or the record, exists: nothing is overwritten), open and start the meter. A meter
        that cannot be opened or started leaves no file behind."""
        check_new(self.out, self.what)
        created: list[Path] = []
        try:
            self._fd = os.open(self.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            created.append(self.out)
            self._write(",".join(CSV_COLUMNS) + "\n")
            os.close(os.open(self.phase_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            created.append(self.phase_path)
        except FileExistsError as exc:                  # created meanwhile by another run
            self._close_file()
            _remove(created)
            raise UsageError(_taken_message(Path(exc.filename or self.out), self.out, self.what)) from None
        except OSError as exc:
            self._close_file()
            _remove(created)
            raise UsageError(f"cannot write {self.what} {exc.filename or self.out}: {exc.strerror}") from None
        try:
            self.meter.open()
            self._meter_live = True
            self.meter.start()
        except BaseException:
            self._stop_meter()
            self._close_file()
            _remove(created)                             # nothing was recorded
            raise
        self.started_at = self.meter.started_at if self.meter.started_at is not None else time.time()
        self._last_fsync = time.monotonic()

    def pump(self, timeout_s: float = 0.1) -> int:
        """Read what the meter has (waiting up to ``timeout_s``), append it to the CSV; the number
        of samples. A :class:`MeterError` is kept in :attr:`meter_error` and raised."""
        try:
            samples = self.meter.read(timeout_s)
        except MeterError as exc:
            self.meter_error = exc
            raise
        if samples:
            self._append(samples)
        if time.monotonic() - self._last_fsync >= _FSYNC_EVERY_S:
            assert self._fd is not None, "pump() runs between start() and finish()"
            os.fsync(self._fd)
            self._last_fsync = time.monotonic()
        return len(samples)

    def _append(self, samples: Sequence[Sample]) -> None:
        t0 = self.started_at
        assert t0 is not None, "samples come only after start() set started_at"
        rows = []
        for s in samples:
            t, w = float(s.t), float(s.watts)
            volts = "" if s.volts is None else repr(float(s.volts))
            amps = "" if s.amps is None else repr(float(s.amps))
            rows.append(f"{t0 + t:.6f},{t!r},{w!r},{volts},{amps}\n")
            self.t.append(t)
            self.w.append(w)
        self._write("".join(rows))

    def drain(self, until: float, max_s: float = 2.0, poll_s: float = 0.1) -> None:
        """After the run: read on until the trace reaches host time ``until`` (a meter may hand
        samples over late) or ``max_s`` passed; a stall in between is waited out, not a stop."""
        if self.meter_error is not None:
            return
        assert self.started_at is not None, "drain() runs after start()"
        deadline = time.monotonic() + max_s
        target = until - self.started_at
        while (not self.t or self.t[-1] < target) and time.monotonic() < deadline:
            try:
                self.pump(min(poll_s, max(0.0, deadline - time.monotonic())))
            except MeterError:
                return

    def _stop_meter(self) -> str | None:
        if not self._meter_live:
            return None
        self._meter_live = False
        problem = None
        for step in (self.meter.stop, self._last_read, self.meter.close):
            try:
                step()
            except MeterError as exc:     # a meter already gone: the samples read stay valid
                problem = problem or str(exc)
        return problem

    def _last_read(self) -> None:
        # What the meter flushed while stopping (a PowerShield sends its buffer's tail); nothing
        # when it never started (a failed start: its error is the one to report).
        samples = self.meter.read(0) if self.started_at is not None else []
        if samples:
            self._append(samples)

    def _close_file(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError:
                pass
            os.close(self._fd)
            self._fd = None

    def finish(self, *, ended: str, message: str, command, exit_code: int | None,
               extra: dict | None = None) -> dict:
        """Stop the meter, close the CSV, and write the record beside it; the record."""
        stop_problem = self._stop_meter()
        self._close_file()
        if ended not in ENDED:
            raise ValueError(f"ended must be one of {ENDED}, got {ended!r}")
        if self.meter_error is not None and ended == "exit":
            ended = "meter-error"
        try:
            meter = self.meter.describe()
        except Exception as exc:                       # a record without it beats none
            meter = {"meter": getattr(self.meter, "name", "meter"), "describe_error": str(exc)}
        record = {
            "command": list(command) if not isinstance(command, str) else command,
            "exit_code": exit_code,
            "ended": ended,
            "message": message,
            "complete": ended == "exit" and exit_code == 0,
            "csv": str(self.out),
            "phases_file": str(self.phase_path),
            "record": str(self.record_path),
            "meter": meter,
            "started_at": self.started_at,
            **summarize(np.frombuffer(self.t, dtype=float), np.frombuffer(self.w, dtype=float),
                        read_markers(self.phase_path), self.started_at),
        }
        if stop_problem:
            record["meter_stop_error"] = stop_problem
        record.update(extra or {})
        try:
            atomic_write_json(self.record_path, record)
        except OSError as exc:
            raise InsituError(f"cannot write the record {self.record_path}: {exc.strerror}") from None
        return record


def _remove(paths) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


# ----------------------------------------------------------------------------------- the summary

def _r(x, digits=9):
    return None if x is None or not math.isfinite(x) else float(f"{x:.{digits}g}")


def summarize(t, w, markers: list[dict], started_at: float | None) -> dict:
    """Energy, mean power and duration of the trace ``t`` (seconds), ``w`` (watts), and of each
    phase of ``markers`` (host times; aligned with ``started_at``, the host time of t = 0)."""
    t, w = np.asarray(t, dtype=float), np.asarray(w, dtype=float)
    if t.size > 1 and np.any(np.diff(t) < 0):       # a meter that delivered out of order
        order = np.argsort(t, kind="stable")
        t, w = t[order], w[order]
    n = int(t.size)
    duration = float(t[-1] - t[0]) if n > 1 else 0.0
    energy = integrate(t, w)
    out = {
        "energy_j": _r(energy),
        "mean_w": _r(energy / duration) if duration > 0 else (_r(float(w[0])) if n else None),
        "duration_s": _r(duration),
        "samples": n,
        "sample_rate_hz": _r((n - 1) / duration, 6) if duration > 0 else None,
        "max_gap_s": _r(float(np.max(np.diff(t))), 6) if n > 1 else None,
        "min_w": _r(float(w.min())) if n else None,
        "max_w": _r(float(w.max())) if n else None,
    }
    phases, totals = [], {}
    offset = started_at if started_at is not None else 0.0
    end = float(t[-1]) if n else 0.0
    for iv in intervals(markers):
        start = iv.start - offset
        stop = (iv.stop if iv.stop is not None else offset + end) - offset
        covered = max(0.0, min(stop, end) - max(start, float(t[0]))) if n > 1 else 0.0
        e = integrate(t, w, start, stop) if n > 1 else 0.0
        phases.append({
            "name": iv.name, "start": _r(start), "stop": _r(stop), "duration_s": _r(stop - start),
            "complete": iv.stop is not None, "covered_s": _r(covered), "energy_j": _r(e),
            "mean_w": _r(e / covered) if covered > 0 else None, "samples": iv.samples,
            "energy_per_sample_j": _r(e / iv.samples) if iv.samples else None,
        })
        tot = totals.setdefault(iv.name, {"count": 0, "duration_s": 0.0, "covered_s": 0.0,
                                          "energy_j": 0.0, "samples": None})
        tot["count"] += 1
        tot["duration_s"] += stop - start
        tot["covered_s"] += covered
        tot["energy_j"] += e
        if iv.samples is not None:
            tot["samples"] = (tot["samples"] or 0) + iv.samples
    for tot in totals.values():
        tot["mean_w"] = _r(tot["energy_j"] / tot["covered_s"]) if tot["covered_s"] > 0 else None
        tot["energy_per_sample_j"] = _r(tot["energy_j"] / tot["samples"]) if tot["samples"] else None
        for k in ("duration_s", "covered_s", "energy_j"):
            tot[k] = _r(tot[k])
    out["phases"] = phases
    out["by_phase"] = totals
    out.update(training_energy(phases))
    return out


#: The phase whose energy per sample is the energy per training sample.
TRAINING_PHASE = "train"


def training_energy(phases: list[dict]) -> dict:
    """``energy_per_training_sample_j``: the energy of the ``train`` phases over the samples they
    counted (never the whole run's energy: loading, evaluation and the recorder's start and drain
    are not training); with ``training_energy_j`` and ``training_samples``. All null when there is
    no train phase or it counted no samples; the per-sample figure is also null when a train phase
    was cut or the trace does not cover it (a meter that failed mid-run: its energy is short)."""
    train = [p for p in phases if p["name"] == TRAINING_PHASE]
    energy = sum(p["energy_j"] or 0.0 for p in train) if train else None
    counted = [p["samples"] for p in train if p["samples"] is not None]
    samples = sum(counted) if counted else None
    covered = all(p["complete"] and p["duration_s"] is not None and p["covered_s"] is not None
                  and p["duration_s"] - p["covered_s"] <= 0.01 * p["duration_s"] + 1e-6
                  and p["samples"] is not None for p in train)
    return {"training_energy_j": _r(energy) if energy is not None else None,
            "training_samples": samples,
            "energy_per_training_sample_j": (_r(energy / samples)
                                             if energy is not None and samples and covered
                                             else None)}


def load_csv(path: str | Path) -> dict[str, np.ndarray]:
    """A trace CSV as arrays (``host_time``, ``t``, ``watts``, ``volts``, ``amps``; NaN where
    empty). A torn last line (a recorder killed mid-write) is dropped; anything else that is not
    a trace is an :class:`InsituError` naming the file and line."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InsituError(f"cannot read the power trace {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InsituError(f"{path} is not a power trace CSV (not text)") from None
    if not lines or tuple(lines[0].split(",")) != CSV_COLUMNS:
        raise InsituError(f"{path} is not a power trace CSV: its header must be {','.join(CSV_COLUMNS)}")
    cols = [[] for _ in CSV_COLUMNS]
    for i, row in enumerate(csv.reader(lines[1:]), start=2):
        try:
            if len(row) != len(CSV_COLUMNS):
                raise ValueError
            values = [float(x) if x else math.nan for x in row]
            if math.isnan(values[1]) or math.isnan(values[2]):
                raise ValueError
        except ValueError:
            if i == len(lines):
                break                                  # torn last line
            raise InsituError(f"{path}, line {i}: not a sample row: {','.join(row)!r}") from None
        for col, v in zip(cols, values):
            col.append(v)
    return {name: np.array(col, dtype=float) for name, col in zip(CSV_COLUMNS, cols)}


def summarize_files(csv_path: str | Path, phases_path: str | Path | None = None) -> dict:
    """The summary of a trace CSV and its marker file (e.g. of a recorder that was killed)."""
    trace = load_csv(csv_path)
    if phases_path is None:
        phases_path = sidecar_paths(csv_path)[1]
    started_at = float(trace["host_time"][0] - trace["t"][0]) if trace["t"].size else None
    return summarize(trace["t"], trace["watts"], read_markers(phases_path), started_at)


# ------------------------------------------------------------------------------- run a command

def _exit_status(returncode: int) -> int:
    """A subprocess return code as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def _stop_child(child: subprocess.Popen, sig: int, grace_s: float = 1.0) -> None:
    """Let a child that got the terminal's Ctrl-C end; then ask (``sig``), then insist."""
    for action, wait_s in ((None, grace_s), (lambda: child.send_signal(sig), 5.0),
                           (child.terminate, 5.0), (child.kill, None)):
        if child.poll() is not None:
            return
        if action is not None:
            try:
                action()
            except ProcessLookupError:
                return
        try:
            child.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_command(meter: Meter, argv: Sequence[str], out: str | Path, *, poll_s: float = 0.1,
                drain_s: float = 2.0, env: dict | None = None, handle_signals: bool = True,
                stdout=None, what: str = "--trace",
                notify: Callable[[str], None] = lambda message: None) -> dict:
    """Record ``meter`` into ``out`` while ``argv`` runs; the record (see :func:`summarize`, plus
    ``command``, ``exit_code``, ``ended``, ``message``, ``complete``, ``csv``, ``meter``...).

    The command gets :data:`PHASE_ENV` for its phase markers. SIGINT or SIGTERM to this process
    (``handle_signals``, main thread only) stop the recording and then the command (it is given a
    second to end on the terminal's own Ctrl-C, then the signal, then SIGTERM, then SIGKILL). A
    meter that fails mid-run ends the recording; the command runs on to its end (``notify`` says
    so). The trace read until then stays in ``out`` either way. ``stdout``: where the command's
    standard output goes (``subprocess.Popen``'s; None: this process's stdout; ``--json`` gives 2,
    stderr, so that stdout holds the record alone). ``out`` and its sidecars must be new
    (:func:`check_new`; ``what`` names the option in the message)."""
    argv = [str(a) for a in argv]
    if not argv:
        raise UsageError("no command to measure")
    rec = Recorder(meter, out, what=what)
    rec.start()
    got_signal: list[int] = []
    previous = {}
    if handle_signals and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: got_signal.append(signum))
    child = None
    ended, message = "error", "the recorder failed"
    t_start, t_end = time.time(), None
    try:
        try:
            child = subprocess.Popen(argv, env={**os.environ, **(env or {}), PHASE_ENV: str(rec.phase_path)},
                                     stdout=stdout)
        except OSError as exc:
            raise UsageError(f"cannot run {argv[0]}: {exc.strerror}") from None
        while not got_signal and child.poll() is None:
            if rec.meter_error is None:
                try:
                    rec.pump(poll_s)
                except MeterError as exc:
                    notify(f"the meter failed: {exc}; the trace until then is in {rec.out}; "
                           f"waiting for the command to end (Ctrl-C stops it)")
            else:
                try:
                    child.wait(timeout=poll_s)
                except subprocess.TimeoutExpired:
                    pass
        t_end = time.time()
        if got_signal:
            sig = got_signal[0]
            ended = "interrupted"
            message = f"interrupted by {signal.Signals(sig).name}; the command was stopped"
            _stop_child(child, sig)
            rec.drain(t_end, min(drain_s, 0.5), poll_s)
        else:
            rec.drain(t_end, drain_s, poll_s)
            code = _exit_status(child.returncode)
            if rec.meter_error is not None:
                ended, message = "meter-error", f"the meter failed mid-run: {rec.meter_error}"
            else:
                ended = "exit"
                message = ("the command finished" if code == 0 else
                           f"the command failed (exit {code})" if child.returncode > 0 else
                           f"the command was killed by {_signal_name(-child.returncode)}")
    except KeyboardInterrupt:                      # signals not handled here (handle_signals off)
        ended, message = "interrupted", "interrupted (KeyboardInterrupt); the command was stopped"
        raise
    finally:
        if child is not None and child.poll() is None:           # never leave it orphaned
            _stop_child(child, signal.SIGTERM, grace_s=0.0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        code = None if child is None or child.returncode is None else _exit_status(child.returncode)
        t_end = time.time() if t_end is None else t_end
        record = rec.finish(ended=ended, message=message, command=argv, exit_code=code,
                            extra={"command_s": _r(t_end - t_start, 6)})
    return record


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def exit_code_of(record: dict) -> int:
    """The exit status for a recording: the command's when it failed; 130 interrupted; 1 when
    the meter failed under a command that succeeded; else 0."""
    code = record.get("exit_code")
    if record["ended"] == "interrupted":
        return 130
    if code:
        return code
    if record["ended"] in ("meter-error", "error"):
        return 1
    return 0 if code == 0 else 1


# ------------------------------------------------------------------------ measure a function call

class InProcessRecording:
    """``meter`` recorded into ``out`` by a thread while this process works in the ``with`` block;
    :func:`~insitu.measure.phases.phase` calls meanwhile (here and in subprocesses) mark phases in
    it. After the block, :attr:`recorder` holds the trace: ``recorder.finish(...)`` writes the
    record."""

    def __init__(self, meter: Meter, out: str | Path, *, what: str = "--trace", poll_s: float = 0.1,
                 notify: Callable[[str], None] = lambda message: None):
        self.recorder = Recorder(meter, out, what=what)
        self.poll_s, self.notify = poll_s, notify
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="insitu-power-recorder", daemon=True)
        self._listening = listening(self.recorder.phase_path)

    def _pump(self) -> None:
        while not self._stop.is_set():
            try:
                self.recorder.pump(self.poll_s)
            except MeterError as exc:
                self.notify(f"the meter failed: {exc}; the trace until then is in "
                            f"{self.recorder.out}; the run goes on unmeasured")
                return

    def start(self) -> None:
        self.recorder.start()
        self._listening.__enter__()
        self._thread.start()

    def stop(self) -> None:
        """Stop marking and pumping (the meter stays open for a last drain and ``finish``)."""
        self._listening.__exit__(None, None, None)
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> InProcessRecording:
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False


def measure_call(meter: Meter, out: str | Path, fn: Callable[[], object], *, phase: str = "run",
                 command=None, poll_s: float = 0.1, drain_s: float = 2.0, what: str = "--power-out",
                 notify: Callable[[str], None] = lambda message: None):
    """Run ``fn()`` in this process while a thread records ``meter`` into ``out`` (new, with its
    sidecars: :func:`check_new`, ``what`` names the option); ``(fn's value, record)``. Phases are
    marked as :class:`InProcessRecording` says; when ``fn`` marks none, the whole call is one
    phase named ``phase`` (``run``: not ``train``, since it is not the training alone, so that it
    gives no energy per training sample; its samples: the value's ``samples`` when it is a dict).
    When ``fn`` raises, the record is written (``ended``: interrupted or error) and the exception
    goes on."""
    import sys

    live = InProcessRecording(meter, out, what=what, poll_s=poll_s, notify=notify)
    rec = live.recorder
    live.start()
    ended, message, value = "error", "the measured call raised", None
    t0 = time.time()
    try:
        value = fn()
        ended, message = "exit", "the run finished"
    except KeyboardInterrupt:
        ended, message = "interrupted", "interrupted (KeyboardInterrupt)"
        raise
    except BaseException as exc:
        message = f"the run failed: {type(exc).__name__}: {exc}"
        raise
    finally:
        t1 = time.time()
        live.stop()
        if ended != "interrupted":
            rec.drain(t1, drain_s, poll_s)
        if not read_markers(rec.phase_path):
            samples = value.get("samples") if isinstance(value, dict) else None
            samples = samples if isinstance(samples, int) and not isinstance(samples, bool) else None
            with listening(rec.phase_path):
                mark(phase, "start", t=t0)
                if ended == "exit":
                    mark(phase, "stop", samples, t=t1)
        record = rec.finish(ended=ended, message=message,
                            command=list(sys.argv) if command is None else command,
                            exit_code=0 if ended == "exit" else None,
                            extra={"command_s": _r(t1 - t0, 6)})
    return value, record


# ------------------------------------------------------------------------------------ the figure

def plot_record(record: dict, t, w, path: str | Path) -> Path:
    """A PNG of the trace (watts over seconds) with the phases shaded and named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, w = np.asarray(t, dtype=float), np.asarray(w, dtype=float)
    fig, ax = plt.subplots(figsize=(10, 4))
    try:
        if t.size > 20_000:                       # an envelope: min..max per bucket, and the mean
            k = int(math.ceil(t.size / 5_000))
            m = t.size // k * k
            tb, wb = t[:m].reshape(-1, k), w[:m].reshape(-1, k)
            ax.fill_between(tb.mean(axis=1), wb.min(axis=1), wb.max(axis=1), color="C0", alpha=0.3, lw=0)
            ax.plot(tb.mean(axis=1), wb.mean(axis=1), color="C0", lw=0.8, label="power")
        else:
            ax.plot(t, w, color="C0", lw=0.8, label="power")
        phases = record.get("phases", [])
        colours, labelled = {}, set()
        for ph in phases:
            colour = colours.setdefault(ph["name"], f"C{len(colours) % 9 + 1}")
            label = None
            if ph["name"] not in labelled:          # one entry per phase name: all its spans
                labelled.add(ph["name"])
                label = _phase_label(ph["name"], [p for p in phases if p["name"] == ph["name"]])
            ax.axvspan(ph["start"], ph["stop"], color=colour, alpha=0.18, lw=0, label=label)
        meter = record.get("meter", {}).get("meter", "meter")
        energy = record.get("energy_j") or 0.0
        ax.set_title(f"{meter}: {energy:.4g} J in {record.get('duration_s') or 0:.3g} s"
                     + ("" if record.get("complete") else f" ({record.get('ended')})"))
        ax.set_xlabel("time since the meter started (s)")
        ax.set_ylabel("power (W)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
        fig.tight_layout()
        try:
            save_figure(fig, path, dpi=120)
        except OSError as exc:
            raise InsituError(f"cannot write --plot {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)
    return Path(path)


def _phase_label(name: str, spans: list[dict]) -> str:
    """A legend entry for every span of one phase: their energy summed (the record's
    ``training_energy_j`` for ``train``), and how many spans there are."""
    energies = [p["energy_j"] for p in spans if p.get("energy_j") is not None]
    counted = f": {sum(energies):.4g} J" if energies else ""
    return f"{name}{counted}" + (f" ({len(spans)} spans)" if len(spans) > 1 else "")
