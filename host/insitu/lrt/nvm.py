"""Weights stored in non-volatile memory (NVM): write counting, energy, lifetime and drift.

The LRT paper (Gural, Nadeau, Tikekar and Murmann, arXiv 2009.03887, section 1) motivates
low-rank training by the cost of NVM writes: RRAM writes cost far more energy than reads
(10.9 pJ/bit versus 1.76 pJ/bit) and a cell endures about 10**6 writes. This module keeps the books for those costs:

* :class:`NVMArray` wraps one weight tensor of the training code *in place* and counts, per cell,
  the writes that really reach the memory: a cell is written only when its stored code changes.
* :class:`NVMModel` holds the arrays of a network and turns the counts into a JSON-ready report
  (writes per cell, write and read energy, projected lifetime).
* :class:`AnalogDrift`, :class:`DigitalDrift` and :class:`NoDrift` are the internal weight-drift
  environments of the SKS paper's appendix F ("online dataset"): Brownian analog drift of
  multi-level cells, and random bit flips of single-bit cells. Drift is not a write.

Conventions:

* A cell holds one weight; its *code* is the nearest level of the array's :class:`FixedPoint`
  format to its (possibly drifted, off-grid) value.
* Drift is applied on 0-based step indices ``i`` with ``i % every == every - 1``, that is after
  every ``every`` completed steps (the first time after step ``every - 1``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from insitu.checks import check_int, check_number
from insitu.lrt import ENVS

from ..numerics import CODE_DTYPE, FixedPoint

__all__ = [
    "DRIFT_ENVS",
    "AnalogDrift",
    "DigitalDrift",
    "Drift",
    "NVMArray",
    "NVMModel",
    "NoDrift",
    "make_drift",
    "write_histogram",
]

_PJ = 1e-12


# --------------------------------------------------------------------------- one array

class NVMArray:
    """One weight tensor held in NVM, one cell per element.

    ``values`` is the training code's own weight array; it is mutated in place, never replaced, so
    that the layer keeps computing with what the memory holds. Construction programs it onto the
    grid of ``fmt`` (the initial programming is not counted: it is the offline-trained model).
    """

    def __init__(self, name: str, fmt: FixedPoint, values: np.ndarray):
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if not isinstance(fmt, FixedPoint):
            raise TypeError(f"NVMArray {name}: fmt must be a FixedPoint, got {type(fmt).__name__}")
        if not isinstance(values, np.ndarray) or not np.issubdtype(values.dtype, np.floating):
            raise TypeError(f"NVMArray {name}: values must be a float numpy array (it is updated in place)")
        if not values.flags.writeable:
            raise ValueError(f"NVMArray {name}: values is read-only; the array is updated in place")
        if values.size == 0:
            raise ValueError(f"NVMArray {name}: values has no cells")
        # Every level must survive the round trip through the array's dtype, or codes() would not
        # read back what apply_delta() wrote.
        if np.finfo(values.dtype).nmant + 1 < fmt.bits:
            raise ValueError(f"NVMArray {name}: {values.dtype} cannot hold the {fmt.bits}-bit levels of {fmt} exactly")
        if not np.isfinite(values).all():
            raise ValueError(f"NVMArray {name}: values are not all finite")
        self.name = name
        self.fmt = fmt
        self.values = values
        self.values[...] = fmt.quantize(values)
        self.writes = np.zeros(values.shape, dtype=np.int64)
        self.reads = 0
        # Update operations addressed to the array (each addresses every cell, whether or not its
        # code changes): the count a write-verify-less controller would pulse, and the one the
        # LRT paper's figure appears to plot ("updates applied to any given cell").
        self.update_ops = 0

    # -- access --------------------------------------------------------------------------------
    def codes(self) -> np.ndarray:
        """The stored codes: the nearest level to each cell's value (values may have drifted)."""
        return self.fmt.quantize_code(self.values)

    def read(self) -> np.ndarray:
        """Read every cell once (counted for read energy); returns ``values`` itself."""
        self.reads += 1
        return self.values

    # -- writes --------------------------------------------------------------------------------
    def _write_codes(self, new_codes: np.ndarray) -> int:
        old = self.codes()
        changed = new_codes != old
        # Only the cells whose code changes are touched: an unchanged cell keeps its drifted
        # analog value, since a real controller would not pulse it (program-and-verify skips it).
        self.values[changed] = self.fmt.to_float(new_codes[changed])
        self.writes[changed] += 1
        return int(np.count_nonzero(changed))

    def apply_delta(self, delta_codes) -> int:
        """Add integer code increments (saturating); returns the number of cells written."""
        delta = np.asarray(delta_codes)
        # Integral floats are accepted (a rounded float update); anything else is a caller bug.
        integral = np.issubdtype(delta.dtype, np.integer) or (
            np.issubdtype(delta.dtype, np.floating) and np.isfinite(delta).all()
            and bool(np.all(delta == np.round(delta))))
        if not integral:
            raise ValueError(f"NVMArray {self.name}: delta_codes must be integers")
        try:
            delta = np.broadcast_to(delta, self.values.shape)
        except ValueError:
            raise ValueError(f"NVMArray {self.name}: delta_codes of shape {np.shape(delta_codes)} "
                             f"do not match the array's shape {self.values.shape}") from None
        # Clamp the delta to the code span first: the saturated result is the same and the
        # int64 sum cannot overflow.
        span = self.fmt.qmax - self.fmt.qmin
        delta = np.clip(delta, -span, span).astype(CODE_DTYPE)
        self.update_ops += 1
        return self._write_codes(self.fmt.saturate(self.codes() + delta))

    def apply_sequence(self, steps) -> int:
        """Apply integer code increments ``steps[0]``, ``steps[1]``, ... one after another.

        ``steps`` has shape ``(S, *shape)`` (or ``(S, n_out, n_in)`` for a weight matrix); each
        increment that changes a cell's code is one write of that cell (online SGD applying one
        update per convolution pixel). Returns the number of writes.
        """
        steps = np.asarray(steps)
        if not np.issubdtype(steps.dtype, np.integer):
            raise ValueError(f"NVMArray {self.name}: steps must be integer codes, got {steps.dtype}")
        steps = steps.astype(CODE_DTYPE).reshape(-1, *self.values.shape)
        self.update_ops += len(steps)
        codes = self.codes()
        path = codes + np.cumsum(steps, axis=0)
        if path.min() >= self.fmt.qmin and path.max() <= self.fmt.qmax:
            # No saturation on the way: every non-zero increment changes the code.
            changes = np.count_nonzero(steps, axis=0)
            final = path[-1]
        else:
            # Saturation makes later increments depend on earlier ones: walk the sequence.
            changes = np.zeros(self.values.shape, dtype=CODE_DTYPE)
            final = codes.copy()
            for step in steps:
                new = self.fmt.saturate(final + step)
                changes += new != final
                final = new
        written = changes > 0
        self.values[written] = self.fmt.to_float(final[written])
        self.writes += changes
        return int(changes.sum())

    def program(self, new_values) -> int:
        """Write target real values (quantized to the nearest level, saturated); returns cells written."""
        target = np.asarray(new_values, dtype=np.float64)
        if target.shape != self.values.shape:
            raise ValueError(f"NVMArray {self.name}: new_values of shape {target.shape} do not match "
                             f"the array's shape {self.values.shape}")
        if not np.isfinite(target).all():
            raise ValueError(f"NVMArray {self.name}: new_values are not all finite")
        self.update_ops += 1
        return self._write_codes(self.fmt.quantize_code(target))

    # -- statistics ----------------------------------------------------------------------------
    @property
    def cells(self) -> int:
        return int(self.values.size)

    @property
    def total_writes(self) -> int:
        return int(self.writes.sum())

    @property
    def max_writes(self) -> int:
        return int(self.writes.max())

    def __repr__(self) -> str:
        return (f"NVMArray({self.name!r}, {self.fmt}, shape={self.values.shape}, "
                f"total_writes={self.total_writes}, max_writes={self.max_writes}, reads={self.reads})")


def write_histogram(writes) -> dict:
    """Histogram of writes per cell on log-spaced edges ``[0, 1, 2, 4, ...]``.

    Bin ``i`` counts the cells with ``edges[i] <= writes < edges[i + 1]``: the first bin holds the
    never-written cells, the last edge is the first power of two above the maximum.
    """
    w = np.asarray(writes, dtype=np.int64).ravel()
    peak = int(w.max()) if w.size else 0
    edges = [0, 1]
    while edges[-1] <= peak:
        edges.append(edges[-1] * 2)
    counts = np.bincount(np.searchsorted(edges, w, side="right") - 1, minlength=len(edges) - 1)
    return {"edges": edges, "counts": [int(c) for c in counts]}


# --------------------------------------------------------------------------- the whole memory

class NVMModel:
    """The NVM arrays of a network and their write/read cost model (LRT paper, section 1).

    Defaults: RRAM write 10.9 pJ/bit, read 1.76 pJ/bit (Wu et al., 2019) and an endurance of
    10**6 writes per cell (Grossi et al., 2019).
    """

    def __init__(self, write_pj_per_bit: float = 10.9, read_pj_per_bit: float = 1.76,
                 endurance: float = 1_000_000):
        self.write_pj_per_bit = check_number("write_pj_per_bit", write_pj_per_bit)
        self.read_pj_per_bit = check_number("read_pj_per_bit", read_pj_per_bit)
        self.endurance = check_number("endurance", endurance)
        self._arrays: dict[str, NVMArray] = {}

    def add(self, array: NVMArray) -> NVMArray:
        if not isinstance(array, NVMArray):
            raise TypeError(f"NVMModel.add takes an NVMArray, got {type(array).__name__}")
        if array.name in self._arrays:
            raise ValueError(f"NVMModel: an array named {array.name!r} is already present")
        self._arrays[array.name] = array
        return array

    @property
    def arrays(self) -> dict[str, NVMArray]:
        """The arrays by name (a copy of the mapping; the arrays themselves are shared)."""
        return dict(self._arrays)

    def __getitem__(self, name: str) -> NVMArray:
        return self._arrays[name]

    def __contains__(self, name) -> bool:
        return name in self._arrays

    def __iter__(self):
        return iter(self._arrays.values())

    def __len__(self) -> int:
        return len(self._arrays)

    def write_counts(self) -> dict[str, np.ndarray]:
        """Per-cell write counters by array name (copies; ready for ``np.savez``)."""
        return {name: a.writes.copy() for name, a in self._arrays.items()}

    def _lifetime(self, max_writes: int, samples: int):
        # Samples until the worst cell reaches its endurance, at the rate observed so far; None
        # (not inf, which JSON cannot hold) when nothing was written or nothing was seen.
        if max_writes == 0 or samples == 0:
            return None
        return self.endurance * samples / max_writes

    def _summary(self, cells: int, bits: int, writes: np.ndarray, write_bits: int,
                 read_bits: int, samples: int) -> dict:
        total = int(writes.sum())
        peak = int(writes.max()) if writes.size else 0
        return {
            "cells": cells,
            "bits": bits,
            "total_writes": total,
            "max_writes_per_cell": peak,
            "mean_writes_per_cell": total / cells if cells else 0.0,
            "written_cells": int(np.count_nonzero(writes)),
            "write_histogram": write_histogram(writes),
            "write_energy_j": write_bits * self.write_pj_per_bit * _PJ,
            "read_energy_j": read_bits * self.read_pj_per_bit * _PJ,
            "lifetime_samples": self._lifetime(peak, samples),
            "endurance_used": peak / self.endurance,
        }

    def report(self, samples: int) -> dict:
        """A JSON-ready report after ``samples`` training samples: per array and in total."""
        samples = check_int("samples", samples, low=0)
        arrays = {}
        for name, a in self._arrays.items():
            entry = self._summary(a.cells, a.cells * a.fmt.bits, a.writes,
                                  a.total_writes * a.fmt.bits, a.reads * a.cells * a.fmt.bits, samples)
            arrays[name] = {"format": a.fmt.describe(), "bits_per_cell": a.fmt.bits,
                            "reads": a.reads, "update_operations": a.update_ops, **entry}
        every = list(self._arrays.values())
        all_writes = (np.concatenate([a.writes.ravel() for a in every]) if every
                      else np.zeros(0, dtype=np.int64))
        total = self._summary(sum(a.cells for a in every), sum(a.cells * a.fmt.bits for a in every),
                              all_writes, sum(a.total_writes * a.fmt.bits for a in every),
                              sum(a.reads * a.cells * a.fmt.bits for a in every), samples)
        return {
            "parameters": {
                "write_pj_per_bit": self.write_pj_per_bit,
                "read_pj_per_bit": self.read_pj_per_bit,
                "endurance": self.endurance,
                "samples": samples,
            },
            "arrays": arrays,
            "total": total,
        }


# --------------------------------------------------------------------------- drift (appendix F)

def _as_arrays(arrays) -> list[NVMArray]:
    if isinstance(arrays, NVMArray):
        return [arrays]
    if isinstance(arrays, Mapping):
        arrays = arrays.values()
    if not isinstance(arrays, Iterable):
        raise TypeError("drift: arrays must be an NVMArray, an NVMModel, a mapping or an iterable of NVMArray")
    out = list(arrays)
    for a in out:
        if not isinstance(a, NVMArray):
            raise TypeError(f"drift: expected NVMArray, got {type(a).__name__}")
    return out


class Drift:
    """Base of the drift environments: applies :meth:`_drift` every ``every`` steps.

    :meth:`step` returns ``{}`` on steps where no drift is due, otherwise ``{name: cells whose
    code changed}`` for every array (0 included). Drift never counts as a write.
    """

    every: int = 1

    def due(self, step_index: int) -> bool:
        step_index = check_int("step_index", step_index, low=0)
        return step_index % self.every == self.every - 1

    def step(self, arrays, step_index: int) -> dict[str, int]:
        if not self.due(step_index):
            return {}
        changed = {}
        for a in _as_arrays(arrays):
            before = a.codes()
            self._drift(a)
            changed[a.name] = int(np.count_nonzero(a.codes() != before))
        return changed

    def _drift(self, array: NVMArray) -> None:
        raise NotImplementedError


class NoDrift(Drift):
    """The control and distribution-shift environments: the memory holds what was written."""

    def step(self, arrays, step_index: int) -> dict[str, int]:
        _as_arrays(arrays)
        check_int("step_index", step_index, low=0)
        return {}

    def __repr__(self) -> str:
        return "NoDrift()"


class AnalogDrift(Drift):
    """Brownian drift of multi-level cells (SKS paper, appendix F).

    Every ``every`` steps each weight gets independent Gaussian noise of
    ``sigma = sigma0 / sqrt(horizon / every)`` and is re-clipped to the format's range, so after
    ``horizon`` steps a cell has drifted by ``sigma0`` (in weight units) in total. Values leave
    the grid: that is the analog error the training has to correct.
    """

    def __init__(self, sigma0: float = 10.0, every: int = 10, horizon: float = 1_000_000, seed=None):
        self.sigma0 = check_number("sigma0", sigma0)
        self.every = check_int("every", every)
        self.horizon = check_number("horizon", horizon)
        self.sigma = self.sigma0 / math.sqrt(self.horizon / self.every)
        self.rng = np.random.default_rng(seed)

    def _drift(self, array: NVMArray) -> None:
        v = array.values
        noise = self.rng.normal(0.0, self.sigma, size=v.shape)
        v[...] = np.clip(v + noise, array.fmt.min_value, array.fmt.max_value)

    def __repr__(self) -> str:
        return f"AnalogDrift(sigma0={self.sigma0}, every={self.every}, horizon={self.horizon}, sigma={self.sigma:.3g})"


class DigitalDrift(Drift):
    """Random bit flips of single-bit cells (SKS paper, appendix F).

    A ``b``-bit weight is ``b`` cells, one per bit of its code (two's complement when signed).
    Every ``every`` steps each bit flips independently with probability
    ``p = p0 / (horizon / every)``, so a cell flips ``p0`` times on average over ``horizon`` steps.
    Flipped weights are set to the flipped code's level (back on the grid).
    """

    def __init__(self, p0: float = 10.0, every: int = 10, horizon: float = 1_000_000, seed=None):
        self.p0 = check_number("p0", p0)
        self.every = check_int("every", every)
        self.horizon = check_number("horizon", horizon)
        self.p = self.p0 / (self.horizon / self.every)
        if self.p > 1:
            raise ValueError(f"p0 * every / horizon is a flip probability and must be <= 1, got {self.p}")
        self.rng = np.random.default_rng(seed)

    def _drift(self, array: NVMArray) -> None:
        fmt = array.fmt
        n_bits = array.cells * fmt.bits
        # Independent Bernoulli(p) per bit is the same law as a Binomial count of flips placed on
        # distinct uniformly chosen bits; this draws O(flips) numbers instead of O(bits).
        n_flips = int(self.rng.binomial(n_bits, self.p))
        if n_flips == 0:
            return
        where = self.rng.choice(n_bits, size=n_flips, replace=False)
        cell, bit = np.divmod(where, fmt.bits)
        mask = np.zeros(array.cells, dtype=np.int64)
        np.bitwise_xor.at(mask, cell, np.left_shift(np.int64(1), bit))
        hit = np.flatnonzero(mask)
        word = (1 << fmt.bits) - 1
        raw = (array.codes().ravel()[hit] & word) ^ mask[hit]   # two's complement bit pattern
        if fmt.signed:
            raw = np.where(raw >= 1 << (fmt.bits - 1), raw - (1 << fmt.bits), raw)
        array.values[np.unravel_index(hit, array.values.shape)] = fmt.to_float(raw)

    def __repr__(self) -> str:
        return f"DigitalDrift(p0={self.p0}, every={self.every}, horizon={self.horizon}, p={self.p:.3g})"


#: Environment names of the SKS paper's experiments and the drift each one implies.
DRIFT_ENVS = ENVS


def make_drift(env: str, seed=None, **params) -> Drift:
    """The drift of an experiment environment: ``control`` and ``shift`` (distribution shift of the
    inputs) have none; ``analog`` and ``digital`` use the paper's defaults unless ``params`` override."""
    if env in ("control", "shift"):
        if params:
            raise ValueError(f"environment {env!r} has no drift parameters, got {sorted(params)}")
        return NoDrift()
    if env == "analog":
        return AnalogDrift(seed=seed, **params)
    if env == "digital":
        return DigitalDrift(seed=seed, **params)
    raise ValueError(f"unknown environment {env!r}; valid: {', '.join(DRIFT_ENVS)}")
