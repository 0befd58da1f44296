"""`insitu writes`: reports of NVM weight writes per cell (the LRT papers' endurance argument)."""

from __future__ import annotations

import click

from insitu.cli.output import emit_json, write_json
from insitu.errors import InsituError, UsageError
from insitu.io import check_writable


@click.group("writes")
def command():
    """Reports of NVM weight writes per cell: histograms, lifetime, write energy.

    \b
    Examples (runs of `insitu lrt adapt` with --out and --counts):
      insitu lrt adapt --env control --scheme sgd --out sgd.json --counts sgd.npz
      insitu lrt adapt --env control --scheme lrt --out lrt.json --counts lrt.npz
      insitu writes report lrt.json --counts lrt.npz
      insitu writes report sgd.json --counts sgd.npz --compare lrt.json --compare-counts lrt.npz \\
          --plot writes.png
      insitu writes report all.json --scheme sgd --compare all.json --compare-scheme lrt --json
      insitu writes report board.json        # from `insitu train --algo lrt --out board.json`
    """


@command.command("report")
@click.argument("run", type=click.Path(dir_okay=True))
@click.option("--counts", type=click.Path(), default=None,
              help="The run's per-cell counts (.npz of `insitu lrt adapt --counts`; with --scheme "
                   "all it wrote COUNTS-SCHEME.npz); without it the run JSON's own histograms are "
                   "used (exact, power-of-two bins).")
@click.option("--scheme", default=None,
              help="The run to report in a `--scheme all` JSON (sgd, lrt, ...).")
@click.option("--compare", "other", type=click.Path(dir_okay=True), default=None,
              help="A second run (JSON or counts .npz) to set side by side; ratios are RUN / OTHER.")
@click.option("--compare-counts", type=click.Path(), default=None,
              help="The second run's per-cell counts (.npz).")
@click.option("--compare-scheme", default=None,
              help="The run to compare in a `--scheme all` JSON.")
@click.option("--samples", type=int, default=None,
              help="Samples a counts .npz given alone took (the lifetime needs them).")
@click.option("--endurance", type=float, default=None,
              help="Writes a cell endures (default: the run's NVM model, else RRAM's 1e6).")
@click.option("--write-pj-per-bit", type=float, default=None,
              help="NVM write energy per bit in pJ (default: the run's NVM model, else RRAM's 10.9).")
@click.option("--bits-per-cell", type=int, default=None,
              help="Bits written per cell write (default: the run's, else the LRT weight format's 8).")
@click.option("--rate", type=float, default=None,
              help="Samples per second of the deployment, for the lifetime in time (default: "
                   "RUN's own samples / seconds, for both runs: the speed of what counted the "
                   "writes, a host simulation for `insitu lrt adapt`).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write one PNG with the runs' histograms of writes per cell, one panel per layer.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the report JSON.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def report(run, counts, scheme, other, compare_counts, compare_scheme, samples, endurance,
           write_pj_per_bit, bits_per_cell, rate, plot, out, as_json):
    """Per-layer writes per cell of RUN (a run JSON or a counts .npz), and OTHER beside it.

    \b
    RUN is the JSON of `insitu lrt adapt --out` (with --counts COUNTS.npz for the per-cell counts)
    or of `insitu train --algo lrt --out`, or a counts .npz alone (with --samples N).
    Per layer and in total: cells, written cells, max and mean writes per cell, the histogram of
    writes per cell, the endurance used by the worst cell, the projected lifetime
    (endurance / max writes per cell x samples, and in time at the run's rate or --rate) and the
    NVM write energy (writes x bits per cell x pJ per bit).
    """
    from insitu.lrt.write_report import format_report, load_run, plot_histograms, report_payload

    if other is None:
        for name, value in (("--compare-counts", compare_counts), ("--compare-scheme", compare_scheme)):
            if value is not None:
                raise UsageError(f"{name} goes with --compare OTHER")
    for path, what in ((plot, "--plot"), (out, "--out")):
        if path:
            check_writable(path, what, plot=what == "--plot")
    runs = [load_run(run, counts=counts, scheme=scheme)]
    if other is not None:
        runs.append(load_run(other, counts=compare_counts, scheme=compare_scheme,
                             what="--compare file", scheme_option="--compare-scheme"))
    payload = report_payload(runs, endurance=endurance, write_pj_per_bit=write_pj_per_bit,
                             bits_per_cell=bits_per_cell, rate=rate, samples=samples)
    if plot:
        try:
            plot_histograms(payload, plot)
        except OSError as exc:
            raise InsituError(f"cannot write --plot {plot}: {exc.strerror}") from None
        payload["plot"] = plot
    if out:
        write_json(out, payload, "--out")
    if as_json:
        emit_json(payload)
    else:
        click.echo(format_report(payload))
