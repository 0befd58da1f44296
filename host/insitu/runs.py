"""Run folders: one folder per run, holding everything the run wrote, and comparison across runs.

A command given ``--run-dir DIR`` writes there:

* ``config.toml``: the resolved config (every option's value); ``insitu <command> --config
  DIR/config.toml`` runs it again;
* ``run.json``: the command, its config, its status (``running``, ``complete``, ``failed``,
  ``interrupted``) and one summary row per training run (name, samples, seconds, final loss,
  accuracy, energy, curve), what ``insitu runs compare`` reads;
* ``result.json``: the command's result (what ``--json`` prints);
* ``curve.csv``: the curve's points (``run,samples,loss,train_accuracy,test_accuracy``);
* ``checkpoint.npz``, ``plot.png``, ``power.csv`` (with ``power.json``), as the command writes them.

A folder holds one run: a folder of another run (another command, or a config that differs in
more than the budget) is refused, never overwritten; a folder of the same run resumes it.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet

from insitu.errors import UsageError
from insitu.io import atomic_write, atomic_write_json, check_writable, os_reason, to_jsonable

#: Tells the user about the run folder on stderr (never in --json output), as the harness does.
log = logging.getLogger(__name__)

#: The format of ``run.json``.
FORMAT = "insitu-run-folder/1"
RUN_FILE, CONFIG_FILE, RESULT_FILE, CURVE_FILE = "run.json", "config.toml", "result.json", "curve.csv"
#: Options that set how much to run or where files go, not which run: a folder's run may be
#: continued with more samples, or with checkpoints written more often.
NOT_IDENTITY = frozenset({"samples", "epochs", "checkpoint", "checkpoint-every", "data-dir", "meter",
                          "power-out", "counts", "out-dir"})
#: The options that set how much to run: a complete run asked again for the same budget is not
#: run again (its result stands); asked for more, it goes on.
BUDGET = frozenset({"samples", "epochs"})
#: The result keys a summary row takes its accuracy from, in order of preference.
ACCURACY_KEYS = ("accuracy", "test_accuracy", "online_accuracy")
CURVE_COLUMNS = ("run", "samples", "loss", "train_accuracy", "test_accuracy")


def to_toml(config: dict) -> str:
    """``config`` as TOML (None values are left out: TOML has no null; paths become strings)."""
    import tomli_w

    plain = {k: _plain(v) for k, v in config.items() if v is not None}
    return tomli_w.dumps(plain)


def _plain(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _shown(value) -> str:
    """A config value in a message: None is the option left at its default."""
    return "default" if value is None else repr(value)


def differences(saved: dict, wanted: dict, skip: AbstractSet[str] = frozenset()) -> str:
    """The fields of two configs that differ, for a message: ``lr 0.1 there, 0.2 here; ...``."""
    keys = [k for k in sorted(set(saved) | set(wanted)) if k not in skip]
    diff = [f"{k} {_shown(saved.get(k))} there, {_shown(wanted.get(k))} here" for k in keys
            if saved.get(k) != wanted.get(k)]
    return "; ".join(diff[:4]) + ("; ..." if len(diff) > 4 else "")


def read_run(folder: Path, hint: str) -> dict:
    """The ``run.json`` of a run folder; a folder without a readable one is an error ending in ``hint``."""
    record = Path(folder) / RUN_FILE
    if not record.is_file():
        raise UsageError(f"{folder} is not a run folder (it has no {RUN_FILE}): {hint}")
    try:
        return json.loads(record.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {record} ({exc}): {hint}") from None


class RunFolder:
    """The folder of one run of ``command`` with ``config`` (the resolved options, JSON-ready)."""

    def __init__(self, path: str | Path, command: str, config: dict):
        self.path, self.command = Path(path), command
        self.config = json.loads(json.dumps(config, default=to_jsonable))
        self.resumed = False
        self.kept_rows: list[dict] = []    # a finished run's figures, kept while it runs again
        self.result: dict | None = None     # the result of this run when complete
        self._check()

    def _check(self) -> None:
        """Refuse a path that is not a folder or is another run's folder (cheap: before any work);
        note a folder of this very run that is complete (:attr:`complete`)."""
        try:
            if self.path.exists() and not self.path.is_dir():
                raise UsageError(f"--run-dir {self.path} is a file, not a folder: choose another path")
            occupied = self.path.is_dir() and any(self.path.iterdir())
        except OSError as exc:
            raise UsageError(f"cannot use --run-dir {self.path}: {os_reason(exc)}; choose another "
                             "folder") from None
        if not occupied:
            check_writable(self.file(RUN_FILE), "--run-dir")
            return
        saved = read_run(self.path, "choose a new or empty --run-dir")
        if saved.get("command") != self.command:
            raise UsageError(f"--run-dir {self.path} holds a run of `{saved.get('command')}`, "
                             f"not `{self.command}`: choose another --run-dir")
        differ = differences(saved.get("config", {}), self.config, NOT_IDENTITY)
        if differ:
            raise UsageError(f"--run-dir {self.path} holds another run ({differ}): choose "
                             "another --run-dir, or the same options to continue that run")
        self.resumed = True
        self.kept_rows = saved.get("rows") or []
        others = (set(self.config) | set(saved.get("config", {}))) - BUDGET
        same_budget = not differences(saved.get("config", {}), self.config, others)
        if saved.get("status") == "complete" and same_budget:
            try:
                result = json.loads(self.file(RESULT_FILE).read_text())
            except (OSError, ValueError):
                result = None            # no readable result: the run is run again (it resumes)
            self.result = result if isinstance(result, dict) else None

    @property
    def complete(self) -> bool:
        """Whether the folder holds this run, finished with this budget: nothing is left to run,
        and its result (:attr:`result`) stands."""
        return self.result is not None

    def already_complete(self) -> dict:
        """The result of this complete run, said on stderr: the run is not run again, and its
        figures (seconds, rates, energy) stay those it measured."""
        log.warning("--run-dir %s already holds this run, complete: its result is shown, nothing is "
                    "run again (ask for more --samples or --epochs to continue it)", self.path)
        assert self.result is not None, "already_complete() of a run that is not complete"
        return self.result

    def start(self) -> None:
        """Create the folder and write the config and a ``running`` record."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            atomic_write(self.file(CONFIG_FILE), to_toml(self.config))
        except OSError as exc:
            raise UsageError(f"cannot write --run-dir {self.path}: {exc.strerror}; choose a writable "
                             "folder") from None
        self._record("running")

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def checkpoint(self) -> Path:
        return self.file("checkpoint.npz")

    def _record(self, status: str, rows: list[dict] | None = None, message: str | None = None) -> None:
        record = {"format": FORMAT, "command": self.command, "config": self.config, "status": status,
                  "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "message": message,
                  "rows": self.kept_rows if rows is None else rows}
        atomic_write_json(self.file(RUN_FILE), record)

    def finish(self, result, rows: list[dict] | None = None, status: str = "complete",
               message: str | None = None) -> None:
        """Write the result, its curves and the record (rows: :func:`summary_rows`); ``status``
        other than ``complete`` for a result of a run that failed (e.g. a measured command's)."""
        rows = summary_rows(result) if rows is None else rows
        atomic_write_json(self.file(RESULT_FILE), result)
        atomic_write(self.file(CURVE_FILE), curve_csv(rows))
        self._record(status, rows, message)

    @contextmanager
    def running(self):
        """Around the run: the folder is written first; a run that raises is recorded as
        ``interrupted`` (Ctrl-C or SIGTERM, exit 130 or 143) or ``failed``, with its message."""
        self.start()
        try:
            yield self
        except BaseException as exc:
            interrupted = isinstance(exc, KeyboardInterrupt) or getattr(exc, "exit_code", None) in (130, 143)
            self.stopped("interrupted" if interrupted else "failed", str(exc) or type(exc).__name__)
            raise

    def stopped(self, status: str, message: str) -> None:
        """Record that the run ended without a result (``failed`` or ``interrupted``)."""
        try:
            self._record(status, message=message)
        except OSError:
            pass                       # the run's own error is the one to report


def summary_row(name: str, result: dict) -> dict:
    """The figures runs are compared by, from one training result."""
    accuracy = next((result[k] for k in ACCURACY_KEYS if result.get(k) is not None), None)
    power = result.get("power") or {}
    return {"name": name, "algo": result.get("algo") or result.get("variant") or result.get("scheme"),
            "samples": result.get("samples"), "seconds": result.get("seconds"),
            "final_loss": result.get("final_loss"), "accuracy": accuracy,
            "energy_j": power.get("energy_j", result.get("energy_j")),
            "curve": result.get("curve") or []}


def summary_rows(result) -> list[dict]:
    """One summary row per training run in ``result``: a record, or a list of named records."""
    if isinstance(result, list):
        return [summary_row(str(r.get("name", r.get("variant", i))), r) for i, r in enumerate(result)]
    return [summary_row("", result)]


def curve_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CURVE_COLUMNS)
    for row in rows:
        for point in row["curve"]:
            writer.writerow([row["name"], *("" if point.get(c) is None else point[c]
                                           for c in CURVE_COLUMNS[1:])])
    return out.getvalue()


# ----------------------------------------------------------------------------------- comparison

@dataclass
class ComparedRun:
    folder: Path
    command: str
    status: str
    config: dict
    row: dict

    @property
    def label(self) -> str:
        return self.folder.name + (f"/{self.row['name']}" if self.row["name"] else "")


def load_runs(folders) -> list[ComparedRun]:
    """Every summary row of every run folder, in order; a folder without a run is an error."""
    runs = []
    for folder in map(Path, folders):
        saved = read_run(folder, "give folders written with --run-dir")
        rows = saved.get("rows") or [{"name": "", "algo": None, "samples": None, "seconds": None,
                                      "final_loss": None, "accuracy": None, "energy_j": None,
                                      "curve": []}]
        runs += [ComparedRun(folder, saved.get("command", "?"), saved.get("status", "?"),
                             saved.get("config", {}), row) for row in rows]
    return runs


def compare(folders) -> dict:
    """One table across runs of any command: their figures, their configs and ``differing``, the
    options that do not have one value in all of them. An option that some runs' commands do not
    have differs too where others set it; an option left unset (None) is as if absent."""
    runs = load_runs(folders)
    keys = set().union(*(r.config for r in runs)) if runs else set()
    differing = [k for k in sorted(keys) if len({json.dumps(r.config.get(k)) for r in runs}) > 1]
    return {"differing": differing,
            "runs": [{"run": r.label, "folder": str(r.folder), "command": r.command, "status": r.status,
                      **{k: v for k, v in r.row.items() if k != "curve"},
                      "config": r.config, "curve": r.row["curve"]}
                     for r in runs]}


def run_colours(count: int) -> list:
    """One distinct colour per run, the same in every panel: tab10 up to 10 runs, tab20 up to
    20, then evenly spaced hues."""
    import matplotlib

    if count <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(count)]
    if count <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(count)]
    return [matplotlib.colormaps["hsv"](i / count) for i in range(count)]


def plot_curves(curves: dict[str, list[dict]], path: str | Path, title: str = "") -> Path:
    """Loss and accuracy (train dashed, test solid) against samples: one colour per run, the same
    in both panels, and one legend beside them with an entry per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from insitu.io import save_figure

    colours = run_colours(len(curves))
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4))
    handles = []
    for (name, curve), colour in zip(curves.items(), colours):
        for ax, key, style in ((loss_ax, "loss", "-"), (acc_ax, "test_accuracy", "-"),
                               (acc_ax, "train_accuracy", "--")):
            points = [(p["samples"], p[key]) for p in curve if p.get(key) is not None]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, style, color=colour, marker="o", markersize=3)
        handles.append(Line2D([], [], color=colour, marker="o", markersize=3, label=name or "run"))
    handles += [Line2D([], [], color="grey", ls="-", label="test accuracy (probe)"),
                Line2D([], [], color="grey", ls="--", label="train accuracy")]
    loss_ax.set(xlabel="training samples", ylabel="training loss (mean since the last point)")
    acc_ax.set(xlabel="training samples", ylabel="accuracy (solid: test probe, dashed: train)")
    for ax in (loss_ax, acc_ax):
        if not ax.lines:
            ax.text(0.5, 0.5, "no points recorded", ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(0.86, 0.5), fontsize=7,
               frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    save_figure(fig, path)
    plt.close(fig)
    return Path(path)
