"""Write-count reports of NVM weight cells (`insitu writes report`): the LRT papers' endurance
argument, from the per-cell write counts a training run leaves.

What a report reads (:func:`load_run`):

* the result JSON of ``insitu lrt adapt --out RUN.json``: its ``layers`` hold every layer's cells,
  maximum and total writes and histogram of writes per cell (power-of-two bins), and
  ``nvm_parameters`` the cost model of the run (:class:`insitu.lrt.nvm.NVMModel`). The exact
  per-cell counts are in the ``.npz`` of ``--counts COUNTS.npz``; give it with the report's
  ``--counts`` (or a ``counts_file`` key of the JSON names it) to check it against the JSON and
  draw from it. A ``--scheme all`` JSON holds several runs: pick one by its scheme.
* the result JSON of ``insitu train --algo lrt --out RUN.json``: its ``write_counts`` are the
  per-cell counts of the layer the LRT PE adapts (``layer``);
* a counts ``.npz`` alone (one integer array per layer); the number of samples it took then comes
  from the caller (lifetime needs it).

What a report gives, per layer and for the whole memory (:func:`run_report`): cells, written
cells, maximum and mean writes per cell, the histogram of writes per cell, the fraction of the
endurance the worst cell used, the projected lifetime (``endurance / max writes per cell`` times
the run's samples, and in seconds at the run's rate or a given one) and the NVM write energy
(``writes × bits per cell × pJ per bit``). Two runs (:func:`compare_reports`) give ratios
``first / second`` of each figure; :func:`plot_histograms` draws both runs' histograms per layer.

The cost model is :class:`~insitu.lrt.nvm.NVMModel`'s (RRAM: 10.9 pJ/bit per write, 10**6 writes
of endurance): a run's own ``nvm_parameters`` win over those defaults, and the caller's values
(command-line options) win over both. Bad input raises :class:`~insitu.errors.UsageError` naming
the file and what to give instead.
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.lib.npyio import NpzFile

from insitu.checks import check_int, check_number
from insitu.errors import UsageError
from insitu.lrt.nvm import NVMModel, write_histogram
from insitu.numerics import LRT_WEIGHT, LRT_WRITE_COUNT_BITS
from insitu.io import save_figure

__all__ = ["PE_COUNT_MAX", "Layer", "Run", "Technology", "common_edges", "compare_reports",
           "default_technology", "format_report", "histogram_labels", "layer_figures", "lifetime",
           "load_counts", "load_run", "plot_histograms", "rebin", "report_payload", "run_report",
           "write_energy_j"]

_PJ = 1e-12
#: The LRT PE's write counters saturate here (``insitu train --algo lrt`` counts).
PE_COUNT_MAX = (1 << LRT_WRITE_COUNT_BITS) - 1

_HOW = ("write counts come from `insitu lrt adapt ... --out RUN.json --counts COUNTS.npz` or "
        "`insitu train --algo lrt ... --out RUN.json`")


# --------------------------------------------------------------------------- technology

@dataclass(frozen=True)
class Technology:
    """The NVM cost model of a report: write energy per bit, endurance per cell, bits per cell;
    ``source`` says where each value came from (``option``, ``run`` or ``default``)."""

    write_pj_per_bit: float
    endurance: float
    bits_per_cell: int
    source: dict = field(default_factory=dict)

    @property
    def cell_write_j(self) -> float:
        """Energy of one cell write (all of its bits)."""
        return self.bits_per_cell * self.write_pj_per_bit * _PJ

    def as_dict(self) -> dict:
        return {"write_pj_per_bit": self.write_pj_per_bit, "endurance": self.endurance,
                "bits_per_cell": self.bits_per_cell, "cell_write_j": self.cell_write_j,
                "source": dict(self.source)}


def default_technology() -> Technology:
    """:class:`NVMModel`'s defaults (RRAM) and the LRT weight format's bits per cell."""
    nvm = NVMModel()
    return Technology(nvm.write_pj_per_bit, nvm.endurance, LRT_WEIGHT.bits,
                      {"write_pj_per_bit": "default", "endurance": "default",
                       "bits_per_cell": "default"})


# --------------------------------------------------------------------------- the math

def write_energy_j(total_writes: int, bits_per_cell: int, write_pj_per_bit: float) -> float:
    """NVM write energy of ``total_writes`` cell writes (each writes every bit of its cell)."""
    return total_writes * bits_per_cell * write_pj_per_bit * _PJ


def lifetime(endurance: float, max_writes: int, per: float | None) -> float | None:
    """``endurance / max_writes × per``: how many ``per`` units (samples, seconds) it takes the
    worst cell to reach its endurance at the observed rate. None when nothing was written (no
    wear: unlimited) or ``per`` is unknown."""
    if max_writes <= 0 or per is None:
        return None
    return endurance / max_writes * per


def _check_edges(edges) -> None:
    want = [0, 1]
    while len(want) < len(edges):
        want.append(want[-1] * 2)
    if list(edges) != want:
        raise ValueError(f"histogram edges {list(edges)} are not the power-of-two edges {want}")


def rebin(histogram: dict, edges: list[int]) -> dict:
    """A :func:`~insitu.lrt.nvm.write_histogram` histogram on longer power-of-two ``edges``
    (the bins are nested, so the extra bins are empty)."""
    _check_edges(histogram["edges"])
    _check_edges(edges)
    counts = list(histogram["counts"])
    if len(edges) < len(histogram["edges"]):
        if any(counts[len(edges) - 1:]):
            raise ValueError(f"histogram with edges {histogram['edges']} has cells beyond {edges[-1]}")
        counts = counts[:len(edges) - 1]
    return {"edges": list(edges), "counts": counts + [0] * (len(edges) - 1 - len(counts))}


def histogram_labels(edges) -> list[str]:
    """Bin labels: ``0``, ``1``, ``2-3``, ``4-7``, ..."""
    labels = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        labels.append(str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}")
    return labels


# --------------------------------------------------------------------------- runs

@dataclass
class Layer:
    """One weight array's write counts: per cell (``counts``) when known, else the run JSON's
    summary (cells, total, max and the power-of-two histogram, all exact)."""

    name: str
    cells: int
    total_writes: int
    max_writes: int
    histogram: dict
    counts: np.ndarray | None = None

    @classmethod
    def from_counts(cls, name: str, counts) -> Layer:
        counts = np.asarray(counts)
        if counts.size == 0:
            raise ValueError(f"layer {name} has no cells")
        if not np.issubdtype(counts.dtype, np.integer):
            if not (np.issubdtype(counts.dtype, np.floating) and np.isfinite(counts).all()
                    and np.all(counts == np.round(counts))):
                raise ValueError(f"layer {name}: counts of dtype {counts.dtype} are not whole numbers")
        counts = counts.astype(np.int64)
        if counts.min() < 0:
            raise ValueError(f"layer {name}: negative write counts")
        return cls(name, int(counts.size), int(counts.sum()), int(counts.max()),
                   write_histogram(counts), counts)

    @property
    def written_cells(self) -> int:
        """Cells written at least once (the histogram's first bin holds the never-written ones)."""
        if self.counts is not None:
            return int(np.count_nonzero(self.counts))
        return self.cells - int(self.histogram["counts"][0])


@dataclass
class Run:
    """What a report knows of one run."""

    file: str
    label: str
    source: str
    layers: dict[str, Layer]
    samples: int | None = None
    seconds: float | None = None
    counts_file: str | None = None
    #: the run's own cost model (None: not recorded)
    write_pj_per_bit: float | None = None
    endurance: float | None = None
    bits_per_cell: int | None = None
    info: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        """Whether every layer's per-cell counts are known (else: the JSON's histograms)."""
        return all(layer.counts is not None for layer in self.layers.values())


def _missing(path: Path, what: str, hint: str) -> None:
    if not path.exists():
        raise UsageError(f"{what} {path} does not exist; {hint}")
    if path.is_dir():
        raise UsageError(f"{what} {path} is a folder; {hint}")
    if path.stat().st_size == 0:
        raise UsageError(f"{what} {path} is empty (an interrupted run?); {hint}")


def load_counts(path, what: str = "counts file") -> dict[str, np.ndarray]:
    """Per-layer write counts from a ``.npz`` (one integer array per layer)."""
    path = Path(path)
    hint = "give the .npz written by `insitu lrt adapt --counts`"
    _missing(path, what, hint)
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, NpzFile):
            raise UsageError(f"{what} {path} is a single .npy array, not a .npz of per-layer "
                             f"counts; {hint}")
        with data:
            arrays = {name: data[name] for name in data.files}
    except UsageError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise UsageError(f"{what} {path} is not a readable .npz ({exc}); it may be truncated or "
                         f"corrupt; {hint}") from None
    if "__meta__" in arrays:
        raise UsageError(f"{what} {path} is a checkpoint, not write counts; {hint}")
    if not arrays:
        raise UsageError(f"{what} {path} holds no arrays; {hint}")
    for name, value in arrays.items():
        try:
            Layer.from_counts(name, value)
        except ValueError as exc:
            raise UsageError(f"{what} {path}: {exc}; {hint}") from None
    return arrays


def _read_json(path: Path, what: str):
    hint = "give the JSON written by `insitu lrt adapt --out` or `insitu train --algo lrt --out`"
    _missing(path, what, hint)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {what} {path} ({exc}); {hint}") from None
    if not text.strip():
        raise UsageError(f"{what} {path} is empty (an interrupted run?); {hint}")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                         f"{exc.msg}); it may be truncated; {hint}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{what} {path} holds a JSON {type(doc).__name__}, not a run's result "
                         f"object; {hint}")
    return doc


def _is_npz(path: Path) -> bool:
    if path.suffix.lower() in (".npz", ".npy"):
        return True
    try:
        with open(path, "rb") as fh:
            head = fh.read(6)
    except OSError:
        return False
    return head.startswith(b"PK\x03\x04") or head == b"\x93NUMPY"


def _whole(value) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value) if value == int(value) and value >= 0 else None


def _select(doc: dict, path: Path, what: str, scheme: str | None, option: str) -> dict:
    runs = doc.get("runs")
    if isinstance(runs, list) and runs and all(isinstance(r, dict) for r in runs):
        schemes = [str(r.get("scheme")) for r in runs]
        if scheme is None:
            raise UsageError(f"{what} {path} holds the runs of several schemes ({', '.join(schemes)}); "
                             f"pick one with {option} NAME")
        if scheme not in schemes:
            raise UsageError(f"{what} {path} has no run of scheme {scheme!r}; its schemes: "
                             f"{', '.join(schemes)}")
        return runs[schemes.index(scheme)]
    if scheme is not None and doc.get("scheme", doc.get("algo")) != scheme:
        raise UsageError(f"{what} {path} is a run of {doc.get('scheme', doc.get('algo'))!r}, not of "
                         f"{scheme!r} ({option} picks a run in a `--scheme all` file)")
    return doc


def _json_layers(doc: dict, path: Path, what: str) -> dict[str, Layer]:
    layers = {}
    for name, entry in doc["layers"].items():
        try:
            hist = entry["write_histogram"]
            cells = _whole(entry["cells"])
            total = _whole(entry["total_writes"])
            peak = _whole(entry["max_writes_per_cell"])
            if cells is None or total is None or peak is None or cells == 0:
                raise ValueError("cells, total_writes and max_writes_per_cell must be whole numbers")
            edges, counts = list(hist["edges"]), [int(c) for c in hist["counts"]]
            _check_edges(edges)
            if len(counts) != len(edges) - 1 or sum(counts) != cells or min(counts) < 0:
                raise ValueError(f"its histogram counts {counts} do not add up to its {cells} cells")
            if peak >= edges[-1] or (peak > 0 and not counts[-1]):
                raise ValueError(f"its histogram does not end at its maximum {peak}")
        except (KeyError, TypeError, ValueError) as exc:
            detail = f"lacks {exc}" if isinstance(exc, KeyError) else str(exc)
            raise UsageError(f"{what} {path}: layer {name}: {detail}; the file is not an intact "
                             f"`insitu lrt adapt --out` result") from None
        layers[name] = Layer(name, cells, total, peak, {"edges": edges, "counts": counts})
    if not layers:
        raise UsageError(f"{what} {path} has an empty 'layers' object: no write counts; {_HOW}")
    return layers


def _attach_counts(run: Run, counts_path: Path, what: str) -> None:
    arrays = load_counts(counts_path, "counts file")
    if sorted(arrays) != sorted(run.layers):
        raise UsageError(f"counts file {counts_path} holds layers {', '.join(sorted(arrays))}, run "
                         f"{run.file} layers {', '.join(sorted(run.layers))}: give the .npz written "
                         f"by the same `insitu lrt adapt` command")
    for name, counts in arrays.items():
        exact = Layer.from_counts(name, counts)
        summary = run.layers[name]
        if (exact.cells, exact.total_writes, exact.max_writes) != \
                (summary.cells, summary.total_writes, summary.max_writes):
            raise UsageError(f"counts file {counts_path} does not match run {run.file}: layer {name} "
                             f"has {exact.cells} cells, {exact.total_writes} writes, at most "
                             f"{exact.max_writes} per cell there and {summary.cells}, "
                             f"{summary.total_writes}, {summary.max_writes} in the run; give the "
                             f".npz written by the same `insitu lrt adapt` command")
        run.layers[name] = exact
    run.counts_file = str(counts_path)


def load_run(path, counts=None, scheme: str | None = None, what: str = "run file",
             scheme_option: str = "--scheme") -> Run:
    """Read a run for a report: a result JSON (``insitu lrt adapt``, ``insitu train --algo lrt``)
    with optional per-cell ``counts`` (.npz), or a counts .npz alone. ``scheme`` picks a run in a
    ``--scheme all`` JSON. Bad input raises :class:`UsageError` naming the file."""
    path = Path(path)
    _missing(path, what, f"give a run JSON or a counts .npz ({_HOW})")
    if _is_npz(path):
        if counts is not None:
            raise UsageError(f"{what} {path} is a counts .npz already; the counts option is for a "
                             "run JSON")
        if scheme is not None:
            raise UsageError(f"{scheme_option} picks a run in a JSON; {path} is a counts .npz")
        arrays = load_counts(path, what)
        run = Run(str(path), path.stem, "counts .npz",
                  {name: Layer.from_counts(name, a) for name, a in arrays.items()},
                  counts_file=str(path))
        return run

    doc = _select(_read_json(path, what), path, what, scheme, scheme_option)
    samples = _whole(doc.get("samples"))
    seconds = doc.get("seconds")
    seconds = float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) \
        and math.isfinite(seconds) and seconds > 0 else None
    info = {k: doc[k] for k in ("env", "scheme", "algo", "board", "arch", "model", "dataset", "seed")
            if isinstance(doc.get(k), (str, int)) and not isinstance(doc.get(k), bool)}

    if isinstance(doc.get("layers"), dict) and all(
            isinstance(v, dict) and "write_histogram" in v for v in doc["layers"].values()):
        run = Run(str(path), str(doc.get("scheme") or path.stem), "insitu lrt adapt",
                  _json_layers(doc, path, what), samples, seconds, info=info)
        params = doc.get("nvm_parameters")
        if not isinstance(params, dict):
            params = {}
        for key in ("write_pj_per_bit", "endurance"):
            value = params.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value) and value > 0:
                setattr(run, key, float(value))
        nvm = doc.get("nvm")
        if not isinstance(nvm, dict):
            nvm = {}
        bits, cells = _whole(nvm.get("bits")), _whole(nvm.get("cells"))
        if bits and cells and bits % cells == 0:
            run.bits_per_cell = bits // cells
        ref = doc.get("counts_file")
        if counts is None and isinstance(ref, str) and ref:
            counts = Path(ref)
            if not counts.is_absolute() and not counts.exists():
                counts = path.parent / counts
        if counts is not None:
            _attach_counts(run, Path(counts), what)
        else:
            run.notes.append("histograms from the run JSON (exact, power-of-two bins); give "
                             "--counts COUNTS.npz to read the per-cell counts")
        return run

    if "write_counts" in doc:
        name = doc.get("layer")
        if not (isinstance(name, str) and name):
            name = "layer"
        try:
            grid = np.asarray(doc["write_counts"])
            if grid.dtype == object:
                raise ValueError("write_counts is not a rectangular array of numbers")
            layer = Layer.from_counts(name, grid)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"{what} {path}: {exc}; the file is not an intact "
                             f"`insitu train --algo lrt --out` result") from None
        if counts is not None:
            raise UsageError(f"{what} {path} holds its per-cell counts itself (write_counts); "
                             "give no counts file with it")
        label = str(doc.get("algo") or path.stem)
        if doc.get("board"):
            label = f"{label}@{doc['board']}"
        run = Run(str(path), label, "insitu train", {name: layer}, samples, seconds,
                  counts_file=None, bits_per_cell=LRT_WEIGHT.bits, info=info)
        run.notes.append(f"the LRT PE adapts layer {name} only; the other layers are frozen "
                         "(never written)")
        if layer.max_writes >= PE_COUNT_MAX:
            run.notes.append(f"some cells reached {layer.max_writes} writes: the PE's 16-bit counters "
                             "saturate at 65535, so counts there are lower bounds")
        return run

    kind = doc.get("algo") or doc.get("scheme")
    said = f" (a run of {kind!r})" if kind else ""
    raise UsageError(f"{what} {path} holds no write counts{said}; {_HOW}")


# --------------------------------------------------------------------------- reports

def layer_figures(layer: Layer, tech: Technology, samples: int | None, rate: float | None,
                  edges: list[int] | None = None) -> dict:
    """The figures of one layer (or of the whole memory, as one :class:`Layer`)."""
    per_sample = lifetime(tech.endurance, layer.max_writes, samples)
    energy = write_energy_j(layer.total_writes, tech.bits_per_cell, tech.write_pj_per_bit)
    return {
        "cells": layer.cells,
        "written_cells": layer.written_cells,
        "total_writes": layer.total_writes,
        "max_writes_per_cell": layer.max_writes,
        "mean_writes_per_cell": layer.total_writes / layer.cells,
        "write_histogram": rebin(layer.histogram, edges) if edges else dict(layer.histogram),
        "endurance_used": layer.max_writes / tech.endurance,
        "lifetime_samples": per_sample,
        "lifetime_seconds": per_sample / rate if per_sample is not None and rate else None,
        "write_energy_j": energy,
        "write_energy_j_per_sample": energy / samples if samples else None,
    }


def _merged(layers) -> Layer:
    """The whole memory as one layer (histograms added on common edges)."""
    layers = list(layers)
    if all(layer.counts is not None for layer in layers):
        return Layer.from_counts("total", np.concatenate([layer.counts.ravel() for layer in layers]))
    edges = max((layer.histogram["edges"] for layer in layers), key=len)
    counts = np.sum([rebin(layer.histogram, edges)["counts"] for layer in layers], axis=0)
    return Layer("total", sum(layer.cells for layer in layers),
                 sum(layer.total_writes for layer in layers),
                 max(layer.max_writes for layer in layers),
                 {"edges": list(edges), "counts": [int(c) for c in counts]})


def _technology(run: Run, endurance=None, write_pj_per_bit=None, bits_per_cell=None) -> Technology:
    base = default_technology()
    values, source = {}, {}
    for key, option, own in (("write_pj_per_bit", write_pj_per_bit, run.write_pj_per_bit),
                             ("endurance", endurance, run.endurance),
                             ("bits_per_cell", bits_per_cell, run.bits_per_cell)):
        if option is not None:
            values[key], source[key] = option, "option"
        elif own is not None:
            values[key], source[key] = own, "run"
        else:
            values[key], source[key] = getattr(base, key), "default"
    return Technology(float(values["write_pj_per_bit"]), float(values["endurance"]),
                      int(values["bits_per_cell"]), source)


def run_report(run: Run, *, endurance: float | None = None, write_pj_per_bit: float | None = None,
               bits_per_cell: int | None = None, rate: float | None = None,
               samples: int | None = None, edges: dict[str, list[int]] | None = None,
               rate_source: str = "option") -> dict:
    """The JSON-ready report of one run. Options override the run's cost model; ``rate``
    (samples per second) overrides the run's own (samples / seconds) for the lifetime in
    seconds (``rate_source`` says whose it is); ``samples`` fills in a run that does not know its
    count; ``edges`` (per layer name, and ``total``) puts histograms on given power-of-two edges
    (for a comparison)."""
    if endurance is not None:
        endurance = check_number("endurance", endurance)
    if write_pj_per_bit is not None:
        write_pj_per_bit = check_number("write energy (pJ per bit)", write_pj_per_bit)
    if bits_per_cell is not None:
        check_int("bits per cell", bits_per_cell)
    if rate is not None:
        rate = check_number("rate (samples per second)", rate)
    if samples is not None:
        check_int("samples", samples)
        if run.samples is not None and run.samples != samples:
            raise UsageError(f"run {run.file} says it took {run.samples} samples; --samples is for a "
                             "counts .npz given alone")
    tech = _technology(run, endurance, write_pj_per_bit, bits_per_cell)
    n = run.samples if run.samples is not None else samples
    own_rate = n / run.seconds if n and run.seconds else None
    use_rate = rate if rate is not None else own_rate
    edges = edges or {}
    layers = {name: layer_figures(layer, tech, n, use_rate, edges.get(name))
              for name, layer in run.layers.items()}
    total = layer_figures(_merged(run.layers.values()), tech, n, use_rate, edges.get("total"))
    notes = list(run.notes)
    if n is None:
        notes.append("no sample count (a counts .npz alone?): give --samples N for the lifetime "
                     "and the energy per sample")
    elif use_rate is None:
        notes.append("no run duration: give --rate SAMPLES_PER_S for the lifetime in time")
    return {
        "file": run.file, "counts_file": run.counts_file, "label": run.label,
        "source": run.source, **run.info,
        "samples": n, "seconds": run.seconds,
        "rate_samples_per_s": use_rate,
        "rate_source": rate_source if rate is not None else ("run" if own_rate else None),
        "exact_counts": run.exact,
        "technology": tech.as_dict(),
        "layers": layers,
        "total": total,
        "notes": notes,
    }


def common_edges(runs: list[Run]) -> dict[str, list[int]]:
    """Per layer (and ``total``), the longest power-of-two edges among ``runs``."""
    out: dict[str, list[int]] = {}
    for run in runs:
        merged = _merged(run.layers.values())
        for name, layer in [*run.layers.items(), ("total", merged)]:
            edges = layer.histogram["edges"]
            if len(edges) > len(out.get(name, [])):
                out[name] = list(edges)
    return out


_RATIO_KEYS = ("max_writes_per_cell", "mean_writes_per_cell", "total_writes", "written_cells",
               "write_energy_j", "endurance_used", "lifetime_samples", "lifetime_seconds")


def _ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def compare_reports(first: dict, second: dict) -> dict:
    """Ratios ``first / second`` of each figure, per layer (those of both runs) and in total.
    None where a side is missing, unknown or zero (a lifetime is None when nothing was written)."""
    names = [n for n in first["layers"] if n in second["layers"]]
    only = {first["label"]: [n for n in first["layers"] if n not in second["layers"]],
            second["label"]: [n for n in second["layers"] if n not in first["layers"]]}

    def ratios(a, b):
        return {k: _ratio(a[k], b[k]) for k in _RATIO_KEYS}

    return {"numerator": first["label"], "denominator": second["label"],
            "layers": {n: ratios(first["layers"][n], second["layers"][n]) for n in names},
            "total": ratios(first["total"], second["total"]),
            "layers_in_one_run_only": {k: v for k, v in only.items() if v}}


def report_payload(runs: list[Run], **options) -> dict:
    """The report of one run, or of two side by side with their ratios (first / second)."""
    if not 1 <= len(runs) <= 2:
        raise ValueError("a report takes one run or two")
    if len(runs) == 2 and runs[0].label == runs[1].label:
        for run in runs:
            run.label = f"{run.label} ({Path(run.file).name})"
    edges = common_edges(runs) if len(runs) == 2 else None
    if len(runs) == 2 and options.get("rate") is None:
        # Lifetimes in time compare at one rate: the first run's (each run's own rate is the
        # speed of whatever counted its writes, a host simulation for `insitu lrt adapt`).
        first = runs[0]
        n = first.samples if first.samples is not None else options.get("samples")
        if n and first.seconds:
            options = {**options, "rate": n / first.seconds,
                       "rate_source": f"{first.label}'s own, for both runs"}
    reports = [run_report(run, edges=edges, **options) for run in runs]
    return {"runs": reports,
            "comparison": compare_reports(*reports) if len(reports) == 2 else None}


# --------------------------------------------------------------------------- text and figure

def _num(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-2:
        return f"{value:.{digits}g}"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:,.2f}"


def _energy(j) -> str:
    if j is None:
        return "-"
    for unit, scale in (("J", 1), ("mJ", 1e-3), ("uJ", 1e-6), ("nJ", 1e-9), ("pJ", 1e-12)):
        if abs(j) >= scale:
            return f"{j / scale:.3g} {unit}"
    return "0 J" if j == 0 else f"{j / 1e-12:.3g} pJ"


def _duration(s) -> str:
    if s is None:
        return "-"
    for unit, scale in (("years", 365.25 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"


def _lifetime_text(fig: dict, key: str, fmt) -> str:
    if fig["max_writes_per_cell"] == 0:
        return "no wear"
    return fmt(fig[key])


def _histogram_text(hist: dict) -> str:
    return " | ".join(f"{label}: {count:,}"
                      for label, count in zip(histogram_labels(hist["edges"]), hist["counts"]))


def _head(r: dict) -> list[str]:
    what = ", ".join(str(r[k]) for k in ("env", "board") if k in r)
    run = (f"{r['label']}: {r['file']}" + (f" + {r['counts_file']}" if r["counts_file"]
                                            and r["counts_file"] != r["file"] else "")
           + f" ({r['source']}{', ' + what if what else ''}; "
           + (f"{r['samples']:,} samples" if r["samples"] else "samples unknown")
           + (f" in {r['seconds']:.3g} s" if r["seconds"] else "") + ")")
    t = r["technology"]
    tech = (f"  NVM: endurance {t['endurance']:.3g} writes/cell ({t['source']['endurance']}), "
            f"{t['write_pj_per_bit']:g} pJ/bit ({t['source']['write_pj_per_bit']}) x "
            f"{t['bits_per_cell']} bits/cell ({t['source']['bits_per_cell']}) = "
            f"{_energy(t['cell_write_j'])} per cell write")
    rate = (f"  lifetime in time at {r['rate_samples_per_s']:.4g} samples/s ({r['rate_source']})"
            if r["rate_samples_per_s"] else None)
    return [run, tech] + ([rate] if rate else [])


def format_report(payload: dict) -> str:
    """The report as text: a table per run (or, for two runs, per layer side by side with the
    ratios) and the histograms of writes per cell."""
    lines: list[str] = []
    runs = payload["runs"]
    for r in runs:
        lines += _head(r)
    if len(runs) == 1:
        r = runs[0]
        header = ("layer", "cells", "written", "max/cell", "mean/cell", "writes", "write energy",
                  "endurance used", "lifetime (samples)", "lifetime (time)")
        rows: list[tuple[str, ...]] = [header]
        for name, fig in [*r["layers"].items(), ("all", r["total"])]:
            rows.append((name, _num(fig["cells"]), _num(fig["written_cells"]),
                         _num(fig["max_writes_per_cell"]), _num(fig["mean_writes_per_cell"]),
                         _num(fig["total_writes"]), _energy(fig["write_energy_j"]),
                         f"{fig['endurance_used']:.3g}",
                         _lifetime_text(fig, "lifetime_samples", _num),
                         _lifetime_text(fig, "lifetime_seconds", _duration)))
        lines += [""] + _table(rows)
        lines += ["", "writes per cell (bins: cells):"]
        for name, fig in [*r["layers"].items(), ("all", r["total"])]:
            lines.append(f"  {name}: {_histogram_text(fig['write_histogram'])}")
    else:
        a, b = runs
        c = payload["comparison"]
        names = list(dict.fromkeys([*a["layers"], *b["layers"]]))
        metrics = (("max writes/cell", "max_writes_per_cell", _num),
                   ("mean writes/cell", "mean_writes_per_cell", _num),
                   ("total writes", "total_writes", _num),
                   ("written cells", "written_cells", _num),
                   ("write energy", "write_energy_j", _energy),
                   ("endurance used", "endurance_used", lambda v: f"{v:.3g}"),
                   ("lifetime (samples)", "lifetime_samples", _num),
                   ("lifetime (time)", "lifetime_seconds", _duration))
        for name in [*names, "all"]:
            fa = a["total"] if name == "all" else a["layers"].get(name)
            fb = b["total"] if name == "all" else b["layers"].get(name)
            ratio = c["total"] if name == "all" else c["layers"].get(name, {})
            cells = fa["cells"] if fa else fb["cells"]
            rows = [(f"{name} ({cells:,} cells)", a["label"], b["label"], f"{a['label']} / {b['label']}")]
            for title, key, fmt in metrics:
                def cell(fig, key=key, fmt=fmt):
                    if fig is None:
                        return "(absent)"
                    if key.startswith("lifetime"):
                        return _lifetime_text(fig, key, fmt)
                    return fmt(fig[key])
                rows.append((title, cell(fa), cell(fb),
                             "-" if ratio.get(key) is None else f"{ratio[key]:.3g}x"))
            lines += [""] + _table(rows)
            for label, fig in ((a["label"], fa), (b["label"], fb)):
                if fig:
                    lines.append(f"  {label} writes per cell (bins: cells): "
                                 f"{_histogram_text(fig['write_histogram'])}")
    notes = [f"{r['label']}: {note}" for r in runs for note in r["notes"]]
    if notes:
        lines += ["", *(f"note: {n}" for n in notes)]
    if payload.get("plot"):
        lines += ["", f"figure: {payload['plot']}"]
    return "\n".join(lines)


def _table(rows) -> list[str]:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    out = []
    for k, row in enumerate(rows):
        out.append("  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w)
                             for i, (v, w) in enumerate(zip(row, widths))).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def plot_histograms(payload: dict, path) -> Path:
    """One PNG: per layer, the histogram of writes per cell of each run (bars side by side,
    cells on a log scale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = payload["runs"]
    names = list(dict.fromkeys(n for r in runs for n in r["layers"]))
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.4 * len(names) + 0.6), squeeze=False)
    width = 0.8 / len(runs)
    for ax, name in zip(axes[:, 0], names):
        edges = max((r["layers"][name]["write_histogram"]["edges"] for r in runs
                     if name in r["layers"]), key=len)
        x = np.arange(len(edges) - 1)
        for k, r in enumerate(runs):
            if name not in r["layers"]:
                continue
            fig_layer = r["layers"][name]
            counts = rebin(fig_layer["write_histogram"], edges)["counts"]
            ax.bar(x + (k - (len(runs) - 1) / 2) * width, counts, width, log=True,
                   label=f"{r['label']} (max {fig_layer['max_writes_per_cell']:,}, "
                         f"mean {fig_layer['mean_writes_per_cell']:.3g})")
        ax.set_ylim(bottom=0.5)                         # a bin of one cell stays visible
        ax.set_xticks(x, histogram_labels(edges), fontsize=7)
        ax.set_title(f"layer {name}", fontsize=9)
        ax.set_ylabel("cells")
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("writes per cell")
    title = " vs ".join(r["label"] for r in runs)
    fig.suptitle(f"NVM writes per cell: {title}", fontsize=10)
    fig.tight_layout()
    try:
        return save_figure(fig, path)
    finally:
        plt.close(fig)
