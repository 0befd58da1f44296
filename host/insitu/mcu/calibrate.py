"""Cycles per instruction (CPI) of the Cortex-M7 twin, calibrated by CoreMark.

The twin (QEMU's mps2-an500 under ``-icount shift=0``) counts guest instructions, not cycles. To
turn a count into the board's time we need the cycles an instruction costs on a real Cortex-M7 for
this kind of code. CoreMark gives it: Arm publishes 5.01 CoreMark/MHz for the Cortex-M7 (the
Cortex-M7 product page, developer.arm.com/Processors/Cortex-M7, an EEMBC-format figure), i.e. one
iteration costs 1e6 / 5.01 = 199,600 cycles on the core. The same iteration built for the twin as
the board's code is built, and counted there, gives instructions per iteration; the ratio is CPI.

CoreMark is not part of insitu: the user names a checkout (``git clone
https://github.com/eembc/coremark``). What is insitu's own is the port written below into a build
folder: a bare-metal mps2-an500 target (vector table, reset, FPU on), time from the MPS2's CMSDK
APB timer 0 and output/exit through Arm semihosting (``bkpt 0xab``).

Why the timer counts instructions: QEMU clocks the MPS2's timers (and SysTick) from its 25 MHz
SYSCLK on the virtual clock, and under ``-icount shift=0`` the virtual clock advances 1 ns per
guest instruction, so one tick is 40 instructions, deterministically. The port does not take that
on trust: before the benchmark it times a loop of exactly 2,000,000 instructions (``subs; bne``)
and the host derives the instructions per tick from it. Fixed costs (start/stop, reporting) cancel
by running N and 2N iterations and differencing.

CoreMark's own reporting rule wants 10 s of run time: at N = 17,500 the 2N run lasts 10 s of the
twin's virtual clock and CoreMark prints "Correct operation validated"; shorter runs are as exact
(its CRCs are checked at any length) and print "Errors detected" for the 10 s rule alone.

``python -m insitu.mcu.calibrate --coremark DIR [--opt O2] [--iterations N] [--json]``
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from insitu.errors import InsituError, UsageError

#: Arm's published CoreMark/MHz for the Cortex-M7 (developer.arm.com/Processors/Cortex-M7).
COREMARK_PER_MHZ = 5.01
CORE_FILES = ("core_list_join.c", "core_main.c", "core_matrix.c", "core_state.c", "core_util.c")
#: The board's code generation (STM32F746: Cortex-M7, single-precision FPU, hard-float ABI).
ARCH_FLAGS = ("-mthumb", "-mcpu=cortex-m7", "-mfpu=fpv5-sp-d16", "-mfloat-abi=hard")
QEMU_MACHINE = "mps2-an500"
PACKAGES = "apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm"
#: The port's probe loop: 1,000,000 passes of two instructions.
PROBE_INSTRUCTIONS = 2_000_000

PORTME_H = r"""/* insitu's CoreMark port for QEMU mps2-an500 (Cortex-M7), bare metal. */
#ifndef CORE_PORTME_H
#define CORE_PORTME_H
#include <stddef.h>
#define HAS_FLOAT 0          /* integer seconds in the report: no float printf needed */
#define HAS_TIME_H 0
#define USE_CLOCK 0
#define HAS_STDIO 0
#define HAS_PRINTF 0         /* ee_printf is ours, through semihosting */
#define SEED_METHOD SEED_VOLATILE
#define MEM_METHOD MEM_STATIC
#define MEM_LOCATION "STATIC"
#define MULTITHREAD 1
#define MAIN_HAS_NOARGC 1
#define MAIN_HAS_NORETURN 0
#define COMPILER_VERSION "GCC" __VERSION__
#define COMPILER_FLAGS FLAGS_STR
#ifndef PERFORMANCE_RUN
#define PERFORMANCE_RUN 1    /* the seeds of the reported CoreMark score */
#endif
typedef signed short ee_s16;
typedef unsigned short ee_u16;
typedef signed int ee_s32;
typedef float ee_f32;
typedef unsigned char ee_u8;
typedef unsigned int ee_u32;
typedef ee_u32 ee_ptr_int;
typedef size_t ee_size_t;
#define align_mem(x) (void *)(4 + (((ee_ptr_int)(x) - 1) & ~3))
#define CORETIMETYPE ee_u32
typedef ee_u32 CORE_TICKS;
typedef struct CORE_PORTABLE_S { ee_u8 portable_id; } core_portable;
extern ee_u32 default_num_contexts;
void portable_init(core_portable *p, int *argc, char *argv[]);
void portable_fini(core_portable *p);
int ee_printf(const char *fmt, ...);
#endif
"""

PORTME_C = r"""/* insitu's CoreMark port for QEMU mps2-an500 (Cortex-M7), bare metal. */
#include <stdarg.h>
#include <stdio.h>
#include "coremark.h"

volatile ee_s32 seed1_volatile = 0x0, seed2_volatile = 0x0, seed3_volatile = 0x66;
volatile ee_s32 seed4_volatile = ITERATIONS, seed5_volatile = 0;
ee_u32 default_num_contexts = 1;

/* Arm semihosting: QEMU serves it with -semihosting-config enable=on,target=native. */
static int semihost(int op, const void *arg)
{
    register int r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

int ee_printf(const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    semihost(0x04, buf);                            /* SYS_WRITE0 */
    return n;
}

static void __attribute__((noreturn)) quit(int ok)
{
    /* SYS_EXIT: ADP_Stopped_ApplicationExit makes QEMU exit 0, anything else 1 */
    semihost(0x18, (const void *)(ok ? 0x20026 : 0x20023));
    for (;;) {}
}

/* CMSDK APB timer 0: CTRL, VALUE, RELOAD. A 32-bit down-counter at 25 MHz of virtual time, so it
   wraps after 171 virtual seconds and needs no interrupt. */
#define TIMER0 ((volatile ee_u32 *)0x40000000)
static ee_u32 now(void) { return 0xFFFFFFFFu - TIMER0[1]; }

static CORE_TICKS start_ticks, stop_ticks;
void start_time(void) { start_ticks = now(); }
void stop_time(void) { stop_ticks = now(); }
CORE_TICKS get_time(void) { return stop_ticks - start_ticks; }
secs_ret time_in_secs(CORE_TICKS ticks) { return ticks / 25000000u; }

void portable_init(core_portable *p, int *argc, char *argv[])
{
    (void)argc;
    (void)argv;
    TIMER0[2] = 0xFFFFFFFFu;
    TIMER0[1] = 0xFFFFFFFFu;
    TIMER0[0] = 1;                                  /* enable */
    /* the probe: exactly 2 * 1000000 instructions, timed, so the host can check the tick */
    ee_u32 n = 1000000, t = now();
    __asm__ volatile("1: subs %0, %0, #1\n\tbne 1b" : "+r"(n));
    t = now() - t;
    ee_printf("insitu-probe: 2000000 instructions in %lu ticks\n", (unsigned long)t);
    p->portable_id = 1;
}

void portable_fini(core_portable *p) { p->portable_id = 0; }

/* Start-up: the vector table at address 0 gives the initial stack and the reset handler. */
extern ee_u32 _bss_start, _bss_end, _stack_top;
int main(void);

void reset(void)
{
    *(volatile ee_u32 *)0xE000ED88 |= 0xFu << 20;   /* CPACR: CP10/CP11 (the FPU) on */
    __asm__ volatile("dsb\n\tisb" ::: "memory");
    for (ee_u32 *w = &_bss_start; w < &_bss_end; w++)
        *w = 0;
    quit(main() == 0);
}

/* newlib's vsnprintf links malloc, which never runs here: no heap */
void *_sbrk(int bytes) { (void)bytes; return (void *)-1; }

static void fault(void)
{
    ee_printf("insitu-fault\n");
    quit(0);
}

__attribute__((section(".vectors"), used)) static void (*const vectors[16])(void) = {
    (void (*)(void))&_stack_top, reset, fault, fault, fault, fault, fault, 0, 0, 0, 0,
    fault, fault, 0, fault, fault,
};
"""

# Everything in the AN500's 4 MiB SSRAM1 at address 0: QEMU loads the ELF's sections in place.
LINK_LD = r"""MEMORY { RAM (rwx) : ORIGIN = 0x00000000, LENGTH = 4M }
ENTRY(reset)
SECTIONS
{
    .text : { KEEP(*(.vectors)) *(.text*) *(.rodata*) } > RAM
    .ARM.exidx : { *(.ARM.exidx*) } > RAM
    .data : { *(.data*) } > RAM
    .bss (NOLOAD) : { . = ALIGN(4); _bss_start = .; *(.bss*) *(COMMON); . = ALIGN(4);
                      _bss_end = .; } > RAM
    _stack_top = ORIGIN(RAM) + LENGTH(RAM);
}
"""


def check_coremark_dir(path) -> Path:
    """The CoreMark checkout, or a UsageError that says what is wrong."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UsageError(f"{path}: no such folder (git clone https://github.com/eembc/coremark)")
    missing = [f for f in CORE_FILES + ("coremark.h",) if not (folder / f).is_file()]
    if missing:
        raise UsageError(f"{path}: not a CoreMark tree (no {', '.join(missing)}); "
                         "git clone https://github.com/eembc/coremark")
    return folder


def check_tools() -> None:
    """Raise a clear error when the cross compiler, newlib or QEMU is missing."""
    missing = [t for t in ("arm-none-eabi-gcc", "qemu-system-arm") if shutil.which(t) is None]
    if not missing:
        libc = subprocess.run(["arm-none-eabi-gcc", *ARCH_FLAGS, "-print-file-name=libc_nano.a"],
                              capture_output=True, text=True).stdout.strip()
        if not Path(libc).is_absolute():        # gcc echoes the bare name when it has no newlib
            missing.append("newlib")
    if missing:
        raise InsituError(f"CoreMark on the twin needs {', '.join(missing)}: {PACKAGES}")


def _version(cmd: str) -> str:
    return subprocess.run([cmd, "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def compile_flags(opt: str) -> list[str]:
    return [opt, *ARCH_FLAGS]


def build(coremark_dir: Path, out: Path, opt: str, iterations: int) -> Path:
    """Compile CoreMark's core files with insitu's port into ``out/coremark-<N>.elf``."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("core_portme.h", PORTME_H), ("core_portme.c", PORTME_C),
                       ("link.ld", LINK_LD)):
        (out / name).write_text(text)
    elf = out / f"coremark-{iterations}.elf"
    flags = compile_flags(opt)
    cmd = ["arm-none-eabi-gcc", *flags, f"-DITERATIONS={iterations}",
           f'-DFLAGS_STR="{" ".join(flags)}"', f"-I{out}", f"-I{coremark_dir}",
           *(str(coremark_dir / f) for f in CORE_FILES), str(out / "core_portme.c"),
           "--specs=nano.specs", "-nostartfiles", f"-T{out / 'link.ld'}", "-o", str(elf)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise InsituError(f"compiling CoreMark failed:\n{' '.join(cmd)}\n{done.stderr[-3000:]}")
    return elf


def qemu_command(elf: Path, report: Path, shift: int = 0) -> list[str]:
    # sleep=off: the virtual clock never runs ahead of the instructions (nothing here sleeps).
    # The semihosting output goes to a file: without a chardev QEMU 7.2 writes it to stderr.
    return ["qemu-system-arm", "-machine", QEMU_MACHINE, "-display", "none", "-monitor", "none",
            "-serial", "none", "-chardev", f"file,id=report,path={report}",
            "-semihosting-config", "enable=on,target=native,chardev=report",
            "-icount", f"shift={shift},sleep=off", "-kernel", str(elf)]


def run(elf: Path, shift: int = 0, timeout: float = 1800) -> str:
    """Run a CoreMark ELF on the twin; its report (the semihosting output)."""
    report = elf.with_suffix(f".shift{shift}.txt")
    cmd = qemu_command(elf, report, shift)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    text = report.read_text() if report.exists() else ""
    if done.returncode:
        raise InsituError(f"CoreMark on the twin failed (exit {done.returncode}):\n"
                          f"{' '.join(cmd)}\n{text[-2000:]}{done.stderr[-2000:]}")
    return text


def parse_report(text: str) -> dict:
    """Ticks, probe and CRCs of one run; an InsituError unless CoreMark validated its CRCs."""
    def number(pattern: str) -> int:
        found = re.search(pattern, text)
        if not found:
            raise InsituError(f"no {pattern!r} in CoreMark's report:\n{text}")
        return int(found.group(1), 0)

    # CoreMark checks the list, matrix and state CRCs against its known values for the 2K
    # performance seeds. Its 10 s minimum is a rule for wall-clock timers, not for an exact count.
    errors = [line for line in text.splitlines() if "ERROR" in line and "10 secs" not in line]
    if errors or "insitu-fault" in text or "2K performance run parameters" not in text:
        raise InsituError("CoreMark did not validate its results:\n" + text)
    crc = dict(re.findall(r"^(?:\[0\])?(\w*crc\w*)\s*:\s*(0x[0-9a-f]+)", text, re.M))
    return {"ticks": number(r"Total ticks\s*:\s*(\d+)"),
            "iterations": number(r"Iterations\s*:\s*(\d+)"),
            "probe_ticks": number(r"insitu-probe: \d+ instructions in (\d+) ticks"),
            "crc": crc}


def instructions_per_tick(probe_ticks: int) -> int:
    """Guest instructions per timer tick, from the probe (40 = 1 ns each at 25 MHz, shift=0)."""
    ratio = PROBE_INSTRUCTIONS / probe_ticks
    # the probe has a few instructions of its own around the loop: far below one tick
    if abs(ratio - round(ratio)) > 1e-3 * ratio:
        raise InsituError(f"the twin's timer ticks every {ratio:.4f} instructions, not a whole "
                          "number: is QEMU running with -icount?")
    return round(ratio)


def per_iteration(ticks_n: int, ticks_2n: int, n: int, per_tick: int) -> float:
    """Instructions per iteration: the run of 2N less the run of N, so fixed costs cancel."""
    if n <= 0 or ticks_2n <= ticks_n:
        raise InsituError(f"the run of {2 * n} iterations took no longer than the run of {n}")
    return (ticks_2n - ticks_n) * per_tick / n


def cpi(instructions_per_iteration: float, coremark_per_mhz: float = COREMARK_PER_MHZ) -> float:
    """Cycles per instruction: the published cycles of an iteration over the twin's instructions."""
    return 1e6 / coremark_per_mhz / instructions_per_iteration


def coremark_cpi(coremark_dir, opt: str = "-O2", iterations: int = 2000, build_dir=None,
                 shift: int = 0) -> dict:
    """Build CoreMark for the board's core with ``opt``, count instructions per iteration on the
    twin (N and 2N iterations), and return the CPI against Arm's published CoreMark/MHz."""
    folder = check_coremark_dir(coremark_dir)
    if iterations < 1:
        raise UsageError(f"iterations must be at least 1, not {iterations}")
    opt = "-" + opt.lstrip("-")                      # "O3" or "-O3"
    if not opt.startswith("-O"):
        raise UsageError(f"opt is a gcc optimization flag (-O2, -O3, -Ofast, -Os), not {opt!r}")
    check_tools()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(build_dir) if build_dir else Path(scratch)
        elfs = [build(folder, out, opt, n) for n in (iterations, 2 * iterations)]
        with ThreadPoolExecutor(2) as pool:          # two independent QEMUs: half the wall time
            reports = list(pool.map(lambda elf: run(elf, shift), elfs))
    first, second = (parse_report(r) for r in reports)
    validated = "Correct operation validated" in reports[1]
    per_tick = instructions_per_tick(first["probe_ticks"])
    per_iter = per_iteration(first["ticks"], second["ticks"], iterations, per_tick)
    return {
        "instructions_per_iteration": per_iter,
        "cycles_per_iteration": 1e6 / COREMARK_PER_MHZ,
        "coremark_per_mhz_published": COREMARK_PER_MHZ,
        "cpi": cpi(per_iter),
        "opt": opt,
        "compiler_flags": " ".join(compile_flags(opt)),
        "compiler": _version("arm-none-eabi-gcc"),
        "qemu": _version("qemu-system-arm"),
        "qemu_command": " ".join(qemu_command(Path("coremark.elf"), Path("report.txt"), shift)),
        "iterations": [iterations, 2 * iterations],
        "ticks": [first["ticks"], second["ticks"]],
        "instructions_per_tick": per_tick,
        "crc": second["crc"],
        "coremark_validated": validated,       # False only for the 10 s rule (CRCs are checked)
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m insitu.mcu.calibrate",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--coremark", required=True, help="a CoreMark checkout")
    parser.add_argument("--opt", default="-O2", help="gcc optimization: O2 (default), O3, Ofast, "
                        "Os (or --opt=-O3)")
    parser.add_argument("--iterations", type=int, default=2000,
                        help="N: runs N and 2N iterations (default 2000)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        result = coremark_cpi(args.coremark, args.opt, args.iterations)
    except InsituError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['compiler_flags']}: {result['instructions_per_iteration']:,.1f} "
              f"instructions per CoreMark iteration on the twin, "
              f"{result['cycles_per_iteration']:,.0f} cycles on a Cortex-M7 "
              f"({COREMARK_PER_MHZ} CoreMark/MHz): CPI {result['cpi']:.3f}")
        print(f"  {result['compiler']}; CRCs {result['crc']}"
              + ("; Correct operation validated" if result["coremark_validated"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
