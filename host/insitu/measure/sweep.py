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

A sweep may instead name an insitu training command (``command = "train"``, ``"tt train"``,
``"lrt adapt"``, ``"e2train run"``; see ``examples/sweeps/train_lr.toml``): the keys of ``[fixed]``
and ``[grid]`` are then the command's options (``batch-size`` or ``batch_size``), checked against
the command and cast by its option types before anything runs, and every (grid point, seed) is one
subprocess ``python -m insitu <command> --config <the point's options> --run-dir OUT/points/<key>
--json`` with ``seed`` from ``[sweep] seeds``. Its stdout is the result; its stderr is kept in
``OUT/points/<key>/stderr.log``; ``OUT/points/<key>/point.json`` marks a finished point, so
``insitu runs compare OUT/points/*`` lists every point's run folder. A point that fails (a non-zero
exit) is reported with its exit code and last stderr lines and does not stop the other points.

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
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from insitu.errors import InsituError, UsageError
from insitu.io import tomllib
from insitu.io import atomic_write, atomic_write_json, to_jsonable

__all__ = ["EXPERIMENTS", "Experiment", "register", "COMMANDS", "Command", "SweepConfig", "Point",
           "load_config", "parse_config", "grid_points", "run_sweep", "run_point", "run_command_point",
           "tabulate", "RAY_HINT"]

RAY_HINT = "pip install 'insitu[ray]'"
_SECTIONS = ("sweep", "fixed", "grid")
_SWEEP_KEYS = ("name", "run", "seeds", "metrics", "heatmap", "command")
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


# --------------------------------------------------------------------------------- commands

#: The insitu training commands a config may name with ``command = "..."``.
COMMANDS = ("train", "tt train", "lrt adapt", "e2train run")


@dataclass(frozen=True)
class Command:
    """An insitu command a sweep runs once per point, as ``insitu <name> --config FILE --run-dir
    DIR --json``. The CLI builds it from the click command (this library does not import the CLI).

    ``options`` maps every spelling a config may use (``batch-size``, ``batch_size``, an older
    alias) to the key the command's ``--config`` file takes (``batch-size``); ``cast(key, value)``
    checks a value as the option would (a ValueError says why); ``paths`` are keys resolved
    relative to the sweep config's folder; ``refused`` are options a point may not set, with the
    reason; ``seed`` says whether the command takes ``--seed``.
    """

    name: str
    options: Mapping[str, str]
    cast: Callable[[str, object], object] | None = None
    paths: tuple[str, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)
    seed: bool = True
    #: Keys that do not change a result (where the data is, how often to checkpoint): not in a
    #: point's key.
    key_ignore: tuple[str, ...] = ("data-dir", "checkpoint-every")

    @property
    def label(self) -> str:
        return f"insitu {self.name}"

    def key(self, spelling: str) -> str | None:
        """The config key of ``spelling`` (dashes or underscores, with or without ``--``)."""
        name = spelling.strip().lstrip("-")
        return self.options.get(name) or self.options.get(name.replace("_", "-"))

    def known(self) -> str:
        """The keys a point may set."""
        return ", ".join(sorted(set(self.options.values()) - set(self.refused) - {"seed"}))


# ----------------------------------------------------------------------------------- config

@dataclass(frozen=True)
class SweepConfig:
    name: str
    run: str | None                  # the experiment, or None when the sweep runs a command
    fixed: dict
    grid: dict[str, list]
    seeds: tuple[int, ...]
    metrics: tuple[str, ...]
    heatmap: tuple[str, str] | None
    source: str = "<config>"
    command: Command | None = None

    @property
    def experiment(self) -> Experiment:
        assert self.run is not None, "a command sweep runs no experiment"
        return experiment(self.run)

    @property
    def label(self) -> str:
        """What the points run: the experiment's name, or ``insitu <command>``."""
        if self.command:
            return self.command.label
        assert self.run is not None, "a sweep runs an experiment or a command"
        return self.run

    @property
    def panel_axes(self) -> tuple[str, ...]:
        """The grid axes that are not heat-map axes: one heat map per combination of them."""
        return tuple(a for a in self.grid if not self.heatmap or a not in self.heatmap)


def load_config(path, commands: Callable[[str], Command] | None = None) -> SweepConfig:
    """Read and check a sweep TOML file (a :class:`UsageError` naming what is wrong);
    ``commands(name)`` gives the :class:`Command` a ``command = "..."`` names (the CLI's)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read the sweep config {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from None
    return parse_config(data, source=str(path), base=path.resolve().parent, default_name=path.stem,
                        commands=commands)


def _unknown(keys, allowed, where: str, source: str) -> None:
    for key in keys:
        if key not in allowed:
            raise UsageError(f"{source}: unknown key {key!r} in {where}; allowed: "
                             f"{', '.join(allowed)}")


def _check_scalar(value, what: str, source: str) -> None:
    if not isinstance(value, _SCALARS) or (isinstance(value, float) and not math.isfinite(value)):
        raise UsageError(f"{source}: {what} must be a string, number or boolean, got {value!r}")


def parse_config(data: dict, source: str = "<config>", base: Path | None = None,
                 default_name: str = "sweep",
                 commands: Callable[[str], Command] | None = None) -> SweepConfig:
    """Check a parsed config; ``base`` is the folder relative paths are taken from;
    ``commands(name)`` gives the :class:`Command` a ``command = "..."`` names."""
    _unknown(data, _SECTIONS, "the top level", source)
    for section in _SECTIONS:
        if section in data and not isinstance(data[section], dict):
            raise UsageError(f"{source}: [{section}] must be a table")
    sweep = data.get("sweep", {})
    _unknown(sweep, _SWEEP_KEYS, "[sweep]", source)
    if "command" in sweep:
        if "run" in sweep:
            raise UsageError(f"{source}: [sweep] has both run and command; keep one (run: an "
                             "experiment function, command: an insitu training command)")
        return _parse_command_config(data, sweep, source, base, default_name, commands)
    run = sweep.get("run")
    if not isinstance(run, str) or not run:
        raise UsageError(f"{source}: [sweep] run or command is required: the experiment to run "
                         f"({', '.join(EXPERIMENTS)} or 'package.module:function'), or the insitu "
                         f"command ({', '.join(repr(c) for c in COMMANDS)})")
    exp = experiment(run)
    name, seeds, metrics = _sweep_section(sweep, source, default_name)
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
    _check_tables(fixed, grid, source)
    missing = [p for p in exp.required if p not in fixed and p not in grid]
    if missing:
        raise UsageError(f"{source}: {exp.name} needs {', '.join(missing)} in [fixed] or [grid]")
    _resolve_paths(exp.paths, fixed, grid, base)
    return SweepConfig(name=name, run=run, fixed=fixed, grid=grid, seeds=seeds, metrics=metrics,
                       heatmap=_heatmap(sweep, grid, source), source=source)


def _sweep_section(sweep: dict, source: str, default_name: str):
    """[sweep]'s name, seeds and metrics, checked."""
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
    return name, tuple(seeds), tuple(metrics)


def _check_tables(fixed: dict, grid: dict, source: str) -> None:
    """[fixed] scalars, [grid] non-empty lists of distinct scalars, no key in both."""
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


def _resolve_paths(paths, fixed: dict, grid: dict, base: Path | None) -> None:
    """The values of the keys ``paths`` made absolute, relative to ``base`` (in place)."""
    for key in paths:
        for table in (fixed, grid):
            if key in table and base is not None:
                if table is fixed:
                    table[key] = str((base / str(table[key])).resolve())
                else:
                    table[key] = [str((base / str(v)).resolve()) for v in table[key]]


def _heatmap(sweep: dict, grid: dict, source: str) -> tuple[str, str] | None:
    heatmap = sweep.get("heatmap")
    if heatmap is None:
        heatmap = tuple(grid)[:2] if len(grid) >= 2 else None
    else:
        if (not isinstance(heatmap, list) or len(heatmap) != 2 or heatmap[0] == heatmap[1]
                or any(a not in grid for a in heatmap)):
            raise UsageError(f"{source}: [sweep] heatmap must name two different [grid] axes "
                             f"(rows, columns), got {heatmap!r}; axes: {', '.join(grid) or 'none'}")
        heatmap = tuple(heatmap)
    return heatmap


def _parse_command_config(data: dict, sweep: dict, source: str, base: Path | None, default_name: str,
                          commands: Callable[[str], Command] | None) -> SweepConfig:
    """A sweep of an insitu command: its options checked against the command, values cast."""
    name = sweep["command"]
    if not isinstance(name, str) or " ".join(name.split()) not in COMMANDS:
        raise UsageError(f"{source}: [sweep] command must be one of the insitu training commands "
                         f"{', '.join(repr(c) for c in COMMANDS)}, got {name!r}")
    if commands is None:
        raise UsageError(f"{source}: [sweep] command = {name!r} needs the insitu command line "
                         "(run it with `insitu sweep`)")
    command = commands(" ".join(name.split()))
    sweep_name, seeds, metrics = _sweep_section(sweep, source, default_name)
    if not command.seed and seeds != (0,):
        raise UsageError(f"{source}: `{command.label}` takes no --seed; leave [sweep] seeds out")

    fixed, grid = dict(data.get("fixed", {})), dict(data.get("grid", {}))
    for where, table in (("[fixed]", fixed), ("[grid]", grid)):
        for key in table:
            option = command.key(key)
            if option == "seed":
                raise UsageError(f"{source}: 'seed' in {where}: list the seeds in [sweep] seeds")
            if option is None:
                raise UsageError(f"{source}: unknown key {key!r} in {where}: `{command.label}` has no "
                                 f"option --{key.lstrip('-').replace('_', '-')}; its options: "
                                 f"{command.known()}")
            if option in command.refused:
                raise UsageError(f"{source}: {key!r} in {where}: {command.refused[option]}")
    canonical: dict[str, str] = {}
    for key in [*fixed, *grid]:
        option = command.key(key)
        assert option is not None, "every key was checked above"
        if option in canonical:
            raise UsageError(f"{source}: {canonical[option]!r} and {key!r} are the same option "
                             f"--{option}; keep one")
        canonical[option] = key
    _check_tables(fixed, grid, source)
    if command.cast is not None:
        for where, table in (("[fixed]", fixed), ("[grid]", grid)):
            for key, values in table.items():
                option = command.key(key)
                assert option is not None, "every key was checked above"
                for value in (values if where == "[grid]" else [values]):
                    try:
                        command.cast(option, value)
                    except ValueError as exc:
                        raise UsageError(f"{source}: {where} {key} = {value!r}: {exc}") from None
    _resolve_paths([k for k in [*fixed, *grid] if command.key(k) in command.paths], fixed, grid, base)
    return SweepConfig(name=sweep_name, run=None, fixed=fixed, grid=grid, seeds=seeds, metrics=metrics,
                       heatmap=_heatmap(sweep, grid, source), source=source, command=command)


# ----------------------------------------------------------------------------------- points

@dataclass(frozen=True)
class Point:
    key: str
    axes: dict                       # the grid values of this point
    seed: int
    params: dict = field(repr=False)  # fixed + axes: the function's keyword arguments (no seed)


def _slug(value) -> str:
    text = str(value)
    slug = re.sub(r"[^A-Za-z0-9.+-]+", "-", text).rstrip("-")
    return (slug if text.startswith("-") else slug.lstrip("-")) or "x"   # -1.0 stays -1.0


def point_key(config: SweepConfig, axes: dict, seed: int) -> str:
    """A file name for one point: its values, its seed and a hash of what its result depends on."""
    if config.command is not None:
        command = config.command
        params = {command.key(k): v for k, v in {**config.fixed, **axes}.items()}
        params = {k: v for k, v in params.items() if k not in command.key_ignore}
        identity = json.dumps({"command": command.name, "params": params, "seed": seed}, sort_keys=True)
    else:
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
    if config.command is not None:
        return                     # the command's options are checked and cast by parse_config
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


# ------------------------------------------------------------------------- command points

#: A point's stderr in its run folder, and the record that marks the point finished.
STDERR_LOG, POINT_FILE = "stderr.log", "point.json"
#: The stderr lines a failed point's report quotes.
STDERR_TAIL = 8
#: One BLAS thread per point, as for experiment points: a result does not depend on where it ran.
_ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_CHILDREN: set = set()
_CHILDREN_LOCK = threading.Lock()


class PointFailed(InsituError):
    """A command point that exited non-zero, or printed no JSON result."""

    #: One line for the sweep's log (a non-zero exit: the last stderr line), or None.
    summary: str | None = None


def _tail(path: Path, lines: int = STDERR_TAIL) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]


def run_command_point(words: list[str], run_dir: str | Path, options: dict, seed: int | None) -> dict:
    """Run one point of a command sweep: ``python -m insitu WORDS --config FILE --run-dir RUN_DIR
    --json`` with ``options`` (config keys) and ``seed`` in FILE, one BLAS thread.

    The child's stderr goes to ``RUN_DIR/stderr.log`` (to ``.<name>.stderr.log`` beside RUN_DIR
    while it runs: the command refuses a folder it did not start). Returns ``{"result": ...,
    "wall_s": ..., "run_dir": ...}``; raises :class:`PointFailed` with the exit code and the last
    stderr lines when the command fails.
    """
    import tomli_w

    run_dir = Path(run_dir)
    points = run_dir.parent
    points.mkdir(parents=True, exist_ok=True)
    # A folder the command never started (it failed before writing run.json) holds only the
    # sweep's stderr.log: clear it, or the command would refuse a folder of something else.
    if run_dir.is_dir() and not (run_dir / "run.json").exists():
        (run_dir / STDERR_LOG).unlink(missing_ok=True)
        try:
            run_dir.rmdir()
        except OSError:
            pass                                   # other files: the command says what they are
    config_path = points / f".{run_dir.name}.toml"
    pending_log = points / f".{run_dir.name}.{STDERR_LOG}"
    values = {**options, **({"seed": seed} if seed is not None else {})}
    atomic_write(config_path, tomli_w.dumps(values))
    argv = [sys.executable, "-m", "insitu", *words, "--config", str(config_path),
            "--run-dir", str(run_dir), "--json"]
    label = "insitu " + " ".join(words)
    start = time.perf_counter()
    with open(pending_log, "wb") as err:
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                 env={**os.environ, **_ONE_THREAD})
        with _CHILDREN_LOCK:
            _CHILDREN.add(child)
        try:
            stdout, _ = child.communicate()
        except BaseException:          # Ctrl-C here: the command got it too; let it stop cleanly
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.terminate()
            raise
        finally:
            with _CHILDREN_LOCK:
                _CHILDREN.discard(child)
    wall_s = round(time.perf_counter() - start, 3)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / STDERR_LOG
    os.replace(pending_log, log)
    config_path.unlink(missing_ok=True)
    if child.returncode != 0:
        tail = _tail(log)
        failed = PointFailed(f"`{label}` exited with {child.returncode}"
                             + (":\n" + "\n".join(f"    {line}" for line in tail) if tail else
                                " and printed nothing on stderr")
                             + f"\n    (its stderr: {log})")
        failed.summary = f"`{label}` exited with {child.returncode}" + (f": {tail[-1]}" if tail else "")
        raise failed
    try:
        result = json.loads(stdout)
    except ValueError:
        raise PointFailed(f"`{label}` exited with 0 but printed no JSON result "
                          f"(its stderr: {log})") from None
    return {"result": result, "wall_s": wall_s, "run_dir": str(run_dir)}


def _stop_children(grace_s: float = 10.0) -> None:
    """After Ctrl-C: the points' commands got it too and stop at a step's end, recording an
    interrupted run folder; wait for them a while, then terminate what still runs."""
    with _CHILDREN_LOCK:
        children = list(_CHILDREN)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.terminate()


def _command_options(config: SweepConfig, point: Point) -> dict:
    """A point's options as the command's --config file takes them."""
    assert config.command is not None, "only a command sweep has command options"
    return {config.command.key(k): v for k, v in point.params.items()}


def metric_value(result, metric: str, key: str = "") -> int | float:
    """``result[metric]`` (dots go into nested dicts, integers index lists), a number; a clear
    error when absent."""
    value = result
    for part in metric.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
            continue
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

def _point_path(out: Path, key: str, config: SweepConfig) -> Path:
    """A finished point's record: ``points/<key>.json``, or ``points/<key>/point.json`` (in the
    point's run folder) for a command sweep."""
    if config.command is not None:
        return out / "points" / key / POINT_FILE
    return out / "points" / f"{key}.json"


def load_point(out: Path, point: Point, config: SweepConfig) -> dict | None:
    """The finished point's record, or None when it has not run (or its file is unreadable)."""
    path = _point_path(out, point.key, config)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != point.key or "result" not in record:
        return None
    return record


def _record(config: SweepConfig, point: Point, outcome: dict) -> dict:
    record = {"key": point.key, "run": config.label, "axes": point.axes, "seed": point.seed,
              "params": point.params, "wall_s": outcome["wall_s"], "result": outcome["result"]}
    if config.command is not None:
        record["command"] = config.command.name
        record["run_dir"] = outcome["run_dir"]
    return record


def _job(config: SweepConfig, out: Path, point: Point) -> tuple[Callable, tuple]:
    """The function that runs ``point`` and its arguments (plain values: they travel to workers)."""
    if config.command is None:
        return run_point, (config.experiment.target, point.params, point.seed)
    command = config.command
    return run_command_point, (command.name.split(), str((out / "points" / point.key).resolve()),
                               _command_options(config, point), point.seed if command.seed else None)


def _ignore_sigint() -> None:
    """In pool workers: Ctrl-C is the parent's to handle (it keeps what finished, then stops us)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _Local:
    """Points in a local process pool (spawned workers), or in this process with one worker;
    command points in threads (each runs its command as a subprocess)."""

    def __init__(self, workers: int, threads: bool = False):
        self.workers, self.threads = workers, threads
        self.pool = None

    def __enter__(self):
        if self.workers > 1 and self.threads:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(self.workers)
        elif self.workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_ignore_sigint)
        return self

    def run(self, job: Callable, todo: list[Point], stop_on_error: bool = True):
        """Yield ``(point, outcome, error)`` as points finish; with ``stop_on_error``, stops
        submitting after an error."""
        if self.pool is None:
            for p in todo:
                fn, args = job(p)
                try:
                    yield p, fn(*args), None
                except Exception as exc:                       # noqa: BLE001 - reported per point
                    yield p, None, exc
                    if stop_on_error:
                        return
            return
        from concurrent.futures import FIRST_COMPLETED, wait

        pending = list(reversed(todo))
        running = {}
        failed = False
        while pending or running:
            while pending and not failed and len(running) < self.workers:
                p = pending.pop()
                fn, args = job(p)
                running[self.pool.submit(fn, *args)] = p
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                p = running.pop(fut)
                exc = fut.exception()
                if exc is not None and stop_on_error:
                    failed = True
                yield p, (None if exc else fut.result()), exc

    def __exit__(self, exc_type, *exc):
        if self.pool is None:
            return
        if exc_type is not None and not issubclass(exc_type, Exception):
            # Ctrl-C: the points still running are lost anyway; do not wait for them (a command
            # point's run folder keeps its checkpoint: the command stops at a step's end).
            if self.threads:
                _stop_children()
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

    def run(self, job: Callable, todo: list[Point], stop_on_error: bool = True):
        ray = self.ray
        tasks = {}
        limit = self.workers or len(todo)
        pending = list(reversed(todo))
        running = {}
        failed = False
        while pending or running:
            while pending and not failed and len(running) < limit:
                p = pending.pop()
                fn, args = job(p)
                task = tasks.get(fn) or tasks.setdefault(fn, ray.remote(num_cpus=1)(fn))
                running[task.remote(*args)] = p
            if not running:
                break
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                p = running.pop(ref)
                try:
                    yield p, ray.get(ref), None
                except Exception as exc:                       # noqa: BLE001 - reported per point
                    failed = stop_on_error
                    cause = getattr(exc, "cause", None)
                    yield p, None, cause if isinstance(cause, BaseException) else exc

    def __exit__(self, *exc):
        if self.started:
            self.ray.shutdown()


def run_sweep(config: SweepConfig, out, workers: int | None = None, ray_address: str | None = None,
              advance: Callable[[int], None] = lambda n: None,
              log: Callable[[str], None] = lambda msg: None) -> dict:
    """Run the points of ``config`` not yet in ``out``, then tabulate, write the CSV and heat maps.

    Raises :class:`InsituError` when a point fails, after keeping every point that finished: an
    experiment sweep stops submitting points; a command sweep runs every other point, writes the
    table of the finished ones, then names each failed point with its exit code and stderr.
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
        raise InsituError(f"cannot write in the sweep folder {out}: choose a writable --out-dir")

    records = {}
    for p in points:
        record = load_point(out, p, config)
        if record is not None:
            records[p.key] = record
        elif _point_path(out, p.key, config).exists():
            log(f"point {p.key}: its file is unreadable; running it again")
    todo = [p for p in points if p.key not in records]
    advance(len(points) - len(todo))
    start = time.perf_counter()
    commands = config.command is not None
    if ray_address:
        backend = _Ray(ray_address, workers)
    else:
        backend = _Local(min(workers or os.cpu_count() or 1, max(1, len(todo))), threads=commands)
    errors = []
    try:
        if todo:
            with backend:
                for p, outcome, exc in backend.run(lambda q: _job(config, out, q), todo,
                                                   stop_on_error=not commands):
                    if exc is not None:
                        errors.append((p, exc))
                        if commands:
                            summary = getattr(exc, "summary", None) or str(exc).splitlines()[0]
                            log(f"point {p.key} failed: {summary}")
                        continue
                    assert outcome is not None, "a point without an exception has its outcome"
                    record = _record(config, p, outcome)
                    atomic_write_json(_point_path(out, p.key, config), record)
                    records[p.key] = record
                    advance(1)
                    for m in config.metrics:              # a metric the run lacks: stop at once
                        metric_value(record["result"], m, p.key)
    except KeyboardInterrupt:
        log(f"interrupted: {len(records)} of {len(points)} points are finished and kept in "
            f"{out / 'points'}; run the sweep again to resume")
        raise
    seconds = time.perf_counter() - start
    finished = sum(1 for q in points if q.key in records)
    if errors and not commands:
        p, exc = errors[0]
        message = str(exc) if isinstance(exc, InsituError) else f"{type(exc).__name__}: {exc}"
        raise InsituError(f"sweep point {p.key} failed: {message} ({finished} of {len(points)} "
                          f"points are finished and kept in {out / 'points'}; run the sweep again "
                          f"to resume)")
    summary = finish(config, out, points, records, ran=len(todo) - len(errors), seconds=seconds,
                     backend="ray" if ray_address else "local",
                     failed=[p.key for p, _ in errors])
    if errors:
        lines = []
        for p, exc in errors:
            message = str(exc) if isinstance(exc, InsituError) else f"{type(exc).__name__}: {exc}"
            lines.append(f"point {p.key}: {message}")
        raise InsituError(f"{len(errors)} of {len(points)} sweep points failed ({finished} are "
                          f"finished and kept in {out / 'points'}; the table of the finished ones is "
                          f"in {out / 'sweep.json'}; run the sweep again to rerun the failed ones):\n"
                          + "\n".join(lines))
    return summary


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
           seconds: float, backend: str, failed: list[str] | None = None) -> dict:
    rows = tabulate(config, points, records)
    csv_path = write_csv(out / "points.csv", config, points, records)
    heatmaps = plot_heatmaps(out, config, rows)
    summary = {
        "name": config.name, "run": config.label,
        "command": config.command.name if config.command else None,
        "config": config.source, "out": str(out),
        "backend": backend, "fixed": config.fixed, "grid": config.grid, "seeds": list(config.seeds),
        "metrics": list(config.metrics), "heatmap": list(config.heatmap or []),
        "points": len(points), "ran": ran, "skipped": len(points) - ran - len(failed or []),
        "failed": list(failed or []),
        "seconds": round(seconds, 2), "table": rows,
        "csv": str(csv_path), "heatmaps": [str(p) for p in heatmaps],
    }
    atomic_write_json(out / "sweep.json", summary)
    return summary
