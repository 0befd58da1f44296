"""Parameter sweeps: a grid of runs of one experiment, resumable, tabulated and drawn as heat maps.

A sweep is described by a TOML file (see ``examples/sweeps/lrt_fig6.toml``)::

    [sweep]
    run = "lrt.adapt"              # a registered experiment (register), or "package.module:function"
    seeds = [0, 1]                 # or a count: seeds = 2 means [0, 1]
    metrics = ["online_accuracy", "max_writes_per_cell"]   # keys of the run's result
    heatmap = ["lr", "dense_batch"]   # rows, columns (default: the first two grid axes)

    [fixed]                        # parameters shared by every point
    env = "control"
    samples = 2000

    [grid]                         # the axes: every combination of their values is one point
    lr = [0.001, 0.01]
    dense_batch = [10, 100]
    scheme = ["lrt", "lrt-maxnorm"]   # an axis that is not a heat-map axis: one map per value

Every (grid point, seed) is one call of the experiment's function with the fixed parameters, the
point's values and ``seed``; it returns a dict of results (the metrics are looked up in it, nested
keys with dots: ``nvm.write_energy_j``). Points run in a local process pool (default) or on an
existing Ray cluster, each with single-threaded BLAS so that a result does not depend on where it
ran. Each finished point is written atomically to ``OUT/points/<key>.json`` as soon as it
arrives; a rerun skips the points already there, so an interrupted sweep keeps what finished. The
key holds the point's values and a hash of everything the result depends on, so changing a fixed
parameter runs new points instead of reusing stale ones.

Outputs in ``OUT``: ``points.csv`` (one row per point and seed), ``sweep.json`` (the table: the
mean over seeds of each metric per grid point) and ``heatmap-<metric>[-<axis>=<value>...].png``
(one per metric and per combination of the axes that are not heat-map axes).
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import inspect
import io
import itertools
import json
import logging
import math
import os
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from insitu.errors import InsituError, UsageError
from insitu.io import atomic_write, atomic_write_json, to_jsonable

__all__ = ["EXPERIMENTS", "Experiment", "register", "SweepConfig", "Point", "load_config", "parse_config",
           "grid_points", "run_sweep", "run_point", "tabulate", "RAY_HINT"]

RAY_HINT = "pip install 'insitu[ray]'"
_SECTIONS = ("sweep", "fixed", "grid")
_SWEEP_KEYS = ("name", "run", "seeds", "metrics", "heatmap")
_SCALARS = (str, int, float, bool)


# ------------------------------------------------------------------------------ experiments

@dataclass(frozen=True)
class Experiment:
    """What a sweep can run: ``function(seed=S, **params) -> dict``.

    ``parameters`` are the names a config may set (None: any; a function: computed when asked,
    so that they follow the experiment's signature); ``required`` must be set;
    ``paths`` are resolved relative to the config file; ``key_ignore`` do not change the result
    (a cache folder) and stay out of a point's key; ``metrics`` are the result's top-level keys a
    metric may start with (None: not known before a run); ``validate(params)`` checks one point's
    parameters before anything runs (a ValueError or UsageError is a usage error).
    """

    name: str
    target: str                                   # "module:function", resolved in the worker
    parameters: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    required: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    key_ignore: tuple[str, ...] = ()
    metrics: tuple[str, ...] | None = None
    validate: Callable[[dict], None] | None = None

    @property
    def allowed(self) -> tuple[str, ...] | None:
        return self.parameters() if callable(self.parameters) else self.parameters


def _resolve(target: str) -> Callable:
    module, _, name = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load the sweep function {target!r}: {exc}") from None
    if not callable(fn):
        raise UsageError(f"the sweep function {target!r} is not callable")
    return fn


#: The experiments a config names with ``run = "..."`` (anything else must be
#: "module:function"): each method registers its own (``insitu.lrt.sweep_points`` registers
#: ``lrt.adapt`` when imported; ``insitu sweep`` imports it).
EXPERIMENTS: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Make ``experiment`` nameable by its name in a config's ``run``."""
    EXPERIMENTS[experiment.name] = experiment
    return experiment


def experiment(run: str) -> Experiment:
    """The experiment ``run`` names (a registered name or ``module:function``)."""
    if run in EXPERIMENTS:
        return EXPERIMENTS[run]
    if ":" not in run:
        raise UsageError(f"unknown experiment {run!r} in [sweep] run; known: "
                         f"{', '.join(EXPERIMENTS)} (or 'package.module:function')")
    fn = _resolve(run)
    sig = inspect.signature(fn)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        names = None
    else:
        names = tuple(p for p in sig.parameters if p != "seed")
        if "seed" not in sig.parameters:
            raise UsageError(f"the sweep function {run!r} must take a 'seed' keyword argument")
    required = tuple(p.name for p in sig.parameters.values()
                     if p.default is p.empty and p.name != "seed"
                     and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return Experiment(run, run, parameters=names, required=required)


# ----------------------------------------------------------------------------------- config

@dataclass(frozen=True)
class SweepConfig:
    name: str
    run: str
    fixed: dict
    grid: dict[str, list]
    seeds: tuple[int, ...]
    metrics: tuple[str, ...]
    heatmap: tuple[str, str] | None
    source: str = "<config>"

    @property
    def experiment(self) -> Experiment:
        return experiment(self.run)

    @property
    def panel_axes(self) -> tuple[str, ...]:
        """The grid axes that are not heat-map axes: one heat map per combination of them."""
        return tuple(a for a in self.grid if not self.heatmap or a not in self.heatmap)


def load_config(path) -> SweepConfig:
    """Read and check a sweep TOML file (a :class:`UsageError` naming what is wrong)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read the sweep config {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from None
    return parse_config(data, source=str(path), base=path.resolve().parent, default_name=path.stem)


def _unknown(keys, allowed, where: str, source: str) -> None:
    for key in keys:
        if key not in allowed:
            raise UsageError(f"{source}: unknown key {key!r} in {where}; allowed: "
                             f"{', '.join(allowed)}")


def _check_scalar(value, what: str, source: str) -> None:
    if not isinstance(value, _SCALARS) or (isinstance(value, float) and not math.isfinite(value)):
        raise UsageError(f"{source}: {what} must be a string, number or boolean, got {value!r}")


def parse_config(data: dict, source: str = "<config>", base: Path | None = None,
                 default_name: str = "sweep") -> SweepConfig:
    """Check a parsed config; ``base`` is the folder relative paths are taken from."""
    _unknown(data, _SECTIONS, "the top level", source)
    for section in _SECTIONS:
        if section in data and not isinstance(data[section], dict):
            raise UsageError(f"{source}: [{section}] must be a table")
    sweep = data.get("sweep", {})
    _unknown(sweep, _SWEEP_KEYS, "[sweep]", source)
    run = sweep.get("run")
    if not isinstance(run, str) or not run:
        raise UsageError(f"{source}: [sweep] run is required: the experiment to run "
                         f"({', '.join(EXPERIMENTS)} or 'package.module:function')")
    exp = experiment(run)
    name = sweep.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise UsageError(f"{source}: [sweep] name must be a non-empty string")

    seeds = sweep.get("seeds", [0])
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            raise UsageError(f"{source}: [sweep] seeds as a count must be >= 1, got {seeds}")
        seeds = list(range(seeds))
    if (not isinstance(seeds, list) or not seeds
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)
            or len(set(seeds)) != len(seeds)):
        raise UsageError(f"{source}: [sweep] seeds must be a count or a list of distinct integers "
                         f">= 0, got {seeds!r}")

    metrics = sweep.get("metrics")
    if (not isinstance(metrics, list) or not metrics
            or any(not isinstance(m, str) or not m for m in metrics) or len(set(metrics)) != len(metrics)):
        raise UsageError(f"{source}: [sweep] metrics must be a non-empty list of distinct result "
                         f"keys, got {metrics!r}")
    if exp.metrics is not None:
        for m in metrics:
            if m.split(".")[0] not in exp.metrics:
                raise UsageError(f"{source}: unknown metric {m!r}; {exp.name} reports: "
                                 f"{', '.join(exp.metrics)} (nested keys with dots)")

    fixed, grid = dict(data.get("fixed", {})), dict(data.get("grid", {}))
    for where, table in (("[fixed]", fixed), ("[grid]", grid)):
        if "seed" in table:
            raise UsageError(f"{source}: 'seed' in {where}: list the seeds in [sweep] seeds")
        allowed = exp.allowed
        if allowed is not None:
            _unknown(table, allowed, f"{where} ({exp.name} parameters)", source)
    both = sorted(set(fixed) & set(grid))
    if both:
        raise UsageError(f"{source}: {both[0]!r} is both in [fixed] and in [grid]; keep one")
    for key, value in fixed.items():
        _check_scalar(value, f"[fixed] {key}", source)
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise UsageError(f"{source}: [grid] {key} must be a non-empty list of values, "
                             f"got {values!r}")
        for v in values:
            _check_scalar(v, f"a value of [grid] {key}", source)
        if len({json.dumps(v) for v in values}) != len(values):
            raise UsageError(f"{source}: [grid] {key} repeats a value: {values!r}")
    missing = [p for p in exp.required if p not in fixed and p not in grid]
    if missing:
        raise UsageError(f"{source}: {exp.name} needs {', '.join(missing)} in [fixed] or [grid]")
    for key in exp.paths:
        for table in (fixed, grid):
            if key in table and base is not None:
                if table is fixed:
                    table[key] = str((base / str(table[key])).resolve())
                else:
                    table[key] = [str((base / str(v)).resolve()) for v in table[key]]

    heatmap = sweep.get("heatmap")
    if heatmap is None:
        heatmap = tuple(grid)[:2] if len(grid) >= 2 else None
    else:
        if (not isinstance(heatmap, list) or len(heatmap) != 2 or heatmap[0] == heatmap[1]
                or any(a not in grid for a in heatmap)):
            raise UsageError(f"{source}: [sweep] heatmap must name two different [grid] axes "
                             f"(rows, columns), got {heatmap!r}; axes: {', '.join(grid) or 'none'}")
        heatmap = tuple(heatmap)
    return SweepConfig(name=name, run=run, fixed=fixed, grid=grid, seeds=tuple(seeds),
                       metrics=tuple(metrics), heatmap=heatmap, source=source)


# ----------------------------------------------------------------------------------- points

@dataclass(frozen=True)
class Point:
    key: str
    axes: dict                       # the grid values of this point
    seed: int
    params: dict = field(repr=False)  # fixed + axes: the function's keyword arguments (no seed)


def _slug(value) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", str(value)).strip("-") or "x"


def point_key(config: SweepConfig, axes: dict, seed: int) -> str:
    """A file name for one point: its values, its seed and a hash of what its result depends on."""
    exp = config.experiment
    params = {k: v for k, v in {**config.fixed, **axes}.items() if k not in exp.key_ignore}
    identity = json.dumps({"run": config.run, "params": params, "seed": seed}, sort_keys=True)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    readable = "_".join(f"{_slug(k)}={_slug(v)}" for k, v in axes.items())
    readable = (readable + "_" if readable else "") + f"seed={seed}"
    return f"{readable[:160]}_{digest}"


def grid_points(config: SweepConfig) -> list[Point]:
    """Every (grid point, seed), grid axes in config order, the last axis fastest, seeds innermost."""
    names = list(config.grid)
    points = []
    for values in itertools.product(*(config.grid[n] for n in names)):
        axes = dict(zip(names, values))
        for seed in config.seeds:
            points.append(Point(point_key(config, axes, seed), axes, seed, {**config.fixed, **axes}))
    return points


def validate_points(config: SweepConfig, points: list[Point]) -> None:
    """The experiment's own checks of every point, before anything runs (a UsageError)."""
    exp = config.experiment
    if exp.validate is None:
        return
    seen = {}
    for p in points:
        seen.setdefault(json.dumps(p.params, sort_keys=True), p)
    for p in seen.values():
        try:
            exp.validate(p.params)
        except (ValueError, UsageError) as exc:
            where = ", ".join(f"{k}={v}" for k, v in p.axes.items()) or "fixed parameters"
            raise UsageError(f"{config.source}: point {where}: {exc}") from None


def run_point(target: str, params: dict, seed: int) -> dict:
    """Run one point of the experiment function ``target`` ("module:function") in a worker
    process, a Ray task or here, with single-threaded BLAS. The target, not the experiment's
    name, travels: a worker knows no registered name.

    Returns ``{"result": ..., "wall_s": ...}`` with the result as it reads back from JSON.
    """
    from threadpoolctl import threadpool_limits

    fn = _resolve(target)
    start = time.perf_counter()
    with threadpool_limits(limits=1):
        result = fn(seed=seed, **params)
    if not isinstance(result, dict):
        raise TypeError(f"the sweep function {target!r} returned {type(result).__name__}, not a dict")
    return {"result": json.loads(json.dumps(result, default=to_jsonable)),
            "wall_s": round(time.perf_counter() - start, 3)}


def metric_value(result: dict, metric: str, key: str = "") -> int | float:
    """``result[metric]`` (dots go into nested dicts), a number; a clear error when absent."""
    value = result
    for part in metric.split("."):
        if not isinstance(value, dict) or part not in value:
            where = f" of point {key}" if key else ""
            known = [k for k, v in (value.items() if isinstance(value, dict) else [])
                     if isinstance(v, (int, float, dict)) and not isinstance(v, bool)]
            raise InsituError(f"metric {metric!r} is not in the result{where}; it has: "
                              f"{', '.join(known) or 'nothing numeric'}")
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InsituError(f"metric {metric!r} is not a number in the result of point {key}: {value!r}")
    return value


# ---------------------------------------------------------------------------------- running

def _point_path(out: Path, key: str) -> Path:
    return out / "points" / f"{key}.json"


def load_point(out: Path, point: Point) -> dict | None:
    """The finished point's record, or None when it has not run (or its file is unreadable)."""
    path = _point_path(out, point.key)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != point.key or "result" not in record:
        return None
    return record


def _record(config: SweepConfig, point: Point, outcome: dict) -> dict:
    return {"key": point.key, "run": config.run, "axes": point.axes, "seed": point.seed,
            "params": point.params, "wall_s": outcome["wall_s"], "result": outcome["result"]}


def _ignore_sigint() -> None:
    """In pool workers: Ctrl-C is the parent's to handle (it keeps what finished, then stops us)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _Local:
    """Points in a local process pool (spawned workers), or in this process with one worker."""

    def __init__(self, workers: int):
        self.workers = workers
        self.pool = None

    def __enter__(self):
        if self.workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_ignore_sigint)
        return self

    def run(self, config: SweepConfig, todo: list[Point]):
        """Yield ``(point, outcome, error)`` as points finish; stops submitting after an error."""
        if self.pool is None:
            for p in todo:
                try:
                    yield p, run_point(config.experiment.target, p.params, p.seed), None
                except Exception as exc:                       # noqa: BLE001 - reported per point
                    yield p, None, exc
                    return
            return
        from concurrent.futures import FIRST_COMPLETED, wait

        pending = list(reversed(todo))
        running = {}
        failed = False
        while pending or running:
            while pending and not failed and len(running) < self.workers:
                p = pending.pop()
                running[self.pool.submit(run_point, config.experiment.target, p.params, p.seed)] = p
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                p = running.pop(fut)
                exc = fut.exception()
                if exc is not None:
                    failed = True
                yield p, (None if exc else fut.result()), exc

    def __exit__(self, exc_type, *exc):
        if self.pool is None:
            return
        if exc_type is not None and not issubclass(exc_type, Exception):
            # Ctrl-C: the points still running are lost anyway; do not wait for them.
            for process in list(getattr(self.pool, "_processes", {}).values()):
                process.terminate()
            self.pool.shutdown(wait=False, cancel_futures=True)
        else:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _probe(address: str) -> None:
    """Fail in seconds, not minutes (Ray retries for long), when nothing listens at HOST:PORT."""
    import socket

    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        return                                  # "auto" and the like: Ray finds the cluster
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as exc:
        raise InsituError(f"cannot reach the Ray cluster at {address}: "
                          f"{exc.strerror or exc}; is `ray start --head` running there?") from None


class _Ray:
    """Points as Ray tasks on an existing cluster (one CPU each)."""

    def __init__(self, address: str, workers: int | None):
        try:
            import ray
        except ImportError:
            raise InsituError(f"--ray-address needs Ray, which is not installed: {RAY_HINT}") from None
        self.ray, self.address, self.workers, self.started = ray, address, workers, False

    def __enter__(self):
        ray = self.ray
        if not ray.is_initialized():
            _probe(self.address)
            try:
                ray.init(address=self.address, log_to_driver=False, logging_level=logging.WARNING)
            except Exception as exc:                           # noqa: BLE001 - ray raises many kinds
                raise InsituError(f"cannot connect to the Ray cluster at {self.address}: {exc}") from None
            self.started = True
        return self

    def run(self, config: SweepConfig, todo: list[Point]):
        ray = self.ray
        task = ray.remote(num_cpus=1)(run_point)
        limit = self.workers or len(todo)
        pending = list(reversed(todo))
        running = {}
        failed = False
        while pending or running:
            while pending and not failed and len(running) < limit:
                p = pending.pop()
                running[task.remote(config.experiment.target, p.params, p.seed)] = p
            if not running:
                break
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                p = running.pop(ref)
                try:
                    yield p, ray.get(ref), None
                except Exception as exc:                       # noqa: BLE001 - reported per point
                    failed = True
                    cause = getattr(exc, "cause", None)
                    yield p, None, cause if isinstance(cause, BaseException) else exc

    def __exit__(self, *exc):
        if self.started:
            self.ray.shutdown()


def run_sweep(config: SweepConfig, out, workers: int | None = None, ray_address: str | None = None,
              advance: Callable[[int], None] = lambda n: None,
              log: Callable[[str], None] = lambda msg: None) -> dict:
    """Run the points of ``config`` not yet in ``out``, then tabulate, write the CSV and heat maps.

    Raises :class:`InsituError` when a point fails (after keeping every point that finished).
    Returns the summary also written to ``OUT/sweep.json``.
    """
    out = Path(out)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise UsageError(f"--workers must be an integer >= 1, got {workers!r}")
    points = grid_points(config)
    validate_points(config, points)
    try:
        (out / "points").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InsituError(f"cannot create the sweep folder {out}: {exc.strerror}") from None
    if not os.access(out / "points", os.W_OK):
        raise InsituError(f"cannot write in the sweep folder {out}: choose a writable --out")

    records = {}
    for p in points:
        record = load_point(out, p)
        if record is not None:
            records[p.key] = record
        elif _point_path(out, p.key).exists():
            log(f"point {p.key}: its file is unreadable; running it again")
    todo = [p for p in points if p.key not in records]
    advance(len(points) - len(todo))
    start = time.perf_counter()
    if ray_address:
        backend = _Ray(ray_address, workers)
    else:
        backend = _Local(min(workers or os.cpu_count() or 1, max(1, len(todo))))
    error = None
    try:
        if todo:
            with backend:
                for p, outcome, exc in backend.run(config, todo):
                    if exc is not None:
                        error = error or (p, exc)
                        continue
                    record = _record(config, p, outcome)
                    atomic_write_json(_point_path(out, p.key), record)
                    records[p.key] = record
                    advance(1)
                    for m in config.metrics:              # a metric the run lacks: stop at once
                        metric_value(record["result"], m, p.key)
    except KeyboardInterrupt:
        log(f"interrupted: {len(records)} of {len(points)} points are finished and kept in "
            f"{out / 'points'}; run the sweep again to resume")
        raise
    seconds = time.perf_counter() - start
    if error is not None:
        p, exc = error
        finished = sum(1 for q in points if q.key in records)
        message = str(exc) if isinstance(exc, InsituError) else f"{type(exc).__name__}: {exc}"
        raise InsituError(f"sweep point {p.key} failed: {message} ({finished} of {len(points)} "
                          f"points are finished and kept in {out / 'points'}; run the sweep again "
                          f"to resume)")
    return finish(config, out, points, records, ran=len(todo), seconds=seconds,
                  backend="ray" if ray_address else "local")


# ----------------------------------------------------------------------------------- output

def tabulate(config: SweepConfig, points: list[Point], records: dict) -> list[dict]:
    """One row per grid point: its axis values, the seeds that finished, each metric's mean."""
    rows, seen = [], {}
    for p in points:
        k = json.dumps(p.axes, sort_keys=True)
        if k not in seen:
            seen[k] = {**p.axes, "seeds": [], **{m: [] for m in config.metrics}}
            rows.append(seen[k])
        if p.key in records:
            row = seen[k]
            row["seeds"].append(p.seed)
            for m in config.metrics:
                row[m].append(metric_value(records[p.key]["result"], m, p.key))
    for row in rows:
        for m in config.metrics:
            values = row[m]
            row[m] = math.fsum(values) / len(values) if values else None
            if len(config.seeds) > 1:
                row[f"{m}_std"] = (math.sqrt(math.fsum((v - row[m]) ** 2 for v in values) / len(values))
                                   if values else None)
    return rows


def write_csv(path: Path, config: SweepConfig, points: list[Point], records: dict) -> Path:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([*config.grid, "seed", *config.metrics, "wall_s", "key"])
    for p in points:
        if p.key in records:
            r = records[p.key]
            writer.writerow([*p.axes.values(), p.seed,
                             *(metric_value(r["result"], m, p.key) for m in config.metrics),
                             r.get("wall_s", ""), p.key])
    return atomic_write(path, buf.getvalue())


def plot_heatmaps(out: Path, config: SweepConfig, rows: list[dict]) -> list[Path]:
    """One PNG per metric and per combination of the non-heat-map axes (rows × columns)."""
    if not config.heatmap:
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ry, rx = config.heatmap
    ys, xs = config.grid[ry], config.grid[rx]
    panels = list(itertools.product(*(config.grid[a] for a in config.panel_axes)))
    paths = []
    for metric in config.metrics:
        values = [row[metric] for row in rows if row[metric] is not None]
        low, high = (min(values), max(values)) if values else (0.0, 1.0)
        middle = (low + high) / 2
        for panel in panels:                    # one colour scale for all panels of a metric
            fixed = dict(zip(config.panel_axes, panel))
            grid = np.full((len(ys), len(xs)), np.nan)
            for row in rows:
                if all(row[a] == v for a, v in fixed.items()) and row[metric] is not None:
                    grid[ys.index(row[ry]), xs.index(row[rx])] = row[metric]
            fig, ax = plt.subplots(figsize=(2.4 + 0.9 * len(xs), 1.8 + 0.5 * len(ys)))
            image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", aspect="auto",
                              origin="lower", vmin=low, vmax=high)
            ax.set_xticks(range(len(xs)), [str(v) for v in xs])
            ax.set_yticks(range(len(ys)), [str(v) for v in ys])
            ax.set_xlabel(rx)
            ax.set_ylabel(ry)
            for i in range(len(ys)):
                for j in range(len(xs)):
                    if np.isfinite(grid[i, j]):
                        ax.text(j, i, f"{grid[i, j]:.3g}", ha="center", va="center", fontsize=8,
                                color="black" if grid[i, j] > middle else "white")
            title = ", ".join(f"{a}={v}" for a, v in fixed.items())
            ax.set_title(f"{config.name}: {metric}" + (f"\n{title}" if title else ""), fontsize=9)
            fig.colorbar(image, ax=ax, label=metric)
            fig.tight_layout()
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=100)
            plt.close(fig)
            suffix = "".join(f"-{_slug(a)}={_slug(v)}" for a, v in fixed.items())
            paths.append(atomic_write(out / f"heatmap-{_slug(metric)}{suffix}.png", buf.getvalue()))
    return paths


def finish(config: SweepConfig, out: Path, points: list[Point], records: dict, ran: int,
           seconds: float, backend: str) -> dict:
    rows = tabulate(config, points, records)
    csv_path = write_csv(out / "points.csv", config, points, records)
    heatmaps = plot_heatmaps(out, config, rows)
    summary = {
        "name": config.name, "run": config.run, "config": config.source, "out": str(out),
        "backend": backend, "fixed": config.fixed, "grid": config.grid, "seeds": list(config.seeds),
        "metrics": list(config.metrics), "heatmap": list(config.heatmap or []),
        "points": len(points), "ran": ran, "skipped": len(points) - ran,
        "seconds": round(seconds, 2), "table": rows,
        "csv": str(csv_path), "heatmaps": [str(p) for p in heatmaps],
    }
    atomic_write_json(out / "sweep.json", summary)
    return summary
