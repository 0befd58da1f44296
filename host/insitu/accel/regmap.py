"""The accelerator's AXI-Lite register map: the one specification of the control plane.

From this list come the RTL register file (:mod:`insitu.rtl.axil`), the offsets the PYNQ driver
uses, and the Markdown table of ``insitu rtl generate``. :data:`VERSION` is a checksum of the
list, readable from the hardware, so a driver can refuse a bitstream built from another map.

Registers are 32 bits at 4-byte offsets. Access kinds:

* ``rw``: storage the processor writes and reads back (configuration);
* ``ro``: driven by the hardware (status, counters, constants); writes are ignored;
* ``wo``: command bits that act for one cycle when written with 1; they read as 0.

An address that names no register reads as 0 and ignores writes (response OKAY: on a Zynq an
error response would be a bus fault in the driver's process).
"""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass

from .params import DEFAULT_PARAMS, AcceleratorParams

#: Bits of the AXI-Lite address bus of the accelerator (a 4 KB window).
ADDR_BITS = 12
#: The ID register's constant: ASCII "insi".
ID_VALUE = 0x696E7369


class Op(enum.IntEnum):
    """Values of the OP register: which PE runs and what it does."""

    PE1 = 1                  # Z'(a,d) = sum_{b,c} Z(a,b,c) G(b,d,c)
    PE2 = 2                  # Z'(a,d,c) = sum_b Z(a,b,c) G(b,d)
    PE3 = 3                  # outer products summed over a batch (full-weight gradient)
    PE3_PSG = 4              # PE3 with E2-Train's MSB sign predictor: g_msb and eq.-2 signs
    LRT_LOAD_BASIS = 16      # stream in Q (rows x cols) of LRT_SIDE
    LRT_READ_BASIS = 17      # stream out Q of LRT_SIDE
    LRT_PROJECT = 18         # MGS projections c = Q^T x and residual of a streamed x
    LRT_REPROJECT = 19       # a second MGS pass on the residual held on chip
    LRT_APPEND = 20          # Q[:, LRT_COLS] = residual * LRT_RECIP
    LRT_ROTATE = 21          # Q[:, :r] = Q . M for a streamed q x r matrix M
    LRT_UPDATE = 22          # W -= Q_L diag(s) Q_R^T for a streamed r-vector s; counts writes
    LRT_LOAD_WEIGHTS = 23    # stream in the weight codes (clears the write counters)
    LRT_READ_WEIGHTS = 24    # stream out the weight codes
    LRT_READ_COUNTS = 25     # stream out the per-cell write counters


class ErrorCode(enum.IntEnum):
    """Values of ERROR_CODE: why the last START ended in error (0: it did not)."""

    NONE = 0
    BAD_OP = 1               # OP names no operation
    ZERO_SIZE = 2            # a size register the op uses is 0
    C_LANES = 3              # c is not a multiple of 16 (PE1/PE2) or not 16 (PE3)
    FACTOR_WORDS = 4         # the factor operand does not fit the factor buffer
    TILE = 5                 # a tile (PE1 row, PE2 b, PE3 batch) exceeds its buffer
    SHIFT = 6                # SHIFT outside [shift_min, shift_max]
    BLOCK = 7                # PE3: a is not a multiple of d (rows per X block)
    STREAM_SHORT = 8         # the input stream ended (TLAST) before the op's last beat
    LRT_SIZE = 9             # LRT rows, columns or cells beyond the generated memories
    ABORTED = 10             # CTRL.ABORT stopped the op
    STREAM_LONG = 11         # the op's last input beat came without TLAST (a longer stream)
    PSG_TAU = 12             # PE3_PSG: PSG_TAU is 0 (the threshold must be >= 1)


#: The TT schedule's PE kinds (:mod:`insitu.tt.schedule`) and the ops that run them.
PE_OPS = {kind: Op[kind] for kind in ("PE1", "PE2", "PE3", "PE3_PSG")}
#: The ops of the LRT PE.
LRT_OPS = frozenset(op for op in Op if op.name.startswith("LRT_"))


@dataclass(frozen=True)
class Field:
    name: str
    lsb: int
    width: int
    doc: str


@dataclass(frozen=True)
class Register:
    name: str
    offset: int
    access: str                       # "rw" | "ro" | "wo"
    width: int
    doc: str
    fields: tuple[Field, ...] = ()
    signed: bool = False
    #: For constant "ro" registers: the AcceleratorParams attribute they report.
    param: str | None = None

    def __post_init__(self):
        if self.access not in ("rw", "ro", "wo"):
            raise ValueError(f"register {self.name}: access must be rw, ro or wo, got {self.access!r}")
        if self.offset % 4 or not 0 <= self.offset < (1 << ADDR_BITS):
            raise ValueError(f"register {self.name}: offset {self.offset:#x} must be 4-aligned and "
                             f"below {1 << ADDR_BITS:#x}")
        if not 1 <= self.width <= 32:
            raise ValueError(f"register {self.name}: width {self.width} must be in [1, 32]")


def _reg(name, offset, access, width, doc, *fields, signed=False, param=None) -> Register:
    return Register(name, offset, access, width, doc, tuple(Field(*f) for f in fields), signed, param)


REGISTERS: tuple[Register, ...] = (
    _reg("ID", 0x00, "ro", 32, f"Constant {ID_VALUE:#010x} (ASCII 'insi'): an insitu accelerator."),
    _reg("VERSION", 0x04, "ro", 32, "Checksum of this register map; the driver refuses another."),
    _reg("CTRL", 0x08, "wo", 2, "Commands (write 1 to act).",
         ("START", 0, 1, "Start OP with the configuration registers; ignored while BUSY."),
         ("ABORT", 1, 1, "Stop the running op: its PE is reset, ERROR with ABORTED, back to "
          "idle (ignored while idle). Reset the DMA channels after any ERROR.")),
    _reg("STATUS", 0x0C, "ro", 3, "State of the last START.",
         ("BUSY", 0, 1, "An op is running."),
         ("DONE", 1, 1, "The last op finished (cleared by START)."),
         ("ERROR", 2, 1, "The last START or op failed; see ERROR_CODE (cleared by START).")),
    _reg("ERROR_CODE", 0x10, "ro", 8, "Why the last START failed (ErrorCode); 0 after success."),
    _reg("CYCLES", 0x14, "ro", 32, "Clock cycles of the last op, START to done (counts while BUSY, "
         "saturates at 2**32 - 1)."),
    _reg("OP", 0x18, "rw", 8, "The operation START runs (Op)."),
    _reg("SHIFT", 0x1C, "rw", 8, "Output rescaling: right shift of the accumulators (negative: "
         "left), round half up, saturate (to 16 bits; LRT_UPDATE: to the weight width).", signed=True),
    _reg("SIZE_A", 0x20, "rw", 16, "Size a of the op (PE1/PE2/PE3)."),
    _reg("SIZE_B", 0x24, "rw", 16, "Size b of the op."),
    _reg("SIZE_C", 0x28, "rw", 16, "Size c of the op."),
    _reg("SIZE_D", 0x2C, "rw", 16, "Size d of the op (PE3: rows per X block)."),
    _reg("IN_BEATS", 0x30, "ro", 32, "Input-stream beats the configured op consumes (size of the DMA "
         "send; while busy: of the running op). The last one must carry TLAST."),
    _reg("OUT_BEATS", 0x34, "ro", 32, "Output-stream beats the configured op produces (size of the "
         "DMA receive; TLAST on the last)."),
    _reg("BEATS_DONE_IN", 0x38, "ro", 32, "Input beats consumed by the current or last op."),
    _reg("BEATS_DONE_OUT", 0x3C, "ro", 32, "Output beats sent by the current or last op."),
    # Generate-time bounds, so that a driver can check its schedule against this bitstream.
    _reg("CAP_FACTOR_WORDS", 0x40, "ro", 32, "Factor buffer depth in words.", param="factor_words"),
    _reg("CAP_PE1_ROW_ENTRIES", 0x44, "ro", 32, "PE1: largest b*c/16.", param="pe1_row_entries"),
    _reg("CAP_PE2_B_MAX", 0x48, "ro", 32, "PE2: largest b.", param="pe2_b_max"),
    _reg("CAP_PE3_B_MAX", 0x4C, "ro", 32, "PE3: largest batch b.", param="pe3_b_max"),
    _reg("CAP_LRT_ROWS_MAX", 0x50, "ro", 32, "LRT: largest basis rows (m or n).", param="lrt_rows_max"),
    _reg("CAP_LRT_COLS_MAX", 0x54, "ro", 32, "LRT: basis columns q.", param="lrt_cols_max"),
    _reg("CAP_LRT_CELLS_MAX", 0x58, "ro", 32, "LRT: weight cells m*n.", param="lrt_cells_max"),
    # ---- E2-Train PSG on PE3 (op PE3_PSG; the others leave these registers alone)
    _reg("PSG_TAU", 0x60, "rw", 32, "PE3_PSG: threshold of the sign predictor, in g_msb codes "
         "(unsigned, >= 1): an entry with |g_msb| >= PSG_TAU takes sgn(g_msb), the others "
         "sgn(g_full) (E2-Train eq. 2)."),
    _reg("PSG_PREDICTED", 0x64, "ro", 32, "PE3_PSG: entries the predictor decided in the last "
         "PE3_PSG op (valid once it is done; 0 after a PE3 or PE3_PSG op ended in ERROR)."),
    _reg("PSG_MAX", 0x68, "ro", 32, "PE3_PSG: max |g_msb| over the last PE3_PSG op, for the next "
         "threshold max(1, ceil(beta * PSG_MAX)) (same validity as PSG_PREDICTED)."),
    # ---- LRT PE (begin): registers of the low-rank-training PE
    _reg("LRT_SIDE", 0x80, "rw", 1, "Basis the LRT op works on: 0 = Q_L (rows LRT_ROWS_L), 1 = Q_R."),
    _reg("LRT_ROWS_L", 0x84, "rw", 16, "m: rows of Q_L (weight rows)."),
    _reg("LRT_ROWS_R", 0x88, "rw", 16, "n: rows of Q_R (weight columns)."),
    _reg("LRT_COLS", 0x8C, "rw", 8, "r: basis columns in use (LRT_APPEND writes column r)."),
    _reg("LRT_RECIP", 0x90, "rw", 16, "Reciprocal of the residual norm for LRT_APPEND, unsigned: "
         "column r = round(residual * LRT_RECIP * 2**-SHIFT), saturated to 16 bits."),
    _reg("LRT_NORM2_LO", 0x94, "ro", 32, "Squared residual norm of the last projection, low word."),
    _reg("LRT_NORM2_HI", 0x98, "ro", 32, "Squared residual norm of the last projection, high word."),
    _reg("LRT_WRITES_MAX", 0x9C, "ro", 32, "Largest per-cell write count since LRT_LOAD_WEIGHTS."),
    _reg("LRT_WRITES_TOTAL", 0xA0, "ro", 32, "Cell writes since LRT_LOAD_WEIGHTS (saturating)."),
    # ---- LRT PE (end)
)

OFFSETS: dict[str, int] = {r.name: r.offset for r in REGISTERS}


def register(name: str) -> Register:
    for reg in REGISTERS:
        if reg.name == name:
            return reg
    raise KeyError(f"no register {name!r}; the map has {', '.join(OFFSETS)}")


def _check_map(registers) -> None:
    seen: dict[int, str] = {}
    for reg in registers:
        if reg.offset in seen:
            raise ValueError(f"registers {seen[reg.offset]} and {reg.name} share offset {reg.offset:#x}")
        seen[reg.offset] = reg.name
        for f in reg.fields:
            if f.lsb + f.width > reg.width:
                raise ValueError(f"register {reg.name}: field {f.name} exceeds its {reg.width} bits")


_check_map(REGISTERS)


def _canonical(registers) -> str:
    lines = []
    for r in registers:
        lines.append(f"{r.name} {r.offset:#x} {r.access} {r.width} {int(r.signed)} {r.param}")
        lines += [f"  {f.name} {f.lsb} {f.width}" for f in r.fields]
    lines += [f"op {o.name} {o.value}" for o in Op] + [f"error {e.name} {e.value}" for e in ErrorCode]
    return "\n".join(lines)


#: CRC-32 of the register map (names, offsets, access, widths, fields, op and error codes).
VERSION = zlib.crc32(_canonical(REGISTERS).encode())


def reset_value(reg: Register, params: AcceleratorParams = DEFAULT_PARAMS) -> int:
    """What the register reads after reset (constants for ID, VERSION and CAP_*)."""
    if reg.name == "ID":
        return ID_VALUE
    if reg.name == "VERSION":
        return VERSION
    if reg.param is not None:
        return int(getattr(params, reg.param))
    return 0


def markdown(params: AcceleratorParams = DEFAULT_PARAMS) -> str:
    """The register map as a Markdown document (written by ``insitu rtl generate``)."""
    out = ["# insitu accelerator: AXI-Lite register map", "",
           f"Register map version (VERSION register): `{VERSION:#010x}`. Registers are 32 bits wide; "
           "unknown addresses read 0 and ignore writes.", "",
           "| offset | name | access | bits | reset | description |",
           "|---|---|---|---|---|---|"]
    for r in REGISTERS:
        reset = reset_value(r, params)
        doc = r.doc + (" Signed." if r.signed else "")
        for f in r.fields:
            bits = f"{f.lsb}" if f.width == 1 else f"{f.lsb + f.width - 1}:{f.lsb}"
            doc += f" `[{bits}] {f.name}`: {f.doc}"
        out.append(f"| `{r.offset:#05x}` | `{r.name}` | {r.access} | {r.width} | `{reset:#x}` | {doc} |")
    out += ["", "## OP values", "", "| value | op |", "|---|---|"]
    out += [f"| {o.value} | `{o.name}` |" for o in Op]
    out += ["", "## ERROR_CODE values", "", "| value | error |", "|---|---|"]
    out += [f"| {e.value} | `{e.name}` |" for e in ErrorCode]
    return "\n".join(out) + "\n"
